"""Evaluation bookkeeping on a scripted env."""

from __future__ import annotations

import math

import numpy as np
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


class Alternating(torch.nn.Module):
    """Bang-bang: +1.5 (clipped to the bound +1), then -1, then +1.5, ... in both envs."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, observation):
        self.calls += 1
        return torch.full((observation.shape[0], 1), 1.5 if self.calls % 2 else -1.0)


class Constant(torch.nn.Module):
    def forward(self, observation):
        return torch.full((observation.shape[0], 1), 0.5)


def test_action_saturation_and_change():
    # Env 0 (the one that does not fall) runs 4 steps. Bang-bang: every action at a bound; changes from
    # the reset's zero action 1, then 2, 2, 2 (the 1.5 counts as the clipped 1): mean 7 / 4.
    flipping = evaluate(ScriptedEnv(), Alternating())
    assert flipping.action_saturation == pytest.approx(1.0)
    assert flipping.action_change == pytest.approx(7 / 4)
    # A constant 0.5: never at a bound; it changes once, by 0.5, in 4 steps.
    steady = evaluate(ScriptedEnv(), Constant())
    assert steady.action_saturation == pytest.approx(0.0)
    assert steady.action_change == pytest.approx(0.5 / 4)


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


# ---------------------------------------------------------------------------
# Per task: evaluate_tasks and the hop figures
# ---------------------------------------------------------------------------


class TwoTaskScriptedEnv(ScriptedEnv):
    """Two envs and a library of two tasks, each env running the task pinned at reset.

    Task 0 (``tracking+0.20``, command (0.2, 0)): env 0 moves at (0.2, 0.05) m/s, env 1 at (0.1, 0)
    and falls at step 2; feet stay down. Task 1 (``jump``, command 0): no speed; env 0's trunk
    rises above the standing height 0.1 m as in :data:`HOP_HEIGHTS` with both feet off the ground
    where :data:`HOP_AIRBORNE` says so; env 1 makes one huge hop, then falls at step 5.
    Episodes are truncated after 8 steps.
    """

    max_episode_steps = 8
    standing_height = 0.1
    # Steps 1..8 of env 0 in the jump task: two flights, steps 2-3 (peak 3 cm) and step 6 (2 cm).
    HOP_AIRBORNE = (False, True, True, False, False, True, False, False)
    HOP_HEIGHTS = (0.0, 0.01, 0.03, 0.0, 0.0, 0.02, 0.0, 0.0)

    def __init__(self):
        from waddle.envs.microduck import MicroDuckEnv
        from waddle.envs.microduck.tasks import as_task_library

        super().__init__()
        self.tasks = as_task_library([MicroDuckEnv.tracking_task(0.2), MicroDuckEnv.jump_task()])
        self.observation_spec["task_id"] = Bounded(0, 1, (2, 1), dtype=torch.int64)
        self.task = 0

    def _observation(self):
        observation = torch.zeros(2, 8)
        if self.task == 0:
            observation[0, 6], observation[0, 7] = 0.2, 0.05
            observation[1, 6] = 0.1
        command = self.tasks.command_low[self.task].expand(2, 2)
        return {"observation": observation, "command": command, "task_id": torch.full((2, 1), self.task)}

    def _reset(self, tensordict=None, **kwargs):
        assert tensordict is not None and "task_id" in tensordict.keys(), "evaluate_tasks pins the task"
        self.task = int(tensordict["task_id"][0])
        assert torch.equal(tensordict["command"][0], self.tasks.command_low[self.task])
        return super()._reset(tensordict)

    def _step(self, tensordict):
        out = super()._step(tensordict)
        fall_step = 2 if self.task == 0 else 5
        out["terminated"] = torch.tensor([[False], [self.t >= fall_step]])
        out["truncated"] = torch.tensor([[self.t >= 8], [False]])
        out["done"] = out["terminated"] | out["truncated"]
        return out

    def foot_contacts(self):
        if self.task == 0 or self.t == 0:
            return torch.ones(2, 2, dtype=torch.bool)
        env0 = not self.HOP_AIRBORNE[min(self.t, 8) - 1]
        env1 = self.t != 1  # one flight at step 1, landing at step 2
        return torch.tensor([[env0, env0], [env1, env1]])

    def foot_heights(self):
        return torch.where(self.foot_contacts(), 0.001, 0.02)

    def base_height(self):
        if self.task == 0 or self.t == 0:
            return torch.full((2,), self.standing_height)
        return torch.tensor([self.HOP_HEIGHTS[min(self.t, 8) - 1], 0.5 if self.t == 1 else 0.0]) + 0.1


class RecordingPolicy(torch.nn.Module):
    """A task-conditioned policy that acts 0 and remembers the task ids it was given."""

    reads_task_id = True

    def __init__(self):
        super().__init__()
        self.seen = []

    def forward(self, observation, task_id):
        self.seen.append(task_id.flatten().tolist())
        return torch.zeros(observation.shape[0], 1)


def test_evaluate_tasks_gives_one_row_per_task_with_hop_figures_for_the_jump_row():
    from waddle.algorithms.evaluation import evaluate_tasks

    policy = RecordingPolicy()
    tracking, jump = evaluate_tasks(TwoTaskScriptedEnv(), policy)
    assert (tracking.task, tracking.task_id, tracking.hop_task) == ("tracking+0.20", 0, False)
    assert (jump.task, jump.task_id, jump.hop_task) == ("jump", 1, True)
    assert tracking.command == (pytest.approx(0.2), 0.0) and jump.command == (0.0, 0.0)
    # Each row's policy saw its own task's id in every env, for every step until both were done.
    assert policy.seen == [[0, 0], [0, 0]] + [[0, 0]] * 6 + [[1, 1]] * 5 + [[1, 1]] * 3

    # Tracking: env 1 fell at step 2, so the speeds are env 0's alone.
    assert tracking.survival == pytest.approx(0.5)
    assert tracking.mean_forward_speed == pytest.approx(0.2)
    assert tracking.mean_lateral_speed == pytest.approx(0.05)
    assert tracking.mean_return == pytest.approx((8 + 2) / 2)
    assert tracking.airborne_fraction == 0.0 and tracking.hop_frequency_hz == 0.0
    assert math.isnan(tracking.hop_height)  # no flight

    # Jump: env 1's 50 cm hop came before its fall, so it does not count.
    assert jump.survival == pytest.approx(0.5)
    assert jump.hop_height == pytest.approx((0.03 + 0.02) / 2)
    assert jump.airborne_fraction == pytest.approx(3 / 8)
    assert jump.hop_frequency_hz == pytest.approx(2 / (8 * 0.02))
    assert jump.mean_forward_speed == 0.0


def test_evaluate_tasks_films_the_first_row_or_the_named_task(monkeypatch):
    from waddle.algorithms import evaluation

    filmed = []
    real = evaluation.evaluate

    def recording(env, policy, *, video_path=None, task_id=None, **kwargs):
        if video_path is not None:
            filmed.append(task_id)
        return real(env, policy, task_id=task_id, **kwargs)

    monkeypatch.setattr(evaluation, "evaluate", recording)
    evaluation.evaluate_tasks(TwoTaskScriptedEnv(), RecordingPolicy(), video_path="run.mp4")
    evaluation.evaluate_tasks(TwoTaskScriptedEnv(), RecordingPolicy(), video_path="run.mp4", video_task="jump")
    assert filmed == [0, 1]
    with pytest.raises(ValueError, match=r"video_task: 'hop' is not a task.*\['tracking\+0.20', 'jump'\]"):
        evaluation.evaluate_tasks(TwoTaskScriptedEnv(), RecordingPolicy(), video_path="run.mp4", video_task="hop")
    assert filmed == [0, 1]  # refused before anything ran


def test_the_table_as_csv(tmp_path):
    import csv

    from waddle.algorithms.evaluation import evaluate_tasks
    from waddle.cli.evaluate import format_table, write_csv

    results = evaluate_tasks(TwoTaskScriptedEnv(), RecordingPolicy())
    path = tmp_path / "eval.csv"
    write_csv(results, path)
    with open(path, newline="") as file:
        rows = list(csv.DictReader(file))
    assert [row["task"] for row in rows] == ["tracking+0.20", "jump"]
    assert [row["task_id"] for row in rows] == ["0", "1"]
    assert float(rows[0]["command_vx"]) == pytest.approx(0.2) and float(rows[0]["command_vy"]) == 0.0
    assert [float(row["survival"]) for row in rows] == [0.5, 0.5]
    assert float(rows[0]["forward_speed_mps"]) == pytest.approx(0.2)
    assert float(rows[0]["lateral_speed_mps"]) == pytest.approx(0.05)
    assert float(rows[0]["episode_return"]) == pytest.approx(5.0)
    # Hop columns: empty where the task does not reward hops, the figures where it does.
    assert rows[0]["hop_height_m"] == rows[0]["airborne_fraction"] == rows[0]["hop_frequency_hz"] == ""
    assert float(rows[1]["hop_height_m"]) == pytest.approx(0.025)
    assert float(rows[1]["airborne_fraction"]) == pytest.approx(0.375)
    assert float(rows[1]["hop_frequency_hz"]) == pytest.approx(12.5)
    table = format_table(results).splitlines()
    assert table[2].split()[0] == "tracking+0.20" and table[2].split()[-3:] == ["-", "-", "-"]
    assert table[3].split()[0] == "jump" and table[3].split()[-3:] == ["2.50", "37.5", "12.50"]


def _body_velocity_by_hand(qpos: np.ndarray, qvel: np.ndarray) -> np.ndarray:
    """World-frame free-joint velocity rotated into the trunk frame, with MuJoCo's own quaternion maths."""
    import mujoco

    out = np.zeros(3)
    inverse = np.zeros(4)
    mujoco.mju_negQuat(inverse, qpos[3:7])
    mujoco.mju_rotVecQuat(out, qvel[:3], inverse)
    return out


