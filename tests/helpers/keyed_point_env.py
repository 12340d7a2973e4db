"""The point mass of :class:`helpers.diff_point_env.DiffPointEnv`, laid out unlike the MicroDuck.

Same dynamics, reward, termination and time limit (``v' = v + dt a``,
``x' = x + dt v'``, reward ``-|x' - goal|^2``, terminated when any
``|x'_i| > bound``, time limit after ``max_steps`` steps), but:

* any batch shape, including none (``batch_shape=()``);
* every entry nested under ``prefix``: the observation is two entries,
  ``(*prefix, "position")`` and ``(*prefix, "velocity")``, next to the action
  and the reward;
* only the done entries named in ``done_entries`` are declared and written,
  with TorchRL's completion of missing ones turned off. The entries it knows:
  ``"done"`` (terminal or time limit), ``"terminated"``, ``"truncated"`` (time
  limit and not terminal), and ``"timeout"`` (the time limit under another name).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

KNOWN_DONE_ENTRIES = ("done", "terminated", "truncated", "timeout")


class KeyedPointEnv(EnvBase):
    """A batched point mass with nested, split entries and a chosen set of done entries."""

    auto_complete_done_specs = False

    def __init__(
        self,
        batch_shape: tuple[int, ...] = (3,),
        *,
        prefix: tuple[str, ...] = ("agent",),
        done_entries: tuple[str, ...] = ("done", "terminated", "truncated"),
        dim: int = 1,
        dt: float = 0.1,
        goal: float = 0.5,
        bound: float = 2.0,
        max_steps: int = 50,
        action_bound: float | None = None,
        init_pos: list[float] | None = None,
        seed: int = 0,
    ) -> None:
        unknown = set(done_entries) - set(KNOWN_DONE_ENTRIES)
        if unknown:
            raise ValueError(f"done_entries must be among {KNOWN_DONE_ENTRIES}, got {sorted(unknown)}.")
        batch = torch.Size(batch_shape)
        super().__init__(device="cpu", batch_size=batch)
        self.prefix, self.done_entries = tuple(prefix), tuple(done_entries)
        self.dim, self.dt, self.goal, self.bound, self.max_steps = dim, dt, goal, bound, max_steps
        self.init_pos = None if init_pos is None else torch.tensor(init_pos).reshape(*batch, 1)

        def nested(leaves: dict) -> Composite:
            spec = Composite(leaves, shape=batch)
            for name in reversed(self.prefix):
                spec = Composite({name: spec}, shape=batch)
            return spec

        self.observation_spec = nested({"position": Unbounded((*batch, dim)), "velocity": Unbounded((*batch, dim))})
        if action_bound is None:
            action = Unbounded((*batch, dim))
        else:
            action = Bounded(-action_bound, action_bound, (*batch, dim))
        self.action_spec = nested({"action": action})
        self.reward_spec = nested({"reward": Unbounded((*batch, 1))})
        flag = Categorical(2, (*batch, 1), dtype=torch.bool)
        self.done_spec = nested({name: flag.clone() for name in self.done_entries})
        self.pos = torch.zeros(*batch, dim)
        self.vel = torch.zeros(*batch, dim)
        self.steps = torch.zeros(batch, dtype=torch.long)
        self.set_seed(seed)

    def key(self, name: str) -> tuple[str, ...] | str:
        """The full key of one of this env's entries."""
        return (*self.prefix, name) if self.prefix else name

    def _set_seed(self, seed: int | None) -> None:
        self.rng = torch.Generator().manual_seed(0 if seed is None else seed)

    def _output(self, reward=None, terminated=None) -> TensorDict:
        batch = self.batch_size
        if terminated is None:
            terminated = torch.zeros(*batch, 1, dtype=torch.bool)
        time_limit = (self.steps >= self.max_steps).reshape(*batch, 1) & ~terminated
        flags = {
            "done": terminated | time_limit,
            "terminated": terminated,
            "truncated": time_limit,
            "timeout": time_limit,
        }
        out = TensorDict({}, batch_size=batch)
        out.set(self.key("position"), self.pos)
        out.set(self.key("velocity"), self.vel)
        for name in self.done_entries:
            out.set(self.key(name), flags[name])
        if reward is not None:
            out.set(self.key("reward"), reward)
        return out

    def _reset(self, tensordict: TensorDict | None = None, **kwargs) -> TensorDict:
        reset = torch.ones(self.batch_size, dtype=torch.bool)
        if tensordict is not None and self.key("_reset") in tensordict.keys(True):
            reset = tensordict.get(self.key("_reset")).reshape(self.batch_size)
        if self.init_pos is None:
            fresh = (torch.rand(self.pos.shape, generator=self.rng) * 2.0 - 1.0) * 0.5
        else:
            fresh = self.init_pos.expand_as(self.pos)
        rows = reset.unsqueeze(-1)
        self.pos = torch.where(rows, fresh, self.pos)
        self.vel = torch.where(rows, torch.zeros_like(self.vel), self.vel)
        self.steps = torch.where(reset, 0, self.steps)
        return self._output()

    def _step(self, tensordict: TensorDict) -> TensorDict:
        action = tensordict.get(self.key("action"))
        self.vel = self.vel + self.dt * action
        self.pos = self.pos + self.dt * self.vel
        self.steps = self.steps + 1
        reward = -((self.pos - self.goal) ** 2).sum(-1, keepdim=True)
        terminated = (self.pos.abs() > self.bound).any(-1, keepdim=True)
        return self._output(reward, terminated)

    def detach_state(self) -> None:
        """Cut the autograd history of the carried state (the named graph cut)."""
        self.pos, self.vel = self.pos.detach(), self.vel.detach()
