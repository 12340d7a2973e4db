"""Per-env domain randomization, delays and sensor noise of MicroDuckEnv.

Expected values come from MuJoCo itself: models modified by hand with the
drawn values and stepped with ``mj_step``, sensors read from ``MjData``, and
delayed sequences worked out from the recorded inputs.
"""

import math

import mujoco
import numpy as np
import pytest
import torch
from torchrl.envs.utils import check_env_specs

from waddle.envs.microduck import MicroDuckEnv, MicroDuckRandomization
from waddle.envs.microduck.assets import load_model
from waddle.envs.microduck.constants import EMBEDDED_SCENE, FOOT_GEOMS, JOINT_NAMES
from waddle.envs.microduck.pushes import PushSchedule
from waddle.envs.microduck.randomization import PRESETS, DelayLine
from waddle.envs.microduck.sensors import SENSOR_FIELDS

STANDING = MicroDuckEnv.standing_task(joint_reset_noise_scale=0.0)
FRAME_SKIP = 10
MODEL_RANGES = dict(
    friction=(0.6, 1.4),
    mass=(0.8, 1.2),
    trunk_com=(-0.01, 0.01),
    head_com=(-0.01, 0.01),
    armature=(0.5, 1.5),
    frictionloss=(0.5, 1.5),
    damping=(0.5, 1.5),
    voltage=(0.7, 1.0),
    joint_offset=(-0.05, 0.05),
)


def _env(randomization, num_envs=3, **kwargs):
    kwargs.setdefault("tasks", STANDING)
    kwargs.setdefault("dtype", torch.float64)
    return MicroDuckEnv(num_envs=num_envs, seed=kwargs.pop("seed", 0), randomization=randomization, **kwargs)


