"""Rollout collectors over TorchRL envs."""

from waddle.collectors.differentiable import (
    ActionAdjointStats,
    DifferentiableCollector,
    DifferentiableRollout,
    DifferentiableTransition,
    clip_per_env_norm,
)
from waddle.collectors.env_layout import EnvLayout
from waddle.collectors.episode_ends import EpisodeEnds

__all__ = [
    "ActionAdjointStats",
    "DifferentiableCollector",
    "DifferentiableRollout",
    "DifferentiableTransition",
    "EnvLayout",
    "EpisodeEnds",
    "clip_per_env_norm",
]
