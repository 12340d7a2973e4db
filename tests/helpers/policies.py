"""Small policies for collector and algorithm tests."""

from __future__ import annotations

import torch
from tensordict.nn import TensorDictModule
from torch import nn


class OpenLoop(nn.Module):
    """One learnable action per env, whatever the observation.

    Actions do not depend on observations, so the only path from a step's
    action to a later reward runs through the env's state.
    """

    def __init__(self, actions: torch.Tensor) -> None:
        super().__init__()
        self.actions = nn.Parameter(actions.clone())

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.actions.clone()


def open_loop_policy(actions: torch.Tensor) -> TensorDictModule:
    """A collector policy playing ``actions`` ``[N, ...]`` at every step."""
    return TensorDictModule(OpenLoop(actions), in_keys=["observation"], out_keys=["action"])


def linear_policy(obs_dim: int, action_dim: int, *, seed: int = 0, scale: float = 1.0, dtype=torch.float32):
    """``action = W obs + b`` reading ``"observation"``, with ``W, b`` drawn from ``seed`` and scaled by ``scale``."""
    torch.manual_seed(seed)
    net = nn.Linear(obs_dim, action_dim).to(dtype)
    with torch.no_grad():
        net.weight.mul_(scale)
        net.bias.mul_(scale)
    return TensorDictModule(net, in_keys=["observation"], out_keys=["action"])
