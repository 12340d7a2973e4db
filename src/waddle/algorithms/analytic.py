"""What the analytic-gradient trainers (APG and SHAC) share.

Both roll an MLP actor out through a differentiable env, backpropagate a loss
through the simulator and take a guarded optimiser step; they differ only in
the loss (APG: the horizon's return; SHAC: plus a learned critic's bootstrap).
This module holds the rest: config checks of the common fields, the actor
(deterministic MLP or reparameterised Gaussian), the observation normaliser
and differentiable collector built around it, the guarded step, the rollout's
scalars and the deterministic policy they export.

With a library of several tasks the actor (and SHAC's critic) read
``"task_id"`` through an embedding appended to the normalised observation
(:class:`~waddle.modules.task_embedding.TaskConditionedMLP`); with one task
they are plain MLPs.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.envs import EnvBase
from torchrl.modules import IndependentNormal, ProbabilisticActor

from waddle.algorithms.task_library import check_task_embedding_dim, task_library
from waddle.collectors import DifferentiableCollector, DifferentiableRollout
from waddle.modules import RunningNormalizer, mlp
from waddle.modules.task_embedding import TASK_ID_KEY, TaskConditionedMLP, conditioned


def check_common_config(config) -> None:
    """Validate the fields APG and SHAC share."""
    if config.horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {config.horizon}.")
    if not 0.0 < config.gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {config.gamma}.")
    if config.max_grad_norm < 0.0:
        raise ValueError(f"max_grad_norm must be >= 0 (0 disables), got {config.max_grad_norm}.")
    if config.action_adjoint_max_norm < 0.0:
        raise ValueError(f"action_adjoint_max_norm must be >= 0 (0 disables), got {config.action_adjoint_max_norm}.")
    check_task_embedding_dim(config)


class GaussianHead(nn.Module):
    """``observation -> (loc, scale)`` with a state-independent, learned log std."""

    def __init__(self, net: nn.Module, action_dim: int, init_log_std: float) -> None:
        super().__init__()
        self.net = net
        self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))

    @property
    def reads_task_id(self) -> bool:
        return isinstance(self.net, TaskConditionedMLP)

    def forward(self, observation: torch.Tensor, *task_id: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self.net(observation, *task_id)
        return loc, self.log_std.exp().expand_as(loc)


def build_net(
    in_features: int,
    hidden_sizes: tuple[int, ...],
    out_features: int,
    *,
    num_tasks: int = 1,
    task_embedding_dim: int = 0,
    layer_norm: bool = False,
) -> nn.Module:
    """A plain :func:`~waddle.modules.mlp`, or a :class:`TaskConditionedMLP` when the library
    has several tasks and ``task_embedding_dim > 0``."""
    if conditioned(num_tasks, task_embedding_dim):
        return TaskConditionedMLP(
            in_features,
            hidden_sizes,
            out_features,
            num_tasks=num_tasks,
            embedding_dim=task_embedding_dim,
            layer_norm=layer_norm,
        )
    return mlp(in_features, hidden_sizes, out_features, layer_norm=layer_norm)


def build_actor(
    obs_dim: int,
    action_dim: int,
    hidden_sizes: tuple[int, ...],
    *,
    stochastic: bool,
    init_log_std: float = -1.0,
    num_tasks: int = 1,
    task_embedding_dim: int = 0,
) -> TensorDictModule:
    """An MLP policy reading ``"observation"`` (and ``"task_id"`` when task-conditioned)
    and writing ``"action"``.

    Deterministic: ``action = mlp(observation)``. Stochastic: a
    ``ProbabilisticActor`` over an independent Gaussian whose samples are
    reparameterised (``rsample``), so gradients reach the mean and the std.
    """
    net = build_net(obs_dim, hidden_sizes, action_dim, num_tasks=num_tasks, task_embedding_dim=task_embedding_dim)
    in_keys = ["observation", TASK_ID_KEY] if isinstance(net, TaskConditionedMLP) else ["observation"]
    if not stochastic:
        return TensorDictModule(net, in_keys=in_keys, out_keys=["action"])
    head = TensorDictModule(
        GaussianHead(net, action_dim, init_log_std),
        in_keys=in_keys,
        out_keys=["loc", "scale"],
    )
    return ProbabilisticActor(head, in_keys=["loc", "scale"], distribution_class=IndependentNormal)


def guarded_step(
    loss: torch.Tensor,
    optimizer: torch.optim.Optimizer,
    params: Iterable[nn.Parameter],
    max_grad_norm: float,
) -> dict[str, float]:
    """Backward, clip and step, unless the loss or the gradient is not finite.

    A non-finite loss is not backpropagated; a non-finite gradient is left in
    ``.grad`` (for inspection) and the step is skipped. Nothing is zeroed or
    replaced to hide it: the returned ``skipped`` flag reports it.

    Returns:
        ``{"grad_norm": ..., "skipped": 0.0 or 1.0}`` (``grad_norm`` is NaN
        when the loss was not finite).
    """
    if not torch.isfinite(loss):
        return {"grad_norm": math.nan, "skipped": 1.0}
    params = list(params)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grads = [p for p in params if p.grad is not None]
    if max_grad_norm > 0.0:
        grad_norm = torch.nn.utils.clip_grad_norm_(grads, max_grad_norm)
    else:
        grad_norm = torch.nn.utils.get_total_norm([p.grad for p in grads])
    grad_norm = float(grad_norm)
    if not math.isfinite(grad_norm):
        return {"grad_norm": grad_norm, "skipped": 1.0}
    optimizer.step()
    return {"grad_norm": grad_norm, "skipped": 0.0}


def env_dims(env: EnvBase) -> tuple[int, int]:
    """``(observation features, action dimensions)`` of a ``(N,)``-batched env."""
    return env.observation_spec["observation"].shape[-1], env.action_spec.shape[-1]


def build_policy(env: EnvBase, config, device: torch.device) -> tuple[RunningNormalizer | None, TensorDictModule]:
    """The observation normaliser and actor of APG and SHAC.

    ``config`` is an ``APGConfig`` or a ``SHACConfig``: both name the
    actor's fields the same way.
    """
    obs_dim, action_dim = env_dims(env)
    normalizer = RunningNormalizer(obs_dim).to(device) if config.normalize_observations else None
    actor = build_actor(
        obs_dim,
        action_dim,
        config.actor_hidden_sizes,
        stochastic=config.stochastic_policy,
        init_log_std=config.init_log_std,
        num_tasks=max(len(task_library(env)), 1),
        task_embedding_dim=config.task_embedding_dim,
    ).to(device)
    return normalizer, actor


def build_collector(
    env: EnvBase, actor: TensorDictModule, normalizer: RunningNormalizer | None, config, device: torch.device
) -> DifferentiableCollector:
    """The differentiable collector that rolls ``actor`` out through ``env`` (which must be differentiable).

    The trainers build it at their first window, not with their networks: a
    trainer rebuilt only for its policy (``waddle eval``, ``waddle export``)
    runs on an env without gradients.
    """
    bounded = getattr(env.action_spec, "low", None) is not None
    return DifferentiableCollector(
        env,
        actor,
        device,
        observation_normalizer=normalizer,
        clip_actions_to_space=config.clip_actions and bounded,
        action_adjoint_max_norm=config.action_adjoint_max_norm,
    )


def rollout_metrics(rollout: DifferentiableRollout) -> dict[str, float]:
    """Reward and episode-end scalars of a rollout (unscaled rewards, alive steps)."""
    alive = rollout.alive_mask
    rewards = rollout.rewards.detach()
    metrics = {
        "charts/reward_mean": float(rewards[alive].mean()),
        "charts/alive_fraction": float(alive.float().mean()),
        "charts/done_fraction": float(rollout.dones.float().mean()),
    }
    if rollout.action_gradient_stats is not None:
        metrics.update(rollout.action_gradient_stats.as_dict())
    return metrics


class NormalizedMeanPolicy(nn.Module):
    """``clamp(net(normalizer(observation)), low, high)``; the normaliser may be ``None``.

    A task-conditioned ``net`` (``reads_task_id``) takes ``(observation, task_id)``.
    """

    def __init__(self, net: nn.Module, normalizer: RunningNormalizer | None, low: float, high: float) -> None:
        super().__init__()
        self.net = net
        self.normalizer = normalizer
        self.low, self.high = float(low), float(high)

    @property
    def reads_task_id(self) -> bool:
        return isinstance(self.net, TaskConditionedMLP) or bool(getattr(self.net, "reads_task_id", False))

    def forward(self, observation: torch.Tensor, task_id: torch.Tensor | None = None) -> torch.Tensor:
        if self.normalizer is not None:
            observation = self.normalizer(observation)
        out = self.net(observation, task_id) if self.reads_task_id else self.net(observation)
        if isinstance(out, tuple):  # a Gaussian head: (loc, scale)
            out = out[0]
        return out.clamp(self.low, self.high)


def mean_policy(actor: TensorDictModule, normalizer: RunningNormalizer | None, env: EnvBase) -> NormalizedMeanPolicy:
    """The deterministic ``observation -> action`` module of an actor made by :func:`build_actor`.

    The mean network is taken out of ``actor`` (the MLP of a deterministic
    actor, the Gaussian head of a stochastic one), ``normalizer`` goes in front
    and the output is clamped to ``env``'s action bounds. It shares parameters
    with ``actor``.
    """
    if isinstance(actor, ProbabilisticActor):
        net = actor[0].module  # the head writing (loc, scale)
    elif isinstance(actor, TensorDictModule):
        net = actor.module
    else:
        raise TypeError(
            f"actor must be a TensorDictModule or ProbabilisticActor from build_actor, got {type(actor).__name__}."
        )
    spec = env.action_spec
    low, high = float(spec.space.low.min()), float(spec.space.high.max())
    return NormalizedMeanPolicy(net, normalizer, low, high).eval()