def _actions(steps, num_envs, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return 0.5 * (2 * torch.rand(steps, num_envs, 14, generator=generator, dtype=torch.float64) - 1)


def _nominal_model():
    return load_model(EMBEDDED_SCENE, low_cost_collisions=True)


def _by_hand(values, row):
    """The nominal model with env ``row``'s drawn values written in field by field."""
    model = _nominal_model()
    value = {name: tensor[row].double().numpy() for name, tensor in values.items()}
    floor = model.geom("floor").id
    for geom in [model.geom(name).id for name in FOOT_GEOMS] + [floor]:
        model.geom_friction[geom, 0] *= value["friction"][0]
    for k, body in enumerate(range(1, model.nbody)):  # every body but the world is the robot's
        model.body_mass[body] *= value["mass"][k]
        model.body_inertia[body] *= value["mass"][k]
    model.body_ipos[model.body("trunk_base").id] += value["trunk_com"]
    model.body_ipos[model.body("jaw_soft").id] += value["head_com"]
    for j, name in enumerate(JOINT_NAMES):
        dof = model.jnt_dofadr[model.joint(name).id]
        model.dof_armature[dof] *= value["armature"][j]
        model.dof_frictionloss[dof] *= value["frictionloss"][j]
        model.dof_damping[dof] *= value["damping"][j] * value["voltage"][0]
    model.actuator_forcerange[:] *= value["voltage"][0]
    for body in range(model.nbody):
        subtree, stack = 0.0, [body]
        while stack:
            b = stack.pop()
            subtree += model.body_mass[b]
            stack += [c for c in range(1, model.nbody) if model.body_parentid[c] == b and c != b]
        model.body_subtreemass[body] = subtree
    return model


def _step_by_hand(model, qpos, qvel, ctrl):
    data = mujoco.MjData(model)
    data.qpos[:], data.qvel[:], data.ctrl[:] = qpos, qvel, ctrl
    for _ in range(FRAME_SKIP):
        mujoco.mj_step(model, data)
    return data


def _tilt_matrix(rotation_vector):
    vector = np.array([rotation_vector[0], rotation_vector[1], 0.0])
    angle = np.linalg.norm(vector)
    quat, matrix = np.zeros(4), np.zeros(9)
    mujoco.mju_axisAngle2Quat(quat, vector / max(angle, 1e-12), angle)
    mujoco.mju_quat2Mat(matrix, quat)
    return matrix.reshape(3, 3)


def _sensors_by_hand(model, qpos, qvel, tilt, offset):
    """Gravity and gyro in the (tilted) IMU frame and biased joint angles, from MuJoCo's data."""
    data = mujoco.MjData(model)
    data.qpos[:], data.qvel[:] = qpos, qvel
    mujoco.mj_forward(model, data)
    imu = model.site("imu").id
    site_to_world = data.site_xmat[imu].reshape(3, 3)
    tilt = _tilt_matrix(tilt)
    gyro = data.sensordata[model.sensor("imu_ang_vel").adr[0] :][:3]
    gravity = tilt.T @ site_to_world.T @ np.array([0.0, 0.0, -1.0])
    joints = data.qpos[7:] + offset - model.key("STAND").qpos[7:]
    return gravity, tilt.T @ gyro, joints


# --------------------------------------------------------------------------- the "none" default


def test_none_is_the_default_and_changes_nothing():
    actions = _actions(25, 2).float()
    runs = []
    for randomization in (None, "none", MicroDuckRandomization(), {}):
        kwargs = {} if randomization is None else {"randomization": randomization}
        env = MicroDuckEnv(num_envs=2, seed=3, tasks=MicroDuckEnv.tracking_task(0.2), reset_noise_scale=0.02, **kwargs)
        td = env.reset()
        reset, outputs = td.clone(), []
        for action in actions:
            td = td.clone()
            td["action"] = action
            td = env.step(td)["next"]
            outputs.append(td.clone())
        assert "randomization" not in td.keys()
        assert env.physics.model_of(1) is env.model
        runs.append((reset, torch.stack(outputs)))
        env.close()
    for reset, steps in runs[1:]:
        assert (reset == runs[0][0]).all()
        assert (steps == runs[0][1]).all()


# --------------------------------------------------------------------------- model parameters


def test_friction_draw_scales_the_foot_and_floor_friction_in_each_env_model():
    env = _env({"friction": (0.7, 0.7)}, num_envs=2)
    env.reset()
    nominal = _nominal_model()
    feet = [nominal.geom(name).id for name in FOOT_GEOMS]
    floor = nominal.geom("floor").id
    for row in range(2):
        friction = env.physics.model_of(row).geom_friction
        np.testing.assert_allclose(friction[feet + [floor], 0], 0.7 * nominal.geom_friction[feet + [floor], 0])
        others = [g for g in range(nominal.ngeom) if g not in feet + [floor]]
        np.testing.assert_array_equal(friction[others], nominal.geom_friction[others])
        np.testing.assert_array_equal(friction[feet + [floor], 1:], nominal.geom_friction[feet + [floor], 1:])
    # The foot-floor contacts MuJoCo builds with that model carry the scaled friction.
    model, state = env.physics.model_of(0), env.get_state()
    data = mujoco.MjData(model)
    data.qpos[:] = state["qpos"][0].numpy()
    mujoco.mj_forward(model, data)
    foot_contacts = [c for c in data.contact[: data.ncon] if set(c.geom) & set(feet)]
    assert foot_contacts
    for contact in foot_contacts:
        assert contact.friction[0] == pytest.approx(0.7)
    env.close()


def test_drawn_model_values_reach_each_env_model():
    env = _env(MODEL_RANGES, num_envs=3)
    td = env.reset()
    values = td["randomization"]
    for row in range(3):
        expected, actual = _by_hand(values, row), env.physics.model_of(row)
        for field in (
            "geom_friction",
            "body_mass",
            "body_inertia",
            "body_ipos",
            "body_subtreemass",
            "dof_armature",
            "dof_frictionloss",
            "dof_damping",
            "actuator_forcerange",
        ):
            np.testing.assert_allclose(getattr(actual, field), getattr(expected, field), rtol=1e-12, err_msg=field)
    assert not torch.allclose(values["mass"][0], values["mass"][1])  # each env draws its own
    env.close()


def test_randomized_step_matches_mujoco_with_a_model_modified_by_hand():
    env = _env(MODEL_RANGES, num_envs=2, reset_noise_scale=0.01)
    td = env.reset()
    values = td["randomization"]
    stand_ctrl = env.model.key("STAND").ctrl
    nominal = _nominal_model()
    moved_apart = 0.0
    for action in _actions(3, 2):
        before = env.get_state()
        td["action"] = action
        td = env.step(td)["next"]
        after = env.get_state()
        for row in range(2):
            ctrl = stand_ctrl + 0.35 * action[row].numpy() - values["joint_offset"][row].numpy()
            q, v = before["qpos"][row].numpy(), before["qvel"][row].numpy()
            data = _step_by_hand(_by_hand(values, row), q, v, ctrl)
            np.testing.assert_allclose(after["qpos"][row].numpy(), data.qpos, atol=1e-10)
            np.testing.assert_allclose(after["qvel"][row].numpy(), data.qvel, atol=1e-8)
            plain = _step_by_hand(nominal, q, v, stand_ctrl + 0.35 * action[row].numpy())
            moved_apart = max(moved_apart, float(np.abs(plain.qvel - data.qvel).max()))
    assert moved_apart > 1e-3  # the drawn values changed the motion
    env.close()


def test_model_draws_are_per_env_per_reset_and_seeded():
    def draws(seed):
        env = _env(PRESETS["upstream"], num_envs=4, seed=seed)
        first = env.reset()["randomization"].clone()
        second = env.reset()["randomization"].clone()
        env.close()
        return first, second

    first, second = draws(5)
    again, _ = draws(5)
    other, _ = draws(6)
    assert (first == again).all()
    assert not torch.equal(first["friction"], other["friction"])
    assert not torch.equal(first["friction"], second["friction"])  # drawn again at every reset
    config = PRESETS["upstream"]
    for name in ("friction", "mass", "armature", "frictionloss", "voltage", "joint_offset", "trunk_com", "head_com"):
        low, high = getattr(config, name)
        assert ((first[name] >= low) & (first[name] <= high)).all(), name
    tilt = first["imu_tilt"].norm(dim=-1)
    assert (tilt <= math.radians(6) + 1e-6).all()
    assert set(first["action_delay"].flatten().tolist()) <= {0.0, 1.0}


def test_partial_reset_redraws_only_the_reset_envs():
    env = _env(MODEL_RANGES, num_envs=3)
    td = env.reset()
    before = td["randomization"].clone()
    friction_before = [env.physics.model_of(r).geom_friction.copy() for r in range(3)]
    request = td.clone()
    request["_reset"] = torch.tensor([[False], [True], [False]])
    after = env.reset(request)["randomization"]
    assert (after[[0, 2]] == before[[0, 2]]).all()
    assert not torch.equal(after["mass"][1], before["mass"][1])
    np.testing.assert_array_equal(env.physics.model_of(0).geom_friction, friction_before[0])
    foot = env.model.geom(FOOT_GEOMS[0]).id
    assert env.physics.model_of(1).geom_friction[foot, 0] == pytest.approx(float(after["friction"][1, 0]))
    env.close()


def test_specs_of_a_randomized_env_pass_torchrl_check():
    env = MicroDuckEnv(num_envs=2, seed=0, randomization="upstream")
    check_env_specs(env)
    spec = env.observation_spec
    assert spec["sensor_observation"].shape == (2, 53)
    assert spec["randomization", "mass"].shape == (2, 15)
    assert spec["randomization", "joint_offset"].shape == (2, 14)
    env.close()


# --------------------------------------------------------------------------- delays, pushes, noise


def test_action_delay_applies_the_action_from_k_steps_ago(monkeypatch):
    env = _env({"action_delay": (0, 3)}, num_envs=4, seed=2)
    applied = []
    step = env.physics.step
    monkeypatch.setattr(env.physics, "step", lambda ctrl: (applied.append(ctrl.clone()), step(ctrl))[1])
    td = env.reset()
    delays = td["randomization", "action_delay"].squeeze(-1).long().tolist()
    assert len(set(delays)) > 1
    actions = _actions(7, 4)
    for action in actions:
        td["action"] = action
        td = env.step(td)["next"]
    stand = torch.as_tensor(env.model.key("STAND").ctrl)
    for t in range(7):
        for row, delay in enumerate(delays):
            sent = stand + 0.35 * actions[t - delay, row] if t >= delay else stand
            torch.testing.assert_close(applied[t][row], sent, rtol=0, atol=1e-12)
    env.close()


def test_imu_delay_and_late_joint_velocity_lag_the_readings_of_mujoco():
    env = _env({"imu_delay": (0, 2), "joint_velocity_delay": 1}, num_envs=4, seed=4)
    model = env.model
    td = env.reset()
    delays = td["randomization", "imu_delay"].squeeze(-1).long().tolist()
    assert len(set(delays)) > 1
    states, sensors = [env.get_state()], [td["sensor_observation"]]
    for action in _actions(5, 4):
        td["action"] = action
        td = env.step(td)["next"]
        states.append(env.get_state())
        sensors.append(td["sensor_observation"])
    gravity, gyro, velocity = (SENSOR_FIELDS[name].indices for name in ("projected_gravity", "gyro", "joint_velocity"))
    for t in range(6):
        for row, delay in enumerate(delays):
            source = states[max(t - delay, 0)]
            q, v = source["qpos"][row].numpy(), source["qvel"][row].numpy()
            expected_gravity, expected_gyro, _ = _sensors_by_hand(model, q, v, (0.0, 0.0), 0.0)
            np.testing.assert_allclose(sensors[t][row, gravity].numpy(), expected_gravity, atol=1e-12)
            np.testing.assert_allclose(sensors[t][row, gyro].numpy(), expected_gyro, atol=1e-10)
            late = states[max(t - 1, 0)]["qvel"][row, 6:]
            torch.testing.assert_close(sensors[t][row, velocity], late, rtol=0, atol=0)
    env.close()


@pytest.mark.parametrize(
    "config",
    [
        {"push_velocity": (0.3, 0.3), "push_interval": (0.09, 0.09)},
        # waddle train --push-scale 1.5 on a preset pushing 0.2 m/s: kicks of 0.3 m/s, at the same interval
        MicroDuckRandomization.preset("none", push_velocity=(0.2, 0.2), push_interval=(0.09, 0.09)).with_pushes_scaled(
            1.5
        ),
    ],
    ids=["kick", "scaled-kick"],
)
def test_pushes_kick_the_trunk_velocity_at_their_interval(config):
    env = _env(config, num_envs=2)
    model = _nominal_model()
    td = env.reset()
    stand = model.key("STAND").ctrl
    for step in range(1, 11):
        before = env.get_state()
        td["action"] = torch.zeros(2, 14, dtype=torch.float64)
        td = env.step(td)["next"]
        after = env.get_state()
        pushed = step % 5 == 0  # 0.09 s runs out during every fifth 0.02 s step
        for row in range(2):
            qvel = before["qvel"][row].numpy().copy()
            qvel[:2] += 0.3 if pushed else 0.0
            data = _step_by_hand(model, before["qpos"][row].numpy(), qvel, stand)
            np.testing.assert_allclose(after["qvel"][row].numpy(), data.qvel, atol=1e-8)
    env.close()


def test_a_push_strength_scales_the_kicks_dealt_and_leaves_the_draws_alone():
    """A curriculum's push strength deals that share of each kick; the timers, and every draw of the
    generator after them, are those of full-strength pushes (a ramp does not change the rest of the run)."""
    config = MicroDuckRandomization.preset("upstream")
    schedules = [PushSchedule(6, config, control_dt=0.02, dtype=torch.float64, device="cpu") for _ in range(2)]
    schedules[1].strength = 0.25
    generators = [torch.Generator().manual_seed(3) for _ in range(2)]
    for schedule, generator in zip(schedules, generators):
        schedule.begin(torch.ones(6, dtype=torch.bool), generator)
    dealt = 0
    for _ in range(400):  # 8 s: every env is pushed at least once (intervals of 3-6 s)
        full, weak = (schedule.tick(generator) for schedule, generator in zip(schedules, generators))
        assert (full is None) == (weak is None)
        if full is not None:
            assert torch.equal(full[0], weak[0])
            torch.testing.assert_close(weak[1], 0.25 * full[1], rtol=0, atol=0)
            dealt += int(full[0].sum())
    assert dealt >= 6
    torch.testing.assert_close(schedules[1].timer, schedules[0].timer, rtol=0, atol=0)
    assert torch.equal(generators[0].get_state(), generators[1].get_state())


@pytest.mark.parametrize("strength", [-0.1, 1.5, float("nan")])
def test_a_push_strength_outside_zero_to_one_is_refused(strength):
    schedule = PushSchedule(
        2, MicroDuckRandomization.preset("upstream"), control_dt=0.02, dtype=torch.float64, device="cpu"
    )
    with pytest.raises(ValueError, match=r"strength is the share of each kick dealt, within \[0, 1\].*--push-scale"):
        schedule.strength = strength
    assert schedule.strength == 1.0


def test_sensor_observation_without_noise_is_what_mujoco_measures():
    config = {"imu_tilt": (0.05, 0.1), "joint_offset": (-0.015, 0.015)}
    env = _env(config, num_envs=3, tasks=MicroDuckEnv.tracking_task(0.2), reset_noise_scale=0.01)
    model = env.model
    td = env.reset()
    actions = _actions(4, 3)
    for action in actions:
        td["action"] = action
        td = env.step(td)["next"]
    state, values, sensor = env.get_state(), td["randomization"], td["sensor_observation"]
    fields = SENSOR_FIELDS
    for row in range(3):
        q, v = state["qpos"][row].numpy(), state["qvel"][row].numpy()
        tilt, offset = values["imu_tilt"][row].numpy(), values["joint_offset"][row].numpy()
        gravity, gyro, joints = _sensors_by_hand(model, q, v, tilt, offset)
        elapsed = 4 * 0.02
        frequency = float(env.tasks.gait_frequency_hz[0])
        phase = MicroDuckEnv.GAIT_PHASE_OFFSET + 2 * math.pi * frequency * elapsed
        expected = {
            "projected_gravity": gravity,
            "gyro": gyro,
            "command": td["command"][row].numpy(),
            "joint_position": joints,
            "joint_velocity": v[6:],
            "gait_clock": [math.sin(phase), math.cos(phase), min(elapsed / 0.4, 1.0)],
            "previous_action": actions[-1, row].numpy(),
        }
        for name, value in expected.items():
            np.testing.assert_allclose(sensor[row, fields[name].indices].numpy(), value, atol=1e-9, err_msg=name)
    # the tilt shows: gravity in the IMU frame is not the trunk's
    trunk_gravity = td["observation"][:, :3]
    assert (sensor[:, :3] - trunk_gravity).abs().max() > 0.03
    env.close()


def test_noise_is_uniform_within_the_configured_half_widths():
    noisy = MicroDuckRandomization(
        gravity_noise=0.01, gyro_noise=0.03, joint_position_noise=0.001, joint_velocity_noise=0.25
    )
    env = _env(noisy, num_envs=64, tasks=MicroDuckEnv.tracking_task(0.2))
    model = env.model
    td = env.reset()
    deviations = {name: [] for name in SENSOR_FIELDS}
    for action in _actions(3, 64):
        td["action"] = action
        td = env.step(td)["next"]
        state = env.get_state()
        for row in range(64):
            q, v = state["qpos"][row].numpy(), state["qvel"][row].numpy()
            gravity, gyro, joints = _sensors_by_hand(model, q, v, (0.0, 0.0), 0.0)
            clean = {"projected_gravity": gravity, "gyro": gyro, "joint_position": joints, "joint_velocity": v[6:]}
            for name, value in clean.items():
                deviations[name].append(td["sensor_observation"][row, SENSOR_FIELDS[name].indices].numpy() - value)
    for name, half_width in (
        ("projected_gravity", 0.01),
        ("gyro", 0.03),
        ("joint_position", 0.001),
        ("joint_velocity", 0.25),
    ):
        noise = np.concatenate(deviations[name])
        assert np.abs(noise).max() <= half_width + 1e-9, name
        assert np.abs(noise).max() > 0.9 * half_width, name  # the whole width is used
        assert abs(noise.mean()) < 0.1 * half_width, name
        assert abs(noise.std() - half_width / math.sqrt(3)) < 0.1 * half_width, name  # uniform, not Gaussian
    env.close()


def test_the_critic_observation_stays_ground_truth_under_bias_and_noise():
    env = _env("upstream", num_envs=4, tasks=MicroDuckEnv.tracking_task(0.2))
    td = env.reset()
    for action in _actions(3, 4):
        td["action"] = action
        td = env.step(td)["next"]
    state = env.get_state()
    stand = torch.as_tensor(env.model.key("STAND").qpos[7:])
    truth = state["qpos"][:, 7:] - stand
    joint_error = td["observation"][:, MicroDuckEnv.JOINT_ERROR_START : MicroDuckEnv.JOINT_VELOCITY_START]
    torch.testing.assert_close(joint_error, truth, rtol=0, atol=1e-12)
    sensed = td["sensor_observation"][:, SENSOR_FIELDS["joint_position"].indices]
    bias = td["randomization", "joint_offset"]
    assert (sensed - truth - bias).abs().max() <= 0.001 + 1e-9  # the encoder adds its bias and noise
    assert (sensed - truth).abs().max() > 0.005
    env.close()


def test_a_sensor_history_stacks_the_single_frame_readings_newest_first():
    """The same seed draws the same physics and noise with any history: the stack of three frames is the
    one-frame env's readings of this step and the two before, and a reset refills only the reset envs."""
    one = _env("upstream", num_envs=2, tasks=MicroDuckEnv.tracking_task(0.2))
    three = _env("upstream", num_envs=2, tasks=MicroDuckEnv.tracking_task(0.2), sensor_history=3)
    assert three.observation_spec["sensor_observation"].shape == (2, 159)
    td_one, td_three = one.reset(), three.reset()
    readings = [td_one["sensor_observation"]]
    torch.testing.assert_close(td_three["sensor_observation"], readings[0].repeat(1, 3), rtol=0, atol=0)
    for action in _actions(4, 2):
        td_one = one.step(td_one.set("action", action))["next"]
        td_three = three.step(td_three.set("action", action))["next"]
        readings.insert(0, td_one["sensor_observation"])
        stacked = torch.cat([readings[min(k, len(readings) - 1)] for k in range(3)], dim=-1)
        torch.testing.assert_close(td_three["sensor_observation"], stacked, rtol=0, atol=0)
    before = td_three["sensor_observation"].clone()
    reset = td_three.set("_reset", torch.tensor([[True], [False]]))
    after = three.reset(reset)["sensor_observation"]
    torch.testing.assert_close(after[0], after[0, :53].repeat(3), rtol=0, atol=0)
    assert not torch.equal(after[0, :53], before[0, :53])
    torch.testing.assert_close(after[1], before[1], rtol=0, atol=0)
    # the mirror reflects every frame as the one-frame mirror does
    mirror, single = three.MIRRORS["sensor_observation"], one.MIRRORS["sensor_observation"]
    torch.testing.assert_close(mirror(after), torch.cat([single(frame) for frame in after.split(53, -1)], -1))
    one.close()
    three.close()


@pytest.mark.parametrize("history", [0, -1, 1.5, True])
def test_a_sensor_history_that_is_not_a_positive_integer_is_refused(history):
    with pytest.raises(ValueError, match=r"sensor_history must be an integer >= 1"):
        MicroDuckEnv(num_envs=1, sensor_history=history)


# --------------------------------------------------------------------------- the sensor layout


def test_sensor_layout_is_contiguous_and_free_of_ground_truth():
    starts = [field.start for field in SENSOR_FIELDS.values()]
    stops = [field.stop for field in SENSOR_FIELDS.values()]
    assert starts[0] == 0 and starts[1:] == stops[:-1] and stops[-1] == MicroDuckEnv.SENSOR_DIM == 53
    assert list(SENSOR_FIELDS) == [
        "projected_gravity",
        "gyro",
        "command",
        "joint_position",
        "joint_velocity",
        "gait_clock",
        "previous_action",
    ]
    assert SENSOR_FIELDS["joint_position"].indices == slice(8, 22)
    assert SENSOR_FIELDS["joint_velocity"].unit == "rad/s"


def test_delay_line_returns_the_value_pushed_k_steps_ago():
    line = DelayLine(3, 1, 2, dtype=torch.float64, device=torch.device("cpu"))
    rows = torch.ones(3, dtype=torch.bool)
    line.set_delay(torch.tensor([0, 1, 2]), rows)
    line.fill(torch.full((3, 1), -1.0, dtype=torch.float64), rows)
    got = [line.push(torch.full((3, 1), float(t), dtype=torch.float64)).flatten().tolist() for t in range(4)]
    assert got == [[0, -1, -1], [1, 0, -1], [2, 1, 0], [3, 2, 1]]
    with pytest.raises(ValueError, match=r"within 0\.\.2 steps"):
        line.set_delay(torch.tensor([3, 0, 0]), rows)


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"friction": (1.3, 0.7)}, r"friction must have low <= high, got low=1.3 > high=0.7"),
        ({"voltage": (-0.1, 1.0)}, r"voltage is a scale: its range must be >= 0"),
        ({"mass": (0.0, 1.0)}, r"mass is a scale: its range must be > 0"),
        ({"action_delay": (0, 1.5)}, r"action_delay must be a \(low, high\) pair of integers"),
        ({"action_delay": (-1, 1)}, r"action_delay must be >= 0"),
        ({"gyro_noise": -0.1}, r"gyro_noise is a noise half-width and must be >= 0"),
        ({"friction": 0.7}, r"friction must be a \(low, high\) pair of numbers"),
        ({"fricton": (0.7, 1.3)}, r"unknown randomization parameter\(s\) \['fricton'\]; accepted names: \['friction',"),
    ],
)
def test_bad_ranges_are_refused_with_the_reason(overrides, message):
    with pytest.raises(ValueError, match=message):
        MicroDuckRandomization.preset("none", **overrides)


