"""Rollout collectors over TorchRL envs."""

from waddle.collectors.differentiable import (
    ActionAdjointStats,
    DifferentiableCollector,
    DifferentiableRollout,
    DifferentiableTransition,
    clip_per_env_norm,
)

__all__ = [
    "ActionAdjointStats",
    "DifferentiableCollector",
    "DifferentiableRollout",
    "DifferentiableTransition",
    "clip_per_env_norm",
]
