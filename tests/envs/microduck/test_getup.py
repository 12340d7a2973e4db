"""Lying on the floor: the limbs' collision boxes, starts on the floor, and falls that do not end episodes."""

from __future__ import annotations

import math

import mujoco
import numpy as np
import pytest
import torch

from waddle.envs.microduck import MicroDuckEnv, assets
from waddle.envs.microduck.constants import EMBEDDED_SCENE, STAND_KEYFRAME
from waddle.envs.microduck.ground_contact import LIMB_BODIES, add_limb_collisions, limb_geom_names
from waddle.envs.microduck.robot import DEFAULT_JOINT_POS
from waddle.envs.microduck.tasks import LYING_DROP_HEIGHT, LYING_STARTS

PENETRATION = 0.002
"""How far MuJoCo's soft contacts let a resting box into the floor, m."""


def box_bottoms(model: mujoco.MjModel, data: mujoco.MjData, geoms: list[int]) -> np.ndarray:
    """The lowest world z of each box geom, from its centre, its axes and its half sizes."""
    bottoms = []
    for geom in geoms:
        assert model.geom_type[geom] == mujoco.mjtGeom.mjGEOM_BOX
        axes = data.geom_xmat[geom].reshape(3, 3)
        bottoms.append(data.geom_xpos[geom][2] - np.abs(axes[2]) @ model.geom_size[geom])
    return np.array(bottoms)


def settle_lying(model: mujoco.MjModel, tilt: tuple[float, float, float, float], seconds: float = 1.5) -> mujoco.MjData:
    """Lay the robot on ``tilt`` (a quaternion) from 2 cm above its lowest point, hold HOME, and let it settle."""
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key(STAND_KEYFRAME).id)
    data.qpos[3:7] = tilt
    data.qpos[7:] = DEFAULT_JOINT_POS
    data.ctrl[:] = DEFAULT_JOINT_POS
    data.qpos[2] = LYING_DROP_HEIGHT
    mujoco.mj_forward(model, data)
    colliding = [g for g in range(model.ngeom) if model.geom_contype[g] == 2]
    data.qpos[2] -= box_bottoms(model, data, colliding).min() - 0.02
    for _ in range(round(seconds / model.opt.timestep)):
        mujoco.mj_step(model, data)
    return data


def _matrix(quaternion) -> np.ndarray:
    out = np.zeros(9)
    mujoco.mju_quat2Mat(out, np.asarray(quaternion, dtype=float))
    return out.reshape(3, 3)


HALF = math.sqrt(0.5)
BACK = (HALF, 0.0, -HALF, 0.0)
LEFT_SIDE = (HALF, -HALF, 0.0, 0.0)


def model_with_limbs(limbs: bool) -> mujoco.MjModel:
    spec = assets.load_spec(EMBEDDED_SCENE, low_cost_collisions=True)
    if limbs:
        add_limb_collisions(spec)
    return spec.compile()


def test_every_collision_box_rests_on_the_floor_where_its_geometry_says():
    model = model_with_limbs(True)
    floor = model.geom("floor").id
    colliding = [g for g in range(model.ngeom) if model.geom_contype[g] == 2]
    for tilt in (BACK, LEFT_SIDE):
        data = settle_lying(model, tilt)
        assert np.abs(data.qvel).max() < 0.05  # at rest
        bottoms = box_bottoms(model, data, colliding)
        touching = {int(g) for c in data.contact[: data.ncon] for g in (c.geom1, c.geom2) if g != floor}
        assert touching, "nothing rests on the floor"
        for geom, bottom in zip(colliding, bottoms, strict=True):
            if geom in touching:  # a box the floor holds up has its lowest point at the floor
                assert -PENETRATION <= bottom <= 1e-3, (model.geom(geom).name, bottom)
            else:  # and no box sinks into it
                assert bottom > -1e-4, (model.geom(geom).name, bottom)
    # On its back the trunk lies on its rear face: the trunk box (centre x -0.01, half length 0.054)
    # holds the trunk's origin 0.064 m up, less the contact's give.
    data = settle_lying(model, BACK)
    trunk = model.geom("trunk_collision").id
    assert trunk in {int(g) for c in data.contact[: data.ncon] for g in (c.geom1, c.geom2)}
    assert 0.064 - PENETRATION - 0.004 <= data.qpos[2] <= 0.064 + 1e-3


def test_without_the_limb_boxes_a_robot_on_its_side_sinks_its_legs_into_the_floor():
    with_limbs, without = model_with_limbs(True), model_with_limbs(False)
    limb_geoms = [with_limbs.geom(name).id for name in limb_geom_names()]
    data = settle_lying(without, LEFT_SIDE)
    # The limbs' boxes placed on the limb-free robot's settled pose: the same bodies, the same frames.
    probe = mujoco.MjData(with_limbs)
    probe.qpos[:] = data.qpos
    mujoco.mj_forward(with_limbs, probe)
    assert box_bottoms(with_limbs, probe, limb_geoms).min() < -0.01
    data = settle_lying(with_limbs, LEFT_SIDE)
    assert box_bottoms(with_limbs, data, limb_geoms).min() > -PENETRATION


