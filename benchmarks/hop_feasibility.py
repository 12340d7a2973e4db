"""Can the embedded MicroDuck hop at all within a given action scale? An open-loop search, per scale.

The jump target (hops of at least 2 cm, airborne at least 15 % of the time at
2 Hz: 75 ms of flight per hop, a take-off speed of about 0.37 m/s) was not
reproduced by PPO on the embedded model. This script asks whether the servos
allow it when a policy's action is bounded, before any learning is involved:

* a "hand" holds the trunk's orientation and its horizontal position with an
  external PD wrench (``xfrc_applied``) and leaves its height free, so balance
  costs nothing;
* both legs follow one open-loop pattern, mirrored: ``cycles`` times a crouch
  (hip pitch, knee and ankle offsets in ``[-1, 1]``) held ``crouch_s`` then an
  extension held ``extend_s``; each offset times the action scale ``S`` is the
  servo target's distance from STAND, as in the env (no gait prior);
* ``--samples`` random patterns per scale (seeded); the best is the one with
  the highest trunk rise above the standing height while nothing touches the
  floor.

Why the action scale matters: a servo's torque is ``kp (target - q)`` (kp 0.55
N m/rad, clipped at 0.96 N m) against a back-EMF damping of 0.053 N m s/rad,
so a joint whose target is at most ``2 S`` away cannot turn faster than about
``kp 2 S / 0.053`` rad/s even unloaded: 7 rad/s at S = 0.35, against the ~15
rad/s of knee a 0.37 m/s take-off needs.

Usage::

    python benchmarks/hop_feasibility.py                        # scales 0.35 0.6 1.0 1.75
    python benchmarks/hop_feasibility.py --scales 0.35 --samples 50
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import mujoco
import numpy as np
from harness import Column, Table, load_line, timed

from waddle.envs.microduck.assets import load_model
from waddle.envs.microduck.constants import EMBEDDED_SCENE, LEFT_LEG, RIGHT_LEG, ROOT_BODY, STAND_KEYFRAME

CONTROL_DT = 0.02
EPISODE_S = 1.2
HOLD_GAINS = (10.0, 0.2, 200.0, 5.0)
"""The hand's PD gains: orientation (N m per unit of quaternion vector part, N m s/rad), horizontal position
(N/m, N s/m)."""
PITCH_JOINTS = slice(2, 5)
"""Hip pitch, knee and ankle within a leg's five joints."""


@dataclass
class Hop:
    rise_m: float
    """Highest trunk height above the standing height while the robot touched nothing (0: never)."""
    airborne_s: float
    """Time the robot touched nothing (there is no self-collision: every contact is with the floor)."""
    crouch: np.ndarray
    extend: np.ndarray
    crouch_s: float
    extend_s: float
    cycles: int


class HeldMicroDuck:
    """The embedded MicroDuck with its trunk held upright and in place, free to rise and sink."""

    def __init__(self) -> None:
        self.model = load_model(EMBEDDED_SCENE)
        self.data = mujoco.MjData(self.model)
        self.stand = self.model.key(STAND_KEYFRAME).id
        self.trunk = self.model.body(ROOT_BODY).id
        self.substeps = round(CONTROL_DT / self.model.opt.timestep)
        left, right = np.arange(14)[LEFT_LEG][PITCH_JOINTS], np.arange(14)[RIGHT_LEG][PITCH_JOINTS]
        self.left, self.right = left, right

    def offsets(self, pitch: np.ndarray) -> np.ndarray:
        """Mirrored leg offsets in action units: the right leg's pitch axes point the other way."""
        action = np.zeros(14)
        action[self.left], action[self.right] = pitch, -pitch
        return action

    def hop(self, scale: float, crouch, extend, crouch_s: float, extend_s: float, cycles: int) -> Hop:
        m, d = self.model, self.data
        mujoco.mj_resetDataKeyframe(m, d, self.stand)
        stand_ctrl, home = d.ctrl.copy(), d.qpos[:3].copy()
        k_rot, d_rot, k_pos, d_pos = HOLD_GAINS
        rise, airborne, period = 0.0, 0, crouch_s + extend_s
        for step in range(round(EPISODE_S / CONTROL_DT)):
            t = step * CONTROL_DT
            cycle, into = divmod(t, period)
            pattern = np.zeros(3) if cycle >= cycles else (crouch if into < crouch_s else extend)
            d.ctrl[:] = stand_ctrl + scale * np.clip(self.offsets(np.asarray(pattern)), -1.0, 1.0)
            for _ in range(self.substeps):
                w, vector = d.qpos[3], d.qpos[4:7]
                d.xfrc_applied[self.trunk, 3:] = -k_rot * np.sign(w) * vector - d_rot * d.qvel[3:6]
                d.xfrc_applied[self.trunk, :2] = k_pos * (home[:2] - d.qpos[:2]) - d_pos * d.qvel[:2]
                mujoco.mj_step(m, d)
                if d.ncon == 0:  # nothing touches the floor: not a sole, nor the trunk of a robot that sat down
                    airborne += 1
                    rise = max(rise, d.qpos[2] - home[2])
        return Hop(rise, airborne * m.opt.timestep, np.asarray(crouch), np.asarray(extend), crouch_s, extend_s, cycles)


def search(robot: HeldMicroDuck, scale: float, samples: int, rng: np.random.Generator) -> Hop:
    """The best of ``samples`` random open-loop crouch-and-extend patterns at action scale ``scale``."""
    durations = (0.06, 0.1, 0.16, 0.24)
    best = None
    for _ in range(samples):
        crouch = rng.uniform(-1.0, 1.0, 3)
        extend = rng.uniform(-1.0, 1.0, 3)
        extend = np.where(np.abs(extend) > 0.5, np.sign(extend), extend)  # a push-off is often bang-bang
        trial = robot.hop(
            scale, crouch, extend, float(rng.choice(durations)), float(rng.choice(durations)), int(rng.integers(1, 4))
        )
        if best is None or (trial.rise_m, trial.airborne_s) > (best.rise_m, best.airborne_s):
            best = trial
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scales", type=float, nargs="+", default=[0.35, 0.6, 1.0, 1.75], help="action scales, rad")
    parser.add_argument("--samples", type=int, default=200, help="random patterns per scale (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.samples < 1:
        parser.error(f"--samples must be >= 1, got {args.samples}")
    bad = [s for s in args.scales if not s > 0]
    if bad:
        parser.error(f"--scales must be > 0 rad per unit of action, got {bad}")
    robot = HeldMicroDuck()
    rng = np.random.default_rng(args.seed)
    print(f"open-loop hops of the held MicroDuck, {args.samples} patterns per scale, seed {args.seed}")
    table = Table(
        [
            Column("scale", ".2f"),
            Column("rise cm", ".2f"),
            Column("airborne ms", ".0f"),
            Column("best pattern (hip, knee, ankle)", left=True),
        ]
    )
    table.print_header()
    for scale in args.scales:
        with timed() as timing:
            best = search(robot, scale, args.samples, rng)
        pattern = (
            f"crouch {np.round(best.crouch, 2)} {best.crouch_s:.2f} s, extend {np.round(best.extend, 2)} "
            f"{best.extend_s:.2f} s, {best.cycles} cycle(s) ({timing.wall_s:.0f} s)"
        )
        table.print_row(scale, 100 * best.rise_m, 1000 * best.airborne_s, pattern)
    print("target of the jump task: rise >= 2 cm, airborne >= 15 % of the time (75 ms per hop at 2 Hz)")
    print(load_line())


if __name__ == "__main__":
    main()
