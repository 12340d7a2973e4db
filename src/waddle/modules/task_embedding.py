"""Networks that read the env's task id beside the observation.

A MicroDuck env holds a library of tasks and writes the index of each env's
task under ``"task_id"``. Task parameters (the reward, the gait clock) are not
in the observation, so a policy trained on several tasks needs the id to tell,
say, standing from hopping: both have a zero command. A learned
``nn.Embedding`` row per task is appended to the (normalised) observation.

With a one-task library nothing reads the id and the networks have the
single-task layout, so a one-task checkpoint without embedding weights loads.
A conditioned network's parameters are the unconditioned network's, under the
same names, plus ``task_embedding.weight``; only its first linear layer is
wider, by the embedding width. :mod:`waddle.algorithms.init_from` relies on
that to start a multi-task network from a one-task one.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from waddle.modules.mlp import mlp

TASK_ID_KEY = "task_id"
"""The entry of the env's TensorDict holding each env's task index (``(N, 1)`` integers)."""

EMBEDDING_KEY = "task_embedding.weight"
"""How every conditioned network's embedding table ends in its ``state_dict``."""


def append_task_embedding(features: torch.Tensor, embedding: nn.Embedding, task_id: torch.Tensor) -> torch.Tensor:
    """``cat(features, embedding(task_id))`` along the last dimension.

    ``task_id`` may carry a trailing unit dimension (the env writes ``(N, 1)``);
    it is reshaped to the batch shape of ``features``.

    Example:
        >>> table = nn.Embedding(2, 3)
        >>> append_task_embedding(torch.zeros(4, 5), table, torch.tensor([[0], [1], [1], [0]])).shape
        torch.Size([4, 8])
    """
    if task_id is None:
        raise ValueError(
            f"this network reads the task id beside the observation (a library of {embedding.num_embeddings} "
            "tasks); call it with task_id, the env's 'task_id' entry."
        )
    rows = embedding(task_id.reshape(features.shape[:-1]).long())
    return torch.cat([features, rows.to(features.dtype)], dim=-1)


def conditioned(num_tasks: int, embedding_dim: int) -> bool:
    """Whether a network over a library of ``num_tasks`` tasks reads the task id.

    Example:
        >>> conditioned(1, 8), conditioned(3, 8), conditioned(3, 0)
        (False, True, False)
    """
    return num_tasks > 1 and embedding_dim > 0


class TaskConditionedMLP(nn.Module):
    """``(features, task_id) -> mlp(cat(features, embedding(task_id)))``.

    The layers are registered under the names :func:`~waddle.modules.mlp.mlp`
    gives them (``"0"``, ``"1"``, ...), so the ``state_dict`` of a
    conditioned network is the plain one's plus ``task_embedding.weight``.

    Args:
        in_features: width of the features (the observation), without the embedding.
        hidden_sizes: hidden layer widths.
        out_features: output width.
        num_tasks: rows of the embedding table (the library's size).
        embedding_dim: width of one row.
        activation: hidden activation class.
        layer_norm: LayerNorm before each hidden activation.

    Example:
        >>> net = TaskConditionedMLP(5, (16,), 2, num_tasks=3, embedding_dim=4)
        >>> net(torch.zeros(7, 5), torch.zeros(7, 1, dtype=torch.long)).shape
        torch.Size([7, 2])
        >>> sorted(net.state_dict())
        ['0.bias', '0.weight', '2.bias', '2.weight', 'task_embedding.weight']
    """

    def __init__(
        self,
        in_features: int,
        hidden_sizes: Sequence[int],
        out_features: int,
        *,
        num_tasks: int,
        embedding_dim: int,
        activation: type[nn.Module] = nn.ELU,
        layer_norm: bool = False,
    ) -> None:
        super().__init__()
        layers = mlp(
            in_features + embedding_dim, hidden_sizes, out_features, activation=activation, layer_norm=layer_norm
        )
        self._layer_names = [name for name, _ in layers.named_children()]
        for name, layer in layers.named_children():
            self.add_module(name, layer)
        self.task_embedding = nn.Embedding(num_tasks, embedding_dim)

    def forward(self, features: torch.Tensor, task_id: torch.Tensor | None = None) -> torch.Tensor:
        out = append_task_embedding(features, self.task_embedding, task_id)
        for name in self._layer_names:
            out = self._modules[name](out)
        return out


def reads_task_id(policy: nn.Module) -> bool:
    """Whether ``policy`` (a deterministic ``observation -> action`` module) needs the task id too."""
    return bool(getattr(policy, "reads_task_id", False))


def act(policy: nn.Module, observation: torch.Tensor, task_id: torch.Tensor | None) -> torch.Tensor:
    """``policy(observation, task_id)`` for a task-conditioned policy, ``policy(observation)`` otherwise."""
    if reads_task_id(policy):
        return policy(observation, task_id)
    return policy(observation)