def test_a_standing_robot_stands_on_its_soles_alone_with_the_limb_boxes():
    """No limb box reaches below a sole: held in HOME the robot stands as high as without the boxes, and the
    floor touches nothing but the soles."""
    heights = []
    for limbs in (False, True):
        model = model_with_limbs(limbs)
        data = mujoco.MjData(model)
        mujoco.mj_resetDataKeyframe(model, data, model.key(STAND_KEYFRAME).id)
        data.ctrl[:] = DEFAULT_JOINT_POS
        for _ in range(round(0.3 / model.opt.timestep)):
            mujoco.mj_step(model, data)
        touching = {model.geom(c.geom2 if model.geom(c.geom1).name == "floor" else c.geom1).name for c in data.contact}
        assert touching == {"left_foot_collision", "right_foot_collision"}, touching
        heights.append(data.qpos[2])
    assert heights[1] == pytest.approx(heights[0], abs=1e-4)


def test_the_limb_boxes_are_mirror_images_and_weigh_nothing():
    model = model_with_limbs(True)
    plain = model_with_limbs(False)
    sizes = {body: model.geom_size[model.geom(name).id] for body, name in zip(LIMB_BODIES, limb_geom_names())}
    for left, right in (("hip_l", "hip_l_2"), ("upper_leg_left", "upper_leg_right"), ("leg", "leg_2")):
        np.testing.assert_allclose(sizes[left], sizes[right], atol=1e-6)
    np.testing.assert_array_equal(model.body_mass, plain.body_mass)
    np.testing.assert_array_equal(model.body_inertia, plain.body_inertia)
    with pytest.raises(ValueError, match="already has limb collision boxes"):
        spec = assets.load_spec(EMBEDDED_SCENE)
        add_limb_collisions(spec)
        add_limb_collisions(spec)


def test_only_a_library_that_lies_down_gets_the_limb_boxes():
    walking = MicroDuckEnv(tasks=[MicroDuckEnv.joystick_task()], num_envs=1)
    getup = MicroDuckEnv(tasks=[MicroDuckEnv.getup_task()], num_envs=1)
    forced = MicroDuckEnv(tasks=[MicroDuckEnv.getup_task()], num_envs=1, limb_collisions=False)
    assert (walking.limb_collisions, getup.limb_collisions, forced.limb_collisions) == (False, True, False)
    assert getup.model.ngeom == walking.model.ngeom + len(LIMB_BODIES) == forced.model.ngeom + len(LIMB_BODIES)
    with pytest.raises(ValueError, match="limb_collisions must be True, False or None"):
        MicroDuckEnv(num_envs=1, limb_collisions="yes")


@pytest.mark.parametrize("side, gravity", [(0, (-1, 0, 0)), (1, (1, 0, 0)), (2, (0, 1, 0)), (3, (0, -1, 0))])
def test_a_lying_start_drops_the_robot_onto_its_side_with_random_joints(side, gravity):
    task = MicroDuckEnv.getup_task(lying_start_side=float(side))
    env = MicroDuckEnv(tasks=[task], num_envs=64, seed=side, action_mode="robot", action_scale=0.7)
    td = env.reset()
    # back: the trunk's rear (-x) down; front: the head (+x) down; left: +y down; right: -y down.
    expected = torch.tensor(gravity, dtype=torch.float32).expand(64, 3)
    torch.testing.assert_close(td["observation"][:, :3], expected, atol=1e-6, rtol=0)
    qpos = env.physics.qpos
    assert torch.allclose(qpos[:, 2], torch.tensor(LYING_DROP_HEIGHT))
    joints = qpos[:, 7:]
    assert ((joints >= env._target_low - 1e-6) & (joints <= env._target_high + 1e-6)).all()
    spread = joints.std(0) / (env._target_high - env._target_low)
    assert (spread > 0.2).all()  # uniform over the range: std is 0.29 of its width
    # The heading is drawn over the whole turn: the trunk axis that lies flat points every way.
    rotation = torch.stack([torch.tensor(_matrix(q)) for q in qpos[:, 3:7].double().numpy()])
    flat = rotation[:, :, 0] if side >= 2 else rotation[:, :, 2]
    assert flat[:, 2].abs().max() < 1e-6
    directions = torch.atan2(flat[:, 1], flat[:, 0])
    assert directions.max() - directions.min() > 1.5 * math.pi
    env.close()


