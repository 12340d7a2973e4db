"""Can the embedded MicroDuck get up from the floor at all within a given action scale? An open-loop search.

PPO on ``--task getup`` had not stood a robot up within its budget. This script
asks whether the servos allow a get-up, before any learning is involved:

* the robot is laid on its back, its front or a side, in the HOME pose, with
  the limbs' collision boxes (``ground_contact``), and left to settle for 1 s;
* it then follows one random open-loop pattern: three poses (``--poses``), each joint's
  target ``HOME + S * u`` with ``u`` uniform in ``[-1, 1]`` (stopped at the
  joint's range, as a servo is), each held 0.3-1.2 s (``--hold-s``), then HOME to the end
  of 4 s; ``S`` is the action scale;
* ``--samples`` patterns per start and scale (seeded), all simulated in one
  ``mujoco.rollout`` call;
* a pattern *stands the robot up* when the trunk is upright (tilt cosine above
  0.9) and at least 0.1 m up for 0.2 s running; the table gives the share of
  patterns that did and the best ``getup`` reward reached (upright cosine
  squared times the height fraction from 0.05 m to standing, 1 when standing).

``--lift-assist`` adds rows with the get-up curriculum's helping hand
(:mod:`waddle.envs.microduck.lift_assist`): an upward force of that share of
the robot's weight at the trunk's centre of mass, held for the whole pattern
as the env holds it (so "stood up" counts a lifted robot).

``--hold-s 0.02 0.02 --poses 200`` draws a new pose every control step, as
PPO's exploration noise around a mean does: white noise at 50 Hz.

Usage::

    python benchmarks/getup_feasibility.py                       # scales 0.7 1.0 1.5, 256 patterns each
    python benchmarks/getup_feasibility.py --scales 0.7 --samples 64
    python benchmarks/getup_feasibility.py --scales 1.0 --lift-assist 0 0.5 0.7 0.9 1.0
    python benchmarks/getup_feasibility.py --scales 1.0 --hold-s 0.02 0.02 --poses 200   # a new pose every step
"""

from __future__ import annotations

import argparse

import mujoco
import numpy as np
from harness import Column, Table, load_line, timed
from mujoco import rollout

from waddle.envs.microduck import getup_reference as reference
from waddle.envs.microduck.assets import load_spec
from waddle.envs.microduck.constants import EMBEDDED_SCENE, ROOT_BODY, STAND_KEYFRAME
from waddle.envs.microduck.ground_contact import add_limb_collisions
from waddle.envs.microduck.lift_assist import robot_weight
from waddle.envs.microduck.robot import DEFAULT_JOINT_POS
from waddle.envs.microduck.tasks import LYING_STARTS

CONTROL_DT = 0.02
CONTROL_SPEC = mujoco.mjtState.mjSTATE_CTRL | mujoco.mjtState.mjSTATE_XFRC_APPLIED
PATTERN_S = 4.0
HOLD_S = (0.3, 1.2)
POSES = 3
UPRIGHT, HEIGHT, HELD_S = 0.9, 0.1, 0.2
LYING_HEIGHT = 0.05


def model() -> mujoco.MjModel:
    spec = load_spec(EMBEDDED_SCENE, low_cost_collisions=True)
    add_limb_collisions(spec)
    return spec.compile()


def lying_state(m: mujoco.MjModel, start: str) -> tuple[np.ndarray, float]:
    """The full physics state of a robot dropped onto ``start`` in HOME and settled; and its standing height."""
    data = reference.lying_state(m, start, np.asarray(DEFAULT_JOINT_POS))
    state = np.empty(mujoco.mj_stateSize(m, mujoco.mjtState.mjSTATE_FULLPHYSICS))
    mujoco.mj_getState(m, data, state, mujoco.mjtState.mjSTATE_FULLPHYSICS)
    keyframe = mujoco.MjData(m)
    mujoco.mj_resetDataKeyframe(m, keyframe, m.key(STAND_KEYFRAME).id)
    return state, float(keyframe.qpos[2])


def patterns(
    m: mujoco.MjModel,
    scale: float,
    samples: int,
    rng: np.random.Generator,
    *,
    hold_s: tuple[float, float] = HOLD_S,
    poses: int = POSES,
) -> np.ndarray:
    """``(samples, steps, nu)`` servo targets per physics step: three random poses held 0.3-1.2 s, then HOME."""
    substeps = round(CONTROL_DT / m.opt.timestep)
    steps = round(PATTERN_S / CONTROL_DT)
    home = np.asarray(DEFAULT_JOINT_POS)
    joints = m.actuator_trnid[:, 0]
    low, high = m.jnt_range[joints, 0], m.jnt_range[joints, 1]
    targets = np.broadcast_to(home, (samples, steps, m.nu)).copy()
    for sample in range(samples):
        at = 0
        for _ in range(poses):
            held = max(1, round(rng.uniform(*hold_s) / CONTROL_DT))
            pose = np.clip(home + scale * rng.uniform(-1.0, 1.0, m.nu), low, high)
            targets[sample, at : at + held] = pose
            at += held
    return np.repeat(targets, substeps, axis=1)


