"""Evaluation bookkeeping on a scripted env."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

from waddle.algorithms.evaluation import evaluate


class ScriptedEnv(EnvBase):
    """Two envs: env 0 moves at 0.2 m/s for 4 steps then is truncated; env 1 falls at step 2.

    Observations carry the body velocity at index 6 (as MicroDuck's do);
    reward is 1 per step; command is (0.2, 0).
    """

    BODY_VELOCITY_START = 6
    max_episode_steps = 10

    def __init__(self):
        super().__init__(batch_size=torch.Size([2]))
        self.observation_spec = Composite(
            observation=Unbounded((2, 8)), command=Unbounded((2, 2)), shape=(2,)
        )
        self.action_spec = Bounded(-1.0, 1.0, (2, 1))
        self.reward_spec = Unbounded((2, 1))
        self.done_spec = Composite(
            done=Categorical(2, (2, 1), dtype=torch.bool),
            terminated=Categorical(2, (2, 1), dtype=torch.bool),
            truncated=Categorical(2, (2, 1), dtype=torch.bool),
            shape=(2,),
        )
        self.t = 0

    def _observation(self):
        observation = torch.zeros(2, 8)
        observation[0, 6] = 0.2
        observation[1, 6] = 0.1
        return {"observation": observation, "command": torch.tensor([[0.2, 0.0], [0.2, 0.0]])}

    def _reset(self, tensordict=None, **kwargs):
        self.t = 0
        false = torch.zeros(2, 1, dtype=torch.bool)
        return TensorDict({**self._observation(), "done": false, "terminated": false, "truncated": false}, [2])

    def _step(self, tensordict):
        self.t += 1
        terminated = torch.tensor([[False], [self.t >= 2]])
        truncated = torch.tensor([[self.t >= 4], [False]])
        return TensorDict(
            {**self._observation(), "reward": torch.ones(2, 1), "terminated": terminated,
             "truncated": truncated, "done": terminated | truncated},
            [2],
        )

    def _set_seed(self, seed):
        pass


def test_evaluate_bookkeeping():
    policy = torch.nn.Linear(8, 1)
    result = evaluate(ScriptedEnv(), policy)
    assert result.episodes == 2
    assert result.mean_episode_length == pytest.approx((4 + 2) / 2)
    assert result.mean_return == pytest.approx((4 + 2) / 2)
    assert result.fall_rate == pytest.approx(0.5)
    # Per-episode mean forward speeds 0.2 and 0.1.
    assert result.mean_forward_speed == pytest.approx(0.15)
    # Tracking error: 0 for 4 steps, 0.1 for 2 steps -> 0.2 / 6 steps.
    assert result.velocity_tracking_error == pytest.approx(0.2 / 6)