def test_a_fall_goes_on_and_pays_only_the_way_up_while_down():
    getup = MicroDuckEnv.getup_task()
    env = MicroDuckEnv(tasks=[getup], num_envs=8, seed=0, action_mode="robot", action_scale=0.7, diagnostics=True)
    td = env.reset()
    assert LYING_STARTS == ("back", "front", "left", "right")
    for _ in range(50):
        td = env.step(td.set("action", torch.zeros(8, 14)))["next"]
        assert not td["done"].any()
        down = env._fallen(env._read_state(env.physics.qpos, env.physics.qvel))
        assert down.any()
        for name in env.REWARD_TERMS:
            share = td[f"diagnostic_reward_{name}"].squeeze(-1)
            if name != "getup":
                assert (share[down] <= 0).all(), name  # penalties stand, nothing else pays
    torch.testing.assert_close(
        td["reward"].squeeze(-1), sum(td[f"diagnostic_reward_{name}"].squeeze(-1) for name in env.REWARD_TERMS)
    )
    env.close()
    # The same drop under a task whose falls end episodes ends them.
    ends = MicroDuckEnv.getup_task(fall_terminates=1.0)
    env = MicroDuckEnv(tasks=[ends], num_envs=8, seed=0, action_mode="robot", action_scale=0.7)
    td = env.reset()
    for _ in range(50):
        td = env.step(td.set("action", torch.zeros(8, 14)))["next"]
        if td["terminated"].all():
            break
    assert td["terminated"].all()
    env.close()


def _placed(env: MicroDuckEnv, lift: torch.Tensor, roll: torch.Tensor) -> None:
    """Set every env's robot in HOME, its trunk raised by ``lift`` m and rolled by ``roll`` rad, at rest."""
    qpos = env._home_qpos.expand(env.num_envs, -1).clone()
    qpos[:, 2] += lift
    qpos[:, 3:7] = torch.stack([(roll / 2).cos(), (roll / 2).sin(), 0 * roll, 0 * roll], dim=-1).to(qpos)
    env.physics.reset(qpos, torch.zeros(env.num_envs, env.physics.nv, dtype=qpos.dtype))


def test_standing_asks_for_an_upright_trunk_up_high_on_a_sole():
    env = MicroDuckEnv(tasks=[MicroDuckEnv.getup_task()], num_envs=4, seed=0, action_mode="robot", action_scale=0.7)
    td = env.reset()
    # On the floor upright; 5 cm up in the air, level; rolled 35 degrees (cos 0.82); rolled 20 degrees (cos 0.94).
    lift = torch.tensor([0.0, 0.05, 0.0, 0.0])
    roll = torch.deg2rad(torch.tensor([0.0, 0.0, 35.0, 20.0]))
    _placed(env, lift, roll)
    env.step(td.set("action", torch.zeros(4, 14)))
    upright = -env._read_state(env.physics.qpos, env.physics.qvel)["gravity"][:, 2]
    on_floor = env.foot_contacts().any(-1)
    assert on_floor.tolist() == [True, False, True, True]  # the rolled ones still touch with one sole
    assert (env.base_height() >= 0.1).all()
    assert env.standing().tolist() == [True, False, False, True]
    assert float(upright[2]) < 0.9 < float(upright[3])
    env.close()


def test_a_robot_propped_half_up_earns_only_the_getup_share():
    """Tilted 60 degrees with its trunk high, a robot is not *down*, yet every positive term but ``getup``
    pays nothing for it; upright, the same robot is paid."""
    task = MicroDuckEnv.joystick_getup_task(lying_start_fraction=0.0)
    env = MicroDuckEnv(tasks=[task], num_envs=2, seed=0, action_mode="robot", action_scale=0.7, diagnostics=True)
    td = env.reset()
    _placed(env, torch.tensor([0.0, 0.02]), torch.deg2rad(torch.tensor([0.0, 60.0])))
    td = env.step(td.set("action", torch.zeros(2, 14)))["next"]
    assert not env.fallen().any()
    shares = {name: td[f"diagnostic_reward_{name}"].squeeze(-1) for name in env.REWARD_TERMS}
    paid = [name for name, share in shares.items() if name != "getup" and share[0] > 0]
    assert "tracking" in paid  # the upright robot is paid
    assert all(float(share[1]) <= 0 for name, share in shares.items() if name != "getup")
    assert 0 < float(shares["getup"][1]) < float(shares["getup"][0])
    env.close()


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("lying_start_fraction", 1.5, r"lying_start_fraction must be in \[0, 1\]"),
        ("lying_start_side", 4.0, r"lying_start_side must be -1 \(any\) or the index of one of"),
        ("lying_start_side", 0.5, r"lying_start_side must be -1"),
        ("fall_terminates", 0.5, "fall_terminates must be 1"),
        ("reference_start_fraction", -0.1, r"reference_start_fraction must be in \[0, 1\]"),
    ],
)
def test_bad_lying_fields_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        MicroDuckEnv.getup_task(**{field: value})