def lifted(m: mujoco.MjModel, targets: np.ndarray, trunk: int, force: float) -> np.ndarray:
    """``mujoco.rollout`` controls of ``CONTROL_SPEC``: the servo ``targets`` and ``force`` N up at the trunk."""
    control = np.zeros((*targets.shape[:2], m.nu + 6 * m.nbody))
    control[..., : m.nu] = targets
    control[..., m.nu + 6 * trunk + 2] = force
    return control


def getup_rewards(states: np.ndarray, m: mujoco.MjModel, standing: float) -> tuple[np.ndarray, np.ndarray]:
    """Per pattern and physics step of ``mujoco.rollout`` states: the env's ``getup`` reward (upright cosine
    squared times the height fraction from ``LYING_HEIGHT`` to standing), and whether the robot stands."""
    qpos = states[..., 1 : 1 + m.nq]
    x, y = qpos[..., 4], qpos[..., 5]
    upright = 1.0 - 2.0 * (x**2 + y**2)  # the trunk z axis' world z
    fraction = np.clip((qpos[..., 2] - LYING_HEIGHT) / (standing - LYING_HEIGHT), 0.0, 1.0)
    return np.clip(upright, 0.0, 1.0) ** 2 * fraction, (upright > UPRIGHT) & (qpos[..., 2] >= HEIGHT)


def judge(states: np.ndarray, m: mujoco.MjModel, standing: float) -> tuple[np.ndarray, np.ndarray]:
    """Per pattern: whether it stood the robot up (held ``HELD_S``), and the best ``getup`` reward reached."""
    score, up = getup_rewards(states, m, standing)
    held = round(HELD_S / m.opt.timestep)
    run = np.zeros(up.shape[0], dtype=int)
    stood = np.zeros(up.shape[0], dtype=bool)
    for t in range(up.shape[1]):  # the longest run of standing steps, per pattern
        run = np.where(up[:, t], run + 1, 0)
        stood |= run >= held
    return stood, score.max(axis=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[0.7, 1.0, 1.5])
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--hold-s", type=float, nargs=2, default=list(HOLD_S), metavar=("LOW", "HIGH"), help="seconds each pose is held"
    )
    parser.add_argument("--poses", type=int, default=POSES, help="random poses per pattern (then HOME to the end)")
    parser.add_argument(
        "--lift-assist", type=float, nargs="+", default=[0.0], metavar="SHARE", help="shares of the weight lifted"
    )
    args = parser.parse_args()
    m = model()
    print(f"MicroDuck get-up feasibility: {load_line('at the start')}")
    low, high = args.hold_s
    print(
        f"{args.samples} random {args.poses}-pose patterns per start and scale, each pose held {low}-{high} s, "
        f"seed {args.seed}, limb boxes on, 4 s each"
    )
    table = Table(
        [
            Column("scale", ".2f"),
            Column("lift", ".2f"),
            Column("start", left=True, width=6),
            Column("stood up %", ".1f"),
            Column("best getup reward", ".3f"),
            Column("median best", ".3f"),
            Column("wall s", ".1f"),
        ]
    )
    table.print_header()
    data = [mujoco.MjData(m) for _ in range(args.threads)]
    weight = robot_weight(m)
    trunk = m.body(ROOT_BODY).id
    for scale in args.scales:
        for lift in args.lift_assist:
            if not 0.0 <= lift <= 1.0:
                parser.error(f"--lift-assist: a share of the weight in [0, 1], got {lift}")
            rng = np.random.default_rng(args.seed)  # the same patterns for every lift
            for start in LYING_STARTS:
                state, standing = lying_state(m, start)
                targets = patterns(m, scale, args.samples, rng, hold_s=tuple(args.hold_s), poses=args.poses)
                control = lifted(m, targets, trunk, lift * weight)
                initial = np.broadcast_to(state, (args.samples, state.size)).copy()
                with timed() as clock:
                    states, _ = rollout.rollout(m, data, initial, control, control_spec=CONTROL_SPEC)
                stood, best = judge(states, m, standing)
                table.print_row(
                    scale, lift, start, 100.0 * stood.mean(), float(best.max()), float(np.median(best)), clock.wall_s
                )
    print(load_line("at the end"))


if __name__ == "__main__":
    main()
