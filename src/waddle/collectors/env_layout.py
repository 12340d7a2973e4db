"""Where a TorchRL env keeps what a rollout needs, read once from its specs.

A rollout is flat: ``N`` envs (the product of the env's batch dimensions,
1 for an unbatched env) by features. :class:`EnvLayout` maps an env's own
layout onto it, whatever the env names its entries or however many batch
dimensions it has: which observation entries make the policy's observation,
the reward entry, the action entry and its per-env shape, and the episode
ends (:class:`~waddle.collectors.episode_ends.EpisodeEnds`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey, unravel_key
from torchrl.envs import EnvBase

from waddle.collectors.episode_ends import EpisodeEnds

__all__ = ["EnvLayout"]

DEFAULT_OBSERVATION_KEY = "observation"


def _per_env_numel(shape: torch.Size, batch_dims: int) -> int:
    return shape[batch_dims:].numel()


def _default_observation_keys(env: EnvBase) -> tuple[NestedKey, ...]:
    spec = env.observation_spec
    leaves = list(spec.keys(True, True))
    if DEFAULT_OBSERVATION_KEY in leaves:
        return (DEFAULT_OBSERVATION_KEY,)
    floating = [key for key in leaves if spec[key].dtype.is_floating_point]
    if len(floating) == 1:
        return (floating[0],)
    raise ValueError(
        f"env has no {DEFAULT_OBSERVATION_KEY!r} entry and {len(floating)} floating-point observation entries "
        f"{floating}: pass observation_keys, a subset of {leaves}, to say which ones the policy reads."
    )


def _checked_observation_keys(env: EnvBase, keys: NestedKey | Sequence[NestedKey]) -> tuple[NestedKey, ...]:
    # A tuple of strings is one nested key, as everywhere in TensorDict.
    keys = (keys,) if isinstance(keys, (str, tuple)) else tuple(keys)
    keys = tuple(unravel_key(key) for key in keys)
    leaves = list(env.observation_spec.keys(True, True))
    unknown = [key for key in keys if key not in leaves]
    if not keys or unknown:
        raise ValueError(
            f"observation_keys must name one or more of env's observation entries {leaves}, got {list(keys)}."
        )
    return keys


def _single_key(keys: list[NestedKey], what: str) -> NestedKey:
    if len(keys) != 1:
        raise ValueError(f"env must declare exactly one {what} entry, it declares {keys}.")
    return keys[0]


@dataclass(frozen=True)
class EnvLayout:
    """An env's entries and batch shape, and their flat ``[N, ...]`` views.

    Build it with :meth:`from_env`.
    """

    batch_size: torch.Size
    observation_keys: tuple[NestedKey, ...]
    reward_key: NestedKey
    action_key: NestedKey
    action_shape: torch.Size
    """Per-env action shape: the action spec's shape without the batch dimensions."""
    episode_ends: EpisodeEnds

    @classmethod
    def from_env(cls, env: EnvBase, observation_keys: NestedKey | Sequence[NestedKey] | None = None) -> EnvLayout:
        """Read ``env``'s specs.

        Args:
            env: any TorchRL env.
            observation_keys: the observation entries the policy reads, flattened
                per env and concatenated in this order. ``None``: ``"observation"``
                if the env declares it, else its only floating-point observation entry.

        Raises:
            ValueError: if the observation entries cannot be chosen or are not
                declared, if the env declares other than one reward entry (of one
                value per env) or one action entry, or if its done entries do
                not tell episode ends (see :meth:`EpisodeEnds.from_env`).
        """
        batch_dims = len(env.batch_size)
        if observation_keys is None:
            observation_keys = _default_observation_keys(env)
        else:
            observation_keys = _checked_observation_keys(env, observation_keys)
        reward_key = _single_key(list(env.reward_keys), "reward")
        reward_shape = env.full_reward_spec[reward_key].shape
        if _per_env_numel(reward_shape, batch_dims) != 1:
            raise ValueError(
                f"env's reward {reward_key!r} must hold one value per env (shape batch_size + (1,)), "
                f"got shape {tuple(reward_shape)} for batch_size {tuple(env.batch_size)}."
            )
        action_key = _single_key(list(env.action_keys), "action")
        return cls(
            batch_size=env.batch_size,
            observation_keys=observation_keys,
            reward_key=reward_key,
            action_key=action_key,
            action_shape=env.full_action_spec[action_key].shape[batch_dims:],
            episode_ends=EpisodeEnds.from_env(env),
        )

    @property
    def num_envs(self) -> int:
        return self.batch_size.numel()

    @property
    def step_keys(self) -> tuple[NestedKey, ...]:
        """The entries a transition holds in its own fields (the rest goes to its ``info``)."""
        return (*self.observation_keys, self.reward_key, *self.episode_ends.done_keys)

    def per_env(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` of shape ``batch_size + feature shape`` as ``[N, feature shape]``."""
        return tensor.reshape(self.num_envs, *tensor.shape[len(self.batch_size) :])

    def observation(self, td: TensorDictBase) -> torch.Tensor:
        """The policy's observation ``[N, F]``: the observation entries, each flattened per env, side by side."""
        parts = [td.get(key).reshape(self.num_envs, -1) for key in self.observation_keys]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def reward(self, td: TensorDictBase) -> torch.Tensor:
        """``[N]``."""
        return td.get(self.reward_key).reshape(self.num_envs)

    def env_action(self, action: torch.Tensor) -> torch.Tensor:
        """A flat action ``[N, *action_shape]`` in the env's own shape ``batch_size + action_shape``.

        Raises:
            ValueError: if ``action`` does not have the flat shape.
        """
        expected = (self.num_envs, *self.action_shape)
        if tuple(action.shape) != expected:
            raise ValueError(
                f"the policy's action must have shape (num_envs, *action_shape) = {expected}, "
                f"got {tuple(action.shape)}."
            )
        return action.reshape(*self.batch_size, *self.action_shape)
