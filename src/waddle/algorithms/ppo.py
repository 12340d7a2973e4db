"""Proximal Policy Optimization on a batched TorchRL env (one readable module).

One call to :meth:`PPO.train_iteration` is one PPO iteration:

1. roll the stochastic policy out for ``num_steps`` steps in every env, under
   ``no_grad``, into a ``(num_envs, num_steps)`` TensorDict, through TorchRL's
   ``Collector`` (:class:`~waddle.collectors.rollout.RolloutCollector`:
   finished envs are reset in place; the envs live in this process, or in
   collector processes or Ray actors built from ``env_factories``, which
   receive the policy's weights before every batch);
2. compute advantages and value targets with TorchRL's :class:`GAE`
   (bootstrapping on truncation, not on termination);
3. run ``num_epochs`` passes of ``num_minibatches`` shuffled minibatches
   through TorchRL's :class:`ClipPPOLoss` (clipped surrogate, value loss and
   entropy bonus), clipping the gradient norm;
4. adapt the learning rate (optional) and fold the rollout's observations
   into the running observation normaliser, which both networks share.

The normaliser is updated *after* the epochs so that, within an iteration,
the policy that scored the old log-probabilities and the one being optimised
see the same statistics (the importance ratio starts at exactly 1).

The maths PPO needs beyond TorchRL is in pure functions the tests import:
:func:`gaussian_kl`, :func:`adapt_learning_rate`, :func:`finished_episodes`
and :func:`reward_term_means`.

When the env's task library holds several tasks, the actor and the critic
each read ``"task_id"`` through their own embedding (``task_embedding_dim``
wide) appended to the normalised observation; with one task they read the
observation alone. The library's task names are saved with the
state and a state saved for another library is refused on load.

The actor reads ``"observation"`` (``actor_observation="full"``, the default)
or what the robot can measure, ``"sensor_observation"`` (``"sensors"``), or
exactly what the robot's daemon feeds its policy, ``"robot_observation"``
(``"robot"``). The critic reads ``"observation"``, then the robot observation
when the actor reads it (it alone holds the yaw-rate command), then, when the
env reports them, the drawn randomization values under ``("randomization",
<name>)``, flattened: privileged information that only training needs
(asymmetric actor-critic). When the two networks read the same entry they
share one normaliser; otherwise each has its own (the state's
``"critic_normalizer"``).
A state saved with another ``actor_observation`` is refused on load.

When the env reports its weighted reward terms (``MicroDuckEnv(diagnostics=True)``
writes ``diagnostic_reward_<term>``, summing to the reward), each iteration also
logs their mean per env step as ``reward/<term>``.
"""

from __future__ import annotations

import copy
import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.envs import EnvBase
from torchrl.modules import IndependentNormal
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from waddle.algorithms.task_library import (
    STATE_KEY,
    check_task_embedding_dim,
    check_task_library,
    saved_task_library,
    task_library,
)
from waddle.collectors.rollout import RolloutCollector
from waddle.modules.heading_memory import HeadingMemory
from waddle.modules.networks import (
    HEADING_ERROR_KEY,
    LOG_STD_BOUNDS,
    OBSERVATION_KEY,
    ROBOT_OBSERVATION_KEY,
    SENSOR_OBSERVATION_KEY,
    GaussianPolicy,
    GeneratorActor,
    PolicyMean,
    ValueNetwork,
    make_actor,
    make_critic,
)
from waddle.modules.normalizer import RunningNormalizer
from waddle.modules.task_embedding import TASK_ID_KEY

LR_SCHEDULES = ("constant", "adaptive")
ACTOR_OBSERVATIONS: dict[str, str] = {
    "full": OBSERVATION_KEY,
    "sensors": SENSOR_OBSERVATION_KEY,
    "robot": ROBOT_OBSERVATION_KEY,
}
"""``PPOConfig.actor_observation`` -> the env entry the actor reads."""
RANDOMIZATION_KEY = "randomization"
"""The env's entry holding each env's drawn randomization values, one sub-entry per parameter."""
OFF_POLICY_WEIGHT_MAX = 1.0
"""Truncation of the importance weight of an overlapped rollout's samples (see ``PPOConfig.overlap_rollout``)."""
REWARD_TERM_PREFIX = "diagnostic_reward_"
"""Entries of an env step's output holding one weighted reward term each (``MicroDuckEnv(diagnostics=True)``)."""


