"""A fallen MicroDuck gets back up: train ``waddle train --task joystick-getup``, export, push it over, lay it down.

For each seed this script

1. trains ``waddle train --task TASK --seed S`` (``joystick-getup`` by default,
   or ``getup``) with its defaults, stopped after ``--minutes`` at the latest;
2. exports the run's robot file (``obs [1, 61] -> actions [1, 14]``);
3. drives the file alone, in onnxruntime, in MicroDuckEnvs under the upstream
   randomization, with the limbs' collision boxes:

   * four rows that start lying on the back, the front and either side
     (dropped from 0.2 m with random joint angles, the servos holding those
     angles for 1 s while it lands and settles), then told to stand: the share
     of the episodes that stand (``MicroDuckEnv.standing``: projected gravity z
     below -0.9, the trunk at least 0.1 m up, a sole on the floor) within 5 s
     of the policy taking over, and the share standing at the end of the 5 s.
     The settling keeps a robot that swings its legs while still in the air
     from counting as a get-up: an early get-up policy landed some drops on its
     feet within 0.16 s;
   * a row that walks at 0.2 m/s and is pushed sideways at 1 m/s after 3 s:
     the share walking again at the command (upright, and its forward speed
     over the last second within 0.05 of 0.2 m/s) within 8 s of the push;
   * for ``joystick-getup``, the rows of ``benchmarks/robot.py`` (a fall ends
     those episodes, as in that benchmark): getting up must not cost walking.

    python benchmarks/getup.py --seeds 0 1 --minutes 90
    python benchmarks/getup.py --runs runs/getup --skip-train   # evaluate finished runs again
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from pathlib import Path

import torch
from harness import load_line, print_table
from robot import SCENARIOS, act, add_run_arguments, drive, trained_file

from waddle.algorithms.presets import fixed_command
from waddle.deploy.daemon import RobotPolicy, parse_policy_file
from waddle.envs.microduck import MicroDuckEnv
from waddle.envs.microduck.tasks import LYING_STARTS

UPRIGHT_WITHIN_S = 5.0
SETTLE_S = 1.0
PUSH_AT_S = 3.0
PUSH_SPEED = 1.0
WALKING_AGAIN_WITHIN_S = 8.0
WALK_SPEED = 0.2
SPEED_TOLERANCE = 0.05


def environment(spec, task, episodes: int, steps: int, seed: int) -> MicroDuckEnv:
    return MicroDuckEnv(
        tasks=[task],
        num_envs=episodes,
        seed=seed,
        randomization="upstream",
        action_mode="robot",
        action_scale=spec.action_scale,
        max_episode_steps=steps,
        limb_collisions=True,
    )


def lying_start(path: Path, side: int, *, episodes: int, seed: int) -> dict[str, float]:
    """Episodes that start lying on ``LYING_STARTS[side]``, settle, and are told to stand: the share standing
    within 5 s, the mean time that took, and the share standing at the end."""
    spec = parse_policy_file(path)
    policy = RobotPolicy(path, spec)
    task = fixed_command(MicroDuckEnv.getup_task(lying_start_side=float(side)), (0.0, 0.0, 0.0))
    settle, steps = round(SETTLE_S / 0.02), round(UPRIGHT_WITHIN_S / 0.02)
    env = environment(spec, task, episodes, settle + steps, seed)
    td = env.reset()
    # The servos hold the drop's joint angles while the robot lands: the action whose target is the reading.
    hold = (env.physics.qpos[:, 7:] - torch.tensor(spec.default_joint_pos, dtype=torch.float32)) / spec.action_scale
    for _ in range(settle):
        td = env.step(td.set("action", hold.float()))["next"].exclude("reward", "done", "terminated", "truncated")
    stood_at = torch.full((episodes,), math.nan)
    for step in range(1, steps + 1):
        td = env.step(td.set("action", act(policy, td)))["next"]
        stood_at = torch.where(stood_at.isnan() & env.standing(), step * env.control_dt, stood_at)
        td = td.exclude("reward", "done", "terminated", "truncated")
    standing_at_end = env.standing().float().mean()
    env.close()
    stood = ~stood_at.isnan()
    return {
        "success_%": 100.0 * float(stood.float().mean()),
        "time_to_stand_s": float(stood_at[stood].mean()) if stood.any() else math.nan,
        "standing_at_5s_%": 100.0 * float(standing_at_end),
    }


def pushed_while_walking(path: Path, *, episodes: int, seed: int) -> dict[str, float]:
    """Walk at 0.2 m/s, take a 1 m/s sideways push at 3 s: the share walking again at the command within 8 s."""
    spec = parse_policy_file(path)
    policy = RobotPolicy(path, spec)
    task = fixed_command(MicroDuckEnv.joystick_getup_task(lying_start_fraction=0.0), (WALK_SPEED, 0.0, 0.0))
    dt = 0.02
    push_step, window = round(PUSH_AT_S / dt), round(1.0 / dt)
    steps = push_step + round(WALKING_AGAIN_WITHIN_S / dt)
    env = environment(spec, task, episodes, steps, seed)
    td = env.reset()
    speeds = torch.zeros(steps, episodes)
    fell = torch.zeros(episodes, dtype=torch.bool)
    again = torch.full((episodes,), math.nan)
    for step in range(steps):
        if step == push_step:
            qvel = env.physics.qvel.clone()
            heading = env.heading()
            side = torch.stack([-heading.sin(), heading.cos()], dim=-1)  # the trunk's left, on the floor
            qvel[:, :2] += PUSH_SPEED * side
            env.physics.set_qvel(qvel)
        td = env.step(td.set("action", act(policy, td)))["next"]
        speeds[step] = td["observation"][:, MicroDuckEnv.BODY_VELOCITY_START]
        if step < push_step:
            continue
        fell |= env.fallen()
        standing = env.standing()
        if step >= push_step + window:
            walking = standing & ((speeds[step - window + 1 : step + 1].mean(0) - WALK_SPEED).abs() <= SPEED_TOLERANCE)
            again = torch.where(torch.isnan(again) & walking, (step + 1 - push_step) * dt, again)
        td = td.exclude("reward", "done", "terminated", "truncated")
    env.close()
    recovered = ~torch.isnan(again)
    return {
        "success_%": 100.0 * float(recovered.float().mean()),
        "fell_%": 100.0 * float(fell.float().mean()),
        "time_to_walk_s": float(again[recovered].mean()) if recovered.any() else math.nan,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=("joystick-getup", "getup"), default="joystick-getup")
    add_run_arguments(parser, minutes=90.0, runs="runs/getup")
    args = parser.parse_args(argv)
    print(f"MicroDuck get-up benchmark: {load_line('at the start')}; torch threads {torch.get_num_threads()}")
    for seed in args.seeds:
        run, minutes, checkpoint, path = trained_file(args, seed, args.task)
        rows = []
        for side, name in enumerate(LYING_STARTS):
            figures = lying_start(path, side, episodes=args.episodes, seed=args.eval_seed)
            rows.append(
                {"scenario": f"start lying on the {name}", **figures, "target": "upright within 5 s in >= 90 %"}
            )
        figures = pushed_while_walking(path, episodes=args.episodes, seed=args.eval_seed)
        rows.append(
            {"scenario": "walk 0.2, pushed 1 m/s sideways", **figures, "target": "walking again within 8 s in >= 90 %"}
        )
        if args.task == "joystick-getup":
            for scenario in SCENARIOS:
                figures = drive(path, scenario, episodes=args.episodes, steps=1000, seed=args.eval_seed)
                rows.append(
                    {
                        "scenario": scenario.name,
                        "success_%": figures["survival_%"],
                        **figures,
                        "target": scenario.target,
                    }
                )
        title = (
            f"{args.task} seed {seed}: {checkpoint['env_steps']:,} env steps"
            + ("" if math.isnan(minutes) else f" in {minutes:.1f} min")
            + f", {args.episodes} episodes per row"
        )
        columns = ["scenario", "success_%", "time_to_stand_s", "standing_at_5s_%", "fell_%", "time_to_walk_s"]
        columns += ["vx_mps", "vy_mps", "yaw_rate_radps", "drift_p95_deg", "target"]
        print_table(title, rows, columns)
        with open(run / "getup_benchmark.json", "w") as file:
            json.dump({"title": title, "rows": rows}, file, indent=1)
    print(f"\n{load_line('at the end')}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
