"""Short-Horizon Actor-Critic (SHAC; Xu et al., ICLR 2022).

Each iteration rolls the actor out for ``horizon`` steps through a
differentiable env. The actor's loss is minus the discounted reward of those
steps plus the discounted target-critic value where each env's window stops,
averaged over ``horizon * num_envs``; it is backpropagated through the
simulator. The critic is then regressed on TD(lambda) targets of the same
(detached) rollout in a few minibatch epochs, the target critic follows it by
Polyak averaging, and the graph is cut before the next window.

Only each env's steps up to its first done in the window count (the rollout's
``alive_mask``): a terminated env contributes no value after it, a truncated
one is bootstrapped from the observation it reached.

With a library of several tasks, the actor and the critic each read the task
id through their own embedding (``task_embedding_dim`` wide).

Both learning rates fall linearly to zero over ``lr_decay_steps`` env steps
by default (DiffRL's schedule; ``lr_schedule="constant"`` keeps them).

Reading order: config, the pure losses, then the trainer, whose
``train_iteration`` is actor step, critic steps, target update, graph cut.
"""

from __future__ import annotations

import copy
import functools
import time
from dataclasses import dataclass

import torch
from torch import nn
from torchrl.envs import EnvBase

from waddle.algorithms.analytic import (
    build_collector,
    build_net,
    build_policy,
    check_common_config,
    env_dims,
    guarded_step,
    mean_policy,
    rollout_metrics,
)
from waddle.algorithms.targets import horizon_returns, td_lambda_targets
from waddle.algorithms.task_library import STATE_KEY, check_task_library, saved_task_library, task_library
from waddle.collectors import DifferentiableCollector, DifferentiableRollout
from waddle.modules.task_embedding import TASK_ID_KEY, TaskConditionedMLP

LR_SCHEDULES = ("linear", "constant")
"""``SHACConfig.lr_schedule`` names."""


@dataclass(frozen=True)
class SHACConfig:
    horizon: int = 32
    """Env steps per iteration; the actor loss backpropagates through all of them."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """Lambda of the TD(lambda) critic targets, as in GAE (0: one-step TD, 1: Monte Carlo)."""
    learning_rate: float = 2e-3
    """Adam learning rate of the actor."""
    critic_learning_rate: float = 2e-3
    """Adam learning rate of the critic."""
    lr_schedule: str = "linear"
    """'linear': both learning rates fall linearly from their start to zero over lr_decay_steps env steps (DiffRL's
    schedule); 'constant': they stay. On the MicroDuck, constant rates stood and then fell again when one window's
    gradient spiked; the linear schedule held (docs/differentiable.md, "SHAC on the MicroDuck")."""
    lr_decay_steps: int = 25_600
    """Env steps the linear schedule spans ('waddle train' sets it to --total-steps unless given); past it the actor
    and the critic no longer change."""
    adam_betas: tuple[float, float] = (0.7, 0.95)
    """Adam betas of both optimisers."""
    max_grad_norm: float = 1.0
    """Clip actor and critic gradients to this global L2 norm; 0 disables clipping."""
    num_epochs: int = 16
    """Passes of critic regression over each rollout batch."""
    num_minibatches: int = 4
    """Minibatches the batch is shuffled into per critic epoch."""
    target_critic_alpha: float = 0.2
    """Polyak weight the target critic keeps: ``target <- alpha target + (1 - alpha) critic``."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this before entering either loss."""
    actor_hidden_sizes: tuple[int, ...] = (400, 200, 100)
    """Hidden widths of the actor MLP (ELU)."""
    critic_hidden_sizes: tuple[int, ...] = (400, 200)
    """Hidden widths of the critic MLP (ELU)."""
    critic_layer_norm: bool = True
    """LayerNorm before each hidden activation of the critic."""
    stochastic_policy: bool = False
    """Sample actions from a Gaussian with the reparameterisation trick. Off by default (DiffRL samples): on the
    MicroDuck's standing task the deterministic actor returned 57.5 of 60 after 10k env steps, a sampling one
    (log std -3, same seed) at most 53.4 by 15k (docs/differentiable.md, "SHAC on the MicroDuck")."""
    init_log_std: float = -1.0
    """Initial log standard deviation of a stochastic policy."""
    normalize_observations: bool = True
    """Normalise actor and critic inputs by running statistics (inside the graph)."""
    clip_actions: bool = True
    """Clamp actions to the env's action bounds (ignored for unbounded specs)."""
    action_adjoint_max_norm: float = 0.0
    """Clip each env's gradient w.r.t. its action to this norm; 0 disables."""
    task_embedding_dim: int = 8
    """Width of the task-id embedding the actor and the critic read beside the observation when the env's
    task library holds more than one task (0: they never read the task id)."""

    def __post_init__(self) -> None:
        check_common_config(self)
        if not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(f"gae_lambda must be in [0, 1], got {self.gae_lambda}.")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"lr_schedule must be one of {', '.join(LR_SCHEDULES)}; got {self.lr_schedule!r}.")
        if isinstance(self.lr_decay_steps, bool) or not isinstance(self.lr_decay_steps, int) or self.lr_decay_steps < 1:
            raise ValueError(f"lr_decay_steps must be an integer >= 1 (env steps), got {self.lr_decay_steps!r}.")
        if not 0.0 <= self.target_critic_alpha < 1.0:
            raise ValueError(f"target_critic_alpha must be in [0, 1), got {self.target_critic_alpha}.")
        for name in ("num_epochs", "num_minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}.")


