"""MicroDuckEnv core: observation layout, action mapping, episodes and bad input.

Expected values come from MuJoCo's own data (``MjData`` after ``mj_forward`` or
``mj_step``), not from the env's helpers.
"""

import math

import mujoco
import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import check_env_specs

from waddle.envs.microduck import MicroDuckEnv
from waddle.envs.microduck.constants import EMBEDDED_SCENE, JOINT_NAMES
from waddle.envs.microduck.rewards import register_reward

STANDING = MicroDuckEnv.standing_task(joint_reset_noise_scale=0.0)


@pytest.fixture
def env():
    env = MicroDuckEnv(num_envs=3, seed=0, tasks=MicroDuckEnv.tracking_task(0.2), reset_noise_scale=0.01)
    yield env
    env.close()


def _mjdata(env, row):
    """A MuJoCo MjData holding env ``row``'s state after ``mj_forward``."""
    state = env.get_state()
    data = mujoco.MjData(env.model)
    data.qpos[:] = state["qpos"][row].double().numpy()
    data.qvel[:] = state["qvel"][row].double().numpy()
    mujoco.mj_forward(env.model, data)
    return data


def test_embedded_model_is_used_without_assets(monkeypatch, tmp_path):
    monkeypatch.delenv("MICRODUCK_RL_ROOT", raising=False)
    env = MicroDuckEnv(num_envs=1, root=tmp_path)
    assert env.scene_path == EMBEDDED_SCENE
    assert env.backend == "mujoco"
    env.close()


def test_specs_pass_torchrl_check(env):
    check_env_specs(env)
    assert env.observation_spec["observation"].shape == (3, 56)
    assert env.action_spec.shape == (3, 14)
    assert set(env.state_spec.keys()) == {"task_id", "command", "yaw_rate_command"}


def test_observation_layout_matches_mujoco_data(env):
    td = env.reset()
    actions = torch.rand(4, 3, 14, generator=torch.Generator().manual_seed(3)) * 2 - 1
    for action in actions:
        td["action"] = action
        td = env.step(td)["next"]
    obs = td["observation"]
    trunk = env.model.body("trunk_base").id
    stand = env.model.key("STAND").qpos
    for row in range(3):
        data = _mjdata(env, row)
        rotation = data.xmat[trunk].reshape(3, 3)  # body to world
        velocity = np.zeros(6)  # (angular, linear) at the trunk frame, trunk axes
        mujoco.mj_objectVelocity(env.model, data, mujoco.mjtObj.mjOBJ_XBODY, trunk, velocity, 1)
        task = env.tasks[0]
        command = td["command"][row].double()
        frequency = float(task.gait_frequency_hz) + float(task.gait_frequency_per_mps) * float(command.norm())
        elapsed = 4 * 0.02
        phase = MicroDuckEnv.GAIT_PHASE_OFFSET + 2 * math.pi * frequency * elapsed
        expected = np.concatenate(
            [
                rotation.T @ np.array([0.0, 0.0, -1.0]),
                velocity[:3],
                velocity[3:],
                command.numpy(),
                data.qpos[7:] - stand[7:],
                data.qvel[6:],
                [math.sin(phase), math.cos(phase), min(elapsed / 0.4, 1.0)],
                actions[-1, row].numpy(),
            ]
        )
        np.testing.assert_allclose(obs[row].double().numpy(), expected, atol=2e-5)
    starts = (MicroDuckEnv.BODY_VELOCITY_START, MicroDuckEnv.COMMAND_START, MicroDuckEnv.GAIT_PHASE_START)
    assert starts == (6, 9, 39)
    assert torch.equal(obs[:, 9:11], td["command"])


def test_action_is_an_offset_around_stand_targets_held_for_ten_substeps(env):
    env.reset()
    before = env.get_state()
    action = torch.linspace(-1, 1, 14).expand(3, 14).contiguous()
    env.step(TensorDict(action=action, batch_size=[3]))
    model = env.model
    for row in range(3):
        data = mujoco.MjData(model)
        data.qpos[:] = before["qpos"][row].double().numpy()
        data.qvel[:] = before["qvel"][row].double().numpy()
        data.ctrl[:] = model.key("STAND").ctrl + 0.35 * action[row].double().numpy()
        for _ in range(10):  # 0.02 s control period / 0.002 s timestep
            mujoco.mj_step(model, data)
        np.testing.assert_allclose(env.get_state()["qpos"][row].double().numpy(), data.qpos, atol=1e-5)
    assert [model.actuator(i).name for i in range(14)] == list(JOINT_NAMES)