@dataclass(frozen=True)
class PPOConfig:
    """Hyperparameters of :class:`PPO`; the defaults train MicroDuck on a 2-core CPU."""

    num_steps: int = 32
    """Steps each env takes per rollout; a batch holds num_steps x num_envs transitions."""
    num_epochs: int = 5
    """Passes over each rollout batch."""
    num_minibatches: int = 4
    """Minibatches each batch is shuffled into per epoch."""
    learning_rate: float = 1e-3
    """Adam step size (the starting one when the schedule changes it)."""
    lr_schedule: str = "adaptive"
    """'constant', or 'adaptive': scale the step size by 1.5 to keep the KL per update near desired_kl."""
    desired_kl: float = 0.01
    """Target KL divergence per update for the 'adaptive' schedule."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE lambda: 0 is one-step TD, 1 is Monte Carlo."""
    clip_epsilon: float = 0.2
    """Clip range of the probability ratio in the surrogate objective."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (0: none, as CleanRL's and Stable-Baselines3's PPO default). The env
    clips actions to [-1, 1], so noise past a bound costs the return little and a bonus buys standard
    deviations above 1: at 0.01 a speed-range policy ended with std 1.1-2.2 and means pinned at the
    bounds, its deterministic gait flipping joints between them. Without it a walk policy's std fell to
    0.4-0.6 by 3M env steps, and standing and walking were found as fast (262,144 and 0.9M env steps)."""
    value_coef: float = 1.0
    """Weight of the value (critic) loss."""
    max_grad_norm: float = 1.0
    """Gradients are rescaled to at most this global norm."""
    actor_hidden_sizes: tuple[int, ...] = (128, 128)
    """Hidden layer widths of the policy network."""
    critic_hidden_sizes: tuple[int, ...] = (256, 128)
    """Hidden layer widths of the value network."""
    init_log_std: float = 0.0
    """Initial log standard deviation of the Gaussian policy (0: std 1; actions live in [-1, 1], the env clips samples)."""
    normalize_observations: bool = True
    """Normalise observations by running mean and variance (frozen at identity when False)."""
    task_embedding_dim: int = 8
    """Width of the task-id embedding the actor and the critic read beside the observation when the env's
    task library holds more than one task (0: they never read the task id)."""
    actor_observation: str = "full"
    """What the actor reads: 'full' (the env's 56-value observation, linear velocity included), 'sensors'
    (sensor_observation, what the robot measures on board) or 'robot' (robot_observation: the 61 floats the
    MicroDuck's daemon feeds its policy); the critic keeps the full observation."""
    mirror_loss_coef: float = 0.0
    """Weight of the mirror loss (0: none): the mean over a minibatch of the squared distance, summed over
    action entries, between the actor's mean action on the left-right reflected observation and the
    reflection of its mean action, the latter held fixed (rsl_rl's ``mirror_loss_coeff``). The env says how
    its entries reflect (``MicroDuckEnv.MIRRORS``); a symmetric robot's straight gait is equivariant, and a
    policy that is not turns the same way every cycle."""
    symmetric_policy: bool | None = None
    """Whether the deterministic policy (``waddle eval``, ``waddle export``) is the actor's mean averaged with
    its mirror image, exactly left-right equivariant (:class:`~waddle.modules.networks.PolicyMean`). Training
    samples around the actor's own mean either way. ``None``: on for an actor that reads the robot observation
    and is trained with a mirror loss (the robot's file), off otherwise."""
    heading_memory_s: float = 0.0
    """Time constant, seconds, of the actor's heading memory (0: none; ``math.inf``: never forgets). With one,
    an action entry that the env names (``MicroDuckEnv.HEADING_MEMORY``: the head's roll on the robot
    observation) is not sampled but computed from the previous action as a leaky integral of the yaw rate the
    command did not ask for (:class:`~waddle.modules.heading_memory.HeadingMemory`): a feed-forward actor
    that reads its previous output can then see its heading error, which the gyro alone does not show."""
    overlap_rollout: bool = False
    """Collect the next rollout in a background thread while the update runs, with the policy from before
    that update: the simulator keeps stepping during the update, at the price of one iteration of policy
    lag, corrected as decoupled PPO does (the ratio is clipped around the policy the update starts from;
    the advantage carries the importance weight from the acting policy, truncated at 1)."""

    def __post_init__(self) -> None:
        check_task_embedding_dim(self)
        if self.actor_observation not in ACTOR_OBSERVATIONS:
            raise ValueError(
                f"PPOConfig.actor_observation must be one of {tuple(ACTOR_OBSERVATIONS)}, "
                f"got {self.actor_observation!r}."
            )
        for name in ("num_steps", "num_epochs", "num_minibatches"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"PPOConfig.{name} must be an integer >= 1, got {value!r}.")
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"PPOConfig.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}.")
        for name in ("learning_rate", "desired_kl", "clip_epsilon", "max_grad_norm"):
            if not getattr(self, name) > 0:
                raise ValueError(f"PPOConfig.{name} must be > 0, got {getattr(self, name)!r}.")
        if not (isinstance(self.mirror_loss_coef, (int, float)) and 0.0 <= self.mirror_loss_coef < math.inf):
            raise ValueError(f"PPOConfig.mirror_loss_coef must be a finite number >= 0, got {self.mirror_loss_coef!r}.")
        if isinstance(self.heading_memory_s, bool) or not (
            isinstance(self.heading_memory_s, (int, float)) and self.heading_memory_s >= 0
        ):
            raise ValueError(
                f"PPOConfig.heading_memory_s must be a number >= 0 (0: no memory, inf: never forgets), "
                f"got {self.heading_memory_s!r}."
            )
        if self.symmetric_policy not in (None, True, False):
            raise ValueError(f"PPOConfig.symmetric_policy must be None, True or False, got {self.symmetric_policy!r}.")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"PPOConfig.{name} must be in [0, 1], got {getattr(self, name)!r}.")
        low, high = LOG_STD_BOUNDS
        if not low <= self.init_log_std <= high:
            raise ValueError(f"PPOConfig.init_log_std must be in [{low}, {high}], got {self.init_log_std!r}.")
        object.__setattr__(self, "actor_hidden_sizes", tuple(int(w) for w in self.actor_hidden_sizes))
        object.__setattr__(self, "critic_hidden_sizes", tuple(int(w) for w in self.critic_hidden_sizes))


