"""Analytic policy gradients (APG) over short horizons.

Roll the policy out for ``horizon`` steps through a differentiable env, take
minus the discounted return as the loss and backpropagate it through the
simulator into the actor; then cut the graph and continue from where the envs
are (truncated backpropagation through time). There is no critic: the
objective ends at the horizon. SHAC (:mod:`waddle.algorithms.shac`) adds a
critic that values what lies beyond it; the actor, collector and guarded
optimiser step both use are in :mod:`waddle.algorithms.analytic`.

Reading order: config, the loss (a pure function), then the trainer:
``train_iteration`` is collect, loss, guarded step, update the normaliser,
cut the graph.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch
from torch import nn
from torchrl.envs import EnvBase

from waddle.algorithms.analytic import (
    build_collector,
    build_policy,
    check_common_config,
    guarded_step,
    mean_policy,
    rollout_metrics,
)
from waddle.algorithms.targets import horizon_returns
from waddle.algorithms.task_library import STATE_KEY, check_task_library, saved_task_library, task_library
from waddle.collectors import DifferentiableCollector


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
    task_embedding_dim: int = 8
    """Width of the task-id embedding the actor reads beside the observation when the env's task library
    holds more than one task (0: it never reads the task id)."""

    def __post_init__(self) -> None:
        check_common_config(self)


def apg_loss(rewards: torch.Tensor, alive: torch.Tensor, gamma: float) -> torch.Tensor:
    """Minus the discounted return of the alive steps, averaged over ``T * N``.

    Args:
        rewards: ``[T, N]``, carrying the graph into the policy.
        alive: ``[T, N]`` bool, the rollout's ``alive_mask``.
        gamma: discount factor.
    """
    num_steps, num_envs = rewards.shape
    return -horizon_returns(rewards, alive, gamma).sum() / (num_steps * num_envs)


class APG:
    """Analytic policy gradient trainer on one differentiable env.

    Args:
        env: a differentiable TorchRL env (see :class:`DifferentiableCollector`).
        config: hyperparameters.
        device: device of the networks.

    Attributes:
        steps_per_iteration: env steps per iteration, ``horizon * num_envs``.
    """

    def __init__(self, env: EnvBase, config: APGConfig, device: torch.device | str = "cpu") -> None:
        self.env = env
        self.config = config
        self.device = torch.device(device)
        self.steps_per_iteration = config.horizon * env.batch_size[0]
        self.task_library = task_library(env)
        self.normalizer, self.actor = build_policy(env, config, self.device)
        self.optimizer = torch.optim.Adam(self.actor.parameters(), lr=config.learning_rate, betas=config.adam_betas)
        self.iteration = 0

    @functools.cached_property
    def collector(self) -> DifferentiableCollector:
        """Built at the first window (:func:`~waddle.algorithms.analytic.build_collector`)."""
        return build_collector(self.env, self.actor, self.normalizer, self.config, self.device)

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

    def deterministic_policy(self) -> nn.Module:
        """The actor's mean action, clamped to the action bounds, behind the normaliser."""
        return mean_policy(self.actor, self.normalizer, self.env)

    def state_dict(self) -> dict:
        return {
            STATE_KEY: list(self.task_library),
            "actor": self.actor.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "normalizer": None if self.normalizer is None else self.normalizer.state_dict(),
            "iteration": self.iteration,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output; a state saved for another task library is refused
        (:class:`~waddle.algorithms.task_library.TaskLibraryError`)."""
        check_task_library(saved_task_library(state), self.task_library)
        self.actor.load_state_dict(state["actor"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.normalizer is not None:
            self.normalizer.load_state_dict(state["normalizer"])
        self.iteration = int(state["iteration"])
