"""The gait clock each env's walking runs on, and the open-loop stepping pattern (the gait prior) on it.

A walking task's clock turns at ``gait_frequency_hz + gait_frequency_per_mps
* |command|`` Hz from :data:`PHASE_OFFSET` at the episode's first step; its
ramp grows from 0 to 1 over :data:`RAMP_DURATION_S`. The gait terms of the
reward, the full observation's clock features (sin, cos, ramp), the tracking
window's length and the gait prior all read it. The robot's own software has
no clock: a policy on the robot's contract never sees it.

    clock = GaitClock(num_envs, control_dt=0.02, dtype=..., device=...)
    clock.adopt(task_rows, command)                 # whenever a task or command changes
    phase, ramp = clock.read(step_count)
    offsets = clock.prior(task_rows, command, step_count, scale)
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from waddle.envs.microduck import constants

PHASE_OFFSET = -1.5237
"""Phase of the gait clock at an episode's first step, in radians."""

RAMP_DURATION_S = 0.4
"""Seconds over which the clock's ramp grows from 0 to 1 after a reset."""


class GaitClock:
    """The gait clocks of ``num_envs`` envs, one frequency each."""

    def __init__(self, num_envs: int, *, control_dt: float, dtype: torch.dtype, device: torch.device | str) -> None:
        self.control_dt = float(control_dt)
        self.dtype = dtype
        pattern = lambda rows: torch.tensor(rows, dtype=dtype, device=device)  # noqa: E731
        self._swing_lift = pattern((constants.SWING_LIFT_LEFT, constants.SWING_LIFT_RIGHT))
        self._stride = pattern(constants.STRIDE)
        self.frequency = torch.zeros(num_envs, dtype=dtype, device=device)
        """``(num_envs,)`` clock frequency, Hz."""

    def adopt(self, task: Mapping[str, torch.Tensor], command: torch.Tensor) -> None:
        """Set each env's frequency from its task row (``gait_frequency_hz``, ``gait_frequency_per_mps``) and
        its ``(num_envs, 2)`` planar command."""
        speed = command.norm(dim=-1)
        self.frequency = task["gait_frequency_hz"] + task["gait_frequency_per_mps"] * speed

    def read(self, step_count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each env's phase (radians, unwrapped) and ramp after ``step_count`` steps of its episode."""
        elapsed = step_count.to(self.dtype) * self.control_dt
        phase = PHASE_OFFSET + 2.0 * math.pi * self.frequency * elapsed
        ramp = (elapsed / RAMP_DURATION_S).clamp(max=1.0)
        return phase, ramp

    def prior(
        self, task: Mapping[str, torch.Tensor], command: torch.Tensor, step_count: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """The ``(num_envs, 14)`` servo-target offsets of the gait prior, ``scale`` of it.

        The clock's swing leg is shortened by ``gait_prior_lift * max(0,
        sin(phase))`` radians along :data:`~waddle.envs.microduck.constants.SWING_LIFT_LEFT`
        (``max(0, -sin(phase))`` along ``SWING_LIFT_RIGHT``), and the hips
        swing by ``gait_prior_stride_per_mps * vx * cos(phase)`` along
        :data:`~waddle.envs.microduck.constants.STRIDE`, so the swing foot moves
        forward while the stance foot pushes back. Both grow in with the ramp; a
        backward command mirrors the swing legs, as the gait terms do.
        """
        phase, ramp = self.read(step_count)
        ramp = ramp * scale
        direction = torch.where(command[:, 0] < 0, -1.0, 1.0).to(self.dtype)
        swing = direction * torch.sin(phase)
        lift = (task["gait_prior_lift"] * ramp).unsqueeze(-1)
        lifts = torch.stack((swing.clamp(min=0.0), (-swing).clamp(min=0.0)), dim=-1) * lift
        stride = task["gait_prior_stride_per_mps"] * command[:, 0] * torch.cos(phase) * ramp
        return lifts @ self._swing_lift + stride.unsqueeze(-1) * self._stride


__all__ = ["PHASE_OFFSET", "RAMP_DURATION_S", "GaitClock"]
