"""Tiny differentiable TorchRL envs in pure torch, for collector and algorithm tests.

Both envs keep their state inside the env (as ``MujocoEnv`` keeps it in its
physics backend), record autograd history from the action and the previous
state into the next observation and reward whenever grad is enabled, and cut
that history only through the named call :meth:`detach_state`.

* :class:`DiffPointEnv`: a batched point mass, semi-implicit Euler
  ``v' = v + dt * a``, ``x' = x + dt * v'``, observation ``[x, v]``, reward
  ``-|x' - goal|^2 - ctrl_cost * |a|^2``, terminated when any ``|x'_i| > bound``,
  truncated after ``max_steps`` steps; ``init_pos`` fixes the start positions.
* :class:`LinearSystemEnv`: the scalar system ``x' = a x + b u`` with reward
  ``-(x'^2 + rho u^2)``, truncated after ``max_steps`` steps, never terminated.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase


class _TorchStateEnv(EnvBase):
    """Shared spec, seeding, partial-reset and step-count plumbing."""

    def __init__(
        self, *, num_envs: int, obs_dim: int, action_dim: int, max_steps: int, action_bound: float | None, seed: int
    ) -> None:
        super().__init__(device="cpu", batch_size=torch.Size([num_envs]))
        n = num_envs
        self.max_steps = max_steps
        self.observation_spec = Composite(observation=Unbounded((n, obs_dim)), shape=(n,))
        if action_bound is None:
            self.action_spec = Unbounded((n, action_dim))
        else:
            self.action_spec = Bounded(-action_bound, action_bound, (n, action_dim))
        self.reward_spec = Unbounded((n, 1))
        self.done_spec = Composite(
            done=Categorical(2, (n, 1), dtype=torch.bool),
            terminated=Categorical(2, (n, 1), dtype=torch.bool),
            truncated=Categorical(2, (n, 1), dtype=torch.bool),
            shape=(n,),
        )
        self.steps = torch.zeros(n, dtype=torch.long)
        self.poison_reward = False  # tests flip this to make rewards NaN
        self.set_seed(seed)

    def _set_seed(self, seed: int | None) -> None:
        self.rng = torch.Generator().manual_seed(0 if seed is None else seed)

    def _reset_mask(self, tensordict: TensorDict | None) -> torch.Tensor:
        n = self.batch_size[0]
        if tensordict is not None and "_reset" in tensordict.keys():
            return tensordict["_reset"].reshape(n)
        return torch.ones(n, dtype=torch.bool)

    def _uniform(self, shape, scale: float) -> torch.Tensor:
        return (torch.rand(shape, generator=self.rng) * 2.0 - 1.0) * scale

    def _output(self, observation, reward=None, terminated=None) -> TensorDict:
        n = self.batch_size[0]
        if terminated is None:
            terminated = torch.zeros(n, 1, dtype=torch.bool)
        truncated = (self.steps >= self.max_steps).reshape(n, 1) & ~terminated
        out = {
            "observation": observation,
            "terminated": terminated,
            "truncated": truncated,
            "done": terminated | truncated,
        }
        if reward is not None:
            if self.poison_reward:
                reward = reward * float("nan")
            out["reward"] = reward
        return TensorDict(out, batch_size=self.batch_size)


class DiffPointEnv(_TorchStateEnv):
    """Batched point mass in ``dim`` dimensions; see the module docstring."""

    def __init__(
        self,
        num_envs: int = 4,
        *,
        dim: int = 1,
        dt: float = 0.1,
        goal: float = 0.5,
        bound: float = 2.0,
        max_steps: int = 50,
        init_scale: float = 0.5,
        ctrl_cost: float = 0.0,
        action_bound: float | None = None,
        init_pos: list[float] | None = None,
        seed: int = 0,
    ) -> None:
        self.dim, self.dt, self.goal, self.bound = dim, dt, goal, bound
        # Fixed per-env start positions (broadcast over dims) instead of random ones.
        self.init_pos = None if init_pos is None else torch.tensor(init_pos)[:, None]
        self.init_scale, self.ctrl_cost = init_scale, ctrl_cost
        super().__init__(
            num_envs=num_envs,
            obs_dim=2 * dim,
            action_dim=dim,
            max_steps=max_steps,
            action_bound=action_bound,
            seed=seed,
        )
        self.pos = torch.zeros(num_envs, dim)
        self.vel = torch.zeros(num_envs, dim)

    def _observation(self) -> torch.Tensor:
        return torch.cat([self.pos, self.vel], dim=-1)

    def _reset(self, tensordict: TensorDict | None = None, **kwargs) -> TensorDict:
        reset = self._reset_mask(tensordict)
        fresh = self._uniform(self.pos.shape, self.init_scale)
        if self.init_pos is not None:
            fresh = self.init_pos.expand_as(fresh)
        self.pos = torch.where(reset[:, None], fresh, self.pos)
        self.vel = torch.where(reset[:, None], torch.zeros_like(self.vel), self.vel)
        self.steps = torch.where(reset, 0, self.steps)
        return self._output(self._observation())

    def _step(self, tensordict: TensorDict) -> TensorDict:
        action = tensordict["action"]
        self.vel = self.vel + self.dt * action
        self.pos = self.pos + self.dt * self.vel
        self.steps = self.steps + 1
        reward = -((self.pos - self.goal) ** 2).sum(-1, keepdim=True)
        reward = reward - self.ctrl_cost * (action**2).sum(-1, keepdim=True)
        terminated = (self.pos.abs() > self.bound).any(-1, keepdim=True)
        return self._output(self._observation(), reward, terminated)

    def detach_state(self) -> None:
        """Cut the autograd history of the carried state (the named graph cut)."""
        self.pos, self.vel = self.pos.detach(), self.vel.detach()


class LinearSystemEnv(_TorchStateEnv):
    """The scalar system ``x' = a x + b u``; see the module docstring."""

    def __init__(
        self,
        num_envs: int = 64,
        *,
        a: float = 1.1,
        b: float = 0.5,
        rho: float = 0.1,
        max_steps: int = 3,
        init_scale: float = 1.0,
        seed: int = 0,
    ) -> None:
        self.a, self.b, self.rho, self.init_scale = a, b, rho, init_scale
        super().__init__(num_envs=num_envs, obs_dim=1, action_dim=1, max_steps=max_steps, action_bound=None, seed=seed)
        self.x = torch.zeros(num_envs, 1)

    def _reset(self, tensordict: TensorDict | None = None, **kwargs) -> TensorDict:
        reset = self._reset_mask(tensordict)
        self.x = torch.where(reset[:, None], self._uniform(self.x.shape, self.init_scale), self.x)
        self.steps = torch.where(reset, 0, self.steps)
        return self._output(self.x)

    def _step(self, tensordict: TensorDict) -> TensorDict:
        u = tensordict["action"]
        self.x = self.a * self.x + self.b * u
        self.steps = self.steps + 1
        return self._output(self.x, -(self.x**2 + self.rho * u**2))

    def detach_state(self) -> None:
        """Cut the autograd history of the carried state (the named graph cut)."""
        self.x = self.x.detach()