@pytest.mark.parametrize(
    ("preset", "scale", "message"),
    [
        ("upstream", 0.0, r"push scale must be a finite number > 0, got 0\.0"),
        ("upstream", -1.5, r"push scale must be a finite number > 0, got -1\.5"),
        ("upstream", math.nan, r"push scale must be a finite number > 0, got nan"),
        ("none", 1.5, r"a push scale of 1\.5 needs a randomization that pushes \(push_velocity is \(0\.0, 0\.0\)\)"),
    ],
)
def test_a_push_scale_that_cannot_apply_is_refused_with_the_reason(preset, scale, message):
    with pytest.raises(ValueError, match=message):
        MicroDuckRandomization.preset(preset).with_pushes_scaled(scale)


def test_bad_randomization_arguments_name_what_is_accepted():
    with pytest.raises(ValueError, match=r"preset must be one of \['none', 'upstream'\], got 'strong'"):
        MicroDuckEnv(randomization="strong")
    with pytest.raises(ValueError, match=r"unknown randomization parameter\(s\) \['pushes'\]"):
        MicroDuckEnv(randomization={"pushes": (0.1, 0.2)})
    with pytest.raises(ValueError, match="randomization must be a MicroDuckRandomization, a preset name"):
        MicroDuckEnv(randomization=0.5)


def test_backends_without_per_env_models_refuse_model_randomization():
    pytest.importorskip("mujoco_torch")
    with pytest.raises(ValueError, match=r"backend='mujoco-torch' cannot simulate\. Use backend='mujoco'"):
        MicroDuckEnv(backend="mujoco-torch", frictionloss="ignore", randomization="upstream")


def test_an_unseeded_env_under_the_upstream_randomization_resets_and_steps():
    env = MicroDuckEnv(num_envs=2, randomization="upstream")  # no seed: every generator unseeded, none missing
    td = env.reset()
    td = env.step(td.set("action", torch.zeros(2, 14)))["next"]
    assert torch.isfinite(td["robot_observation"]).all() and torch.isfinite(td["sensor_observation"]).all()
    env.close()
