"""Search for an open-loop get-up from each lying start: the scripts in ``getup_reference.GETUP_SCRIPTS``.

A script is ``SCRIPT_POSES`` servo-target poses, each held ``POSE_HOLD_S``,
then the default pose for ``FINAL_HOLD_S`` (``waddle.envs.microduck.getup_reference``).
The robot starts dropped onto its side in the default pose and settled, on the
nominal model with the limbs' collision boxes. A cross-entropy search
(``--population`` scripts per iteration, the ``--elites`` best refit a Gaussian
over the poses) maximises

    mean getup reward over the script's last second + 0.3 * its best getup reward

for each script's poses rounded to 4 decimals, exactly as they are pasted.
With ``--copies K`` a script is scored instead by the mean over K runs with
every target shifted by Gaussian noise of ``--target-noise`` rad, which asks for
a margin. No script found that way stood the robot up from the front in more
than 25 % of its copies (``--copies 4``, 0.03 rad, 25 iterations x 48): an
open-loop get-up is a knife edge, which a policy that reads its sensors need
not be. The scripts are references for the states along a way up, not a
controller. The getup reward is the env's ``getup`` term (upright cosine squared
times the height fraction from 0.05 m to standing; 1 when standing). On the
back and the front the search is over left-right symmetric poses (the right
leg mirrors the left, head yaw and roll stay 0: 7 numbers a pose); on a side
over all 14 joints (``--free`` forces that everywhere). All scripts of an
iteration run in one ``mujoco.rollout`` call.

It prints, per start, the best score, whether that script stands the robot up
(upright cosine above 0.9 and the trunk 0.1 m up over the last second), the
share of its noisy copies that do, and the script itself, rounded to 4
decimals, to paste into ``GETUP_SCRIPTS``.

Usage::

    python benchmarks/getup_search.py                     # all four starts, seed 0: GETUP_SCRIPTS
    python benchmarks/getup_search.py --starts left --iterations 40
"""

from __future__ import annotations

import argparse

import mujoco
import numpy as np
from getup_feasibility import getup_rewards, lying_state, model
from harness import Column, Table, load_line, timed
from mujoco import rollout

from waddle.envs.microduck import getup_reference as reference
from waddle.envs.microduck.constants import CONTROL_DT, HEAD, LEFT_LEG, RIGHT_LEG
from waddle.envs.microduck.robot import DEFAULT_JOINT_POS
from waddle.envs.microduck.tasks import LYING_STARTS

SYMMETRIC_STARTS = ("back", "front")
HEAD_PITCHES = slice(HEAD.start, HEAD.start + 2)
"""neck_pitch and head_pitch: the head joints a symmetric pose moves."""


def poses_of(params: np.ndarray, symmetric: bool, home: np.ndarray) -> np.ndarray:
    """``(n, SCRIPT_POSES, 14)`` poses from the searched numbers: 7 a pose when symmetric, else 14."""
    if not symmetric:
        return params
    poses = np.broadcast_to(home, (*params.shape[:-1], home.size)).copy()
    poses[..., LEFT_LEG] = params[..., :5]
    poses[..., RIGHT_LEG] = -params[..., :5]  # every leg joint's mirror sign is -1 (symmetry.JOINT_MIRROR_SIGN)
    poses[..., HEAD_PITCHES] = params[..., 5:7]
    return poses


def controls(m: mujoco.MjModel, poses: np.ndarray, home: np.ndarray) -> np.ndarray:
    """``(n, physics steps, nu)`` servo targets of scripts made of ``poses``."""
    held = round(reference.POSE_HOLD_S / CONTROL_DT)
    final = np.broadcast_to(home, (poses.shape[0], round(reference.FINAL_HOLD_S / CONTROL_DT), home.size))
    per_control_step = np.concatenate([np.repeat(poses, held, axis=1), final], axis=1)
    return np.repeat(per_control_step, round(CONTROL_DT / m.opt.timestep), axis=1)


