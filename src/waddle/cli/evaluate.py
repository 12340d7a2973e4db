"""``waddle eval``: run a checkpoint's deterministic policy and report how it does.

Prints mean return, episode length, velocity-tracking error, forward speed
and fall rate over one episode in each of ``--episodes`` envs of the task the
checkpoint was trained on; ``--video`` films the first env from the tracking
camera.
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
        "--max-steps", type=int, metavar="N", help="cut episodes after N steps (default: the env's limit, 500)"
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
    from waddle.algorithms.evaluation import evaluate, policy_from_checkpoint
    from waddle.algorithms.presets import make_env

    for flag, value in (("--episodes", args.episodes), ("--max-steps", args.max_steps)):
        if value is not None and value < 1:
            print(f"waddle eval: error: {flag} must be >= 1, got {value}", file=sys.stderr)
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
        )
        policy = policy_from_checkpoint(checkpoint, env, args.device)
    except CheckpointError as err:
        print(f"waddle eval: error: {err}", file=sys.stderr)
        return 1
    except (KeyError, TypeError, ValueError, ImportError) as err:
        print(f"waddle eval: error: {path} cannot be evaluated: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    try:
        result = evaluate(env, policy, video_path=args.video, max_steps=args.max_steps)
    finally:
        env.close()
    trained = f"{checkpoint['algo']}, task {run_config['task']}, {checkpoint['env_steps']} env steps"
    print(f"checkpoint               {path} ({trained})")
    print(f"episodes                 {result.episodes}")
    print(f"mean return              {result.mean_return:.3f}")
    print(f"mean episode length      {result.mean_episode_length:.1f} steps")
    print(f"velocity tracking error  {result.velocity_tracking_error:.4f} m/s")
    print(f"mean forward speed       {result.mean_forward_speed:.4f} m/s")
    print(f"fall rate                {100.0 * result.fall_rate:.1f}%")
    if args.video:
        print(f"video                    {args.video}")
    return 0
