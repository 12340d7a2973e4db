"""The MicroDuck's left-right mirror, against the model's joint axes and MuJoCo's dynamics."""

from __future__ import annotations

import math

import mujoco
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from waddle.envs.microduck import MicroDuckEnv, constants
from waddle.envs.microduck.robot import DEFAULT_JOINT_POS, ROBOT_FIELDS
from waddle.envs.microduck.sensors import OBSERVATION_FIELDS, SENSOR_FIELDS
from waddle.envs.microduck.symmetry import JOINT_MIRROR_SIGN, JOINT_TWIN, MIRRORS, SignedPermutation

REFLECTION = np.diag([1.0, -1.0, 1.0])  # through the sagittal (x-z) plane


def mirror_qpos(qpos: np.ndarray) -> np.ndarray:
    """The reflected free-joint pose and joint angles (quaternion: R -> M R M)."""
    out = qpos.copy()
    out[1] = -qpos[1]
    out[3:7] = qpos[3:7] * np.array([1.0, -1.0, 1.0, -1.0])
    out[7:] = np.asarray(JOINT_MIRROR_SIGN) * qpos[7:][list(JOINT_TWIN)]
    return out


def mirror_qvel(qvel: np.ndarray) -> np.ndarray:
    """World linear velocity is a polar vector, the body-frame angular velocity an axial one."""
    out = qvel.copy()
    out[:3] = REFLECTION @ qvel[:3]
    out[3:6] = -REFLECTION @ qvel[3:6]
    out[6:] = np.asarray(JOINT_MIRROR_SIGN) * qvel[6:][list(JOINT_TWIN)]
    return out


@pytest.fixture(scope="module")
def model():
    return mujoco.MjModel.from_xml_path(str(constants.EMBEDDED_SCENE))


def test_joint_signs_follow_the_reflected_joint_axes(model):
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key(constants.STAND_KEYFRAME).id)
    mujoco.mj_kinematics(model, data)
    for joint, name in enumerate(constants.JOINT_NAMES):
        axis = data.xaxis[model.joint(name).id]
        twin_axis = data.xaxis[model.joint(constants.JOINT_NAMES[JOINT_TWIN[joint]]).id]
        reflected = -REFLECTION @ axis  # a rotation axis is an axial vector
        assert abs(abs(reflected @ twin_axis) - 1.0) < 1e-9, name  # the twin turns about the reflected line
        assert np.sign(reflected @ twin_axis) == JOINT_MIRROR_SIGN[joint], name
    stand = model.key(constants.STAND_KEYFRAME)
    np.testing.assert_allclose(mirror_qpos(stand.qpos), stand.qpos, atol=1e-12)  # STAND is its own mirror
    np.testing.assert_allclose(MIRRORS["action"](torch.tensor(stand.ctrl)).numpy(), stand.ctrl, atol=1e-12)


def test_mujoco_maps_a_mirrored_state_and_control_to_the_mirrored_state(model):
    """In the air (no contacts), one control step of the reflected state under the reflected control
    lands on the reflection of the original step, up to the model's own 0.3 % asymmetry (its inertias
    come from the CAD meshes); reflecting one joint the wrong way misses by far more."""
    rng = np.random.default_rng(0)
    home = model.key_ctrl[model.key(constants.STAND_KEYFRAME).id]

    def step(qpos, qvel, ctrl):
        data = mujoco.MjData(model)
        data.qpos[:], data.qvel[:], data.ctrl[:] = qpos, qvel, ctrl
        for _ in range(10):
            mujoco.mj_step(model, data)
        return data.qpos.copy(), data.qvel.copy()

    qpos = model.key_qpos[model.key(constants.STAND_KEYFRAME).id].copy()
    qpos[2] = 1.0
    qpos[3:7] = [0.99, 0.05, 0.03, 0.1]
    qpos[3:7] /= np.linalg.norm(qpos[3:7])
    qpos[7:] += rng.normal(0.0, 0.1, 14)
    qvel = rng.normal(0.0, 0.5, model.nv)
    ctrl = home + rng.uniform(-0.3, 0.3, 14)
    mirrored_ctrl = MIRRORS["action"](torch.tensor(ctrl)).numpy()

    after_qpos, after_qvel = step(qpos, qvel, ctrl)
    twin_qpos, twin_qvel = step(mirror_qpos(qpos), mirror_qvel(qvel), mirrored_ctrl)
    velocity_change = np.abs(after_qvel - qvel).max()
    assert velocity_change > 0.5
    assert np.abs(mirror_qvel(after_qvel) - twin_qvel).max() < 0.01 * velocity_change
    assert np.abs(mirror_qpos(after_qpos) - twin_qpos).max() < 1e-3

    wrong = mirrored_ctrl.copy()
    wrong[3] = 2 * home[3] - wrong[3]  # the left knee reflected with the other sign
    _, wrong_qvel = step(mirror_qpos(qpos), mirror_qvel(qvel), wrong)
    assert np.abs(mirror_qvel(after_qvel) - wrong_qvel).max() > 0.1 * velocity_change


def set_mirrored_states(env: MicroDuckEnv) -> None:
    """Put env 0 of two in a tilted, moving state off its reset pose and env 1 in its reflection."""
    state = env.get_state()
    qpos, qvel = state["qpos"].double().numpy(), state["qvel"].double().numpy()
    rng = np.random.default_rng(1)
    qpos[0, 7:] += rng.normal(0.0, 0.05, 14)
    qpos[0, 3:7] = [0.995, 0.04, 0.03, 0.08]
    qpos[0, 3:7] /= np.linalg.norm(qpos[0, 3:7])
    qvel[0] = rng.normal(0.0, 0.3, qvel.shape[1])
    qpos[1], qvel[1] = mirror_qpos(qpos[0]), mirror_qvel(qvel[0])
    dtype = state["qpos"].dtype
    env.physics.reset(torch.tensor(qpos, dtype=dtype), torch.tensor(qvel, dtype=dtype), torch.tensor([True, True]))


