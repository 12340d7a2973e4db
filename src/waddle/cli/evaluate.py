"""``waddle eval``: run a checkpoint's deterministic policy and report how it does, per task and command.

For each task of the library the checkpoint was trained on, and each command
of that task (a fixed command, or the low, middle and high speed of a range;
or the one ``--command VX VY``), it resets ``--episodes`` envs into that task
and command, runs one episode of ``--max-steps`` steps (1000 = 20 s by
default) in each and prints one row: survival, return, the forward and lateral
speed of the envs that did not fall, tracking error, yaw drift, foot clearance,
step frequency, how often the actions sit at a bound and how much they change
per step (a bang-bang policy is not one servos can follow), and for a task
that rewards hops (jump) the hop height,
airborne fraction and hop frequency; for a task that goes on after a fall
(getup, joystick-getup) the falls, the share of them the robot got up from,
its mean time to stand and its mean time lying. A task-conditioned policy gets each
env's task id. ``--csv`` writes the same rows to a CSV file; ``--video`` films
the first env of the first row from the tracking camera.

The envs draw the randomization the checkpoint was trained under
(``--randomization`` overrides it) and the policy reads the observation it was
trained on (``--actor-observation``, when given, must name that one: a policy
trained on the robot's sensors cannot read the full observation, nor the
reverse).
"""

from __future__ import annotations

import argparse
import csv
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from waddle.algorithms.checkpoint import CheckpointError, load_checkpoint
from waddle.algorithms.presets import ACTOR_OBSERVATIONS, BACKENDS, RANDOMIZATIONS, TASKS
from waddle.algorithms.task_library import task_library
from waddle.deploy.daemon import command_problem
from waddle.envs.microduck.tasks import as_task_library
from waddle.files import atomic_write


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="a checkpoint.pt written by waddle train (or its run directory)"
    )
    parser.add_argument(
        "--episodes",
        type=int,
        default=16,
        metavar="N",
        help="episodes per task and command, run side by side (default 16)",
    )
    parser.add_argument("--video", metavar="PATH", help="write an mp4 of the first env's episode here")
    parser.add_argument(
        "--video-task",
        metavar="NAME",
        help="film this task of the library (default: the first row of the table); needs --video",
    )
    parser.add_argument("--csv", metavar="PATH", help="also write the table here, one row per task and command")
    parser.add_argument(
        "--max-steps", type=int, default=1000, metavar="N", help="episode length in steps (default 1000 = 20 s)"
    )
    parser.add_argument(
        "--command",
        type=float,
        nargs="+",
        metavar="V",
        help="VX VY [VYAW]: evaluate this twist only (m/s, m/s, rad/s; two values: no yaw rate), in every task",
    )
    parser.add_argument(
        "--seed", type=int, default=12345, metavar="S", help="seed of the evaluation envs (default 12345)"
    )
    parser.add_argument("--backend", choices=BACKENDS, help="physics backend (default: the one it was trained on)")
    add_policy_arguments(parser)
    parser.add_argument(
        "--randomization",
        choices=RANDOMIZATIONS,
        help="domain randomization, latency and noise of the evaluation envs (default: the checkpoint's)",
    )
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")


def add_policy_arguments(parser: argparse.ArgumentParser) -> None:
    """``--actor-observation``, shared by ``waddle eval`` and ``waddle export``."""
    parser.add_argument(
        "--actor-observation",
        choices=ACTOR_OBSERVATIONS,
        help="the observation the policy must read: 'full' or 'sensors' (default: the one it was trained on; "
        "a checkpoint trained on the other is refused)",
    )


def checkpoint_path(path: str | Path) -> Path:
    """``path`` itself, or ``path/checkpoint.pt`` when ``path`` is a run directory."""
    path = Path(path)
    return path / "checkpoint.pt" if path.is_dir() else path