def _yaw_by_hand(quaternion: np.ndarray) -> float:
    w, x, y, z = quaternion
    return math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def test_per_task_speeds_and_drift_match_the_trajectory_on_microduck():
    from waddle.algorithms.evaluation import evaluate_tasks
    from waddle.algorithms.presets import make_env

    steps, num_envs = 20, 3  # the open-loop robot tips over after about 0.7 s: stop before
    env = make_env("mix", num_envs=num_envs, seed=5, max_episode_steps=steps)

    def state():
        return env.physics.qpos.double().numpy().copy(), env.physics.qvel.double().numpy().copy()

    states, commands, ends = [], [], []

    class Shuffle(torch.nn.Module):
        """An open-loop shuffle: hips and knees swing on a 2 Hz beat, so the trunk moves a little."""

        def forward(self, observation):
            t = len(states) % steps
            states.append(state())
            commands.append(observation[:, 9:11].clone())
            action = torch.zeros(observation.shape[0], 14)
            action[:, [0, 5, 7, 12]] = 0.5 * math.sin(2 * math.pi * 2.0 * t * 0.02)
            action[:, 1] = 0.3
            return action

    reset = env.reset

    def recording_reset(*args, **kwargs):
        ends.append(state())  # the last state of the row before (and, first, of nothing)
        return reset(*args, **kwargs)

    env.reset = recording_reset
    results = evaluate_tasks(env, Shuffle(), max_steps=steps)
    ends.append(state())
    env.close()
    assert [r.task for r in results] == ["standing", "tracking+0.20", "sidestep+0.15", "jump"]
    assert len(states) == 4 * steps  # nobody fell: every row ran its full episodes

    for index, result in enumerate(results):
        trajectory = states[index * steps : (index + 1) * steps] + [ends[index + 1]]
        after = trajectory[1:]  # the state after each step
        assert result.survival == 1.0
        for qpos, _ in after:
            assert (qpos[:, 2] > 0.55 * env.standing_height).all()  # standing: every env's speeds count
        velocity = np.array(
            [[_body_velocity_by_hand(qpos[i], qvel[i]) for i in range(num_envs)] for qpos, qvel in after]
        )
        assert result.mean_forward_speed == pytest.approx(velocity[:, :, 0].mean(), abs=1e-5)
        assert result.mean_lateral_speed == pytest.approx(velocity[:, :, 1].mean(), abs=1e-5)
        yaw_start = np.array([_yaw_by_hand(trajectory[0][0][i, 3:7]) for i in range(num_envs)])
        yaw_end = np.array([_yaw_by_hand(trajectory[-1][0][i, 3:7]) for i in range(num_envs)])
        assert result.yaw_drift_deg == pytest.approx(np.degrees(np.abs(yaw_end - yaw_start)).mean(), abs=1e-3)
        # Every env ran the row's task: its command is the task's.
        assert torch.equal(commands[index * steps], env.tasks.command_low[index].expand(num_envs, 2))
    assert max(abs(r.mean_forward_speed) for r in results) > 1e-3  # the figures are not trivially zero
