"""Random shoves of the trunk: each env's push timer, and the kicks it deals when the timer runs out.

The upstream randomization pushes a walking robot every few seconds: the
trunk's planar velocity jumps by a kick drawn from ``push_velocity`` (m/s, per
axis, in the world frame), and the next push comes after an interval drawn
from ``push_interval`` (s). :class:`PushSchedule` keeps the timers and draws
the kicks; the env applies them to its physics.

    pushes = PushSchedule(num_envs, randomization, control_dt=0.02, dtype=..., device=...)
    pushes.begin(rows, generator)          # at a reset: the envs' first interval
    due, kick = pushes.tick(generator)     # every step: who is pushed, by how much (None when nobody is)
    pushes.strength = 0.5                  # a curriculum's ramp: half of every kick drawn from here on

Every draw comes from the generator passed in, in the order of the calls.
"""

from __future__ import annotations

import torch

from waddle.envs.microduck.randomization import MicroDuckRandomization


class PushSchedule:
    """The push timers of ``num_envs`` envs under ``randomization``'s ``push_interval`` and ``push_velocity``."""

    def __init__(
        self,
        num_envs: int,
        randomization: MicroDuckRandomization,
        *,
        control_dt: float,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        self.interval = tuple(float(v) for v in randomization.push_interval)
        self.velocity = tuple(float(v) for v in randomization.push_velocity)
        self.control_dt = float(control_dt)
        self.dtype, self.device = dtype, device
        self.timer = torch.zeros(num_envs, dtype=dtype, device=device)
        """``(num_envs,)`` seconds until each env's next push."""
        self._strength = 1.0

    @property
    def strength(self) -> float:
        """Share of each drawn kick that is dealt, in [0, 1] (a training curriculum ramps it up; the draws, and
        so every later draw of the generator, are the same at any strength; ``--push-scale`` makes kicks
        harder)."""
        return self._strength

    @strength.setter
    def strength(self, value: float) -> None:
        share = float(value)
        if not 0.0 <= share <= 1.0:  # also refuses NaN
            raise ValueError(
                f"PushSchedule.strength is the share of each kick dealt, within [0, 1]; got {value!r} "
                "(harder pushes are a randomization's push_velocity, --push-scale on the command line)."
            )
        self._strength = share

    def _uniform(self, bounds: tuple[float, float], shape: tuple[int, ...], generator: torch.Generator):
        low, high = bounds
        return low + (high - low) * torch.rand(*shape, generator=generator, dtype=self.dtype, device=self.device)

    def begin(self, rows: torch.Tensor, generator: torch.Generator) -> None:
        """Draw a first interval for every env (one draw per env, so the stream does not depend on ``rows``)
        and start the timers of ``rows`` with it."""
        interval = self._uniform(self.interval, (self.timer.shape[0],), generator)
        self.timer = torch.where(rows, interval, self.timer)

    def tick(self, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Advance the timers one control step. When some ran out: the ``(num_envs,)`` bool mask of those
        envs and the ``(num_envs, 2)`` planar kicks (zero elsewhere), their next interval started; else
        ``None`` and nothing drawn."""
        self.timer = self.timer - self.control_dt
        due = self.timer <= 0
        if not bool(due.any()):
            return None
        n = self.timer.shape[0]
        kick = self._uniform(self.velocity, (n, 2), generator)
        interval = self._uniform(self.interval, (n,), generator)
        self.timer = torch.where(due, interval, self.timer)
        return due, torch.where(due.unsqueeze(-1), self.strength * kick, torch.zeros_like(kick))


__all__ = ["PushSchedule"]
