"""Rollouts that keep the autograd graph from the policy through the env.

:class:`DifferentiableCollector` steps a differentiable TorchRL env with a
TensorDict policy and hands back every tensor with its history intact, so a
loss on the rollout's rewards backpropagates through the simulator into the
policy parameters (analytic policy gradients, SHAC). Nothing is preallocated
or written in place: a rollout is an immutable tuple of transitions.

Graph cuts are explicit. The carried state keeps its history across
:meth:`DifferentiableCollector.collect` calls until
:meth:`DifferentiableCollector.detach_state` starts a new truncated-BPTT
segment, which also calls the env's own ``detach_state()`` (the physics cut)
when the env has one.

Any differentiable TorchRL env will do, however it names its entries and
however many batch dimensions it has (:class:`~waddle.collectors.env_layout.EnvLayout`):
the policy's observation is the env's observation entries flattened per env,
and the ``terminated``/``truncated`` flags are derived from the done entries
the env declares (:class:`~waddle.collectors.episode_ends.EpisodeEnds`).

Shapes: ``N`` envs (the product of the env's batch dimensions), ``T`` steps,
``F`` observation features, ``A...`` the per-env action shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from tensordict.utils import NestedKey
from torch import nn
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, set_exploration_type

from waddle.collectors.env_layout import EnvLayout

__all__ = [
    "ActionAdjointStats",
    "DifferentiableCollector",
    "DifferentiableRollout",
    "DifferentiableTransition",
    "clip_per_env_norm",
]


def clip_per_env_norm(gradient: torch.Tensor, max_norm: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Rescale each env's row of ``gradient`` ``[N, ...]`` to an L2 norm of at most ``max_norm``.

    Returns:
        ``(clipped, norms)``: the clipped gradient and the per-env norms ``[N]``
        measured before clipping.
    """
    norms = torch.linalg.vector_norm(gradient.reshape(gradient.shape[0], -1), dim=1)
    scale = (max_norm / norms.clamp_min(torch.finfo(norms.dtype).tiny)).clamp(max=1.0)
    return gradient * scale.reshape((-1,) + (1,) * (gradient.ndim - 1)), norms


@dataclass
class ActionAdjointStats:
    """Per-env action-adjoint norms seen by the clipping hook during backward passes.

    Filled in as backward runs (the hooks fire then), one record per env and
    step; the totals stay on the device until read.

    Args:
        clip_norm: the per-env norm the adjoint is clipped to.
        device: where the running totals live.
    """

    clip_norm: float
    device: torch.device | str = "cpu"
    num_samples: torch.Tensor = field(init=False)
    num_clipped: torch.Tensor = field(init=False)
    norm_sum: torch.Tensor = field(init=False)
    norm_max: torch.Tensor = field(init=False)

    def __post_init__(self) -> None:
        self.num_samples = torch.zeros((), dtype=torch.long, device=self.device)
        self.num_clipped = torch.zeros((), dtype=torch.long, device=self.device)
        self.norm_sum = torch.zeros((), device=self.device)
        self.norm_max = torch.zeros((), device=self.device)

    def record(self, norms: torch.Tensor) -> None:
        """Add one step's per-env pre-clipping norms ``[N]``."""
        norms = norms.detach().to(self.norm_sum)
        self.num_samples += norms.numel()
        self.num_clipped += (norms > self.clip_norm).sum()
        self.norm_sum += norms.sum()
        self.norm_max = torch.maximum(self.norm_max, norms.max())

    @property
    def mean_norm(self) -> float:
        """Mean pre-clipping norm over the recorded env-steps (0 when none)."""
        return (self.norm_sum / self.num_samples.clamp_min(1)).item()

    @property
    def max_norm(self) -> float:
        """Largest pre-clipping norm recorded (0 when none)."""
        return self.norm_max.item()

    @property
    def clipped_fraction(self) -> float:
        """Fraction of recorded env-steps whose adjoint was clipped (0 when none)."""
        return (self.num_clipped / self.num_samples.clamp_min(1)).item()

    def as_dict(self, prefix: str = "action_adjoint/") -> dict[str, float]:
        """The statistics as loggable scalars."""
        return {
            f"{prefix}mean_norm": self.mean_norm,
            f"{prefix}max_norm": self.max_norm,
            f"{prefix}clipped_fraction": self.clipped_fraction,
            f"{prefix}num_samples": float(self.num_samples.item()),
        }


