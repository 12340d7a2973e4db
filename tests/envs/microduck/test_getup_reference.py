"""The scripted get-ups and the env's reference starts along them."""

from __future__ import annotations

import math

import mujoco
import numpy as np
import pytest
import torch

from waddle.algorithms.presets import make_env
from waddle.envs.microduck import MicroDuckEnv, assets
from waddle.envs.microduck import getup_reference as reference
from waddle.envs.microduck.constants import CONTROL_DT, EMBEDDED_SCENE, STAND_KEYFRAME
from waddle.envs.microduck.ground_contact import add_limb_collisions
from waddle.envs.microduck.robot import DEFAULT_JOINT_POS
from waddle.envs.microduck.tasks import LYING_STARTS

HOME = np.asarray(DEFAULT_JOINT_POS)


@pytest.fixture(scope="module")
def model() -> mujoco.MjModel:
    spec = assets.load_spec(EMBEDDED_SCENE, low_cost_collisions=True)
    add_limb_collisions(spec)
    return spec.compile()


def upright_cosine(quaternion: np.ndarray) -> np.ndarray:
    """The trunk z axis' world z, from (w, x, y, z) quaternions."""
    x, y = quaternion[..., 1], quaternion[..., 2]
    return 1.0 - 2.0 * (x**2 + y**2)


def run_script_by_hand(model: mujoco.MjModel, side: str) -> np.ndarray:
    """Drop, settle and drive the script with plain MuJoCo calls: one row of qpos per control step."""
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key(STAND_KEYFRAME).id)
    data.qpos[2] = 0.2
    data.qpos[3:7] = {
        "back": (math.sqrt(0.5), 0, -math.sqrt(0.5), 0),
        "front": (math.sqrt(0.5), 0, math.sqrt(0.5), 0),
        "left": (math.sqrt(0.5), -math.sqrt(0.5), 0, 0),
        "right": (math.sqrt(0.5), math.sqrt(0.5), 0, 0),
    }[side]
    data.qpos[7:] = HOME
    data.ctrl[:] = HOME
    substeps = round(CONTROL_DT / model.opt.timestep)
    for _ in range(50 * substeps):  # 1 s to settle
        mujoco.mj_step(model, data)
    rows = [data.qpos.copy()]
    plan = [pose for pose in reference.GETUP_SCRIPTS[side] for _ in range(30)] + [HOME] * 80  # 0.6 s each, 1.6 s
    for target in plan:
        data.ctrl[:] = target
        for _ in range(substeps):
            mujoco.mj_step(model, data)
        rows.append(data.qpos.copy())
    return np.array(rows)


SCRIPTED = tuple(reference.GETUP_SCRIPTS)


@pytest.mark.parametrize("side", SCRIPTED)
def test_each_script_stands_the_nominal_robot_up_from_its_side(model, side):
    by_hand = run_script_by_hand(model, side)
    assert upright_cosine(by_hand[0, 3:7]) < 0.2  # it starts lying down
    last_second = by_hand[-50:]
    assert (upright_cosine(last_second[:, 3:7]) > 0.9).all()
    assert (last_second[:, 2] > 0.1).all()
    states = reference.reference_trajectory(model, side, HOME)
    assert states.shape == (len(by_hand), model.nq + model.nv)
    np.testing.assert_allclose(states[:, : model.nq], by_hand, atol=1e-9, rtol=0)


def test_every_script_is_four_poses_of_servo_targets_within_the_joint_ranges(model):
    joints = model.actuator_trnid[:, 0]
    low, high = model.jnt_range[joints, 0], model.jnt_range[joints, 1]
    assert set(SCRIPTED) == {"back", "front"}
    for poses in reference.GETUP_SCRIPTS.values():
        poses = np.asarray(poses)
        assert poses.shape == (reference.SCRIPT_POSES, 14)
        assert ((poses >= low - 1e-9) & (poses <= high + 1e-9)).all()
    with pytest.raises(ValueError, match="side must be one of"):
        reference.script_targets("belly", HOME)


@pytest.mark.parametrize("side", [0, 1])
def test_a_reference_start_begins_at_a_state_along_its_sides_scripted_get_up(model, side):
    task = MicroDuckEnv.getup_task(lying_start_side=float(side), reference_start_fraction=1.0)
    env = MicroDuckEnv(tasks=[task], num_envs=48, seed=3, action_mode="robot", action_scale=1.0, dtype=torch.float64)
    env.reset()
    qpos, qvel = env.physics.qpos.numpy(), env.physics.qvel.numpy()
    states = reference.reference_trajectory(model, LYING_STARTS[side], HOME)
    nq = model.nq
    # Each env is at one row of the trajectory: its joints, height, tilt and joint speeds are that row's.
    nearest = np.abs(qpos[:, None, 7:] - states[None, :, 7:nq]).max(-1).argmin(1)
    row = states[nearest]
    np.testing.assert_allclose(qpos[:, 7:], row[:, 7:nq], atol=1e-12, rtol=0)
    np.testing.assert_allclose(qvel[:, 6:], row[:, nq + 6 :], atol=1e-12, rtol=0)
    np.testing.assert_allclose(qpos[:, 2], row[:, 2], atol=1e-12, rtol=0)
    np.testing.assert_allclose(upright_cosine(qpos[:, 3:7]), upright_cosine(row[:, 3:7]), atol=1e-9, rtol=0)
    # Turned about the vertical only: the linear velocity keeps its length and its vertical part.
    np.testing.assert_allclose(
        np.linalg.norm(qvel[:, :3], axis=1), np.linalg.norm(row[:, nq : nq + 3], axis=1), atol=1e-9
    )
    np.testing.assert_allclose(qvel[:, 2], row[:, nq + 2], atol=1e-12, rtol=0)
    np.testing.assert_allclose(qvel[:, 3:6], row[:, nq + 3 : nq + 6], atol=1e-12, rtol=0)
    np.testing.assert_allclose(qpos[:, :2], 0.0, atol=1e-12)
    # Drawn along the whole way up, from lying to standing.
    assert nearest.min() < len(states) * 0.25 and nearest.max() > len(states) * 0.75
    env.close()


@pytest.mark.parametrize("side, share", [(1, 0.5), (2, 0.0)])
def test_reference_start_fraction_is_the_share_of_floor_starts_moved_onto_the_way_up(side, share):
    """Half the front starts are moved; a side without a script drops every time."""
    task = MicroDuckEnv.getup_task(lying_start_side=float(side), reference_start_fraction=0.5)
    env = MicroDuckEnv(tasks=[task], num_envs=256, seed=0, action_mode="robot", action_scale=1.0)
    env.reset()
    moved = (env.physics.qpos[:, 2] - 0.2).abs() > 1e-6
    assert abs(float(moved.float().mean()) - share) < 0.12
    env.close()


def test_waddle_eval_builds_its_env_without_reference_starts():
    trained = make_env("getup", num_envs=1)
    judged = make_env("getup", num_envs=1, reference_starts=False)
    assert float(trained.tasks.reference_start_fraction.min()) > 0
    assert float(judged.tasks.reference_start_fraction.max()) == 0
    trained.close()
    judged.close()
