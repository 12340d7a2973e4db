"""Actor and critic networks for on-policy RL, and the deterministic policy that gets exported.

Both networks read the raw observation and normalise it with one shared
:class:`~waddle.modules.normalizer.RunningNormalizer`, so a saved policy
carries its own statistics and an exported graph needs no preprocessing.

The actor is a Gaussian with a state-independent log standard deviation (the
usual choice for locomotion PPO). Samples are *not* squashed: the MicroDuck env
clips actions to ``[-1, 1]`` itself, which keeps the log-probability and the
entropy exact and cheap, and the deterministic policy clamps its mean the same
way.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from tensordict.nn import InteractionType, TensorDictModule
from torch import nn
from torchrl.modules import IndependentNormal, ProbabilisticActor, ValueOperator

from waddle.modules.mlp import mlp
from waddle.modules.normalizer import RunningNormalizer

OBSERVATION_KEY = "observation"
"""The entry of the env's TensorDict both networks read."""

LOG_STD_BOUNDS = (-5.0, 1.0)
"""The log standard deviation is clamped to this range before use."""


class GaussianPolicy(nn.Module):
    """``observation -> (loc, scale)``: an MLP mean and a learned, state-independent scale.

    Args:
        normalizer: the observation normaliser applied first (shared with the critic).
        action_dim: number of action entries.
        hidden_sizes: widths of the hidden layers.
        init_std: initial standard deviation of every action entry.
        activation: hidden activation class.

    Example:
        >>> policy = GaussianPolicy(RunningNormalizer(3), 2, (16,), init_std=0.5)
        >>> loc, scale = policy(torch.zeros(4, 3))
        >>> loc.shape, scale[0, 0].item()
        (torch.Size([4, 2]), 0.5)
    """

    def __init__(
        self,
        normalizer: RunningNormalizer,
        action_dim: int,
        hidden_sizes: Sequence[int],
        *,
        init_std: float = 0.5,
        activation: type[nn.Module] = nn.ELU,
    ) -> None:
        super().__init__()
        if init_std <= 0:
            raise ValueError(f"init_std must be > 0, got {init_std}.")
        (observation_dim,) = normalizer.shape
        self.normalizer = normalizer
        self.net = mlp(observation_dim, hidden_sizes, action_dim, activation=activation)
        # A small last layer starts the policy near the STAND pose (action 0).
        nn.init.uniform_(self.net[-1].weight, -1e-2, 1e-2)
        nn.init.zeros_(self.net[-1].bias)
        self.log_std = nn.Parameter(torch.full((action_dim,), math.log(init_std)))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self.net(self.normalizer(observation))
        scale = self.log_std.clamp(*LOG_STD_BOUNDS).exp().expand_as(loc)
        return loc, scale


class ValueNetwork(nn.Module):
    """``observation -> value`` of shape ``[..., 1]``, on normalised observations.

    Args:
        normalizer: the observation normaliser applied first (shared with the actor).
        hidden_sizes: widths of the hidden layers.
        activation: hidden activation class.
    """

    def __init__(
        self, normalizer: RunningNormalizer, hidden_sizes: Sequence[int], *, activation: type[nn.Module] = nn.ELU
    ) -> None:
        super().__init__()
        (observation_dim,) = normalizer.shape
        self.normalizer = normalizer
        self.net = mlp(observation_dim, hidden_sizes, 1, activation=activation)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.net(self.normalizer(observation))


class PolicyMean(nn.Module):
    """The deterministic policy ``observation -> clamp(mean, low, high)``, normaliser included.

    This is what ``waddle eval`` runs and ``waddle export`` writes to ONNX: one
    plain tensor-in, tensor-out module with no TensorDict and no sampling.

    Args:
        policy: the Gaussian policy whose mean is used.
        low: lower action bound.
        high: upper action bound.

    Example:
        >>> mean = PolicyMean(GaussianPolicy(RunningNormalizer(3), 2, (16,)))
        >>> mean(torch.zeros(1, 3)).shape
        torch.Size([1, 2])
    """

    def __init__(self, policy: GaussianPolicy, low: float = -1.0, high: float = 1.0) -> None:
        super().__init__()
        self.policy = policy
        self.low = float(low)
        self.high = float(high)

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        loc = self.policy.net(self.policy.normalizer(observation))
        return loc.clamp(self.low, self.high)


def make_actor(policy: GaussianPolicy) -> ProbabilisticActor:
    """Wrap ``policy`` as a TorchRL actor reading ``"observation"`` and writing
    ``"loc"``, ``"scale"``, a sampled ``"action"`` and its log-probability.

    The actor samples unless an exploration context (``set_exploration_type``)
    says otherwise; for the deterministic policy use :class:`PolicyMean`.
    """
    module = TensorDictModule(policy, in_keys=[OBSERVATION_KEY], out_keys=["loc", "scale"])
    return ProbabilisticActor(
        module,
        in_keys=["loc", "scale"],
        distribution_class=IndependentNormal,
        return_log_prob=True,
        default_interaction_type=InteractionType.RANDOM,
    )


def make_critic(value: ValueNetwork) -> ValueOperator:
    """Wrap ``value`` as a TorchRL value operator reading ``"observation"`` and writing ``"state_value"``."""
    return ValueOperator(value, in_keys=[OBSERVATION_KEY])
