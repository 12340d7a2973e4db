"""A heading the robot's feed-forward network can carry from one tick to the next.

The robot's daemon runs a stateless graph and feeds it, among its 61 floats,
the graph's own raw output of the previous tick. That is the only memory a
deployed MicroDuck policy has, and it is enough for one number: an action
entry whose new value is computed from its old one. :class:`HeadingMemory`
makes one entry (on the MicroDuck the head's roll, see
:data:`~waddle.envs.microduck.robot.HEADING_MEMORY_LAYOUT`) a leaky integral
of the turn the robot did not ask for,

    m[t] = clamp(decay * m[t-1] - (dt / action_scale) * (gyro_z - vyaw_command), -limit, limit)

so that the carrier joint's target ``action_scale * m`` is minus the heading
the trunk has drifted off its command, in radians. The network, which reads
the previous action and the joint's encoder, reads its heading error there.
A stateless policy that only sees the gyro cannot tell a slow drift from the
sway of a stride; this one
can. ``decay = exp(-dt / time_constant_s)`` forgets a heading over seconds, so
an old command's error does not linger.

The entry is not sampled: the actor's distribution pins it to this value (see
:class:`~waddle.modules.networks.GaussianPolicy`), so exploration noise never
enters the integral, and the exported graph computes it in the same ops.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class HeadingMemory(nn.Module):
    """One action entry computed as a leaky integral of the unasked yaw rate, from the previous action.

    Args:
        channel: index of the action entry that holds the memory.
        previous_action_start: index in the observation of the previous action's first entry.
        gyro_index: index in the observation of the yaw rate the gyro reads, rad/s.
        yaw_command_index: index in the observation of the yaw-rate command, rad/s.
        control_dt: seconds per tick.
        action_scale: radians of target per unit of action, to keep the memory in radians of heading.
        time_constant_s: seconds over which the memory forgets (``decay = exp(-control_dt / time_constant_s)``).
        limit: largest magnitude of the entry, in action units.

    Example:
        >>> memory = HeadingMemory(channel=1, previous_action_start=3, gyro_index=0, yaw_command_index=2,
        ...                        control_dt=0.02, action_scale=0.5, time_constant_s=math.inf)
        >>> observation = torch.tensor([[0.5, 0.0, 0.0, 0.0, 0.1]])  # turning at 0.5 rad/s, unasked
        >>> round(float(memory(observation)), 6)  # 0.1 - 0.02 / 0.5 * 0.5
        0.08
    """

    def __init__(
        self,
        *,
        channel: int,
        previous_action_start: int,
        gyro_index: int,
        yaw_command_index: int,
        control_dt: float,
        action_scale: float,
        time_constant_s: float = 10.0,
        limit: float = 1.0,
    ) -> None:
        super().__init__()
        for name, value in (("control_dt", control_dt), ("action_scale", action_scale), ("limit", limit)):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"HeadingMemory: {name} must be a finite number > 0, got {value!r}.")
        if not time_constant_s > 0:
            raise ValueError(
                f"HeadingMemory: time_constant_s must be > 0 (inf: never forget), got {time_constant_s!r}."
            )
        self.channel = int(channel)
        self.previous_index = int(previous_action_start) + self.channel
        self.gyro_index = int(gyro_index)
        self.yaw_command_index = int(yaw_command_index)
        self.control_dt, self.action_scale = float(control_dt), float(action_scale)
        self.time_constant_s, self.limit = float(time_constant_s), float(limit)
        self.decay = math.exp(-self.control_dt / self.time_constant_s)
        self.gain = self.control_dt / self.action_scale

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        """The memory entry ``(...,)`` for raw observations ``(..., observation_dim)``."""
        unasked = observation[..., self.gyro_index] - observation[..., self.yaw_command_index]
        value = self.decay * observation[..., self.previous_index] - self.gain * unasked
        return value.clamp(-self.limit, self.limit)

    def insert(self, action: torch.Tensor, observation: torch.Tensor) -> torch.Tensor:
        """``action`` with its memory entry replaced by :meth:`forward` of ``observation``."""
        value = self(observation).unsqueeze(-1).to(action.dtype)
        return torch.cat([action[..., : self.channel], value, action[..., self.channel + 1 :]], dim=-1)

    def pinned(self, action_dim: int, device: torch.device | None = None) -> torch.Tensor:
        """``(action_dim,)`` bool, true at the memory entry: the one the actor does not sample."""
        mask = torch.zeros(action_dim, dtype=torch.bool, device=device)
        mask[self.channel] = True
        return mask

    def extra_repr(self) -> str:
        return f"channel={self.channel}, time_constant_s={self.time_constant_s}, limit={self.limit}"


__all__ = ["HeadingMemory"]