@dataclass(frozen=True)
class DifferentiableTransition:
    """One env step with its graph.

    ``observation`` is the raw (unnormalised) observation ``[N, F]`` the policy
    acted on; ``next_observation`` is the observation the step produced, before
    any auto-reset replaced it. ``reward``, ``terminated`` and ``truncated`` are
    ``[N]``: ``terminated`` marks a terminal state (worth 0, never
    bootstrapped), ``truncated`` any other episode end (the next observation
    is bootstrapped); at most one of them is set per env and step. ``info``
    holds the other entries the env wrote under ``"next"``, in the env's own
    shapes.
    """

    observation: torch.Tensor
    policy_output: TensorDictBase
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    next_observation: torch.Tensor
    info: dict[Any, torch.Tensor]

    @property
    def action(self) -> torch.Tensor:
        """The action sent to the env (after any clipping), with its graph."""
        return self.policy_output["action"]

    @property
    def done(self) -> torch.Tensor:
        """``terminated | truncated``, ``[N]``."""
        return self.terminated | self.truncated


@dataclass(frozen=True)
class DifferentiableRollout:
    """An immutable sequence of graph-carrying transitions.

    Stacked views keep the graph; ``action_gradient_stats`` is ``None`` unless
    the collector clips the action adjoint, and fills in during backward.
    """

    initial_observation: torch.Tensor
    transitions: tuple[DifferentiableTransition, ...]
    action_gradient_stats: ActionAdjointStats | None = None

    @property
    def num_steps(self) -> int:
        return len(self.transitions)

    @property
    def num_envs(self) -> int:
        return self.initial_observation.shape[0]

    @property
    def final_observation(self) -> torch.Tensor:
        """The last ``next_observation`` (the initial one for an empty rollout)."""
        if not self.transitions:
            return self.initial_observation
        return self.transitions[-1].next_observation

    def _stack(self, name: str, empty_tail: tuple[int, ...], dtype=None) -> torch.Tensor:
        if not self.transitions:
            return self.initial_observation.new_empty((0, self.num_envs, *empty_tail), dtype=dtype)
        return torch.stack([getattr(t, name) for t in self.transitions])

    @property
    def rewards(self) -> torch.Tensor:
        """``[T, N]``."""
        return self._stack("reward", ())

    @property
    def observations(self) -> torch.Tensor:
        """Raw observations the policy acted on, ``[T, N, F]``."""
        return self._stack("observation", self.initial_observation.shape[1:])

    @property
    def next_observations(self) -> torch.Tensor:
        """Observations each step produced (before auto-reset), ``[T, N, F]``."""
        return self._stack("next_observation", self.initial_observation.shape[1:])

    @property
    def actions(self) -> torch.Tensor:
        """``[T, N, A]``."""
        if not self.transitions:
            raise ValueError("an empty rollout has no actions to stack.")
        return torch.stack([t.action for t in self.transitions])

    @property
    def terminations(self) -> torch.Tensor:
        """``[T, N]`` bool."""
        return self._stack("terminated", (), dtype=torch.bool)

    @property
    def dones(self) -> torch.Tensor:
        """``[T, N]`` bool, ``terminated | truncated``."""
        return self._stack("done", (), dtype=torch.bool)

    @property
    def alive_mask(self) -> torch.Tensor:
        """``[T, N]`` bool: true up to and including each env's first done, false after."""
        dones = self.dones
        if dones.shape[0] == 0:
            return dones
        ended_before = torch.cumsum(dones.long(), dim=0) - dones.long()
        return ended_before == 0


