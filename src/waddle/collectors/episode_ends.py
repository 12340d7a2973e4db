"""Per-env ``terminated`` and ``truncated`` flags from whichever done entries an env declares.

TorchRL envs do not agree on their done entries: waddle's and TorchRL's
``BraxEnv`` write ``done`` and ``terminated`` (Brax has no time limit of its
own), ``MicroDuckEnv`` writes all three, an env built with
``auto_complete_done_specs=False`` may write any subset. The analytic-gradient
losses need the two flags with their exact meaning:

* ``terminated``: the step reached a terminal state; the future is worth 0, so
  nothing is bootstrapped from the next observation.
* ``truncated``: the episode was cut for any other reason (a time limit, or
  any other done entry TorchRL resets on); the next observation is not
  terminal, so a critic bootstraps from its value.

:class:`EpisodeEnds` derives both from the entries the env declares in its
``full_done_spec``, so that exactly the steps TorchRL auto-resets after are
episode ends and none is counted twice:

========================================  ====================  ===========================
declared entries                          ``terminated``        ``truncated``
========================================  ====================  ===========================
``terminated`` (with anything else)       ``terminated``        ``ended & ~terminated``
``done`` and maybe ``truncated``          ``done & ~truncated`` ``ended & ~terminated``
``truncated`` only                        all false             ``truncated``
none of the three                         rejected (:class:`ValueError`)
========================================  ====================  ===========================

``ended`` is the OR of every done entry of the group, including ones named
otherwise (``"success"``...): TorchRL resets on all of them. A terminal step
that is also at the time limit counts as terminated (no bootstrap: the state
is terminal either way). An env that only says ``done`` cannot tell a time
limit from a terminal state, and ``done`` is read as terminal, as TorchRL
itself fills a missing ``terminated`` with ``done``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import TensorDictBase
from tensordict.utils import NestedKey
from torchrl.envs import EnvBase

__all__ = ["EpisodeEnds"]

DONE, TERMINATED, TRUNCATED = "done", "terminated", "truncated"
_FLAG_NAMES = (DONE, TERMINATED, TRUNCATED)


def _name(key: NestedKey) -> str:
    return key if isinstance(key, str) else key[-1]


def _parent(key: NestedKey) -> tuple[str, ...]:
    return () if isinstance(key, str) else tuple(key[:-1])


@dataclass(frozen=True)
class EpisodeEnds:
    """The done entries of one env and how they become per-env ``terminated``/``truncated`` flags.

    Build it with :meth:`from_env`; see the module documentation for the rules.

    Args:
        num_envs: number of envs, the product of the env's batch dimensions.
        done_keys: every done entry of the group TorchRL resets on.
        terminated_key, done_key, truncated_key: the entries of that group
            named ``terminated``, ``done`` and ``truncated``, ``None`` when not declared.
    """

    num_envs: int
    done_keys: tuple[NestedKey, ...]
    terminated_key: NestedKey | None
    done_key: NestedKey | None
    truncated_key: NestedKey | None

    @classmethod
    def from_env(cls, env: EnvBase) -> EpisodeEnds:
        """Read the done entries ``env`` declares.

        Raises:
            ValueError: if the env declares no done entry named ``done``,
                ``terminated`` or ``truncated``, declares several groups of
                them and none at the root, or a flag has more than one value per env.
        """
        groups = [tuple(group) for group in env.done_keys_groups]
        root = [group for group in groups if _parent(group[0]) == ()]
        if len(groups) > 1 and not root:
            raise ValueError(
                "env must declare its done entries at the root of its full_done_spec or under a single parent; "
                f"it declares the groups {groups}."
            )
        group = root[0] if root else groups[0] if groups else ()
        by_name = {_name(key): key for key in group}
        if not set(by_name) & set(_FLAG_NAMES):
            raise ValueError(
                f"env must declare at least one of {list(_FLAG_NAMES)} in its full_done_spec, so that episode ends "
                f"can be told apart; it declares {list(env.done_keys)}."
            )
        spec = env.full_done_spec
        batch_dims = len(env.batch_size)
        for key in group:
            per_env = spec[key].shape[batch_dims:]
            if per_env.numel() != 1:
                raise ValueError(
                    f"env's done entry {key!r} must hold one flag per env (shape batch_size + (1,) or batch_size), "
                    f"got shape {tuple(spec[key].shape)} for batch_size {tuple(env.batch_size)}."
                )
        return cls(
            num_envs=env.batch_size.numel(),
            done_keys=group,
            terminated_key=by_name.get(TERMINATED),
            done_key=by_name.get(DONE),
            truncated_key=by_name.get(TRUNCATED),
        )

    def flags(self, next_td: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
        """``(terminated, truncated)``, each ``[num_envs]`` bool, of a step's ``"next"`` data."""
        read = {key: self._read(next_td, key) for key in self.done_keys}
        ended = torch.stack(list(read.values())).any(0)
        if self.terminated_key is not None:
            terminated = read[self.terminated_key]
        elif self.done_key is not None:
            terminated = read[self.done_key]
            if self.truncated_key is not None:
                terminated = terminated & ~read[self.truncated_key]
        else:
            terminated = torch.zeros_like(ended)
        return terminated, ended & ~terminated

    def _read(self, next_td: TensorDictBase, key: NestedKey) -> torch.Tensor:
        return next_td.get(key).reshape(self.num_envs).bool()
