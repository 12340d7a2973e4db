"""The MicroDuck's left-right mirror, as signed permutations of its observations and action.

The robot is symmetric about its sagittal (x-z) plane: its centre of mass lies
0.014 mm off that plane and each left joint has a right twin at the mirrored
place. Reflecting a state through the plane gives another state the robot can
be in, and a policy that walks straight should answer the reflected state with
the reflected action. :class:`SignedPermutation` says how each layout's values
move under that reflection; PPO's mirror loss
(``PPOConfig.mirror_loss_coef``) pulls the actor toward that equivariance.

What the reflection does to each kind of value:

- a polar vector in the trunk frame (gravity, linear velocity, the command)
  keeps x and z and negates y;
- an axial vector (angular velocity) negates x and z and keeps y;
- a joint swaps with its twin (left leg <-> right leg; a head joint is its own
  twin); its angle changes sign unless the reflected axis of the joint is the
  twin's axis (:data:`JOINT_MIRROR_SIGN`, read off the model's joint axes in
  the STAND pose, checked against MuJoCo in the tests);
- the gait clock moves by half a cycle, because the left foot's swing becomes
  the right foot's: sin and cos change sign, the ramp stays;
- a twist command ``(vx, vy, vyaw)`` keeps ``vx`` and turns the other way;
  a head command keeps its pitches and negates yaw and roll; a body pose
  command negates y, roll and yaw.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch

from waddle.envs.microduck.constants import HEAD, LEFT_LEG, NUM_JOINTS, RIGHT_LEG
from waddle.envs.microduck.robot import ROBOT_FIELDS
from waddle.envs.microduck.sensors import OBSERVATION_FIELDS, SENSOR_FIELDS, SensorField


def _twin_joints() -> tuple[int, ...]:
    twin = list(range(NUM_JOINTS))
    for left, right in zip(range(LEFT_LEG.start, LEFT_LEG.stop), range(RIGHT_LEG.start, RIGHT_LEG.stop)):
        twin[left], twin[right] = right, left
    return tuple(twin)


JOINT_TWIN: tuple[int, ...] = _twin_joints()
"""``JOINT_TWIN[i]``: the joint that joint ``i`` becomes in the mirror (a head joint is its own twin)."""

JOINT_MIRROR_SIGN: tuple[float, ...] = (-1.0,) * LEFT_LEG.stop + (1.0, 1.0, -1.0, -1.0) + (-1.0,) * 5
"""Sign of joint ``i``'s angle as the angle of its twin: each leg joint's twin turns about the reflected
axis reversed, as do head yaw and head roll; neck and head pitch turn about the sagittal normal, which
the reflection keeps."""

if len(JOINT_MIRROR_SIGN) != NUM_JOINTS or HEAD != slice(5, 9):
    raise AssertionError("JOINT_MIRROR_SIGN is written for the 14-joint MicroDuck layout.")

_VECTOR_BLOCKS: dict[str, tuple[tuple[int, ...], tuple[float, ...]]] = {
    "polar": ((0, 1, 2), (1.0, -1.0, 1.0)),
    "axial": ((0, 1, 2), (-1.0, 1.0, -1.0)),
    "planar": ((0, 1), (1.0, -1.0)),
    "joints": (JOINT_TWIN, JOINT_MIRROR_SIGN),
    "clock": ((0, 1, 2), (-1.0, -1.0, 1.0)),
    "twist": ((0, 1, 2), (1.0, -1.0, -1.0)),
    "head": ((0, 1, 2, 3), (1.0, 1.0, -1.0, -1.0)),
    "pose6": ((0, 1, 2, 3, 4, 5), (1.0, -1.0, 1.0, -1.0, 1.0, -1.0)),
}

_FIELD_KINDS: dict[str, str] = {
    "projected_gravity": "polar",
    "body_velocity": "polar",
    "angular_velocity": "axial",
    "gyro": "axial",
    "command": "planar",
    "joint_position": "joints",
    "joint_velocity": "joints",
    "previous_action": "joints",
    "gait_clock": "clock",
    # The robot's layout (robot.ROBOT_FIELDS) under the daemon's names.
    "base_ang_vel": "axial",
    "joint_pos": "joints",
    "joint_vel": "joints",
    "actions": "joints",
    "head_command": "head",
    "body_command": "pose6",
}
"""How each field of the observation layouts reflects (a name missing here is a layout this module
does not know, and building its mirror fails)."""


@dataclasses.dataclass(frozen=True)
class SignedPermutation:
    """``y[..., i] = sign[i] * x[..., index[i]]``: a reflection of a flat vector's entries.

    Args:
        index: ``(n,)`` long tensor, a permutation of ``range(n)``.
        sign: ``(n,)`` tensor of +1 / -1.

    Example:
        >>> flip = SignedPermutation.from_lists([1, 0], [1.0, -1.0])
        >>> flip(torch.tensor([2.0, 3.0]))
        tensor([ 3., -2.])
    """

    index: torch.Tensor
    sign: torch.Tensor

    @classmethod
    def from_lists(cls, index: list[int] | tuple[int, ...], sign: list[float] | tuple[float, ...]) -> SignedPermutation:
        if sorted(index) != list(range(len(index))) or len(sign) != len(index):
            raise ValueError(f"index must be a permutation of range(n) and sign n long, got {index} and {sign}.")
        return cls(torch.tensor(index, dtype=torch.long), torch.tensor(sign, dtype=torch.float64))

    @property
    def size(self) -> int:
        return int(self.index.numel())

    def __call__(self, values: torch.Tensor) -> torch.Tensor:
        if values.shape[-1] != self.size:
            raise ValueError(f"expected a last dimension of {self.size}, got shape {tuple(values.shape)}.")
        return values[..., self.index.to(values.device)] * self.sign.to(values.device, values.dtype)

    def tiled(self, copies: int) -> SignedPermutation:
        """The reflection of ``copies`` vectors of this layout laid end to end (a stack of frames)."""
        offsets = torch.arange(copies).repeat_interleave(self.size) * self.size
        return SignedPermutation(self.index.repeat(copies) + offsets, self.sign.repeat(copies))


def layout_mirror(fields: Mapping[str, SensorField], kinds: Mapping[str, str] | None = None) -> SignedPermutation:
    """The reflection of a flat vector laid out as ``fields`` (:data:`SENSOR_FIELDS`,
    :data:`OBSERVATION_FIELDS` or :data:`~waddle.envs.microduck.robot.ROBOT_FIELDS`); ``kinds``
    names how a field reflects where the layout's name means something else than usual (the robot's
    ``command`` is a twist)."""
    kinds = {**_FIELD_KINDS, **(kinds or {})}
    index: list[int] = []
    sign: list[float] = []
    for name, field in fields.items():
        if name not in kinds:
            raise ValueError(f"no mirror is known for field {name!r}; known: {sorted(kinds)}.")
        block_index, block_sign = _VECTOR_BLOCKS[kinds[name]]
        if len(block_index) != field.size:
            raise ValueError(f"field {name!r} has {field.size} values, its mirror {len(block_index)}.")
        index += [field.start + i for i in block_index]
        sign += list(block_sign)
    return SignedPermutation.from_lists(index, sign)


MIRRORS: dict[str, SignedPermutation] = {
    "observation": layout_mirror(OBSERVATION_FIELDS),
    "sensor_observation": layout_mirror(SENSOR_FIELDS),
    "robot_observation": layout_mirror(ROBOT_FIELDS, {"command": "twist"}),
    "action": SignedPermutation.from_lists(JOINT_TWIN, JOINT_MIRROR_SIGN),
}
"""The env's entries by key -> their reflection; ``"action"`` is the action (an offset around the STAND
pose and the gait prior, which the reflection maps to itself half a cycle later, or around the robot's
HOME pose, which is its own mirror)."""

__all__ = ["JOINT_MIRROR_SIGN", "JOINT_TWIN", "MIRRORS", "SignedPermutation", "layout_mirror"]