def search(m, start: str, args, rng: np.random.Generator) -> tuple[float, bool, float, np.ndarray]:
    """The best script found from ``start``: its score, whether it stands up over its last second, the share
    of its noisy copies that do, and its poses."""
    home = np.asarray(DEFAULT_JOINT_POS)
    joints = m.actuator_trnid[:, 0]
    low, high = m.jnt_range[joints, 0], m.jnt_range[joints, 1]
    symmetric = start in SYMMETRIC_STARTS and not args.free
    if symmetric:
        low = np.r_[low[LEFT_LEG], low[HEAD_PITCHES]]
        high = np.r_[high[LEFT_LEG], high[HEAD_PITCHES]]
        centre = np.r_[home[LEFT_LEG], home[HEAD_PITCHES]]
    else:
        centre = home
    state, standing = lying_state(m, start)
    mean = np.broadcast_to(centre, (reference.SCRIPT_POSES, centre.size)).copy()
    std = np.broadcast_to((high - low) / 3.0, mean.shape).copy()
    last = round(1.0 / m.opt.timestep)
    workers = [mujoco.MjData(m) for _ in range(args.threads)]
    joint_low, joint_high = m.jnt_range[joints, 0], m.jnt_range[joints, 1]
    best = (-np.inf, False, 0.0, None)
    copies = args.copies + 1  # the script as it is, then its noisy copies
    for _ in range(args.iterations):
        params = np.clip(mean + std * rng.standard_normal((args.population, *mean.shape)), low, high)
        poses = np.round(np.clip(poses_of(params, symmetric, home), joint_low, joint_high), 4)
        runs = np.repeat(poses, copies, axis=0)
        noise = args.target_noise * rng.standard_normal(runs.shape)
        noise[::copies] = 0.0
        runs = np.clip(runs + noise, joint_low, joint_high)
        initial = np.broadcast_to(state, (len(runs), state.size)).copy()
        states, _ = rollout.rollout(m, workers, initial, controls(m, runs, home))
        reward, up = getup_rewards(states, m, standing)
        score = (reward[:, -last:].mean(1) + 0.3 * reward.max(1)).reshape(-1, copies)
        stands = up[:, -last:].all(1).reshape(-1, copies)
        mean_score = score[:, 1:].mean(1) if args.copies else score[:, 0]
        order = np.argsort(-mean_score)
        elites = params[order[: args.elites]]
        mean = 0.7 * elites.mean(0) + 0.3 * mean
        std = 0.7 * elites.std(0) + 0.3 * std + 0.02
        top = order[0]
        if mean_score[top] > best[0]:
            share = float(stands[top, 1:].mean()) if args.copies else float(stands[top, 0])
            best = (float(mean_score[top]), bool(stands[top, 0]), share, poses[top])
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", nargs="+", choices=LYING_STARTS, default=list(LYING_STARTS))
    parser.add_argument("--iterations", type=int, default=30)
    parser.add_argument("--population", type=int, default=64)
    parser.add_argument("--elites", type=int, default=8)
    parser.add_argument("--copies", type=int, default=0, help="noisy copies each script is scored on")
    parser.add_argument("--target-noise", type=float, default=0.03, help="rad, per target of a copy")
    parser.add_argument("--free", action="store_true", help="search all 14 joints on the back and front too")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    m = model()
    print(f"MicroDuck get-up search: {load_line('at the start')}")
    print(
        f"{args.iterations} iterations x {args.population} scripts x {args.copies} copies "
        f"(targets +- {args.target_noise} rad), {args.elites} elites, seed {args.seed}; "
        f"{reference.SCRIPT_POSES} poses x {reference.POSE_HOLD_S} s, then the default pose {reference.FINAL_HOLD_S} s"
    )
    table = Table(
        [
            Column("start", left=True, width=6),
            Column("score", ".3f"),
            Column("stands", left=True, width=6),
            Column("copies standing %", ".0f"),
            Column("wall s", ".1f"),
        ]
    )
    found = {}
    table.print_header()
    for start in args.starts:
        rng = np.random.default_rng(args.seed)
        with timed() as clock:
            score, stands, share, poses = search(m, start, args, rng)
        found[start] = poses
        table.print_row(start, score, "yes" if stands else "no", 100.0 * share, clock.wall_s)
    print(load_line("at the end"))
    for start, poses in found.items():
        rows = ",\n".join("        (" + ", ".join(f"{value:.4f}" for value in pose) + ")" for pose in poses)
        print(f'    "{start}": (\n{rows},\n    ),')


if __name__ == "__main__":
    main()
