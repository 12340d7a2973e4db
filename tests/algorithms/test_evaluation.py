"""Evaluation bookkeeping on a scripted env."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, Unbounded
from torchrl.envs import EnvBase

from waddle.algorithms.evaluation import evaluate


class ScriptedEnv(EnvBase):
    """Two envs: env 0 moves at (0.2, 0.05) m/s for 4 steps then is truncated; env 1 falls at step 2.

    Observations carry the body velocity at index 6 (as MicroDuck's do);
    reward is 1 per step; command is (0.2, 0). Both turn 0.1 rad per step. The
    left foot of both rests at 1 mm, lifts to 20 mm at step 1 and 30 mm at step
    2 and lands at step 3 (env 1 has fallen by then); right feet stay down.
    """

    BODY_VELOCITY_START = 6
    max_episode_steps = 10
    control_dt = 0.02
    LEFT_HEIGHTS = (0.001, 0.02, 0.03, 0.001, 0.001)

    def __init__(self):
        super().__init__(batch_size=torch.Size([2]))
        self.observation_spec = Composite(observation=Unbounded((2, 8)), command=Unbounded((2, 2)), shape=(2,))
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
        observation[0, 6], observation[0, 7] = 0.2, 0.05
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
            {
                **self._observation(),
                "reward": torch.ones(2, 1),
                "terminated": terminated,
                "truncated": truncated,
                "done": terminated | truncated,
            },
            [2],
        )

    def _set_seed(self, seed):
        pass

    def heading(self):
        return torch.full((2,), 0.1 * self.t)

    def foot_heights(self):
        return torch.tensor([[self.LEFT_HEIGHTS[min(self.t, 4)], 0.001]] * 2)

    def foot_contacts(self):
        return self.foot_heights() < 0.005


def test_evaluate_bookkeeping():
    policy = torch.nn.Linear(8, 1)
    result = evaluate(ScriptedEnv(), policy)
    assert result.episodes == 2
    assert result.mean_episode_length == pytest.approx((4 + 2) / 2)
    assert result.mean_return == pytest.approx((4 + 2) / 2)
    assert result.fall_rate == pytest.approx(0.5) and result.survival == pytest.approx(0.5)
    # Speeds of the episodes that did not fall: env 0's only.
    assert result.mean_forward_speed == pytest.approx(0.2)
    assert result.mean_lateral_speed == pytest.approx(0.05)
    # Tracking error: 0.05 for 4 steps (env 0), |(-0.1, 0)| for 2 steps (env 1).
    assert result.velocity_tracking_error == pytest.approx((4 * 0.05 + 2 * 0.1) / 6)
    # Env 0 turned 0.1 rad in each of 4 steps.
    assert result.yaw_drift_deg == pytest.approx(math.degrees(0.4), rel=1e-5)
    assert result.yaw_drift_p95_deg == pytest.approx(math.degrees(0.4), rel=1e-5)
    # One completed swing (env 0's left foot): peak 30 mm over a 1 mm rest height.
    assert result.foot_clearance == pytest.approx(0.029)
    # One touchdown in 4 steps of 0.02 s.
    assert result.step_frequency_hz == pytest.approx(1 / 0.08)
    assert result.command is None


def test_yaw_drift_unwraps_across_pi():
    class Spinning(ScriptedEnv):
        def heading(self):  # 3 rad per step, wrapped into (-pi, pi]
            return torch.remainder(torch.full((2,), 3.0 * self.t) + math.pi, 2 * math.pi) - math.pi

    result = evaluate(Spinning(), torch.nn.Linear(8, 1))
    assert result.yaw_drift_deg == pytest.approx(math.degrees(12.0), rel=1e-5)


def test_task_commands():
    from waddle.algorithms.evaluation import task_commands
    from waddle.envs.microduck import MicroDuckEnv
    from waddle.envs.microduck.tasks import as_task_library

    library = as_task_library(
        [MicroDuckEnv.tracking_task(0.2), MicroDuckEnv.speed_range_task(0.1, 0.3), MicroDuckEnv.standing_task()]
    )
    assert task_commands(library) == [(0.2, 0.0), (0.1, 0.0), (0.3, 0.0), (0.0, 0.0)]
