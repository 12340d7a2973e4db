"""``waddle eval``: run a checkpoint's deterministic policy and report how it does, per command.

For each command of the task library the checkpoint was trained on (a fixed
command, or the low, middle and high speed of a range), or for the one
``--command VX VY``, it runs one episode of ``--max-steps`` steps (1000 = 20 s
by default) in each of ``--episodes`` envs and prints one row: survival,
return, the forward and lateral speed of the envs that did not fall, yaw
drift, foot clearance and step frequency. ``--video`` films the first env of
the first command from the tracking camera.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from waddle.algorithms.checkpoint import CheckpointError, load_checkpoint
from waddle.algorithms.presets import BACKENDS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="a checkpoint.pt written by waddle train (or its run directory)"
    )
    parser.add_argument("--episodes", type=int, default=16, metavar="N", help="episodes, run side by side (default 16)")
    parser.add_argument("--video", metavar="PATH", help="write an mp4 of the first env's episode here")
    parser.add_argument(
        "--max-steps", type=int, default=1000, metavar="N", help="episode length in steps (default 1000 = 20 s)"
    )
    parser.add_argument(
        "--command", type=float, nargs=2, metavar=("VX", "VY"), help="evaluate this planar command (m/s) only"
    )
    parser.add_argument(
        "--seed", type=int, default=12345, metavar="S", help="seed of the evaluation envs (default 12345)"
    )
    parser.add_argument("--backend", choices=BACKENDS, help="physics backend (default: the one it was trained on)")
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")


def checkpoint_path(path: str | Path) -> Path:
    """``path`` itself, or ``path/checkpoint.pt`` when ``path`` is a run directory."""
    path = Path(path)
    return path / "checkpoint.pt" if path.is_dir() else path


def run(args: argparse.Namespace) -> int:
    import math

    from waddle.algorithms.evaluation import evaluate, policy_from_checkpoint, task_commands
    from waddle.algorithms.presets import make_env

    for flag, value in (("--episodes", args.episodes), ("--max-steps", args.max_steps)):
        if value is not None and value < 1:
            print(f"waddle eval: error: {flag} must be >= 1, got {value}", file=sys.stderr)
            return 2
    if args.command is not None and not all(math.isfinite(v) for v in args.command):
        print(f"waddle eval: error: --command must be two finite speeds in m/s, got {args.command}", file=sys.stderr)
        return 2
    path = checkpoint_path(args.checkpoint)
    try:
        checkpoint = load_checkpoint(path)
        run_config = checkpoint["config"]["run"]
        env = make_env(
            run_config["task"],
            num_envs=args.episodes,
            seed=args.seed,
            backend=args.backend or run_config["backend"],
            device=args.device,
            max_episode_steps=args.max_steps,
            command=None if args.command is None else tuple(args.command),
        )
        policy = policy_from_checkpoint(checkpoint, env, args.device)
    except CheckpointError as err:
        print(f"waddle eval: error: {err}", file=sys.stderr)
        return 1
    except (KeyError, TypeError, ValueError, ImportError) as err:
        print(f"waddle eval: error: {path} cannot be evaluated: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    commands = [tuple(args.command)] if args.command is not None else task_commands(env.tasks)
    results = []
    try:
        for index, command in enumerate(commands):
            video = args.video if index == 0 else None
            results.append(evaluate(env, policy, command=command, video_path=video, max_steps=args.max_steps))
    finally:
        env.close()
    trained = f"{checkpoint['algo']}, task {run_config['task']}, {checkpoint['env_steps']} env steps"
    print(f"checkpoint {path} ({trained})")
    print(
        f"{args.episodes} episodes of {args.max_steps} steps per command; speeds and drift over the envs that did not fall"
    )
    print(format_table(results))
    if args.video:
        print(f"video: {args.video} (command {commands[0][0]:+.2f}, {commands[0][1]:+.2f})")
    return 0


HEADER = (
    f"{'command vx,vy':>14} {'survival':>8} {'return':>8} {'forward':>8} {'lateral':>8} {'track err':>9} "
    f"{'yaw drift':>9} {'p95':>6} {'clearance':>9} {'steps/s':>7}"
)


def format_table(results) -> str:
    """One row per command: the figures of :class:`~waddle.algorithms.evaluation.EvaluationResult`."""
    rows = [
        HEADER,
        f"{'':>14} {'%':>8} {'':>8} {'m/s':>8} {'m/s':>8} {'m/s':>9} {'deg':>9} {'deg':>6} {'cm':>9} {'Hz':>7}",
    ]
    for r in results:
        command = f"{r.command[0]:+.2f},{r.command[1]:+.2f}"
        rows.append(
            f"{command:>14} {100 * r.survival:>8.1f} {r.mean_return:>8.2f} {r.mean_forward_speed:>8.3f} "
            f"{r.mean_lateral_speed:>8.3f} {r.velocity_tracking_error:>9.3f} {r.yaw_drift_deg:>9.1f} "
            f"{r.yaw_drift_p95_deg:>6.1f} {100 * r.foot_clearance:>9.2f} {r.step_frequency_hz:>7.2f}"
        )
    return "\n".join(rows)
