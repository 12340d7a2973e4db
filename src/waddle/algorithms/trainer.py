"""The interface every trainer (PPO, SHAC, APG) offers the runner, the CLI and evaluation.

A trainer owns its networks, optimisers and rollout state; what drives it
(:class:`~waddle.algorithms.runner.Runner`, ``waddle train``, the learning
benchmark) only uses the members below, so any algorithm that has them plugs in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from torch import nn


@runtime_checkable
class Trainer(Protocol):
    """What :class:`~waddle.algorithms.runner.Runner` and ``waddle train`` need of a trainer."""

    steps_per_iteration: int
    """Env steps one :meth:`train_iteration` takes, over all envs."""

    def train_iteration(self) -> dict[str, float]:
        """Collect and update once; returns scalars named ``charts/*``, ``losses/*``, ``perf/*``."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training (networks, optimisers, normaliser, counters)."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        ...

    def deterministic_policy(self) -> nn.Module:
        """The ``observation -> action`` module to evaluate and export: normaliser inside,
        mean action clamped to the action bounds, in eval mode. A task-conditioned one
        (``reads_task_id``) is ``(observation, task_id) -> action``; one that reads another
        env entry than ``"observation"`` names it in ``observation_key``."""
        ...