def run(args: argparse.Namespace) -> int:
    from waddle.algorithms.evaluation import evaluate_tasks, observation_key, policy_from_checkpoint
    from waddle.algorithms.presets import make_env
    from waddle.algorithms.run_plan import RunPlan

    for flag, value in (("--episodes", args.episodes), ("--max-steps", args.max_steps)):
        if value is not None and value < 1:
            print(f"waddle eval: error: {flag} must be >= 1, got {value}", file=sys.stderr)
            return 2
    if args.command is not None:
        problem = command_problem(args.command)
        if problem is not None:
            print(f"waddle eval: error: --command {problem}", file=sys.stderr)
            return 2
    if args.video_task is not None and not args.video:
        print("waddle eval: error: --video-task names the task to film; give --video PATH as well", file=sys.stderr)
        return 2
    path = checkpoint_path(args.checkpoint)
    try:
        checkpoint = load_checkpoint(path)
        plan = RunPlan.from_checkpoint(checkpoint)
        trained = plan.run
        randomization = args.randomization or trained.randomization
        env = make_env(
            trained.task,
            num_envs=args.episodes,
            seed=args.seed,
            backend=args.backend or trained.backend,
            device=args.device,
            max_episode_steps=args.max_steps,
            command=None if args.command is None else tuple(args.command),
            reference_starts=False,
            randomization=randomization,
            **plan.policy_env_options,
        )
        try:
            policy = policy_from_checkpoint(checkpoint, env, args.device, actor_observation=args.actor_observation)
        except BaseException:
            env.close()
            raise
    except CheckpointError as err:
        print(f"waddle eval: error: {err}", file=sys.stderr)
        return 1
    except (KeyError, TypeError, ValueError, ImportError) as err:
        print(f"waddle eval: error: {path} cannot be evaluated: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    command = None if args.command is None else tuple(args.command)
    if command is not None:
        outside = outside_trained_range(as_task_library(TASKS[trained.task]()), command)
        if outside is not None:
            print(f"waddle eval: warning: --command {outside}", file=sys.stderr)
    names = task_library(env)
    if args.video_task is not None and args.video_task not in names:
        env.close()
        print(
            f"waddle eval: error: --video-task {args.video_task!r} is not a task of this checkpoint's library; "
            f"its tasks are {', '.join(names)}",
            file=sys.stderr,
        )
        return 2
    try:
        results = evaluate_tasks(
            env, policy, command=command, video_path=args.video, video_task=args.video_task, max_steps=args.max_steps
        )
    finally:
        env.close()
    print(f"checkpoint {path} ({checkpoint['algo']}, task {trained.task}, {checkpoint['env_steps']} env steps)")
    print(f"policy reads {observation_key(policy)}; envs drawn with randomization {randomization!r}")
    print(
        f"{args.episodes} episodes of {args.max_steps} steps per task and command; "
        "speeds, drift and hops over the envs that did not fall"
    )
    if trained.push_scale != 1.0:
        print(
            f"note: the policy trained on pushes {trained.push_scale:g} times as hard as the "
            f"{trained.randomization!r} preset's; these envs draw the {randomization!r} preset as it is"
        )
    horizon = trained.max_episode_steps
    if args.max_steps > horizon:
        print(
            f"note: the policy trained on episodes of {horizon} steps; past step {horizon} it runs in states it "
            f"never saw (waddle train --max-episode-steps {args.max_steps} trains on the whole episode)"
        )
    print(format_table(results))
    if args.csv:
        write_csv(results, args.csv)
        print(f"table: {args.csv}")
    if args.video:
        filmed = next(r for r in results if args.video_task in (None, r.task))
        shown = ", ".join(f"{value:+.2f}" for value in filmed.command)
        print(f"video: {args.video} (task {filmed.task}, command {shown})")
    return 0


def outside_trained_range(tasks: Any, command: Sequence[float]) -> str | None:
    """A warning when ``command`` lies outside every task's trained box (and yaw-rate range), naming
    them; ``None`` when a task of the library was trained on it."""
    values = [*command, 0.0][:3]
    boxes = []
    for low, high, yaw in zip(tasks.command_low.tolist(), tasks.command_high.tolist(), tasks.yaw_rate_range.tolist()):
        inside = all(lo - 1e-6 <= v <= hi + 1e-6 for v, lo, hi in zip(values, [*low, yaw[0]], [*high, yaw[1]]))
        if inside:
            return None
        boxes.append(
            f"vx [{low[0]:+.2f}, {high[0]:+.2f}], vy [{low[1]:+.2f}, {high[1]:+.2f}], vyaw [{yaw[0]:+.2f}, {yaw[1]:+.2f}]"
        )
    shown = " ".join(f"{value:+.2f}" for value in command)
    return f"{shown} lies outside what the policy trained on ({'; '.join(boxes)}); expect it to do worse"


TASK_WIDTH = 22
HEADER = (
    f"{'task':<{TASK_WIDTH}} {'command vx,vy,vyaw':>18} {'survival':>8} {'return':>8} {'forward':>8} {'lateral':>8} "
    f"{'track err':>9} {'yaw drift':>9} {'p95':>6} {'yaw rate':>8} {'clearance':>9} {'steps/s':>7} {'at bound':>8} "
    f"{'act chg':>7} {'hop':>6} {'airborne':>8} {'hops/s':>6}"
)
UNITS = (
    f"{'':<{TASK_WIDTH}} {'':>18} {'%':>8} {'':>8} {'m/s':>8} {'m/s':>8} {'m/s':>9} {'deg':>9} {'deg':>6} "
    f"{'rad/s':>8} {'cm':>9} {'Hz':>7} {'%':>8} {'/step':>7} {'cm':>6} {'%':>8} {'Hz':>6}"
)


RECOVERY_HEADER = f" {'falls':>6} {'got up':>6} {'to stand':>8} {'lying':>6}"
RECOVERY_UNITS = f" {'':>6} {'%':>6} {'s':>8} {'s':>6}"


def format_table(results: Sequence[Any]) -> str:
    """One row per task and command: the figures of :class:`~waddle.algorithms.evaluation.EvaluationResult`;
    the hop columns are filled for the tasks that reward hops and ``-`` elsewhere. When a task goes on after
    a fall, recovery columns follow, filled for such tasks."""
    recovering = any(getattr(r, "recovery_task", False) for r in results)
    rows = [HEADER + RECOVERY_HEADER, UNITS + RECOVERY_UNITS] if recovering else [HEADER, UNITS]
    for r in results:
        command = ",".join(f"{value:+.2f}" for value in (*r.command, 0.0)[:3])
        task = r.task if r.task is not None else "-"
        if r.hop_task:
            hops = f"{100 * r.hop_height:>6.2f} {100 * r.airborne_fraction:>8.1f} {r.hop_frequency_hz:>6.2f}"
        else:
            hops = f"{'-':>6} {'-':>8} {'-':>6}"
        rows.append(
            f"{task:<{TASK_WIDTH}} {command:>18} {100 * r.survival:>8.1f} {r.mean_return:>8.2f} "
            f"{r.mean_forward_speed:>8.3f} {r.mean_lateral_speed:>8.3f} {r.velocity_tracking_error:>9.3f} "
            f"{r.yaw_drift_deg:>9.1f} {r.yaw_drift_p95_deg:>6.1f} {r.mean_yaw_rate:>8.3f} {100 * r.foot_clearance:>9.2f} "
            f"{r.step_frequency_hz:>7.2f} {100 * r.action_saturation:>8.1f} {r.action_change:>7.3f} {hops}"
            + (_recovery_cells(r) if recovering else "")
        )
    return "\n".join(rows)


def _recovery_cells(r: Any) -> str:
    if not r.recovery_task:
        return f" {'-':>6} {'-':>6} {'-':>8} {'-':>6}"

    def figure(value: float, width: int, digits: int) -> str:  # no fall, or none got up: nothing to show
        return f"{'-':>{width}}" if math.isnan(value) else f"{value:>{width}.{digits}f}"

    got_up = figure(100 * r.recovered_fraction, 6, 1)
    return f" {r.falls:>6d} {got_up} {figure(r.time_to_stand_s, 8, 2)} {figure(r.time_lying_s, 6, 2)}"


CSV_COLUMNS: dict[str, str] = {
    "task": "task",
    "task_id": "task_id",
    "command_vx": "command[0]",
    "command_vy": "command[1]",
    "command_vyaw": "command[2]",
    "episodes": "episodes",
    "survival": "survival",
    "episode_return": "mean_return",
    "episode_length": "mean_episode_length",
    "forward_speed_mps": "mean_forward_speed",
    "lateral_speed_mps": "mean_lateral_speed",
    "tracking_error_mps": "velocity_tracking_error",
    "yaw_drift_deg": "yaw_drift_deg",
    "yaw_drift_p95_deg": "yaw_drift_p95_deg",
    "yaw_rate_radps": "mean_yaw_rate",
    "foot_clearance_m": "foot_clearance",
    "step_frequency_hz": "step_frequency_hz",
    "action_saturation": "action_saturation",
    "action_change": "action_change",
    "hop_height_m": "hop_height",
    "airborne_fraction": "airborne_fraction",
    "hop_frequency_hz": "hop_frequency_hz",
    "falls": "falls",
    "recovered_fraction": "recovered_fraction",
    "time_to_stand_s": "time_to_stand_s",
    "time_to_stand_p95_s": "time_to_stand_p95_s",
    "time_lying_s": "time_lying_s",
}
"""CSV header -> the :class:`~waddle.algorithms.evaluation.EvaluationResult` figure in it (SI units, fractions)."""
HOP_COLUMNS = ("hop_height_m", "airborne_fraction", "hop_frequency_hz")
"""Columns left empty in the rows of tasks that do not reward hops, as the table shows ``-`` there."""
RECOVERY_COLUMNS = ("falls", "recovered_fraction", "time_to_stand_s", "time_to_stand_p95_s", "time_lying_s")
"""Columns left empty in the rows of tasks that end at a fall."""


def csv_row(result: Any) -> dict[str, Any]:
    """One CSV row of ``result`` (see :data:`CSV_COLUMNS`)."""
    row: dict[str, Any] = {}
    for column, figure in CSV_COLUMNS.items():
        if figure.startswith("command["):
            index = int(figure[8])
            value = (*result.command, 0.0)[index] if result.command is not None else ""
        else:
            value = getattr(result, figure)
        if column in HOP_COLUMNS and not result.hop_task:
            value = ""
        if column in RECOVERY_COLUMNS and not result.recovery_task:
            value = ""
        row[column] = "" if value is None or (isinstance(value, float) and math.isnan(value)) else value
    return row


def write_csv(results: Sequence[Any], path: str | Path) -> None:
    """Write the table's rows to ``path`` (atomically), one per task and command."""

    def write(file) -> None:
        writer = csv.DictWriter(file, fieldnames=list(CSV_COLUMNS), lineterminator="\n")
        writer.writeheader()
        writer.writerows(csv_row(result) for result in results)

    atomic_write(path, write, mode="w")