def _floating_parameter_dtype(module: nn.Module) -> torch.dtype | None:
    """The dtype of ``module``'s first floating-point parameter (``None`` without one)."""
    for parameter in module.parameters():
        if parameter.is_floating_point():
            return parameter.dtype
    return None


def _env_attribute(env: EnvBase, name: str) -> Any:
    """``env.name``, or ``None`` when the env has no such attribute.

    Wrappers (``TransformedEnv``) forward unknown attributes to the env they
    wrap, so this is a plain ``getattr``; TorchRL's batched envs recurse
    without end on an unknown attribute before they are started, which means
    the same as a missing one here.
    """
    try:
        return getattr(env, name, None)
    except RecursionError:
        return None


class DifferentiableCollector:
    """Collect graph-carrying rollouts from any differentiable TorchRL env.

    Args:
        env: a TorchRL env whose step is differentiable from its action (and
            its carried state) when grad is enabled: waddle's ``BraxEnv`` or
            ``MicroDuckEnv`` built with ``requires_grad=True``, or a pure-torch
            env. Any batch shape (flattened to ``N`` envs); one action entry,
            one reward entry with one value per env, and at least one of
            ``done``/``terminated``/``truncated`` in its ``full_done_spec``
            (the flags are derived from whichever it declares, see
            :mod:`waddle.collectors.episode_ends`). State the env carries
            outside its tensordict with autograd history must be cut by an
            ``env.detach_state()`` method.
        policy: a TensorDict module reading the flat observation ``[N, F]``
            under ``"observation"`` (whatever the env calls its entries) and
            writing ``"action"`` ``[N, *action_shape]`` (a ``ProbabilisticActor``
            samples with ``rsample`` unless ``deterministic=True``). Its other
            in-keys (a task-conditioned policy's ``"task_id"``) are read from
            the env's current TensorDict, flattened to ``N`` envs.
        device: device of the collected tensors and statistics.

    Keyword Args:
        observation_keys: the env's observation entries that make the policy's
            observation, flattened per env and concatenated in this order.
            Defaults to ``"observation"`` when the env declares it, else to the
            env's only floating-point observation entry.
        observation_normalizer: applied to the observation inside the graph
            before the policy reads it (the collector never updates it).
        clip_actions_to_space: clamp actions to the bounds of ``env.action_spec``.
        action_adjoint_max_norm: if > 0, clip each env's gradient with respect
            to its action to this L2 norm during backward, and record the norms
            in the rollout's ``action_gradient_stats``; 0 disables.

    Raises:
        ValueError: for a bad argument, an env whose ``requires_grad`` is
            ``False``, or an env layout the collector cannot read (see
            :meth:`EnvLayout.from_env <waddle.collectors.env_layout.EnvLayout.from_env>`).

    Typical use, with ``env`` and ``policy`` as above::

        collector = DifferentiableCollector(env, policy, "cpu")
        rollout = collector.collect(16)
        loss = -(rollout.rewards * rollout.alive_mask).mean()
        loss.backward()  # gradients reach the policy through the env
        collector.detach_state()  # the next collect() starts a new segment
    """

    def __init__(
        self,
        env: EnvBase,
        policy: TensorDictModuleBase,
        device: torch.device | str,
        *,
        observation_keys: NestedKey | list[NestedKey] | None = None,
        observation_normalizer: nn.Module | None = None,
        clip_actions_to_space: bool = False,
        action_adjoint_max_norm: float = 0.0,
    ) -> None:
        if not action_adjoint_max_norm >= 0.0:
            raise ValueError(
                f"action_adjoint_max_norm must be >= 0 (0 disables clipping), got {action_adjoint_max_norm}."
            )
        if not isinstance(env, EnvBase):
            raise TypeError(f"env must be a torchrl.envs.EnvBase, got {type(env).__name__}.")
        # Envs with a gradient switch (BraxEnv, MujocoEnv) say up front whether
        # their step records history; others are checked at the first step.
        if _env_attribute(env, "requires_grad") is False:
            raise ValueError(
                f"env must be differentiable: build {type(env).__name__} with requires_grad=True "
                "(its step is cut from autograd otherwise)."
            )
        self.env = env
        self.layout = EnvLayout.from_env(env, observation_keys)
        self.policy = policy
        self.device = torch.device(device)
        self.observation_normalizer = observation_normalizer
        self.clip_actions_to_space = bool(clip_actions_to_space)
        self.action_adjoint_max_norm = float(action_adjoint_max_norm)
        self._extra_in_keys = [key for key in getattr(policy, "in_keys", ()) if key != "observation"]
        # A float64 env (MJX's float64 physics) under a float32 policy: observations are cast to the
        # policy's dtype on the way out and actions to the env's on the way in, both inside the graph.
        self._policy_dtype = _floating_parameter_dtype(policy)
        self._env_action_dtype = env.full_action_spec[self.layout.action_key].dtype
        self._root: TensorDictBase | None = None
        self._action_low: torch.Tensor | None = None
        self._action_high: torch.Tensor | None = None
        if self.clip_actions_to_space:
            spec = env.full_action_spec[self.layout.action_key]
            low, high = getattr(spec, "low", None), getattr(spec, "high", None)
            if low is None or high is None:
                raise TypeError(
                    "clip_actions_to_space=True needs a bounded action spec with "
                    f"low/high (e.g. torchrl.data.Bounded), got {type(spec).__name__}."
                )
            self._action_low = self.layout.per_env(torch.as_tensor(low, device=self.device))
            self._action_high = self.layout.per_env(torch.as_tensor(high, device=self.device))

    @property
    def num_envs(self) -> int:
        return self.layout.num_envs

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Reset every env (seeding it first if ``seed`` is given); returns the observation ``[N, F]``.

        Also starts a new truncated-BPTT segment: an env that resets by
        selecting fresh values over its old state (``torch.where``) would
        otherwise keep the old graph attached, and a backward pass would run
        into the already freed graph of the last segment.
        """
        self._cut_env_graph()
        if seed is not None:
            self.env.set_seed(seed)
        self._root = self.env.reset()
        return self._observation()

    def detach_state(self) -> torch.Tensor:
        """Start a new truncated-BPTT segment: cut the env's physics graph and ours.

        Cuts the state the collector carries (the env's last tensordict, which
        holds all of the state of an env like ``BraxEnv``) and calls the env's
        own ``detach_state()`` when it has one (the state an env like
        ``MicroDuckEnv`` keeps inside).

        Returns:
            The carried observation ``[N, F]``, now without history.
        """
        self._cut_env_graph()
        if self._root is None:
            return self.reset()
        self._root = self._root.detach()
        return self._observation()

    def collect(
        self,
        num_steps: int,
        *,
        deterministic: bool = False,
        on_step_callback: Callable[[DifferentiableTransition], None] | None = None,
    ) -> DifferentiableRollout:
        """Step the env ``num_steps`` times, keeping every tensor's history.

        Envs that finish auto-reset (TorchRL's ``step_and_maybe_reset``) and
        keep going; :attr:`DifferentiableRollout.alive_mask` tells the steps
        before each env's first done from those after.

        Args:
            num_steps: number of env steps, > 0.
            deterministic: act with the policy's deterministic output (the
                distribution's mode/mean) instead of a reparameterised sample.
            on_step_callback: called with each transition as it is made.

        Raises:
            ValueError: if ``num_steps`` is not a positive integer, or the
                policy's action does not have the shape ``[N, *action_shape]``.
            RuntimeError: if, with grad enabled, a step's observation and
                reward carry no history from an action that does (the env is
                not differentiable).
        """
        if isinstance(num_steps, bool) or not isinstance(num_steps, int) or num_steps <= 0:
            raise ValueError(f"num_steps must be a positive integer, got {num_steps!r}.")
        if self._root is None:
            self.reset()
        stats = None
        if self.action_adjoint_max_norm > 0.0:
            stats = ActionAdjointStats(self.action_adjoint_max_norm, self.device)
        exploration = ExplorationType.DETERMINISTIC if deterministic else ExplorationType.RANDOM
        layout = self.layout
        initial_observation = self._observation()
        transitions = []
        for _ in range(num_steps):
            observation = self._observation()
            inputs = {"observation": self._normalize(observation)}
            inputs.update({key: self._flat_entry(key) for key in self._extra_in_keys})
            with set_exploration_type(exploration):
                policy_output = self.policy(TensorDict(inputs, batch_size=[self.num_envs], device=self.device))
            action = self._postprocess_action(policy_output["action"], stats)
            policy_output.set("action", action)

            env_input = self._root.copy()  # shallow: the carried tensors keep their graph
            env_action = layout.env_action(action).to(self._env_action_dtype)
            env_input.set(layout.action_key, self._to_env_device(env_action))
            stepped, self._root = self.env.step_and_maybe_reset(env_input)
            next_td = stepped.get("next")
            reward = layout.reward(next_td).to(self.device)
            next_observation = self._to_policy(layout.observation(next_td))
            if action.requires_grad and not (reward.requires_grad or next_observation.requires_grad):
                raise RuntimeError(
                    f"env {type(self.env).__name__} is not differentiable: its step returned an observation and a "
                    "reward without autograd history from the action. DifferentiableCollector needs an env whose "
                    "step is differentiable (e.g. BraxEnv or MicroDuckEnv with requires_grad=True, not a "
                    "ParallelEnv)."
                )
            terminated, truncated = layout.episode_ends.flags(next_td)
            transition = DifferentiableTransition(
                observation=observation,
                policy_output=policy_output,
                reward=reward,
                terminated=terminated.to(self.device),
                truncated=truncated.to(self.device),
                next_observation=next_observation,
                info={key: value for key, value in next_td.exclude(*layout.step_keys).items(True, True)},
            )
            transitions.append(transition)
            if on_step_callback is not None:
                on_step_callback(transition)
        return DifferentiableRollout(initial_observation, tuple(transitions), stats)

    # -- helpers -------------------------------------------------------------

    def _flat_entry(self, key: NestedKey) -> torch.Tensor:
        """An entry of the env's current TensorDict with its batch dims flattened to ``N``."""
        value = self._root.get(key)
        return value.reshape(self.num_envs, *value.shape[len(self.env.batch_size) :]).to(self.device)

    def _observation(self) -> torch.Tensor:
        assert self._root is not None
        return self._to_policy(self.layout.observation(self._root))

    def _to_policy(self, observation: torch.Tensor) -> torch.Tensor:
        if self._policy_dtype is None or not observation.is_floating_point():
            return observation.to(self.device)
        return observation.to(self.device, self._policy_dtype)

    def _cut_env_graph(self) -> None:
        cut = _env_attribute(self.env, "detach_state")
        if callable(cut):
            cut()

    def _to_env_device(self, tensor: torch.Tensor) -> torch.Tensor:
        # A device-less env (device=None) takes tensors where they are.
        return tensor if self.env.device is None else tensor.to(self.env.device)

    def _normalize(self, observation: torch.Tensor) -> torch.Tensor:
        if self.observation_normalizer is None:
            return observation
        return self.observation_normalizer(observation)

    def _postprocess_action(self, action: torch.Tensor, stats: ActionAdjointStats | None) -> torch.Tensor:
        if self.clip_actions_to_space:
            action = torch.clamp(action, self._action_low.to(action.dtype), self._action_high.to(action.dtype))
        if stats is not None and action.requires_grad:
            action.register_hook(functools.partial(self._clip_adjoint, stats))
        return action

    def _clip_adjoint(self, stats: ActionAdjointStats, gradient: torch.Tensor) -> torch.Tensor:
        clipped, norms = clip_per_env_norm(gradient, self.action_adjoint_max_norm)
        stats.record(norms)
        return clipped