def test_fall_terminates_only_the_fallen_env(env):
    env.reset()
    state = env.get_state()
    qpos = state["qpos"].clone()
    tilt = math.radians(80)  # about the trunk's x axis
    qpos[1, 3:7] = torch.tensor([math.cos(tilt / 2), math.sin(tilt / 2), 0.0, 0.0])
    env.physics.reset(qpos, state["qvel"], torch.tensor([False, True, False]))
    out = env.step(TensorDict(action=torch.zeros(3, 14), batch_size=[3]))["next"]
    assert out["terminated"].squeeze(-1).tolist() == [False, True, False]
    assert out["done"].squeeze(-1).tolist() == [False, True, False]


def test_low_trunk_terminates(env):
    env.reset()
    state = env.get_state()
    qpos = state["qpos"].clone()
    qpos[0, 2] = 0.04  # below 0.55 of the 0.12 m standing height
    env.physics.reset(qpos, state["qvel"], torch.tensor([True, False, False]))
    out = env.step(TensorDict(action=torch.zeros(3, 14), batch_size=[3]))["next"]
    assert out["terminated"].squeeze(-1).tolist() == [True, False, False]


def test_non_finite_physics_ends_one_episode_and_keeps_the_batch_finite(env):
    env.reset()
    state = env.get_state()
    qvel = state["qvel"].clone()
    qvel[2, 6:] = 1e30
    env.physics.reset(state["qpos"], qvel, torch.tensor([False, False, True]))
    out = env.step(TensorDict(action=torch.zeros(3, 14), batch_size=[3]))["next"]
    assert out["terminated"].squeeze(-1).tolist() == [False, False, True]
    assert torch.isfinite(out["observation"]).all()
    assert torch.isfinite(out["reward"]).all()


def test_registered_term_returning_nan_or_inf_is_named(restore_reward_registry):
    @register_reward("lopsided", weight=1.0)
    def lopsided(features, params):
        return torch.tensor([0.0, math.nan, -math.inf])

    env = MicroDuckEnv(num_envs=3, seed=0, tasks=MicroDuckEnv.standing_task())  # built after registering
    env.reset()
    with pytest.raises(ValueError, match=r"term 'lopsided' returned NaN or inf for envs \[1, 2\]"):
        env.step(TensorDict(action=torch.zeros(3, 14), batch_size=[3]))
    env.close()


def test_truncation_at_max_episode_steps():
    env = MicroDuckEnv(num_envs=2, tasks=STANDING, max_episode_steps=3, seed=0)
    rollout = env.rollout(3, break_when_any_done=False)
    assert rollout["next", "truncated"].squeeze(-1).tolist() == [[False, False, True]] * 2
    assert rollout["next", "done"][:, -1].all()
    assert not rollout["next", "terminated"].any()
    env.close()


def test_partial_reset_touches_only_masked_envs(env):
    td = env.reset()
    for _ in range(3):
        td["action"] = torch.zeros(3, 14)
        td = env.step(td)["next"]
    before = env.get_state()
    request = td.clone()
    request["_reset"] = torch.tensor([[False], [True], [False]])
    out = env.reset(request)
    after = env.get_state()
    assert torch.equal(after["qpos"][[0, 2]], before["qpos"][[0, 2]])
    assert torch.equal(out["observation"][[0, 2]], td["observation"][[0, 2]])
    assert after["time"][1] == 0
    assert out["observation"][1, MicroDuckEnv.GAIT_PHASE_START + 2] == 0  # gait ramp restarts
    assert torch.all(out["observation"][1, -14:] == 0)  # no previous action after a reset


def test_default_task_tracks_a_slow_forward_command():
    env = MicroDuckEnv(num_envs=2, seed=0)
    td = env.reset()
    assert torch.allclose(td["command"], torch.tensor([[0.03, 0.0]] * 2))
    rollout = env.rollout(5)
    assert torch.isfinite(rollout["next", "reward"]).all()
    env.close()


@pytest.mark.parametrize(
    "action, message",
    [
        (torch.zeros(3, 13), r"shape \(3, 14\)"),
        (torch.zeros(3, 14, dtype=torch.int64), r"floating tensor of shape \(3, 14\)"),
        (torch.full((3, 14), float("nan")), r"non-finite entries in envs \[0, 1, 2\]"),
    ],
)
def test_bad_actions_are_refused(env, action, message):
    env.reset()
    with pytest.raises(ValueError, match=message):
        env.step(TensorDict(action=action, batch_size=[3]))


