"""The MicroDuck on its own software: train ``waddle train --task joystick``, export the robot's file, drive it.

For each seed this script

1. trains ``waddle train --task joystick --seed S`` with its defaults, stopped
   after ``--minutes`` of training at the latest (the run keeps its last
   checkpoint);
2. exports the run with ``waddle export RUN --onnx policy.onnx``: the file the
   MicroDuck's daemon loads (``obs [1, 61] -> actions [1, 14]``, metadata
   ``microduck``);
3. drives that file alone, in onnxruntime, in MicroDuckEnvs under the upstream
   randomization (pushes, delays, noise, per-env physics), 20 s episodes: the
   env hands over the robot's 61 floats and applies ``default_joint_pos +
   action_scale * action``, nothing else between them;

and prints one row per scenario, with the issue's targets beside the figures, and how many robots fell
and how many of those fell within a second of a push or of a new command.

    python benchmarks/robot.py --seeds 0 1 --minutes 60
    python benchmarks/robot.py --runs runs/robot --skip-train   # evaluate finished runs again
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from harness import load_line, print_table

from waddle.algorithms.presets import fixed_command
from waddle.deploy.daemon import RobotPolicy, parse_policy_file
from waddle.envs.microduck import MicroDuckEnv
from waddle.envs.rotations import wrap_angle


@dataclass(frozen=True)
class Scenario:
    """One row of the table: a twist held for the episode, or a joystick that changes it every 4 s."""

    name: str
    command: tuple[float, float, float] | None
    """The held twist ``(vx, vy, vyaw)``; ``None`` for the changing joystick."""
    target: str


SCENARIOS = (
    Scenario("walk 0.2 m/s", (0.2, 0.0, 0.0), "survival >= 95 %, vx within 0.05, drift p95 <= 30 deg"),
    Scenario("turn +0.5 rad/s", (0.0, 0.0, 0.5), "survival >= 95 %, yaw rate within 0.1"),
    Scenario("turn -0.5 rad/s", (0.0, 0.0, -0.5), "survival >= 95 %, yaw rate within 0.1"),
    Scenario("sidestep 0.1 m/s", (0.0, 0.1, 0.0), "survival >= 95 %, vy within 0.05"),
    Scenario("stand", (0.0, 0.0, 0.0), "survival >= 95 %"),
    Scenario("joystick, new twist every 4 s", None, "survival >= 95 %"),
)

WADDLE = (sys.executable, "-m", "waddle")
"""The waddle command of this interpreter, activated or not."""

JOYSTICK_BOX = ((-0.2, -0.15), (0.3, 0.15))
JOYSTICK_YAW = (-0.8, 0.8)
JOYSTICK_EVERY_S = 4.0

FALL_CAUSE_S = 1.0
"""A fall within this many seconds of a push (or of a new command) is counted against it. Pushes come every
3-6 s, so about a fifth of the falls would land there by chance."""


def scenario_task(scenario: Scenario):
    """The joystick task row that commands ``scenario`` (no gait prior: the robot adds none)."""
    task = MicroDuckEnv.joystick_task()
    if scenario.command is not None:
        return fixed_command(task, scenario.command)
    row = fixed_command(task, (0.0, 0.0, 0.0))  # no standing, turning or sidestep shares; the box set below
    row.command_low, row.command_high = torch.tensor(JOYSTICK_BOX[0]), torch.tensor(JOYSTICK_BOX[1])
    row.yaw_rate_range = torch.tensor(JOYSTICK_YAW)
    row.command_resample_s = torch.tensor([JOYSTICK_EVERY_S, JOYSTICK_EVERY_S])
    return row


def act(policy: RobotPolicy, td) -> torch.Tensor:
    """The file's actions for every env's robot observation, one call per env: the file is batch 1, as on
    the robot."""
    return torch.from_numpy(np.stack([policy(row) for row in td["robot_observation"].numpy()])).float()


def twist_of(td) -> torch.Tensor:
    """``(num_envs, 3)``: each env's command ``(vx, vy, vyaw)``, as the env's observation reports it."""
    return torch.cat([td["command"], td["yaw_rate_command"]], dim=-1)


def drive(policy_path: Path, scenario: Scenario, *, episodes: int, steps: int, seed: int) -> dict[str, float]:
    """Run ``episodes`` episodes of ``scenario`` with the file at ``policy_path`` alone; measure them."""
    spec = parse_policy_file(policy_path)
    policy = RobotPolicy(policy_path, spec)
    env = MicroDuckEnv(
        tasks=[scenario_task(scenario)],
        num_envs=episodes,
        seed=seed,
        randomization="upstream",
        action_mode="robot",
        action_scale=spec.action_scale,
        max_episode_steps=steps,
    )
    if env.default_joint_pos != tuple(spec.default_joint_pos.tolist()):
        raise SystemExit(f"{policy_path}: its default_joint_pos is not the env's robot pose")
    reach_low, reach_high = env.action_spec.space.low, env.action_spec.space.high  # the servos' ranges, in actions
    past_range = torch.zeros(episodes)
    td = env.reset()
    alive = torch.ones(episodes, dtype=torch.bool)
    heading = env.heading().double()
    turned = torch.zeros(episodes, dtype=torch.float64)
    velocity_sum = torch.zeros(episodes, 2, dtype=torch.float64)
    lengths = torch.zeros(episodes)
    # Seconds since each robot's last push and last new command, read when it falls: a fall soon after a
    # push (or a command change) points at that as its cause.
    since_push = torch.full((episodes,), math.inf)
    since_command = torch.full((episodes,), math.inf)
    push_timer = env.pushes.timer.clone()
    twist = twist_of(td)
    fall_after_push = torch.zeros(episodes, dtype=torch.bool)
    fall_after_command = torch.zeros(episodes, dtype=torch.bool)
    for _ in range(steps):
        action = act(policy, td)
        past_range += torch.where(alive, ((action < reach_low) | (action > reach_high)).float().mean(-1), 0.0)
        td = env.step(td.set("action", action))["next"]
        done = td["done"].reshape(-1)
        terminated = td["terminated"].reshape(-1)
        pushed = env.pushes.timer > push_timer  # a push restarts its env's timer with a new interval
        since_push = torch.where(pushed, 0.0, since_push + env.control_dt)
        push_timer = env.pushes.timer.clone()
        new_twist = twist_of(td)
        since_command = torch.where((new_twist != twist).any(-1), 0.0, since_command + env.control_dt)
        twist = new_twist
        falls = alive & terminated
        fall_after_push |= falls & (since_push <= FALL_CAUSE_S)
        fall_after_command |= falls & (since_command <= FALL_CAUSE_S)
        new_heading = env.heading().double()
        counted = alive & ~terminated
        turned += torch.where(counted, wrap_angle(new_heading - heading), 0.0)
        heading = new_heading
        body = td["observation"][:, MicroDuckEnv.BODY_VELOCITY_START : MicroDuckEnv.BODY_VELOCITY_START + 2]
        velocity_sum += torch.where(counted.unsqueeze(-1), body.double(), 0.0)
        lengths += counted.float()
        alive &= ~terminated
        if done.all():
            break
        td = td.exclude("reward", "done", "terminated", "truncated")
    env.close()
    survived = alive
    seconds = lengths[survived].double() * env.control_dt
    mean = velocity_sum[survived] / lengths[survived].double().unsqueeze(-1) if survived.any() else None
    nan = math.nan
    return {
        "survival_%": 100.0 * float(survived.float().mean()),
        "vx_mps": float(mean[:, 0].mean()) if mean is not None else nan,
        "vy_mps": float(mean[:, 1].mean()) if mean is not None else nan,
        "yaw_rate_radps": float((turned[survived] / seconds).mean()) if survived.any() else nan,
        "drift_p95_deg": float(torch.quantile(torch.rad2deg(turned[survived].abs()), 0.95)) if survived.any() else nan,
        # Share of the servo targets the file asked past their joints' ranges, over the ticks until a robot fell.
        "past_range_%": 100.0 * float(past_range.sum() / (lengths.sum() + (~alive).sum()).clamp_min(1)),
        "falls": int((~survived).sum()),
        "after_push": int(fall_after_push.sum()),
        "after_command": int(fall_after_command.sum()),
    }


def train(run: Path, seed: int, minutes: float, extra: list[str], task: str = "joystick") -> float:
    """``waddle train --task TASK`` into ``run``, interrupted (it keeps its checkpoint) after ``minutes``."""
    command = [*WADDLE, "train", "--task", task, "--seed", str(seed), "--out", str(run), "--no-progress"]
    command += extra
    print("$ waddle " + " ".join(command[3:]), flush=True)
    started = time.perf_counter()
    # A shell's background job starts with SIGINT ignored; the run gets it back to be stopped with it.
    process = subprocess.Popen(command, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        process.wait(timeout=60.0 * minutes)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGINT)  # the runner saves its checkpoint and stops
        process.wait()
    return (time.perf_counter() - started) / 60.0


def export(run: Path) -> Path:
    path = run / "policy.onnx"
    subprocess.run([*WADDLE, "export", str(run), "--onnx", str(path)], check=True)
    return path


def add_run_arguments(parser: argparse.ArgumentParser, *, minutes: float, runs: str) -> None:
    """The flags of a benchmark that trains a run per seed, exports it and drives the file."""
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1], metavar="S")
    parser.add_argument(
        "--minutes", type=float, default=minutes, help=f"training time limit per seed (default {minutes:g})"
    )
    parser.add_argument("--runs", type=Path, default=Path(runs), help=f"where the runs go (default {runs})")
    parser.add_argument("--skip-train", action="store_true", help="evaluate the runs already under --runs")
    parser.add_argument("--episodes", type=int, default=64, help="episodes per row (default 64)")
    parser.add_argument("--eval-seed", type=int, default=12345)
    parser.add_argument("train_args", nargs=argparse.REMAINDER, help="after --: more waddle train flags")


def trained_file(args: argparse.Namespace, seed: int, task: str) -> tuple[Path, float, dict, Path]:
    """Train seed ``seed`` of ``task`` (unless ``--skip-train``) and export it: the run, its training minutes
    (NaN when skipped), its checkpoint and the exported file."""
    run = args.runs / f"seed{seed}"
    minutes = math.nan
    if not args.skip_train:
        minutes = train(run, seed, args.minutes, [flag for flag in args.train_args if flag != "--"], task=task)
    checkpoint = torch.load(run / "checkpoint.pt", map_location="cpu", weights_only=False)
    return run, minutes, checkpoint, export(run)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser, minutes=60.0, runs="runs/robot")
    parser.add_argument("--steps", type=int, default=1000, help="control steps per episode (default 1000 = 20 s)")
    args = parser.parse_args(argv)
    print(f"MicroDuck robot benchmark: {load_line('at the start')}; torch threads {torch.get_num_threads()}")
    for seed in args.seeds:
        run, minutes, checkpoint, path = trained_file(args, seed, "joystick")
        meta = parse_policy_file(path)
        rows = []
        for scenario in SCENARIOS:
            figures = drive(path, scenario, episodes=args.episodes, steps=args.steps, seed=args.eval_seed)
            rows.append({"scenario": scenario.name, **figures, "target": scenario.target})
        title = (
            f"seed {seed}: {checkpoint['env_steps']:,} env steps"
            + ("" if math.isnan(minutes) else f" in {minutes:.1f} min")
            + f", action scale {meta.action_scale}, {args.episodes} episodes of {args.steps * 0.02:.0f} s per row"
        )
        columns = [
            "scenario",
            "survival_%",
            "vx_mps",
            "vy_mps",
            "yaw_rate_radps",
            "drift_p95_deg",
            "past_range_%",
            "falls",
            "after_push",
            "after_command",
            "target",
        ]
        print_table(title, rows, columns)
        with open(run / "robot_benchmark.json", "w") as file:
            json.dump({"title": title, "rows": rows}, file, indent=1)
    print(f"\n{load_line('at the end')}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
