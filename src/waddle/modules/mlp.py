"""The plain multilayer perceptron the differentiable-RL algorithms build on."""

from __future__ import annotations

from collections.abc import Sequence

from torch import nn


def mlp(
    in_features: int,
    hidden_sizes: Sequence[int],
    out_features: int,
    *,
    activation: type[nn.Module] = nn.ELU,
    layer_norm: bool = False,
) -> nn.Sequential:
    """``Linear -> [LayerNorm] -> activation`` per hidden size, then a linear head.

    Args:
        in_features: input width.
        hidden_sizes: widths of the hidden layers; empty gives one linear layer.
        out_features: output width.
        activation: activation class placed after each hidden layer.
        layer_norm: put a ``LayerNorm`` before each hidden activation (as
            DiffRL's critics do).

    Example:
        >>> import torch
        >>> net = mlp(4, (32, 32), 2)
        >>> net(torch.zeros(5, 4)).shape
        torch.Size([5, 2])
    """
    layers: list[nn.Module] = []
    width = in_features
    for size in hidden_sizes:
        layers.append(nn.Linear(width, size))
        if layer_norm:
            layers.append(nn.LayerNorm(size))
        layers.append(activation())
        width = size
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)