@pytest.mark.parametrize("key", ["observation", "sensor_observation"])
def test_env_observations_of_mirrored_states_are_mirrored(key):
    """Two envs, the second set to the reflection of the first and driven by the reflected action:
    every observed value but the gait clock (the same step count in both) is the reflection."""
    env = MicroDuckEnv(num_envs=2, seed=0, tasks=MicroDuckEnv.standing_task(joint_reset_noise_scale=0.0))
    env.reset()
    set_mirrored_states(env)
    action = torch.rand(14, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 2 - 1
    actions = torch.stack([action, MIRRORS["action"](action)]).to(env.dtype)
    out = env.step(TensorDict(action=actions, batch_size=[2]))["next"][key].double()

    fields = OBSERVATION_FIELDS if key == "observation" else SENSOR_FIELDS
    reflected = MIRRORS[key](out[0])
    velocities = {"angular_velocity", "gyro", "body_velocity", "joint_velocity"}
    for name, field in fields.items():
        if name == "gait_clock":
            torch.testing.assert_close(out[1][field.indices], out[0][field.indices])
            continue
        # Velocities carry the model's residual asymmetry (one step: 0.026 rad/s at head roll, of 0.5).
        atol = 0.03 if name in velocities else 3e-3
        torch.testing.assert_close(out[1][field.indices], reflected[field.indices], atol=atol, rtol=0, msg=name)
    joints = fields["joint_velocity"].indices
    assert (out[0][joints] - out[1][joints]).abs().max() > 0.3  # the two states differ: a wrong sign shows
    env.close()


def test_clock_reflection_is_half_a_gait_cycle_and_swaps_the_gait_prior_legs():
    """The gait prior lifts the left leg while sin(phase) > 0 and strides along cos(phase): the reflected
    prior is the prior half a cycle later exactly when the left lift pattern reflects onto the right one and
    the stride pattern onto its negative."""
    phase = 0.7
    clock = torch.zeros(56, dtype=torch.float64)
    start = OBSERVATION_FIELDS["gait_clock"].start
    clock[start : start + 3] = torch.tensor([math.sin(phase), math.cos(phase), 0.5])
    reflected = MIRRORS["observation"](clock)[start : start + 3]
    torch.testing.assert_close(
        reflected, torch.tensor([math.sin(phase + math.pi), math.cos(phase + math.pi), 0.5], dtype=torch.float64)
    )
    action = MIRRORS["action"]
    left, right, stride = (
        torch.tensor(p, dtype=torch.float64)
        for p in (constants.SWING_LIFT_LEFT, constants.SWING_LIFT_RIGHT, constants.STRIDE)
    )
    torch.testing.assert_close(action(left), right)
    torch.testing.assert_close(action(stride), -stride)


@pytest.mark.parametrize("key", ["observation", "sensor_observation", "robot_observation", "action"])
def test_every_mirror_is_an_involution(key):
    values = torch.randn(5, MIRRORS[key].size, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(MIRRORS[key](MIRRORS[key](values)), values)
    assert not torch.allclose(MIRRORS[key](values), values)


def test_signed_permutation_rejects_bad_input():
    with pytest.raises(ValueError, match="permutation of range"):
        SignedPermutation.from_lists([0, 0], [1.0, 1.0])
    with pytest.raises(ValueError, match="last dimension of 2"):
        SignedPermutation.from_lists([1, 0], [1.0, 1.0])(torch.zeros(3))


def test_robot_observations_of_mirrored_states_and_twists_are_mirrored():
    """As above for the robot's 61 floats: the second env is the reflection of the first, commanded the
    reflected twist ((vx, vy, vyaw) -> (vx, -vy, -vyaw)) and driven by the reflected action."""
    env = MicroDuckEnv(
        num_envs=2,
        seed=0,
        tasks=MicroDuckEnv.joystick_task(joint_reset_noise_scale=0.0),
        action_mode="robot",
        action_scale=0.7,
    )
    twist = TensorDict(
        command=torch.tensor([[0.2, 0.1], [0.2, -0.1]]),
        yaw_rate_command=torch.tensor([[0.5], [-0.5]]),
        batch_size=[2],
    )
    env.reset(twist)
    set_mirrored_states(env)
    action = torch.rand(14, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 0.6 - 0.3
    actions = torch.stack([action, MIRRORS["action"](action)]).to(env.dtype)
    out = env.step(TensorDict(action=actions, batch_size=[2]))["next"]["robot_observation"].double()

    reflected = MIRRORS["robot_observation"](out[0])
    twist_field = ROBOT_FIELDS["command"].indices
    torch.testing.assert_close(out[0][twist_field], torch.tensor([0.2, 0.1, 0.5], dtype=torch.float64))
    for name, field in ROBOT_FIELDS.items():
        atol = 0.03 if name in ("base_ang_vel", "joint_vel") else 3e-3
        torch.testing.assert_close(out[1][field.indices], reflected[field.indices], atol=atol, rtol=0, msg=name)
    env.close()


def test_the_robot_default_pose_is_its_own_mirror():
    pose = torch.tensor(DEFAULT_JOINT_POS, dtype=torch.float64)
    torch.testing.assert_close(MIRRORS["action"](pose), pose)