class NonFiniteLossError(FloatingPointError):
    """A loss or gradient turned NaN or infinite; the update was not applied."""


class ActorObservationError(ValueError):
    """A policy state was trained on another actor observation than the trainer reads."""


def saved_actor_observation(state: Mapping[str, Any]) -> str:
    """The ``actor_observation`` a PPO state was trained with (``"full"`` for states that predate the choice)."""
    config = state.get("config")
    return str(config.get("actor_observation", "full")) if isinstance(config, Mapping) else "full"


def check_actor_observation(saved: str, requested: str, *, what: str = "checkpoint") -> None:
    """Refuse to run an actor on another observation than the one it was trained on.

    Raises:
        ActorObservationError: naming both choices and what each entry holds.

    Example:
        >>> check_actor_observation("sensors", "full")
        Traceback (most recent call last):
        ...
        waddle.algorithms.ppo.ActorObservationError: the checkpoint's actor was trained on actor_observation 'sensors' (sensor_observation: IMU, encoders, command, gait clock, previous action; 53 values) but 'full' was asked for (observation: the 56-value ground truth, linear velocity included); the two layouts differ in width and meaning, so use 'sensors'.
    """
    if saved == requested:
        return
    raise ActorObservationError(
        f"the {what}'s actor was trained on actor_observation {saved!r} ({_DESCRIPTIONS.get(saved, saved)}) but "
        f"{requested!r} was asked for ({_DESCRIPTIONS.get(requested, requested)}); the two layouts differ in width "
        f"and meaning, so use {saved!r}."
    )


_DESCRIPTIONS = {
    "full": "observation: the 56-value ground truth, linear velocity included",
    "sensors": "sensor_observation: IMU, encoders, command, gait clock, previous action; 53 values",
    "robot": "robot_observation: the MicroDuck daemon's 61 floats, no gait clock",
}


def critic_keys(env: EnvBase, actor_key: str = OBSERVATION_KEY) -> list[str | tuple[str, str]]:
    """The entries the critic reads, in order: ``"observation"``, the robot observation and the heading
    error when the actor reads the robot observation, then each ``("randomization", name)`` the env reports
    (none when it reports no randomization).

    A robot actor cannot see its heading, so the critic is told it: without it the
    return of ``heading_hold`` is noise to the value function."""
    keys: list[str | tuple[str, str]] = [OBSERVATION_KEY]
    if actor_key == ROBOT_OBSERVATION_KEY:
        keys.append(ROBOT_OBSERVATION_KEY)
        if HEADING_ERROR_KEY in env.observation_spec.keys():
            keys.append(HEADING_ERROR_KEY)
    values = env.observation_spec.get(RANDOMIZATION_KEY, None)
    if values is not None:
        keys += [(RANDOMIZATION_KEY, name) for name in values.keys()]
    return keys


def flat_width(env: EnvBase, keys: list[str | tuple[str, str]]) -> int:
    """Total width of ``keys`` of ``env``'s observations, each flattened after the batch dimension."""
    return sum(math.prod(env.observation_spec[key].shape[len(env.batch_size) :]) for key in keys)


@contextmanager
def torch_threads(count: int | None) -> Iterator[None]:
    """Run the block with ``count`` threads for torch's ops, then restore the previous count (``None``: as is)."""
    if count is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def default_update_threads(config: PPOConfig, cores: int) -> int:
    """The threads of PPO's update when none are asked for: every core, which the physics pool leaves
    idle while the plain loop learns; one with ``overlap_rollout``, whose rollout holds the cores then.

    On 2 cores a second update thread cuts the update's wall time by a tenth for twice its CPU time:
    overlapped, that CPU time is taken from the physics (PPO at 0.56 of the C limit with two update
    threads, 0.65 with one; ``benchmarks/throughput.py``).
    """
    return 1 if config.overlap_rollout else cores


def adapt_learning_rate(
    lr: float, kl: float, desired_kl: float, *, factor: float = 1.5, bounds: tuple[float, float] = (1e-5, 1e-2)
) -> float:
    """The KL-adaptive step size: divide by ``factor`` when ``kl > 2 desired``,
    multiply by it when ``kl < desired / 2``, then clamp to ``bounds``.

    Example:
        >>> adapt_learning_rate(1e-3, kl=0.05, desired_kl=0.01)
        0.0006666666666666666
    """
    if kl > 2.0 * desired_kl:
        lr = lr / factor
    elif kl < 0.5 * desired_kl:
        lr = lr * factor
    return min(max(lr, bounds[0]), bounds[1])


