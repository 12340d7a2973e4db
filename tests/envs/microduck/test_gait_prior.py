"""The walking presets' gait prior: its joint patterns against MuJoCo kinematics, its values by hand."""

from __future__ import annotations

import math

import mujoco
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from waddle.envs.microduck import MicroDuckEnv, constants
from waddle.envs.microduck.tasks import WALKING_PRIOR


@pytest.fixture(scope="module")
def kinematics():
    model = mujoco.MjModel.from_xml_path(str(constants.EMBEDDED_SCENE))
    data = mujoco.MjData(model)
    stand = model.key(constants.STAND_KEYFRAME).id

    def feet(offset):
        """Foot site positions in the trunk frame and sole normals, after adding ``offset`` to STAND's joints."""
        mujoco.mj_resetDataKeyframe(model, data, stand)
        data.qpos[7:] += np.asarray(offset, dtype=float)
        mujoco.mj_kinematics(model, data)
        out = []
        for name in constants.FOOT_SITES:
            site = model.site(name).id
            out.append((data.site_xpos[site].copy(), data.site_xmat[site].reshape(3, 3)[:, 2].copy()))
        return out

    return feet


def _tilt_deg(normal, reference):
    return math.degrees(math.acos(np.clip(np.dot(normal, reference), -1.0, 1.0)))


@pytest.mark.parametrize("side, pattern", [(0, constants.SWING_LIFT_LEFT), (1, constants.SWING_LIFT_RIGHT)])
def test_a_lift_raises_one_foot_and_keeps_its_sole_level(kinematics, side, pattern):
    (stand_left, stand_right) = kinematics(np.zeros(14))
    lifted = kinematics(0.3 * np.asarray(pattern))
    position, normal = lifted[side]
    stand_position, stand_normal = (stand_left, stand_right)[side]
    assert position[2] - stand_position[2] > 0.012  # 0.3 rad of lift raises the foot by more than 1.2 cm
    assert abs(position[0] - stand_position[0]) < 0.002  # straight up, not forward or back
    assert _tilt_deg(normal, stand_normal) < 1.0
    other_position, other_normal = lifted[1 - side]
    np.testing.assert_allclose(other_position, (stand_left, stand_right)[1 - side][0], atol=1e-9)


def test_the_stride_swings_the_feet_apart_with_level_soles(kinematics):
    (left0, left_n0), (right0, right_n0) = kinematics(np.zeros(14))
    (left, left_n), (right, right_n) = kinematics(0.2 * np.asarray(constants.STRIDE))
    assert left[0] - left0[0] < -0.012 and right[0] - right0[0] > 0.012  # left back, right forward
    assert _tilt_deg(left_n, left_n0) < 1.0 and _tilt_deg(right_n, right_n0) < 1.0


def test_prior_values_by_hand():
    task = MicroDuckEnv.tracking_task(0.2, gait_prior_lift=0.2, gait_prior_stride_per_mps=1.5)
    env = MicroDuckEnv(num_envs=3, seed=0, tasks=[task])
    env.reset()
    steps = (5, 30, 45)  # a quarter of the way up the 0.4 s (20-step) ramp, then past it
    env._step_count[:] = torch.tensor(steps)
    prior = env.gait_prior()
    for row, (count, ramp) in enumerate(zip(steps, (0.25, 1.0, 1.0))):
        phase = -1.5237 + 2 * math.pi * 1.8913 * count * 0.02
        left, right = 0.2 * ramp * max(0.0, math.sin(phase)), 0.2 * ramp * max(0.0, -math.sin(phase))
        stride = 1.5 * 0.2 * math.cos(phase) * ramp
        expected = [0.0] * 14
        expected[2], expected[3], expected[4] = left + stride, 2 * left, left - stride
        expected[11], expected[12], expected[13] = -right + stride, -2 * right, -right - stride
        torch.testing.assert_close(prior[row], torch.tensor(expected, dtype=prior.dtype), rtol=0, atol=1e-5)


def test_prior_is_off_for_standing_and_jumping():
    library = [
        MicroDuckEnv.tracking_task(0.2, **WALKING_PRIOR),
        MicroDuckEnv.standing_task(),
        MicroDuckEnv.jump_task(),
    ]
    env = MicroDuckEnv(num_envs=3, seed=0, tasks=library)
    env.reset(TensorDict(task_id=torch.tensor([0, 1, 2]), batch_size=[3]))
    env._step_count[:] = 30
    prior = env.gait_prior()
    assert prior[0].abs().max() > 0.05 and torch.all(prior[1:] == 0)


def test_the_step_applies_the_prior_under_the_action():
    """A zero action on a walking task drives the joints toward STAND plus the prior, not STAND."""
    task = MicroDuckEnv.tracking_task(0.2, gait_prior_lift=0.4)
    env = MicroDuckEnv(num_envs=1, seed=0, tasks=[task])
    sent = []
    step = env.physics.step
    env.physics.step = lambda ctrl: (sent.append(ctrl.clone()), step(ctrl))[1]
    td = env.reset()
    for _ in range(25):
        expected = env._home_ctrl + env.gait_prior()
        td = env.step(td.set("action", torch.zeros(1, 14)))["next"]
        torch.testing.assert_close(sent[-1], expected)
    assert (sent[-1] - env._home_ctrl).abs().max() > 0.1


def test_negative_prior_fields_are_refused():
    with pytest.raises(ValueError, match="gait_prior_lift must be >= 0"):
        MicroDuckEnv.tracking_task(0.2, gait_prior_lift=-0.1)
    with pytest.raises(ValueError, match="gait_prior_stride_per_mps must be >= 0"):
        MicroDuckEnv.tracking_task(0.2, gait_prior_stride_per_mps=-1.0)
