"""Reference get-ups: open-loop scripts that stand the nominal MicroDuck up from each way of lying.

PPO from a robot lying still on the floor finds no get-up by itself: random
joint noise around the lying pose never reaches a pose from which the robot
rises, so the ``getup`` reward stays near zero (docs/microduck.md). A get-up
does exist within the servos' ranges and torques. :data:`GETUP_SCRIPTS` holds
one for each lying start the search has solved, found by
``benchmarks/getup_search.py`` (a cross-entropy search over a few held poses):
each is :data:`SCRIPT_POSES` servo-target poses held :data:`POSE_HOLD_S` each,
then the default pose for :data:`FINAL_HOLD_S`.

So far those are the back and the front. The env uses them for *reference
starts* (DeepMimic's reference state initialisation): a share of the episodes
that start on the floor begin instead at a state drawn along their side's
scripted get-up, so the policy meets the
states a get-up passes through, and the ``getup`` reward they earn, from the
first iteration. The scripts are open loop and for the nominal model only; the
policy is never told to follow them.
"""

from __future__ import annotations

import mujoco
import numpy as np

from waddle.envs.microduck.constants import CONTROL_DT, NUM_JOINTS, STAND_KEYFRAME
from waddle.envs.microduck.tasks import LYING_DROP_HEIGHT, LYING_TILTS

SETTLE_S = 1.0
"""Seconds a robot dropped onto its lying start is left to settle, in the default pose, before a script."""

POSE_HOLD_S = 0.6
"""Seconds a script holds each of its poses."""

FINAL_HOLD_S = 1.6
"""Seconds a script holds the default pose after its last pose."""

SCRIPT_POSES = 4
"""Poses per script."""

# fmt: off
GETUP_SCRIPTS: dict[str, tuple[tuple[float, ...], ...]] = {
    "back": (
        (0.16252507554489684, -0.13795713171434398, 0.5738088246678911, -0.6020761752008672, 0.8059929094548636, 0.6537109140276343, -0.9572306917552371, 0.0, 0.0, -0.16252507554489684, 0.13795713171434398, -0.5738088246678911, 0.6020761752008672, -0.8059929094548636),
        (-0.21904202356059616, -0.0902232569836851, -0.24770781901788225, 1.5707963267948948, 0.5090239520557203, 0.0790148054861835, -1.3682813613813678, 0.0, 0.0, 0.21904202356059616, 0.0902232569836851, 0.24770781901788225, -1.5707963267948948, -0.5090239520557203),
        (0.32685831973754026, -0.2498429232385603, 0.876570318797296, -1.4831618042385257, 1.296615485508854, 0.7247354727159419, 0.09923608765144767, 0.0, 0.0, -0.32685831973754026, 0.2498429232385603, -0.876570318797296, 1.4831618042385257, -1.296615485508854),
        (0.2704276482659409, -0.3839724354386992, -1.195212857967343, 0.32279343196423677, 0.9968400581458994, 0.9835782677933331, -0.6870101818260574, 0.0, 0.0, -0.2704276482659409, 0.3839724354386992, 1.195212857967343, -0.32279343196423677, -0.9968400581458994),
    ),
    "front": (
        (-0.10680391349206898, 0.38397243543880577, -0.18640344053946614, 0.23203067478056752, 0.244749166972491, -0.166783988676134, 1.5707963267948966, 0.0, 0.0, 0.10680391349206898, -0.38397243543880577, 0.18640344053946614, -0.23203067478056752, -0.244749166972491),
        (-0.07020398393639435, 0.100880487995947, -1.055425034877173, 1.309061072552444, -0.7687898325006203, -0.5152005823745299, -0.14039288916385584, 0.0, 0.0, 0.07020398393639435, -0.100880487995947, 1.055425034877173, -1.309061072552444, 0.7687898325006203),
        (0.24098098107142985, 0.06650755538186152, -1.570796326794949, 1.3809366279232604, -0.575901150686037, -1.1646737464164305, 1.4909233264319133, 0.0, 0.0, -0.24098098107142985, -0.06650755538186152, 1.570796326794949, -1.3809366279232604, 0.575901150686037),
        (0.3849631934341209, -0.28405440653262837, -0.9133297665921347, -0.9984602519933216, 0.224474164679856, -1.5226872552407815, 1.2787069877649813, 0.0, 0.0, -0.3849631934341209, 0.28405440653262837, 0.9133297665921347, 0.9984602519933216, -0.224474164679856),
    ),
}
# fmt: on
"""Per lying start that has one, :data:`SCRIPT_POSES` poses of 14 servo targets (rad, joint order), left-right
symmetric. Full precision is part of the script: rounded to 4 decimals, both leave the robot on the floor
(an open-loop get-up is a knife edge; MuJoCo is pinned, so they replay exactly). The sides have none yet: the
search over all 14 joints found no get-up from a side within 30 iterations of 64 scripts."""


def script_targets(side: str, default_joint_pos: np.ndarray) -> np.ndarray:
    """``(steps, 14)`` servo targets of ``side``'s script, one row per control step, ending in the default pose."""
    poses = np.asarray(_script(side), dtype=np.float64)
    held = round(POSE_HOLD_S / CONTROL_DT)
    final = np.broadcast_to(
        np.asarray(default_joint_pos, dtype=np.float64), (round(FINAL_HOLD_S / CONTROL_DT), NUM_JOINTS)
    )
    return np.concatenate([np.repeat(poses, held, axis=0), final])


def lying_state(model: mujoco.MjModel, side: str, default_joint_pos: np.ndarray) -> mujoco.MjData:
    """A robot dropped from ``LYING_DROP_HEIGHT`` onto ``side`` at heading 0, in ``default_joint_pos`` and
    holding it, left to settle for :data:`SETTLE_S`; ``time`` is reset to 0."""
    if side not in LYING_TILTS:
        raise ValueError(f"side must be one of {tuple(LYING_TILTS)}, got {side!r}.")
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key(STAND_KEYFRAME).id)
    data.qpos[2] = LYING_DROP_HEIGHT
    data.qpos[3:7] = LYING_TILTS[side]
    data.qpos[7:] = default_joint_pos
    data.ctrl[:] = default_joint_pos
    for _ in range(round(SETTLE_S / model.opt.timestep)):
        mujoco.mj_step(model, data)
    data.time = 0.0
    return data


def reference_trajectory(model: mujoco.MjModel, side: str, default_joint_pos: np.ndarray) -> np.ndarray:
    """``(steps + 1, nq + nv)``: qpos and qvel at every control step of ``side``'s script, from the settled
    lying state to the end of the final hold, simulated on ``model`` with MuJoCo."""
    data = lying_state(model, side, default_joint_pos)
    substeps = round(CONTROL_DT / model.opt.timestep)
    targets = script_targets(side, default_joint_pos)
    states = np.empty((len(targets) + 1, model.nq + model.nv))
    states[0] = np.concatenate([data.qpos, data.qvel])
    for step, target in enumerate(targets, start=1):
        data.ctrl[:] = target
        mujoco.mj_step(model, data, substeps)
        states[step] = np.concatenate([data.qpos, data.qvel])
    return states


def _script(side: str) -> tuple[tuple[float, ...], ...]:
    if side not in GETUP_SCRIPTS:
        raise ValueError(f"side must be one of {tuple(GETUP_SCRIPTS)}, got {side!r}.")
    return GETUP_SCRIPTS[side]
