"""Falls and get-ups counted over a batch of episodes: how often a robot that fell stood up again, how soon.

A robot is *down* when its trunk tilts past ``MicroDuckEnv.MIN_UPRIGHT`` or
sinks under ``MIN_HEIGHT_RATIO`` of the standing height (the env's fall), and
*stands* when ``MicroDuckEnv.standing`` says so: projected gravity's z below
-0.9, the trunk at least 0.1 m up and a sole on the floor (what the robot's
runtime reads as upright, without the moment a dropped robot swings level in
mid-air). A fall starts when a robot goes down (an episode that starts on the
floor starts with one) and is recovered when the robot next stands; the time
from the one to the other is its time to stand, and the steps it spent down
within it its time lying.

    tracker = RecoveryTracker(num_envs, control_dt)
    tracker.observe(env.standing(), env.fallen(), counted)   # after the reset and after every step
    tracker.summary()
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RecoverySummary:
    """Falls and get-ups over the episodes a :class:`RecoveryTracker` watched."""

    falls: int
    """Falls started (an episode that starts lying counts one)."""
    recovered_fraction: float
    """Share of those falls after which the robot stood again (NaN without a fall)."""
    time_to_stand_s: float
    """Mean seconds from a fall's start to standing, over the recovered falls."""
    time_to_stand_p95_s: float
    """95th percentile of the same."""
    time_lying_s: float
    """Mean seconds spent down per fall, the falls not recovered included (until their episode ended)."""


class RecoveryTracker:
    """Counts the falls and get-ups of ``num_envs`` envs stepped together, one episode each."""

    def __init__(self, num_envs: int, control_dt: float) -> None:
        self.control_dt = float(control_dt)
        self._fallen_at = torch.full((num_envs,), -1, dtype=torch.long)
        self._lying_steps = torch.zeros(num_envs, dtype=torch.long)
        self._step = 0
        self._times: list[torch.Tensor] = []
        self._lying: list[torch.Tensor] = []
        self._falls = 0

    def observe(self, standing: torch.Tensor, down: torch.Tensor, counted: torch.Tensor) -> None:
        """Read one moment of every env, three ``(num_envs,)`` bool tensors: whether it stands, whether it is
        down, and whether its episode is still running (the others are not counted)."""
        counted = counted.bool().cpu()
        down, stands = down.bool().cpu() & counted, standing.bool().cpu() & counted
        falling = self._fallen_at >= 0
        up_again = falling & stands
        if up_again.any():
            self._times.append((self._step - self._fallen_at[up_again]).float() * self.control_dt)
            self._lying.append(self._lying_steps[up_again].float() * self.control_dt)
        self._fallen_at = torch.where(up_again, -1, self._fallen_at)
        new = down & ~(falling & ~up_again)
        self._falls += int(new.sum())
        self._fallen_at = torch.where(new, self._step, self._fallen_at)
        self._lying_steps = torch.where(new | up_again, 0, self._lying_steps)
        self._lying_steps += (down & (self._fallen_at >= 0)).long()
        self._step += 1

    def share_recovered_within(self, seconds: float) -> float:
        """Share of the falls so far after which the robot stood within ``seconds`` (NaN without a fall)."""
        if not self._falls:
            return math.nan
        times = torch.cat(self._times) if self._times else torch.zeros(0)
        return float((times <= seconds + 1e-9).sum()) / self._falls

    def summary(self) -> RecoverySummary:
        """The falls so far; a fall still open counts as not recovered, its lying time as far as it went."""
        times = torch.cat(self._times) if self._times else torch.zeros(0)
        open_falls = self._fallen_at >= 0
        lying = torch.cat([*self._lying, self._lying_steps[open_falls].float() * self.control_dt])
        nan = math.nan
        return RecoverySummary(
            falls=self._falls,
            recovered_fraction=len(times) / self._falls if self._falls else nan,
            time_to_stand_s=float(times.mean()) if len(times) else nan,
            time_to_stand_p95_s=float(torch.quantile(times, 0.95)) if len(times) else nan,
            time_lying_s=float(lying.mean()) if len(lying) else nan,
        )