def gaussian_kl(old_loc: torch.Tensor, old_scale: torch.Tensor, loc: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of KL(old || new) between diagonal Gaussians, summed over action entries.

    Example:
        >>> one, zero = torch.ones(1, 1), torch.zeros(1, 1)
        >>> gaussian_kl(zero, one, one, one)  # 0.5 * (mean difference / std)^2
        tensor(0.5000)
    """
    kl = torch.log(scale / old_scale) + (old_scale**2 + (old_loc - loc) ** 2) / (2.0 * scale**2) - 0.5
    return kl.sum(-1).mean()


def mirrors_of(
    env: EnvBase, key: str, asked_by: str = "PPOConfig.mirror_loss_coef > 0"
) -> tuple[Callable[[torch.Tensor], torch.Tensor], ...]:
    """The reflections of ``env``'s entry ``key`` and of its action, from the env's ``MIRRORS`` mapping.

    Raises:
        ValueError: the env declares no mirror for ``key`` or for ``"action"``.
    """
    mirrors = getattr(env, "MIRRORS", None) or {}
    missing = [name for name in (key, "action") if name not in mirrors]
    if missing:
        raise ValueError(
            f"{asked_by} needs the env's left-right reflection of {missing}, and "
            f"{type(env).__name__} declares {sorted(mirrors) or 'none'} (a MIRRORS mapping, as MicroDuckEnv's); "
            "set mirror_loss_coef=0 and symmetric_policy=False for an env without one."
        )
    return mirrors[key], mirrors["action"]


def heading_memory_of(env: EnvBase, key: str, time_constant_s: float) -> HeadingMemory | None:
    """The heading memory of an actor reading ``key`` of ``env``, with this time constant (``None`` at 0).

    Raises:
        ValueError: ``env`` names no heading memory for ``key``.
    """
    if time_constant_s == 0:
        return None
    layouts = getattr(env, "HEADING_MEMORY", None) or {}
    if key not in layouts:
        raise ValueError(
            f"PPOConfig.heading_memory_s > 0 needs an actor observation whose heading memory the env names; "
            f"{type(env).__name__} names one for {sorted(layouts) or 'none'} (HEADING_MEMORY), the actor reads "
            f"{key!r}. Use actor_observation='robot' with MicroDuckEnv, or heading_memory_s=0."
        )
    layout = dict(layouts[key])
    action_scale = float(env.action_scale)
    limit_rad = layout.pop("limit_rad", math.inf)
    return HeadingMemory(
        **{name: int(index) for name, index in layout.items()},
        control_dt=float(env.control_dt),
        action_scale=action_scale,
        time_constant_s=float(time_constant_s),
        limit=min(1.0, limit_rad / action_scale),
    )


def mirror_loss(
    policy: GaussianPolicy,
    observation: torch.Tensor,
    task_id: torch.Tensor | None,
    observation_mirror: Callable[[torch.Tensor], torch.Tensor],
    action_mirror: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Mean over the batch of ``|mu(mirror(o)) - mirror(mu(o))|^2``, the second mean action held fixed.

    Zero exactly when the actor's mean commutes with the reflection on these
    observations; its gradient moves only the answer to the reflected ones.
    """
    both = torch.cat([observation, observation_mirror(observation)])
    task_ids = None if task_id is None else torch.cat([task_id, task_id])
    loc, _ = policy(both, task_ids)
    direct, reflected = loc.chunk(2)
    return (reflected - action_mirror(direct).detach()).pow(2).sum(-1).mean()


def finished_episodes(
    rewards: torch.Tensor, dones: torch.Tensor, running_return: torch.Tensor, running_length: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accumulate per-env returns and lengths over a ``(num_envs, T)`` rollout.

    ``running_return`` and ``running_length`` (``(num_envs,)``) hold the
    unfinished episodes' totals and are updated in place; an env's totals go
    back to zero after a done step.

    Returns:
        the returns and lengths of the episodes that finished, in time order.

    Example:
        >>> ret, length = torch.zeros(1), torch.zeros(1, dtype=torch.long)
        >>> finished_episodes(torch.tensor([[1.0, 2.0, 3.0]]), torch.tensor([[False, True, False]]), ret, length)
        (tensor([3.]), tensor([2]))
        >>> ret, length
        (tensor([3.]), tensor([1]))
    """
    returns, lengths = [], []
    for t in range(rewards.shape[1]):
        running_return += rewards[:, t]
        running_length += 1
        done = dones[:, t]
        returns.append(running_return[done].clone())
        lengths.append(running_length[done].clone())
        running_return.masked_fill_(done, 0.0)
        running_length.masked_fill_(done, 0)
    return torch.cat(returns), torch.cat(lengths)


def reward_term_means(step_output: TensorDictBase) -> dict[str, float]:
    """``reward/<term>``: the mean per env step of each ``diagnostic_reward_<term>`` entry.

    Args:
        step_output: the ``"next"`` part of a rollout (any batch shape); its
            entries named :data:`REWARD_TERM_PREFIX` ``+ term`` are read.

    Example:
        >>> from tensordict import TensorDict
        >>> out = TensorDict({"diagnostic_reward_upright": torch.tensor([[1.0], [3.0]]),
        ...                   "reward": torch.tensor([[1.0], [3.0]])}, batch_size=[2])
        >>> reward_term_means(out)
        {'reward/upright': 2.0}
    """
    return {
        f"reward/{key[len(REWARD_TERM_PREFIX) :]}": float(step_output[key].mean())
        for key in step_output.keys()
        if isinstance(key, str) and key.startswith(REWARD_TERM_PREFIX)
    }


class PPO:
    """PPO trainer for a batched env with an ``"observation"`` entry and a bounded action.

    Args:
        env: a TorchRL env with ``batch_size=(num_envs,)``, a flat
            ``"observation"`` and a bounded flat action. Sampled actions are
            not squashed: the env clips them to its bounds (MicroDuckEnv
            does), and the deterministic policy clamps its mean the same way.
        config: hyperparameters.
        device: where the networks live (the env's device by default).
        update_threads: threads of torch's ops during the update, restored
            after it (``None``: leave torch's setting alone). The physics
            pool idles while the networks learn, so on a CPU the update may
            use every core even when the rollout keeps torch to one thread.
        env_factories: to collect outside this process, one picklable
            ``() -> env`` per collector (see
            :func:`waddle.algorithms.presets.collector_envs`); their envs'
            batches are concatenated in order, and ``env`` then only
            describes that batch (specs, total size): it is never stepped.
        collector_backend: ``"process"`` or ``"ray"``, for ``env_factories``.
        ray_init: ``ray.init`` keyword arguments for the ``"ray"`` backend.

    Attributes:
        env_steps: env steps taken so far (``num_envs`` per env step).
        iteration: iterations completed so far.
        steps_per_iteration: env steps per iteration, ``num_steps * num_envs``.

    Example:
        >>> from waddle.envs import MicroDuckEnv
        >>> env = MicroDuckEnv(tasks=[MicroDuckEnv.standing_task()], num_envs=256, seed=0)  # doctest: +SKIP
        >>> trainer = PPO(env, PPOConfig())  # doctest: +SKIP
        >>> for _ in range(40):  # doctest: +SKIP
        ...     metrics = trainer.train_iteration()
        >>> metrics["charts/episode_length"] > 450  # doctest: +SKIP
        True
    """

    def __init__(
        self,
        env: EnvBase,
        config: PPOConfig | None = None,
        device: torch.device | str | None = None,
        *,
        update_threads: int | None = None,
        env_factories: Sequence[Callable[[], EnvBase]] | None = None,
        collector_backend: str = "process",
        ray_init: dict[str, Any] | None = None,
    ) -> None:
        if update_threads is not None and (
            isinstance(update_threads, bool) or not isinstance(update_threads, int) or update_threads < 1
        ):
            raise ValueError(f"update_threads must be an integer >= 1 or None, got {update_threads!r}.")
        self.update_threads = update_threads
        self.env = env
        self.config = config = PPOConfig() if config is None else config
        self.device = torch.device(env.device if device is None else device)
        if len(env.batch_size) != 1:
            raise ValueError(f"PPO needs an env with batch_size=(num_envs,), got {tuple(env.batch_size)}.")
        self.num_envs = env.batch_size[0]
        self.steps_per_iteration = config.num_steps * self.num_envs
        self.actor_key = ACTOR_OBSERVATIONS[config.actor_observation]
        if self.actor_key not in env.observation_spec.keys():
            raise ValueError(
                f"PPOConfig.actor_observation={config.actor_observation!r} reads {self.actor_key!r}, which this env "
                f"does not report; its entries: {sorted(map(str, env.observation_spec.keys()))}."
            )
        self.mirrors = mirrors_of(env, self.actor_key) if config.mirror_loss_coef > 0 else None
        self._policy_mirrors = (
            mirrors_of(env, self.actor_key, "PPOConfig.symmetric_policy=True") if self.symmetric_policy else None
        )
        self.critic_keys = critic_keys(env, self.actor_key)
        observation_dim = env.observation_spec[self.actor_key].shape[-1]
        action_dim = env.action_spec.shape[-1]
        low, high = env.action_spec.space.low, env.action_spec.space.high
        self.action_low, self.action_high = float(low.min()), float(high.max())
        self.task_library = task_library(env)
        tasks = dict(num_tasks=max(len(self.task_library), 1), task_embedding_dim=config.task_embedding_dim)

        # Networks: one normaliser shared by the actor and the critic when both read the same entry.
        self.normalizer = RunningNormalizer(observation_dim).to(self.device)
        self.asymmetric = self.critic_keys != [self.actor_key]
        self.critic_normalizer = (
            RunningNormalizer(flat_width(env, self.critic_keys)).to(self.device) if self.asymmetric else None
        )
        self.policy = GaussianPolicy(
            self.normalizer,
            action_dim,
            config.actor_hidden_sizes,
            init_std=math.exp(config.init_log_std),
            observation_key=self.actor_key,
            memory=heading_memory_of(env, self.actor_key, config.heading_memory_s),
            **tasks,
        )
        critic_normalizer = self.normalizer if self.critic_normalizer is None else self.critic_normalizer
        self.value = ValueNetwork(critic_normalizer, config.critic_hidden_sizes, **tasks)
        self.policy.to(self.device)
        self.value.to(self.device)
        self.actor = make_actor(self.policy)
        self.critic = make_critic(self.value, self.critic_keys)

        # Objective and advantage estimator, both from TorchRL.
        self.loss_module = ClipPPOLoss(
            self.actor,
            self.critic,
            clip_epsilon=config.clip_epsilon,
            entropy_bonus=config.entropy_coef > 0,
            entropy_coeff=config.entropy_coef,
            critic_coeff=config.value_coef,
            loss_critic_type="l2",
            normalize_advantage=True,
        )
        self.advantage_module = GAE(
            gamma=config.gamma, lmbda=config.gae_lambda, value_network=self.critic, average_gae=False
        )
        self.optimizer = torch.optim.Adam(
            list(self.policy.parameters()) + list(self.value.parameters()), lr=config.learning_rate
        )
        self.learning_rate = config.learning_rate

        # Overlapped rollouts: a copy of the policy acts in the collecting thread while this one learns,
        # drawing its actions from its own generator (TorchRL's losses switch the process-wide
        # exploration type to deterministic while they run, and the update shuffles with the global one).
        self._rollout_policy: GaussianPolicy | None = None
        self._rollout_actor: GeneratorActor | None = None
        self._next_batch: TensorDictBase | None = None
        if config.overlap_rollout:
            self._rollout_policy = copy.deepcopy(self.policy)
            seed = int(torch.randint(0, 2**62, (1,)))
            generator = torch.Generator(device=self.device).manual_seed(seed)
            self._rollout_actor = GeneratorActor(self._rollout_policy, generator)

        # Rollouts through TorchRL's Collector: on this env, or on env_factories' envs in other processes.
        # It is built at the first rollout: building resets the envs, which an evaluation that only
        # loads a policy into this trainer must not see.
        if env_factories is not None:
            if config.overlap_rollout:
                raise ValueError(
                    "PPOConfig.overlap_rollout needs the envs in this process; with several collectors, "
                    "leave it off (the collector processes step while this one waits)."
                )
            collected = sum(int(getattr(factory, "num_envs", 0)) for factory in env_factories)
            if collected != self.num_envs:
                raise ValueError(
                    f"the collectors' envs add up to {collected}, but env has batch size {self.num_envs}; "
                    "env describes the batch the collectors deliver (its specs and size)."
                )
        self._acting_actor = self.actor if self._rollout_actor is None else self._rollout_actor
        self._collector_options: dict[str, Any] = (
            {"env": env}
            if env_factories is None
            else {"env_factories": list(env_factories), "backend": collector_backend, "ray_init": ray_init}
        )
        self._collector: RolloutCollector | None = None

        # Rollout state carried across iterations.
        self.env_steps = 0
        self.iteration = 0
        self._running_return = torch.zeros(self.num_envs, device=self.device)
        self._running_length = torch.zeros(self.num_envs, dtype=torch.long, device=self.device)
        self._recent_returns: deque[float] = deque(maxlen=max(self.num_envs, 16))
        self._recent_lengths: deque[float] = deque(maxlen=max(self.num_envs, 16))

    # ------------------------------------------------------------------
    # Rollout
    # ------------------------------------------------------------------

    @torch.no_grad()
    def collect(self) -> TensorDictBase:
        """Roll the stochastic policy out for ``num_steps``; returns a ``(num_envs, num_steps)`` batch."""
        batch = self._rollout()
        self.env_steps += batch.numel()
        return batch

    @property
    def collector(self) -> RolloutCollector:
        """The rollouts' source, started on first use (collector processes or Ray actors included)."""
        if self._collector is None:
            self._collector = RolloutCollector(
                self._acting_actor, num_steps=self.config.num_steps, **self._collector_options
            )
        return self._collector

    def start_collectors(self) -> None:
        """Start the collector now rather than at the first rollout: remote ones fail here, before training."""
        self.collector  # noqa: B018 (the property starts it)

    @torch.no_grad()
    def _rollout(self) -> TensorDictBase:
        """The collector's next batch, acted by the weights the acting actor holds now."""
        self.collector.update_weights(self._acting_actor)
        return self.collector.next_batch().to(self.device)

    def close(self) -> None:
        """Stop the collectors (their processes or actors, if any); a later rollout starts them again."""
        if self._collector is not None:
            self._collector.shutdown()
            self._collector = None

    def _record_episodes(self, batch: TensorDictBase) -> None:
        rewards = batch["next", "reward"].squeeze(-1)
        dones = batch["next", "done"].squeeze(-1)
        returns, lengths = finished_episodes(rewards, dones, self._running_return, self._running_length)
        self._recent_returns.extend(returns.tolist())
        self._recent_lengths.extend(lengths.tolist())

    # ------------------------------------------------------------------
    # Update
    # ------------------------------------------------------------------

    def update(self, batch: TensorDictBase) -> dict[str, float]:
        """GAE, then ``num_epochs`` x ``num_minibatches`` clipped-PPO steps on ``batch``.

        Raises:
            NonFiniteLossError: a minibatch loss or gradient is not finite
                (nothing from that minibatch is applied).
        """
        config = self.config
        with torch.no_grad():
            self.advantage_module(batch)
        # With the advantages in, the loss never reads the next step's entries: leave them out of the shuffles.
        b_data = batch.exclude("next").reshape(-1)
        if config.overlap_rollout:
            # The policy that acted is one update behind (decoupled PPO, Hilton et al. 2021): the ratio is
            # clipped around the policy this update starts from, and the advantage carries the importance
            # weight from the acting policy to it, truncated at 1 as V-trace does. The adaptive step size
            # keeps measuring the KL from the acting policy: from the start of the update, it let the
            # steps grow until the lagged data stopped teaching (a point-mass task stalled).
            with torch.no_grad():
                loc, scale = self.policy(b_data[self.actor_key], self._task_id(b_data))
                proximal = IndependentNormal(loc, scale).log_prob(b_data["action"])
                weight = (proximal - b_data["action_log_prob"]).exp().clamp(max=OFF_POLICY_WEIGHT_MAX)
                b_data["advantage"] = b_data["advantage"] * weight.unsqueeze(-1)
                b_data["action_log_prob"] = proximal
        batch_size = b_data.numel()
        minibatch_size = batch_size // config.num_minibatches
        logged = {  # ClipPPOLoss output -> our metric name
            "loss_objective": "losses/policy_loss",
            "loss_critic": "losses/value_loss",
            "loss_entropy": "losses/entropy_loss",
            "entropy": "charts/entropy",
            "kl_approx": "charts/kl_approx",
            "clip_fraction": "charts/clip_fraction",
            "explained_variance": "charts/explained_variance",
        }
        extras = ["charts/kl", "charts/grad_norm"] + (["losses/mirror_loss"] if self.mirrors is not None else [])
        sums = dict.fromkeys([*logged.values(), *extras], 0.0)
        num_updates = 0
        for _epoch in range(config.num_epochs):
            # One gather per epoch; the minibatches are then contiguous slices of it.
            shuffled = b_data[torch.randperm(batch_size, device=self.device)]
            for start in range(0, minibatch_size * config.num_minibatches, minibatch_size):
                mb_data = shuffled[start : start + minibatch_size]
                losses = self.loss_module(mb_data)
                loss = sum(value for key, value in losses.items() if key.startswith("loss_"))
                if self.mirrors is not None:
                    mirrored = mirror_loss(self.policy, mb_data[self.actor_key], self._task_id(mb_data), *self.mirrors)
                    sums["losses/mirror_loss"] += float(mirrored.detach())
                    loss = loss + config.mirror_loss_coef * mirrored
                if not torch.isfinite(loss):
                    parts = ", ".join(
                        f"{logged[key]}={float(value.detach()):.4g}" for key, value in losses.items() if key in logged
                    )
                    raise NonFiniteLossError(
                        f"PPO loss is {float(loss.detach())} at iteration {self.iteration + 1} ({parts})."
                    )
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                grad_norm = torch.nn.utils.clip_grad_norm_(self._parameters(), config.max_grad_norm)
                if not torch.isfinite(grad_norm):
                    raise NonFiniteLossError(
                        f"PPO gradient norm is {float(grad_norm)} at iteration {self.iteration + 1}."
                    )
                self.optimizer.step()

                if config.lr_schedule == "adaptive":
                    with torch.no_grad():
                        new_loc, new_scale = self.policy(mb_data[self.actor_key], self._task_id(mb_data))
                        kl = gaussian_kl(mb_data["loc"], mb_data["scale"], new_loc, new_scale)
                    sums["charts/kl"] += float(kl)
                    self._set_learning_rate(adapt_learning_rate(self.learning_rate, float(kl), config.desired_kl))
                for key, name in logged.items():
                    if key in losses.keys():
                        sums[name] += float(losses[key].detach().mean())
                sums["charts/grad_norm"] += float(grad_norm)
                num_updates += 1
        return {name: total / num_updates for name, total in sums.items()}

    def _task_id(self, data: TensorDictBase) -> torch.Tensor | None:
        """The task ids of ``data`` for a task-conditioned policy, ``None`` for one that does not read them."""
        return data[TASK_ID_KEY] if self.policy.reads_task_id else None

    def _parameters(self) -> list[torch.nn.Parameter]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def _set_learning_rate(self, lr: float) -> None:
        self.learning_rate = lr
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    # ------------------------------------------------------------------
    # One iteration
    # ------------------------------------------------------------------

    def train_iteration(self) -> dict[str, float]:
        """Collect one rollout, update on it, then refresh the observation statistics.

        Returns:
            scalars named like CleanRL's: ``charts/episode_return`` and
            ``charts/episode_length`` (means over the most recent finished
            episodes, one per env at most; NaN before any), ``charts/reward_mean``
            (per step), ``losses/policy_loss``, ``losses/value_loss``,
            ``losses/entropy_loss``, ``charts/entropy``, ``charts/kl`` (exact,
            after each step; 0 unless the schedule is adaptive), ``charts/kl_approx``,
            ``charts/clip_fraction``, ``charts/explained_variance``,
            ``charts/grad_norm``, ``charts/learning_rate``, ``charts/action_std``,
            the seconds spent in ``perf/rollout_s`` and ``perf/update_s``, and
            this process's CPU seconds (every thread, the physics pool's
            included; collector processes and Ray actors not counted) in each,
            ``perf/rollout_cpu_s`` and ``perf/update_cpu_s`` (NaN with
            ``overlap_rollout``, whose phases run at once), and in the whole
            iteration, ``perf/iteration_cpu_s``;
            with an env that reports its reward terms, ``reward/<term>``
            (:func:`reward_term_means`; they sum to ``charts/reward_mean``).
        """
        cpu_start = time.process_time()
        if self.config.overlap_rollout:
            batch, stats, rollout_time, update_time = self._overlapped_iteration()
            # The phases run at once: only the iteration's CPU total is known.
            rollout_cpu = math.nan
        else:
            start = time.perf_counter()
            batch = self.collect()
            self._record_episodes(batch)
            rollout_time = time.perf_counter() - start
            rollout_cpu = time.process_time() - cpu_start
            start = time.perf_counter()
            stats = self._learn(batch)
            update_time = time.perf_counter() - start
        iteration_cpu = time.process_time() - cpu_start
        self.iteration += 1

        def mean(values: deque[float]) -> float:
            return sum(values) / len(values) if values else math.nan

        return {
            "charts/episode_return": mean(self._recent_returns),
            "charts/episode_length": mean(self._recent_lengths),
            "charts/reward_mean": float(batch["next", "reward"].mean()),
            **reward_term_means(batch["next"]),
            **stats,
            "charts/learning_rate": self.learning_rate,
            "charts/action_std": float(
                self.policy.log_std.detach().clamp(*LOG_STD_BOUNDS).exp()[~self.policy.pinned].mean()
            ),
            "perf/rollout_s": rollout_time,
            "perf/update_s": update_time,
            "perf/rollout_cpu_s": rollout_cpu,
            "perf/update_cpu_s": iteration_cpu - rollout_cpu,
            "perf/iteration_cpu_s": iteration_cpu,
        }

    def _learn(self, batch: TensorDictBase) -> dict[str, float]:
        """The update on ``batch``, then the observation statistics refreshed with it."""
        with torch_threads(self.update_threads):
            stats = self.update(batch)
        if self.config.normalize_observations:
            self.normalizer.update(batch[self.actor_key])
            if self.critic_normalizer is not None:
                self.critic_normalizer.update(self.critic_input(batch))
        return stats

    def _overlapped_iteration(self) -> tuple[TensorDictBase, dict[str, float], float, float]:
        """Learn from the batch collected during the last update while the next one is collected.

        The collecting thread is joined before this returns, so no rollout is
        in flight between iterations (a checkpoint or ``env.close()`` finds
        the env idle). The first iteration collects its batch first; the
        batch collected during the last iteration of a run is never learned from.
        """
        start = time.perf_counter()
        batch = self._next_batch
        if batch is None:
            batch = self.collect()
        self._next_batch = None
        self._record_episodes(batch)
        self._rollout_policy.load_state_dict(self.policy.state_dict())
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="waddle-rollout")
        try:
            pending = executor.submit(self._rollout)
            learn_start = time.perf_counter()
            try:
                stats = self._learn(batch)
            finally:
                # An update that raised still waits for the rollout: the env must be idle when the caller sees it.
                learned = time.perf_counter()
                next_batch = pending.result()
        finally:
            executor.shutdown(wait=True)
        self._next_batch = next_batch
        self.env_steps += next_batch.numel()
        waited = time.perf_counter() - learned
        # The update's time is its own; the rollout's is what the update did not hide.
        return batch, stats, learn_start - start + waited, learned - learn_start

    # ------------------------------------------------------------------
    # Policy and state
    # ------------------------------------------------------------------

    def critic_input(self, data: TensorDictBase) -> torch.Tensor:
        """What the critic reads from ``data``: its entries flattened and concatenated, batch shape kept."""
        batch = data.batch_dims
        return torch.cat([data[key].flatten(batch) for key in self.critic_keys], dim=-1)

    def deterministic_policy(self) -> PolicyMean:
        """The exportable ``observation -> action`` module (normaliser baked in, mean clamped);
        ``(observation, task_id) -> action`` when task-conditioned. Its ``observation_key``
        names the env entry it reads (``"sensor_observation"`` for a sensors policy)."""
        return PolicyMean(self.policy, self.action_low, self.action_high, self._policy_mirrors).eval()

    @property
    def symmetric_policy(self) -> bool:
        """Whether :meth:`deterministic_policy` averages the actor with its mirror image
        (``PPOConfig.symmetric_policy``, its ``None`` resolved)."""
        if self.config.symmetric_policy is not None:
            return self.config.symmetric_policy
        return self.actor_key == ROBOT_OBSERVATION_KEY and self.config.mirror_loss_coef > 0

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue training: networks, normaliser, optimiser, counters,
        and the task library the networks were built for."""
        return {
            "config": asdict(self.config),
            STATE_KEY: list(self.task_library),
            "policy": self.policy.state_dict(),
            "value": self.value.state_dict(),
            "normalizer": self.normalizer.state_dict(),
            **({} if self.critic_normalizer is None else {"critic_normalizer": self.critic_normalizer.state_dict()}),
            "optimizer": self.optimizer.state_dict(),
            "learning_rate": self.learning_rate,
            "env_steps": self.env_steps,
            "iteration": self.iteration,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output (the env is reset, not restored).

        Raises:
            TaskLibraryError: the state was saved for another task library.
            ActorObservationError: the state's actor read another observation.
        """
        check_task_library(saved_task_library(state), self.task_library)
        check_actor_observation(saved_actor_observation(state), self.config.actor_observation, what="state")
        self.policy.load_state_dict(state["policy"])
        self.value.load_state_dict(state["value"])
        self.normalizer.load_state_dict(state["normalizer"])
        if self.critic_normalizer is not None:
            self.critic_normalizer.load_state_dict(state["critic_normalizer"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._set_learning_rate(float(state["learning_rate"]))
        self.env_steps = int(state["env_steps"])
        self.iteration = int(state["iteration"])
        self._running_return.zero_()
        self._running_length.zero_()
