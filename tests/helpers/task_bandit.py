"""A one-step contextual bandit whose best action depends only on the task id.

Every env draws a task at reset (uniformly, or the ``task_id`` given in the
reset TensorDict), sees the same constant observation whatever its task, acts
once and is done. The reward ``-(action - target[task])^2`` is differentiable
in the action, so the analytic-gradient trainers can use it too. A policy that
ignores ``task_id`` cannot do better than the mean target; one that reads it
can reach every target.

``tasks.name`` lists the task names, as a MicroDuck library does.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace

import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase


class TaskBanditEnv(EnvBase):
    def __init__(
        self,
        num_envs: int,
        targets: Sequence[float] = (0.5, -0.5),
        *,
        names: Sequence[str] | None = None,
        obs_dim: int = 3,
        action_dim: int = 1,
        seed: int = 0,
    ) -> None:
        super().__init__(device="cpu", batch_size=torch.Size([num_envs]))
        n, k = num_envs, len(targets)
        self.targets = torch.tensor(targets, dtype=torch.float32)
        self.tasks = SimpleNamespace(name=list(names or [f"target{t:+.2f}" for t in targets]))
        self.obs_dim = obs_dim
        self.observation_spec = Composite(
            observation=Unbounded((n, obs_dim)),
            task_id=Bounded(0, k - 1, (n, 1), dtype=torch.int64),
            shape=(n,),
        )
        self.state_spec = Composite(task_id=Bounded(0, k - 1, (n, 1), dtype=torch.int64), shape=(n,))
        self.action_spec = Bounded(-1.0, 1.0, (n, action_dim))
        self.reward_spec = Unbounded((n, 1))
        self.done_spec = Composite(
            done=Categorical(2, (n, 1), dtype=torch.bool),
            terminated=Categorical(2, (n, 1), dtype=torch.bool),
            truncated=Categorical(2, (n, 1), dtype=torch.bool),
            shape=(n,),
        )
        self._task_id = torch.zeros(n, 1, dtype=torch.long)
        self.set_seed(seed)

    def _set_seed(self, seed: int | None) -> None:
        self.rng = torch.Generator().manual_seed(0 if seed is None else seed)

    def _observation(self) -> torch.Tensor:
        return torch.full((self.batch_size[0], self.obs_dim), 0.3)

    def _reset(self, tensordict=None, **kwargs) -> TensorDict:
        n = self.batch_size[0]
        rows = torch.ones(n, dtype=torch.bool)
        if tensordict is not None and "_reset" in tensordict.keys():
            rows = tensordict["_reset"].reshape(n)
        if tensordict is not None and "task_id" in tensordict.keys():
            drawn = tensordict["task_id"].reshape(n, 1).long()
        else:
            drawn = torch.randint(len(self.targets), (n, 1), generator=self.rng)
        self._task_id = torch.where(rows.unsqueeze(-1), drawn, self._task_id)
        false = torch.zeros(n, 1, dtype=torch.bool)
        return TensorDict(
            {
                "observation": self._observation(),
                "task_id": self._task_id.clone(),
                "done": false,
                "terminated": false,
                "truncated": false.clone(),
            },
            batch_size=self.batch_size,
        )

    def _step(self, tensordict: TensorDict) -> TensorDict:
        action = tensordict["action"]
        target = self.targets[self._task_id.squeeze(-1)].unsqueeze(-1)
        reward = -((action - target) ** 2).sum(-1, keepdim=True)
        true = torch.ones(self.batch_size[0], 1, dtype=torch.bool)
        return TensorDict(
            {
                "observation": self._observation(),
                "task_id": self._task_id.clone(),
                "reward": reward,
                "done": true,
                "terminated": true.clone(),
                "truncated": ~true,
            },
            batch_size=self.batch_size,
        )
