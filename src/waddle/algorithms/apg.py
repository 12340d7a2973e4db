"""Analytic policy gradients (APG) over short horizons.

Roll the policy out for ``horizon`` steps through a differentiable env, take
minus the discounted return as the loss and backpropagate it through the
simulator into the actor; then cut the graph and continue from where the envs
are (truncated backpropagation through time). There is no critic: the
objective ends at the horizon. SHAC (:mod:`waddle.algorithms.shac`) adds a
critic that values what lies beyond it, and reuses this module's actor and
guarded optimiser step.

Reading order: config, the loss (a pure function), shared building blocks,
then the trainer: ``train_iteration`` is collect, loss, guarded step, update
the normaliser, cut the graph.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.envs import EnvBase
from torchrl.modules import IndependentNormal, ProbabilisticActor

from waddle.algorithms.targets import horizon_returns
from waddle.collectors import DifferentiableCollector, DifferentiableRollout
from waddle.modules import RunningNormalizer, mlp


@dataclass(frozen=True)
class APGConfig:
    horizon: int = 32
    """Env steps per iteration; the loss backpropagates through all of them."""
    gamma: float = 0.99
    """Discount factor inside the horizon."""
    learning_rate: float = 1e-3
    """Adam learning rate of the actor."""
    adam_betas: tuple[float, float] = (0.7, 0.95)
    """Adam betas (DiffRL's choice for gradients through long rollouts)."""
    max_grad_norm: float = 1.0
    """Clip the actor's gradient to this global L2 norm; 0 disables clipping."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this before entering the loss."""
    actor_hidden_sizes: tuple[int, ...] = (64, 64)
    """Hidden widths of the actor MLP (ELU); empty gives a linear policy."""
    stochastic_policy: bool = False
    """Sample actions from a Gaussian with the reparameterisation trick."""
    init_log_std: float = -1.0
    """Initial log standard deviation of a stochastic policy."""
    normalize_observations: bool = True
    """Normalise observations by running statistics inside the graph."""
    clip_actions: bool = True
    """Clamp actions to the env's action bounds (ignored for unbounded specs)."""
    action_adjoint_max_norm: float = 0.0
    """Clip each env's gradient w.r.t. its action to this norm; 0 disables."""

    def __post_init__(self) -> None:
        check_common_config(self)


def check_common_config(config) -> None:
    """Validate the fields APG and SHAC share."""
    if config.horizon < 1:
        raise ValueError(f"horizon must be >= 1, got {config.horizon}.")
    if not 0.0 < config.gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {config.gamma}.")
    if config.max_grad_norm < 0.0:
        raise ValueError(f"max_grad_norm must be >= 0 (0 disables), got {config.max_grad_norm}.")
    if config.action_adjoint_max_norm < 0.0:
        raise ValueError(
            "action_adjoint_max_norm must be >= 0 (0 disables), "
            f"got {config.action_adjoint_max_norm}."
        )


def apg_loss(rewards: torch.Tensor, alive: torch.Tensor, gamma: float) -> torch.Tensor:
    """Minus the discounted return of the alive steps, averaged over ``T * N``.

    Args:
        rewards: ``[T, N]``, carrying the graph into the policy.
        alive: ``[T, N]`` bool, the rollout's ``alive_mask``.
        gamma: discount factor.
    """
    num_steps, num_envs = rewards.shape
    return -horizon_returns(rewards, alive, gamma).sum() / (num_steps * num_envs)


# -- pieces shared with SHAC ------------------------------------------------


class GaussianHead(nn.Module):
    """``observation -> (loc, scale)`` with a state-independent, learned log std."""

    def __init__(self, net: nn.Module, action_dim: int, init_log_std: float) -> None:
        super().__init__()
        self.net = net
        self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))

    def forward(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self.net(observation)
        return loc, self.log_std.exp().expand_as(loc)


def build_actor(
    obs_dim: int,
    action_dim: int,
    hidden_sizes: tuple[int, ...],
    *,
    stochastic: bool,
    init_log_std: float = -1.0,
) -> TensorDictModule:
    """An MLP policy reading ``"observation"`` and writing ``"action"``.

    Deterministic: ``action = mlp(observation)``. Stochastic: a
    ``ProbabilisticActor`` over an independent Gaussian whose samples are
    reparameterised (``rsample``), so gradients reach the mean and the std.
    """
    net = mlp(obs_dim, hidden_sizes, action_dim)
    if not stochastic:
        return TensorDictModule(net, in_keys=["observation"], out_keys=["action"])
    head = TensorDictModule(
        GaussianHead(net, action_dim, init_log_std),
        in_keys=["observation"],
        out_keys=["loc", "scale"],
    )
    return ProbabilisticActor(
        head, in_keys=["loc", "scale"], distribution_class=IndependentNormal
    )


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


def build_policy_and_collector(
    env: EnvBase, config, device: torch.device
) -> tuple[RunningNormalizer | None, TensorDictModule, DifferentiableCollector]:
    """The observation normaliser, actor and differentiable collector of APG and SHAC.

    ``config`` is an :class:`APGConfig` or a ``SHACConfig``: both name the
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
    ).to(device)
    bounded = getattr(env.action_spec, "low", None) is not None
    collector = DifferentiableCollector(
        env,
        actor,
        device,
        observation_normalizer=normalizer,
        clip_actions_to_space=config.clip_actions and bounded,
        action_adjoint_max_norm=config.action_adjoint_max_norm,
    )
    return normalizer, actor, collector


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


# -- the trainer -------------------------------------------------------------


class APG:
    """Analytic policy gradient trainer on one differentiable env.

    Args:
        env: a differentiable TorchRL env (see :class:`DifferentiableCollector`).
        config: hyperparameters.
        device: device of the networks.
    """

    def __init__(self, env: EnvBase, config: APGConfig, device: torch.device | str = "cpu") -> None:
        self.env = env
        self.config = config
        self.device = torch.device(device)
        self.normalizer, self.actor, self.collector = build_policy_and_collector(env, config, self.device)
        self.optimizer = torch.optim.Adam(
            self.actor.parameters(), lr=config.learning_rate, betas=config.adam_betas
        )
        self.iteration = 0

    def train_iteration(self) -> dict[str, float]:
        """One horizon: roll out, backpropagate through the env, step, cut the graph."""
        cfg = self.config
        start = time.perf_counter()
        rollout = self.collector.collect(cfg.horizon)
        loss = apg_loss(rollout.rewards * cfg.reward_scale, rollout.alive_mask, cfg.gamma)
        rollout_time = time.perf_counter() - start

        start = time.perf_counter()
        step = guarded_step(loss, self.optimizer, self.actor.parameters(), cfg.max_grad_norm)
        update_time = time.perf_counter() - start

        if self.normalizer is not None:
            self.normalizer.update(rollout.observations)
        self.collector.detach_state()
        self.iteration += 1
        return {
            "losses/actor_loss": float(loss.detach()),
            "charts/actor_grad_norm": step["grad_norm"],
            "charts/actor_update_skipped": step["skipped"],
            **rollout_metrics(rollout),
            "perf/rollout_s": rollout_time,
            "perf/update_s": update_time,
        }

    def state_dict(self) -> dict:
        return {
            "actor": self.actor.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "normalizer": None if self.normalizer is None else self.normalizer.state_dict(),
            "iteration": self.iteration,
        }

    def load_state_dict(self, state: dict) -> None:
        self.actor.load_state_dict(state["actor"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.normalizer is not None:
            self.normalizer.load_state_dict(state["normalizer"])
        self.iteration = int(state["iteration"])
