"""A helping hand for learning to get up: an upward force on the trunk, a share of the robot's weight.

From the floor, a get-up is a long chain of joint motions that pays nothing
until the robot is nearly up, and exploration around the HOME pose does not
find one. HoST (Huang et al., 2025, "Learning Humanoid Standing-up Control
across Diverse Postures") lifts the robot's base with a vertical force early
in training and takes it away as the policy learns: the states on the way up,
and standing itself, become reachable, and the policy's own effort has to
replace the force as it fades. Here the force is a share of the robot's
weight, held at the trunk's centre of mass, in the world's +z, on every env
all the time: the robot simply weighs less at the trunk, lying or standing,
so nothing changes at the moment it stands up. A training curriculum sets the
share (``waddle train --lift-assist``); evaluations and exports never lift.

    assist = LiftAssist(num_envs=4, nbody=16, trunk=1, weight=7.23, dtype=torch.float32, device=cpu)
    assist.share = 0.5                                  # half the robot's weight
    forces = assist.forces()                            # (4, 16, 6), for PhysicsBackend.apply_forces
"""

from __future__ import annotations

import math

import mujoco
import numpy as np
import torch


def robot_weight(model: mujoco.MjModel) -> float:
    """The weight, N, of every body of ``model`` under its gravity: what a lift share of 1 holds up."""
    return float(model.body_mass.sum()) * float(np.linalg.norm(model.opt.gravity))


class LiftAssist:
    """The upward force a curriculum holds on the robots' trunks.

    Args:
        num_envs: envs in the batch.
        nbody: bodies of the model (the rows of MuJoCo's ``xfrc_applied``).
        trunk: index of the trunk's body.
        weight: the robot's weight, N: what a share of 1 holds up.
    """

    def __init__(
        self, *, num_envs: int, nbody: int, trunk: int, weight: float, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.trunk = trunk
        self.weight = float(weight)
        self._forces = torch.zeros(num_envs, nbody, 6, dtype=dtype, device=device)
        self._share = 0.0

    @property
    def share(self) -> float:
        """The share of the robot's weight lifted, in [0, 1]; 0 (the default) applies no force at all."""
        return self._share

    @share.setter
    def share(self, value: float) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value)):
            raise ValueError(f"lift assist share must be a number in [0, 1], got {value!r}.")
        if not 0.0 <= value <= 1.0:
            raise ValueError(
                f"lift assist share must be in [0, 1] (a share of the robot's weight), got {value!r}: "
                "more than 1 would carry the robot off the floor."
            )
        self._share = float(value)

    @property
    def active(self) -> bool:
        return self._share > 0

    def forces(self) -> torch.Tensor:
        """The ``(num_envs, nbody, 6)`` external forces: ``share`` of the weight up on every env's trunk."""
        self._forces[:, self.trunk, 2] = self._share * self.weight
        return self._forces
