"""What each env's twist command is tracked against: the trunk's velocity and yaw rate over a stride.

A walking trunk sways, surges and twists within every gait cycle, so its
instantaneous velocity is a poor measure of whether it walks at the command.
A task with ``tracking_window_cycles > 0`` is tracked against the floor
displacement (in the heading frame) and the heading change over the last that
many gait cycles, per second. :class:`TrackingWindow` keeps a ring of the
trunk's last floor positions and unwrapped headings for that, as long as the
library's longest window; a task without a window is tracked against the
instantaneous body velocity and yaw rate.

    window = TrackingWindow(num_envs, longest_steps, control_dt=0.02, dtype=..., device=...)
    window.reset(rows, qpos, heading)                          # the envs starting an episode
    window.advance(state, window_steps, step_count)            # after every physics step
    window.velocity, window.yaw_rate                           # what the tracking terms read

Every update is out of place (``where``, ``index_copy``), so a differentiable
backend's gradients flow through the window until :meth:`detach`.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from waddle.envs.rotations import wrap_angle


class TrackingWindow:
    """The tracked velocity and yaw rate of ``num_envs`` envs.

    Args:
        num_envs: the batch.
        longest_steps: the longest window of the library in control steps, or ``None`` when no task has one
            (no ring is kept).
        control_dt: seconds per control step.
    """

    def __init__(
        self,
        num_envs: int,
        longest_steps: int | None,
        *,
        control_dt: float,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.control_dt = float(control_dt)
        self.dtype = dtype
        self.ring: torch.Tensor | None = None
        """``(num_envs, slots, 3)``: floor x, y and the heading unwrapped (turns accumulate past +-pi)."""
        if longest_steps is not None:
            slots = int(longest_steps) + 1
            self.ring = torch.zeros(num_envs, slots, 3, dtype=dtype, device=device)
            self._slots = torch.arange(slots, device=device)
            self._envs = torch.arange(num_envs, device=device)
        self._slot = 0
        self.velocity = torch.zeros(num_envs, 2, dtype=dtype, device=device)
        """``(num_envs, 2)`` planar velocity in the heading frame, m/s (zero for envs without a ring)."""
        self.yaw_rate = torch.zeros(num_envs, dtype=dtype, device=device)
        """``(num_envs,)`` yaw rate, rad/s."""

    @property
    def keeps_ring(self) -> bool:
        """Whether some task of the library tracks over a window."""
        return self.ring is not None

    def reset(self, rows: torch.Tensor, qpos: torch.Tensor, heading: torch.Tensor) -> None:
        """Start the envs ``rows`` over: nothing tracked yet, every slot of their ring where they stand."""
        self.velocity = torch.where(rows.unsqueeze(-1), torch.zeros_like(self.velocity), self.velocity)
        self.yaw_rate = torch.where(rows, torch.zeros_like(self.yaw_rate), self.yaw_rate)
        if self.ring is not None:
            here = torch.cat([qpos[:, :2], heading.detach().unsqueeze(-1)], dim=-1)
            floor = here.unsqueeze(1).expand_as(self.ring)
            self.ring = torch.where(rows.view(-1, 1, 1), floor, self.ring)

    def advance(self, state: Mapping[str, torch.Tensor], window_steps: torch.Tensor, step_count: torch.Tensor) -> None:
        """Record the trunk's floor position and heading from ``state`` (``qpos``, ``qvel``, ``heading``,
        ``body_velocity`` after a step) and update what each env tracks: over the last ``min(window_steps,
        step_count)`` steps where its window is not 0, else the instantaneous velocity and yaw rate."""
        if self.ring is None:
            self.yaw_rate = state["qvel"][:, 5]
            return
        # The newest slot holds the last heading, unwrapped: this step's turn is added to it.
        last = self.ring[:, self._slot, 2]
        unwrapped = last + wrap_angle(state["heading"] - last)
        slots = self.ring.shape[1]
        self._slot = (self._slot + 1) % slots
        floor = torch.cat([state["qpos"][:, :2].to(self.dtype), unwrapped.unsqueeze(-1)], dim=-1)
        here = self._slots[self._slot : self._slot + 1]
        ring = self.ring.index_copy(1, here, floor.unsqueeze(1))
        span = torch.minimum(window_steps, step_count).clamp_min(1)
        earlier = ring[self._envs, (self._slot - span) % slots]
        change = (floor - earlier) / (span.to(self.dtype) * self.control_dt).unsqueeze(-1)
        world = change[:, :2]
        yaw = state["heading"]
        cos, sin = yaw.cos(), yaw.sin()
        averaged = torch.stack([cos * world[:, 0] + sin * world[:, 1], cos * world[:, 1] - sin * world[:, 0]], dim=-1)
        windowed = window_steps > 0
        self.velocity = torch.where(windowed.unsqueeze(-1), averaged, state["body_velocity"][:, :2])
        self.yaw_rate = torch.where(windowed, change[:, 2], state["qvel"][:, 5])
        self.ring = ring

    def detach(self) -> None:
        """Cut the autograd history the window carries into the next step."""
        self.velocity = self.velocity.detach()
        self.yaw_rate = self.yaw_rate.detach()
        if self.ring is not None:
            self.ring = self.ring.detach()


__all__ = ["TrackingWindow"]