def actor_loss(
    rewards: torch.Tensor,
    alive: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """SHAC's actor loss: ``-(sum_t gamma^t r_t + gamma^(t_end+1) V(s_end)) / (T * N)``.

    Args:
        rewards: ``[T, N]``, carrying the graph into the policy.
        alive: ``[T, N]`` bool, the rollout's ``alive_mask``.
        next_values: ``[T, N]`` target-critic values of each step's next
            observation (only the bootstrap step of each env is used).
        terminated: ``[T, N]`` bool; a terminated env is not bootstrapped.
        gamma: discount factor.
    """
    num_steps, num_envs = rewards.shape
    returns = horizon_returns(rewards, alive, gamma, next_values=next_values, terminated=terminated)
    return -returns.sum() / (num_steps * num_envs)


def critic_loss(values: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean squared error of the critic's values against fixed targets."""
    return ((values - targets) ** 2).mean()


@torch.no_grad()
def polyak_update(target: nn.Module, source: nn.Module, alpha: float) -> None:
    """``target = alpha * target + (1 - alpha) * source``, parameter by parameter."""
    for target_param, param in zip(target.parameters(), source.parameters(), strict=True):
        target_param.lerp_(param, 1.0 - alpha)


class SHAC:
    """Short-Horizon Actor-Critic trainer on one differentiable env.

    Args:
        env: a differentiable TorchRL env (see :class:`DifferentiableCollector`).
        config: hyperparameters.
        device: device of the networks.

    Attributes:
        steps_per_iteration: env steps per iteration, ``horizon * num_envs``.
    """

    def __init__(self, env: EnvBase, config: SHACConfig, device: torch.device | str = "cpu") -> None:
        self.env = env
        self.config = config
        self.device = torch.device(device)
        self.steps_per_iteration = config.horizon * env.batch_size[0]
        self.task_library = task_library(env)
        self.normalizer, self.actor = build_policy(env, config, self.device)
        obs_dim, _ = env_dims(env)
        self.critic = build_net(
            obs_dim,
            config.critic_hidden_sizes,
            1,
            num_tasks=max(len(self.task_library), 1),
            task_embedding_dim=config.task_embedding_dim,
            layer_norm=config.critic_layer_norm,
        ).to(self.device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_optimizer = torch.optim.Adam(
            self.actor.parameters(), lr=config.learning_rate, betas=config.adam_betas
        )
        self.critic_optimizer = torch.optim.Adam(
            self.critic.parameters(), lr=config.critic_learning_rate, betas=config.adam_betas
        )
        self.iteration = 0

    @functools.cached_property
    def collector(self) -> DifferentiableCollector:
        """Built at the first window (:func:`~waddle.algorithms.analytic.build_collector`)."""
        return build_collector(self.env, self.actor, self.normalizer, self.config, self.device)

    def _normalize(self, observation: torch.Tensor) -> torch.Tensor:
        return observation if self.normalizer is None else self.normalizer(observation)

    @property
    def _critic_reads_task_id(self) -> bool:
        return isinstance(self.critic, TaskConditionedMLP)

    def values(self, critic: nn.Module, observation: torch.Tensor, task_id: torch.Tensor | None = None) -> torch.Tensor:
        """``critic(normalize(observation))`` (with the task id when conditioned), without the trailing unit dimension."""
        if self._critic_reads_task_id:
            return critic(self._normalize(observation), task_id).squeeze(-1)
        return critic(self._normalize(observation)).squeeze(-1)

    def _task_ids(self, rollout: DifferentiableRollout) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """``[T, N, 1]`` task ids of each step's observation and of its next observation (``None`` unconditioned)."""
        if not self._critic_reads_task_id:
            return None, None
        # The policy's input holds the id it acted under; the step's output, the id of the episode it stepped.
        acted = torch.stack([t.policy_output[TASK_ID_KEY] for t in rollout.transitions])
        stepped = torch.stack([t.info[TASK_ID_KEY] for t in rollout.transitions]).to(acted.device)
        return acted, stepped

    def learning_rate_fraction(self) -> float:
        """The fraction of their starting values the learning rates have in the next window."""
        if self.config.lr_schedule == "constant":
            return 1.0
        return max(0.0, 1.0 - self.iteration * self.steps_per_iteration / self.config.lr_decay_steps)

    def _set_learning_rates(self) -> float:
        fraction = self.learning_rate_fraction()
        for optimizer, start in (
            (self.actor_optimizer, self.config.learning_rate),
            (self.critic_optimizer, self.config.critic_learning_rate),
        ):
            for group in optimizer.param_groups:
                group["lr"] = start * fraction
        return fraction

    def train_iteration(self) -> dict[str, float]:
        """One window: actor step through the env, critic regression, target update, graph cut."""
        cfg = self.config
        lr_fraction = self._set_learning_rates()

        # 1. actor: differentiable rollout, bootstrapped by the target critic
        start = time.perf_counter()
        rollout = self.collector.collect(cfg.horizon)
        rewards = rollout.rewards * cfg.reward_scale
        alive, terminated = rollout.alive_mask, rollout.terminations
        task_ids, next_task_ids = self._task_ids(rollout)
        next_values = self.values(self.target_critic, rollout.next_observations, next_task_ids)
        loss = actor_loss(rewards, alive, next_values, terminated, cfg.gamma)
        rollout_time = time.perf_counter() - start
        start = time.perf_counter()
        actor_step = guarded_step(loss, self.actor_optimizer, self.actor.parameters(), cfg.max_grad_norm)
        actor_time = time.perf_counter() - start

        # 2. critic: regress TD(lambda) targets on the alive steps of the detached rollout
        start = time.perf_counter()
        with torch.no_grad():
            targets = td_lambda_targets(
                rewards.detach(),
                next_values.detach(),
                terminated,
                rollout.dones,
                cfg.gamma,
                cfg.gae_lambda,
            )
            b_obs = self._normalize(rollout.observations.detach())[alive]
            b_task_ids = task_ids[alive] if task_ids is not None else None
            b_targets = targets[alive]
        critic_losses, critic_skipped = [], 0.0
        for _ in range(cfg.num_epochs):
            order = torch.randperm(b_obs.shape[0], device=b_obs.device)
            for mb_idx in order.chunk(cfg.num_minibatches):
                mb_inputs = (b_obs[mb_idx],) if b_task_ids is None else (b_obs[mb_idx], b_task_ids[mb_idx])
                mb_loss = critic_loss(self.critic(*mb_inputs).squeeze(-1), b_targets[mb_idx])
                step = guarded_step(mb_loss, self.critic_optimizer, self.critic.parameters(), cfg.max_grad_norm)
                critic_losses.append(float(mb_loss.detach()))
                critic_skipped += step["skipped"]
        critic_time = time.perf_counter() - start

        # 3. target critic, observation statistics, graph cut
        polyak_update(self.target_critic, self.critic, cfg.target_critic_alpha)
        if self.normalizer is not None:
            self.normalizer.update(rollout.observations)
        self.collector.detach_state()
        self.iteration += 1
        return {
            "losses/actor_loss": float(loss.detach()),
            "losses/critic_loss": sum(critic_losses) / len(critic_losses),
            "charts/actor_grad_norm": actor_step["grad_norm"],
            "charts/actor_update_skipped": actor_step["skipped"],
            "charts/critic_updates_skipped": critic_skipped,
            "charts/value_target_mean": float(b_targets.mean()),
            "charts/learning_rate": cfg.learning_rate * lr_fraction,
            **rollout_metrics(rollout),
            "perf/rollout_s": rollout_time,
            "perf/actor_update_s": actor_time,
            "perf/critic_update_s": critic_time,
        }

    def deterministic_policy(self) -> nn.Module:
        """The actor's mean action, clamped to the action bounds, behind the normaliser."""
        return mean_policy(self.actor, self.normalizer, self.env)

    def state_dict(self) -> dict:
        return {
            STATE_KEY: list(self.task_library),
            "actor": self.actor.state_dict(),
            "critic": self.critic.state_dict(),
            "target_critic": self.target_critic.state_dict(),
            "actor_optimizer": self.actor_optimizer.state_dict(),
            "critic_optimizer": self.critic_optimizer.state_dict(),
            "normalizer": None if self.normalizer is None else self.normalizer.state_dict(),
            "iteration": self.iteration,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore :meth:`state_dict` output; a state saved for another task library is refused
        (:class:`~waddle.algorithms.task_library.TaskLibraryError`)."""
        check_task_library(saved_task_library(state), self.task_library)
        self.actor.load_state_dict(state["actor"])
        self.critic.load_state_dict(state["critic"])
        self.target_critic.load_state_dict(state["target_critic"])
        self.actor_optimizer.load_state_dict(state["actor_optimizer"])
        self.critic_optimizer.load_state_dict(state["critic_optimizer"])
        if self.normalizer is not None:
            self.normalizer.load_state_dict(state["normalizer"])
        self.iteration = int(state["iteration"])
