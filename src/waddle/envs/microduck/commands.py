"""Each env's twist command: drawn or pinned at reset, redrawn within an episode, and the heading it turns to.

A twist is the planar command ``(vx, vy)`` in m/s and a yaw rate in rad/s.
:class:`TwistCommands` holds one per env with its redraw timer and the heading
the yaw-rate command integrates to (what ``heading_hold`` and the critic's
``"heading_error"`` measure against), and does the three things the env asks
of it:

* at a reset, :meth:`draw` a twist per env from its task (or take the pinned
  one, checked against the task), then :meth:`begin` the episodes with it and
  :meth:`aim` them at the heading they start with;
* after every step, :meth:`turn` the commanded heading by the yaw rate and
  :meth:`redraw_due` the twists whose interval ran out.

Every random draw comes from the generator the caller passes, in the order
the calls are made, so the env decides the order of its streams.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDictBase

from waddle.envs.microduck.tasks import SIDESTEP_MIN_FRACTION, TURN_IN_PLACE_MIN_FRACTION

LISTED = 8
"""Envs an error message lists by index; a batch of thousands would bury the message."""


def first(values: list[Any]) -> str:
    """``values`` for an error message: the first :data:`LISTED` of them, and how many there are in all."""
    if len(values) <= LISTED:
        return str(values)
    shown = ", ".join(map(str, values[:LISTED]))
    return f"[{shown}, ...] ({len(values)} in all)"


class TwistCommands:
    """The twist commands of ``num_envs`` envs.

    Args:
        num_envs: the batch.
        control_dt: seconds per step: the redraw timers and the commanded heading advance by it.
        varies: whether the task library turns, gives shares to standing, turning or sidestepping, or
            redraws commands (any ``yaw_rate_range``, ``turn_in_place_fraction``, ``sidestep_fraction``,
            ``standing_fraction`` or ``command_resample_s``); a library that does none of it draws only
            the planar box.
    """

    def __init__(
        self, num_envs: int, *, control_dt: float, varies: bool, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.num_envs, self.control_dt, self.varies = num_envs, float(control_dt), bool(varies)
        self.dtype, self.device = dtype, device
        self.command = torch.zeros(num_envs, 2, dtype=dtype, device=device)
        """``(num_envs, 2)`` planar command, m/s."""
        self.yaw_rate = torch.zeros(num_envs, dtype=dtype, device=device)
        """``(num_envs,)`` yaw-rate command, rad/s."""
        self.timer = torch.full((num_envs,), math.inf, dtype=dtype, device=device)
        """Seconds until each env's next twist (inf: held for the episode)."""
        self.target_heading = torch.zeros(num_envs, dtype=dtype, device=device)
        """The heading each env is commanded to have: its heading at the last reset or redraw, turned by
        the yaw-rate command since."""

    # ------------------------------------------------------------------ reset

    def draw(
        self,
        tensordict: TensorDictBase | None,
        task: Mapping[str, Any],
        rows: torch.Tensor,
        generator: torch.Generator,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each env's twist for a reset: the planar command ``(num_envs, 2)`` and the yaw rate ``(num_envs,)``.

        ``command`` and ``yaw_rate_command`` entries of the reset TensorDict pin
        them (inside the task's box and range) for the whole episode; the rest is drawn.
        """
        command, yaw_rate = self.sample(task, generator)
        pinned = tensordict is not None and "command" in tensordict.keys()
        if pinned:
            command = self._pinned_command(tensordict["command"], task, rows)
        if tensordict is not None and "yaw_rate_command" in tensordict.keys():
            yaw_rate = self._pinned_yaw_rate(tensordict["yaw_rate_command"], task, rows)
        elif pinned and self.varies:
            # A pinned planar command is not turned by a drawn yaw rate.
            yaw_rate = torch.zeros_like(yaw_rate)
        return command, yaw_rate

    def begin(
        self,
        rows: torch.Tensor,
        command: torch.Tensor,
        yaw_rate: torch.Tensor,
        task: Mapping[str, Any],
        *,
        pinned: bool,
        generator: torch.Generator,
    ) -> None:
        """Start the episodes of ``rows`` with this twist; a ``pinned`` twist is held, a drawn one is redrawn
        after the task's ``command_resample_s``."""
        self.command = torch.where(rows.unsqueeze(-1), command, self.command)
        self.yaw_rate = torch.where(rows, yaw_rate, self.yaw_rate)
        if self.varies:
            interval = self._interval(task, generator)
            if pinned:
                interval = torch.full_like(interval, math.inf)
            self.timer = torch.where(rows, interval, self.timer)

    def aim(self, rows: torch.Tensor, heading: torch.Tensor) -> None:
        """Command the envs of ``rows`` to hold ``heading``, the one they start the episode with."""
        self.target_heading = torch.where(rows, heading.detach(), self.target_heading)

    # ------------------------------------------------------------------- step

    def turn(self) -> None:
        """Turn every commanded heading by one step of its yaw-rate command."""
        if self.varies:
            self.target_heading = self.target_heading + self.yaw_rate * self.control_dt

    def redraw_due(self, task: Mapping[str, Any], heading: torch.Tensor, generator: torch.Generator) -> bool:
        """Count the timers down; give the envs whose interval ran out a new twist, a new interval, and the
        ``heading`` they have now as the one the new command turns from. Returns whether any env got one."""
        if not self.varies:
            return False
        self.timer = self.timer - self.control_dt
        due = self.timer <= 0
        if not bool(due.any()):
            return False
        command, yaw_rate = self.sample(task, generator)
        self.command = torch.where(due.unsqueeze(-1), command, self.command)
        self.yaw_rate = torch.where(due, yaw_rate, self.yaw_rate)
        self.timer = torch.where(due, self._interval(task, generator), self.timer)
        self.aim(due, heading)
        return True

    # ---------------------------------------------------------------- drawing

    def sample(self, task: Mapping[str, Any], generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """A twist drawn per env from its task: uniform in the box and the yaw range, then the task's
        shares of standing (a zero twist), turning in place (no planar command, a yaw rate of at least
        ``TURN_IN_PLACE_MIN_FRACTION`` of the range's largest magnitude) and sidestepping (a lateral speed
        of at least ``SIDESTEP_MIN_FRACTION`` of the box's largest ``|vy|``, nothing else).

        One uniform picks the share; the magnitude and sign of a turn or a sidestep reuse the same two
        draws, so a task without a sidestep share draws what it always drew."""
        n = self.num_envs
        low, high = task["command_low"], task["command_high"]
        fraction = torch.rand(n, 2, generator=generator, device=self.device, dtype=self.dtype)
        command = low + fraction * (high - low)
        yaw_rate = torch.zeros(n, dtype=self.dtype, device=self.device)
        if not self.varies:
            return command, yaw_rate
        draws = torch.rand(n, 4, generator=generator, device=self.device, dtype=self.dtype)
        yaw_low, yaw_high = task["yaw_rate_range"].unbind(-1)
        yaw_rate = yaw_low + draws[:, 0] * (yaw_high - yaw_low)
        share = draws[:, 1]
        standing = share < task["standing_fraction"]
        turn_edge = task["standing_fraction"] + task["turn_in_place_fraction"]
        turning = ~standing & (share < turn_edge)
        sidestepping = ~standing & ~turning & (share < turn_edge + task["sidestep_fraction"])
        negative = draws[:, 3] < 0.5

        def magnitude(largest: torch.Tensor, least: float) -> torch.Tensor:
            value = largest * (least + (1 - least) * draws[:, 2])
            return torch.where(negative, -value, value)

        turn = magnitude(torch.maximum(yaw_low.abs(), yaw_high.abs()), TURN_IN_PLACE_MIN_FRACTION)
        yaw_rate = torch.where(turning, turn.clamp(yaw_low, yaw_high), yaw_rate)
        yaw_rate = torch.where(standing | sidestepping, torch.zeros_like(yaw_rate), yaw_rate)
        rest = torch.zeros_like(command).clamp(low, high)
        command = torch.where((standing | turning).unsqueeze(-1), rest, command)
        lateral_low, lateral_high = low[..., 1], high[..., 1]
        lateral = magnitude(torch.maximum(lateral_low.abs(), lateral_high.abs()), SIDESTEP_MIN_FRACTION)
        sidestep = torch.stack((rest[..., 0], lateral.clamp(lateral_low, lateral_high)), dim=-1)
        command = torch.where(sidestepping.unsqueeze(-1), sidestep, command)
        return command, yaw_rate

    def _interval(self, task: Mapping[str, Any], generator: torch.Generator) -> torch.Tensor:
        """Seconds until each env's next command: uniform in its task's ``command_resample_s``, inf for none."""
        low, high = task["command_resample_s"].unbind(-1)
        fraction = torch.rand(self.num_envs, generator=generator, device=self.device, dtype=self.dtype)
        return torch.where(high > 0, low + fraction * (high - low), torch.full_like(low, math.inf))

    def _pinned_command(self, command: torch.Tensor, task: Mapping[str, Any], rows: torch.Tensor) -> torch.Tensor:
        low, high = task["command_low"], task["command_high"]
        command = command.to(self.device, self.dtype)
        if command.shape != (self.num_envs, 2) or not torch.isfinite(command[rows]).all():
            raise ValueError(
                f"command at reset must be a finite ({self.num_envs}, 2) tensor of (vx, vy); "
                f"got shape {tuple(command.shape)}."
            )
        outside = rows.unsqueeze(-1) & ((command < low - 1e-6) | (command > high + 1e-6))
        if outside.any():
            bad = outside.any(-1).nonzero().flatten().tolist()
            shown = bad[:LISTED]
            raise ValueError(
                f"command at reset is outside the task's command box for envs {first(bad)}: "
                f"got {command[shown].tolist()}, boxes low={low[shown].tolist()} high={high[shown].tolist()}."
            )
        return command

    def _pinned_yaw_rate(self, yaw_rate: torch.Tensor, task: Mapping[str, Any], rows: torch.Tensor) -> torch.Tensor:
        yaw_rate = yaw_rate.to(self.device, self.dtype)
        if yaw_rate.shape == (self.num_envs, 1):
            yaw_rate = yaw_rate.squeeze(-1)
        if yaw_rate.shape != (self.num_envs,) or not torch.isfinite(yaw_rate[rows]).all():
            raise ValueError(
                f"yaw_rate_command at reset must be a finite ({self.num_envs}, 1) or ({self.num_envs},) tensor "
                f"of rad/s; got shape {tuple(yaw_rate.shape)}."
            )
        low, high = task["yaw_rate_range"].unbind(-1)
        outside = rows & ((yaw_rate < low - 1e-6) | (yaw_rate > high + 1e-6))
        if outside.any():
            bad = outside.nonzero().flatten().tolist()
            shown = bad[:LISTED]
            raise ValueError(
                f"yaw_rate_command at reset is outside the task's yaw_rate_range for envs {first(bad)}: "
                f"got {yaw_rate[shown].tolist()}, ranges low={low[shown].tolist()} high={high[shown].tolist()}."
            )
        return yaw_rate