def test_a_reset_command_outside_the_box_names_the_first_envs_and_how_many():
    env = MicroDuckEnv(num_envs=12, seed=0, tasks=MicroDuckEnv.tracking_task(0.2))  # the box is (0.2, 0) exactly
    try:
        command = torch.zeros(12, 2)
        first = r"\[0, 1, 2, 3, 4, 5, 6, 7, ...\] \(12 in all\): got \[\[0\.0, 0\.0\](, \[0\.0, 0\.0\]){7}\], boxes"
        with pytest.raises(ValueError, match=rf"command box for envs {first}"):
            env.reset(TensorDict(command=command, batch_size=[12]))
        command[:, 0] = 0.2
        command[[2, 5], 0] = 0.5
        with pytest.raises(ValueError, match=r"for envs \[2, 5\]: got \[\[0\.5, 0\.0\], \[0\.5, 0\.0\]\], boxes"):
            env.reset(TensorDict(command=command, batch_size=[12]))
    finally:
        env.close()


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        ({"num_envs": 0}, ValueError, "num_envs"),
        ({"action_scale": -0.1}, ValueError, "action_scale"),
        ({"action_scale": float("inf")}, ValueError, "action_scale"),
        ({"max_episode_steps": 0}, ValueError, "max_episode_steps"),
        ({"backend": "bullet"}, ValueError, r"choose one of \['mjx', 'mujoco', 'mujoco-torch'\]"),
        ({"microduck_root": "/nonexistent/microduck_rl"}, FileNotFoundError, "/nonexistent/microduck_rl"),
        ({"requires_grad": True, "backend": "mujoco"}, ValueError, "backend='mjx'"),
    ],
)
def test_bad_construction_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        MicroDuckEnv(**kwargs)


def test_heading_error_is_the_wrapped_turn_since_reset():
    env = MicroDuckEnv(num_envs=2, seed=0)
    env.reset()
    torch.testing.assert_close(env.commands.target_heading, env.heading())  # recorded at reset
    env.commands.target_heading = torch.tensor([0.0, 3.0])
    yaw = torch.tensor([0.3, -3.0])
    qpos = env.physics.qpos.clone()
    qpos[:, 3:7] = torch.stack([torch.cos(yaw / 2), torch.zeros(2), torch.zeros(2), torch.sin(yaw / 2)], dim=-1)
    state = TensorDict(qpos=qpos, qvel=env.physics.qvel.clone(), batch_size=[2])
    features = env.reward_features(state, torch.zeros(2, 14))
    # -3.0 - 3.0 = -6.0 rad of turn is 2 pi - 6.0 = 0.283 rad the short way round.
    torch.testing.assert_close(features["heading_error"], torch.tensor([0.3, 2 * math.pi - 6.0]))


def test_walking_tasks_track_the_floor_displacement_over_one_gait_cycle():
    # Tracking alone pays dt * exp(-(vx - command)^2 / 0.05^2 - vy^2 / 0.05^2) of the tracked velocity.
    weights = dict.fromkeys(MicroDuckEnv.REWARD_TERMS, 0.0) | {"tracking": 1.0}
    task = MicroDuckEnv.speed_range_task(
        0.01,
        0.03,
        reward_weights=weights,
        gait_frequency_hz=1.0,
        gait_frequency_per_mps=50.0,
        tracking_std=0.05,
        tracking_relative_std=0.0,
    )
    env = MicroDuckEnv(tasks=task, num_envs=4, seed=0)
    td = env.reset()
    command = td["command"][:, 0].double()
    frequency = 1.0 + 50.0 * command  # the clock, Hz: 1.5 to 2.5
    window = torch.round(1.0 / (frequency * env.control_dt)).long()  # one cycle, in control steps
    floor, yaw = [], []

    def record():
        qpos = env.get_state()["qpos"].double()
        floor.append(qpos[:, :2].clone())
        w, z = qpos[:, 3], qpos[:, 6]
        yaw.append(torch.atan2(2 * w * z + 2 * qpos[:, 4] * qpos[:, 5], 1 - 2 * (qpos[:, 5] ** 2 + z**2)))

    record()
    actions = torch.rand(30, 4, 14, generator=torch.Generator().manual_seed(1)) * 0.2 - 0.1
    for step, action in enumerate(actions, start=1):
        td["action"] = action
        td = env.step(td)["next"]
        assert not td["done"].any()
        record()
        # The window grows from the reset until it spans a cycle (20 to 33 steps here).
        span = torch.minimum(window, torch.tensor(step))
        start = torch.stack([floor[step - int(s)][row] for row, s in enumerate(span)])
        world = (floor[step] - start) / (span.double() * env.control_dt).unsqueeze(-1)
        forward = torch.cos(yaw[step]) * world[:, 0] + torch.sin(yaw[step]) * world[:, 1]
        lateral = torch.cos(yaw[step]) * world[:, 1] - torch.sin(yaw[step]) * world[:, 0]
        expected = env.control_dt * torch.exp(-((forward - command) ** 2) / 0.05**2 - lateral**2 / 0.05**2)
        torch.testing.assert_close(td["reward"][:, 0].double(), expected, rtol=1e-4, atol=1e-7)
    env.close()
