"""The embedded, mesh-free MicroDuck model against the upstream reference MJCF.

The reference files (tests/data/microduck_reference) cannot be loaded by MuJoCo
(their meshes are not distributed), so they are read here as plain XML with
ElementTree and used as independent data for the embedded model.
"""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from pathlib import Path

import mujoco
import numpy as np
import pytest

from waddle.envs.microduck import constants as C

REF_DIR = Path(__file__).resolve().parents[2] / "data" / "microduck_reference"
ROBOT_COLLISION_GEOMS = {*C.FOOT_GEOMS, "trunk_collision", "head_collision"}


# --------------------------------------------------------------------------- reference data


def _floats(text: str) -> np.ndarray:
    return np.array([float(x) for x in text.split()])


@pytest.fixture(scope="module")
def ref_robot() -> ET.Element:
    return ET.parse(REF_DIR / "robot_walk.xml").getroot()


@pytest.fixture(scope="module")
def ref_scene() -> ET.Element:
    return ET.parse(REF_DIR / "scene_walk.xml").getroot()


@pytest.fixture(scope="module")
def ref_bodies(ref_robot) -> dict[str, tuple[str, ET.Element]]:
    """Reference bodies by name: (parent body name, element)."""
    out = {}

    def walk(elem: ET.Element, parent: str) -> None:
        for child in elem.findall("body"):
            out[child.get("name")] = (parent, child)
            walk(child, child.get("name"))

    walk(ref_robot.find("worldbody"), "world")
    return out


@pytest.fixture(scope="module")
def ref_chosen_actuator(ref_robot) -> ET.Element:
    (cls,) = [d for d in ref_robot.iter("default") if d.get("class") == "chosen_actuator"]
    return cls


# --------------------------------------------------------------------------- model


@pytest.fixture(scope="module")
def model() -> mujoco.MjModel:
    return mujoco.MjModel.from_xml_path(str(C.EMBEDDED_SCENE))


def _stand_data(model: mujoco.MjModel) -> mujoco.MjData:
    data = mujoco.MjData(model)
    mujoco.mj_resetDataKeyframe(model, data, model.key(C.STAND_KEYFRAME).id)
    mujoco.mj_forward(model, data)
    return data


def _floor_contacts(model: mujoco.MjModel, data: mujoco.MjData) -> set[str]:
    """Names of the geoms touching the floor."""
    floor = model.geom("floor").id
    out = set()
    for con in data.contact[: data.ncon]:
        if floor in (con.geom1, con.geom2):
            other = con.geom2 if con.geom1 == floor else con.geom1
            out.add(model.geom(other).name)
    return out


def _box_bottom(model: mujoco.MjModel, data: mujoco.MjData, name: str) -> float:
    """Lowest world z of the corners of a box geom."""
    g = model.geom(name).id
    rot = data.geom_xmat[g].reshape(3, 3)
    signs = np.array(list(itertools.product((-1, 1), repeat=3)))
    corners = data.geom_xpos[g] + (signs * model.geom_size[g]) @ rot.T
    return float(corners[:, 2].min())


def _upright(data: mujoco.MjData) -> float:
    """World z component of the trunk's z axis (1 when upright)."""
    return float(data.xmat[1].reshape(3, 3)[2, 2])


# --------------------------------------------------------------------------- structure


def test_loads_without_meshes(model):
    assert model.nmesh == 0
    assert model.nq == 7 + C.NUM_JOINTS and model.nv == 6 + C.NUM_JOINTS
    assert model.nu == C.NUM_JOINTS
    # The robot file also loads on its own.
    robot = mujoco.MjModel.from_xml_path(str(C.ASSET_DIR / "microduck.xml"))
    assert robot.nu == C.NUM_JOINTS


def test_constants_describe_the_model(model):
    assert len(C.JOINT_NAMES) == C.NUM_JOINTS
    assert all(n.startswith("left_") for n in C.JOINT_NAMES[C.LEFT_LEG])
    assert all(n.startswith("right_") for n in C.JOINT_NAMES[C.RIGHT_LEG])
    assert [n.removeprefix("left_") for n in C.JOINT_NAMES[C.LEFT_LEG]] == [
        n.removeprefix("right_") for n in C.JOINT_NAMES[C.RIGHT_LEG]
    ]
    assert all(n.startswith(("neck_", "head_")) for n in C.JOINT_NAMES[C.HEAD])
    assert model.body(C.ROOT_BODY).id == 1
    model.site(C.IMU_SITE)
    for name in C.FOOT_SITES:
        model.site(name)
    for name in C.FOOT_GEOMS:
        assert model.geom(name).type == mujoco.mjtGeom.mjGEOM_BOX
    assert model.cam(C.TRACKING_CAMERA).id >= 0
    assert model.opt.timestep == C.TIMESTEP
    assert round(C.CONTROL_DT / C.TIMESTEP) * C.TIMESTEP == pytest.approx(C.CONTROL_DT)


def test_solver_options_are_mujoco_defaults(model):
    default = mujoco.MjModel.from_xml_string("<mujoco/>").opt
    for field in (
        "integrator",
        "cone",
        "solver",
        "iterations",
        "tolerance",
        "ls_iterations",
        "noslip_iterations",
        "impratio",
        "disableflags",
        "enableflags",
    ):
        assert getattr(model.opt, field) == getattr(default, field), field
    np.testing.assert_array_equal(model.opt.gravity, default.gravity)


def test_joint_names_and_order_match_reference(model, ref_robot):
    ref_hinges = [j.get("name") for j in ref_robot.find("worldbody").iter("joint")]
    ref_actuators = [(a.get("name"), a.get("joint")) for a in ref_robot.find("actuator")]
    assert tuple(ref_hinges) == C.JOINT_NAMES
    assert [(n, n) for n in C.JOINT_NAMES] == ref_actuators

    (ref_free,) = ref_robot.find("worldbody").iter("freejoint")
    assert model.jnt_type[0] == mujoco.mjtJoint.mjJNT_FREE
    assert model.joint(0).name == ref_free.get("name")
    assert model.body(model.jnt_bodyid[0]).name == C.ROOT_BODY

    model_hinges = [model.joint(j).name for j in range(1, model.njnt)]
    assert tuple(model_hinges) == C.JOINT_NAMES
    assert all(model.jnt_type[1:] == mujoco.mjtJoint.mjJNT_HINGE)
    for i, name in enumerate(C.JOINT_NAMES):
        assert model.actuator(i).name == name
        assert model.actuator_trntype[i] == mujoco.mjtTrn.mjTRN_JOINT
        assert model.joint(model.actuator_trnid[i, 0]).name == name
        # qpos layout: free joint (7), then the joints in actuator order.
        assert model.jnt_qposadr[model.joint(name).id] == 7 + i


def test_joint_axes_and_ranges_match_reference(model, ref_robot):
    for j in ref_robot.find("worldbody").iter("joint"):
        jid = model.joint(j.get("name")).id
        assert model.jnt_limited[jid]
        np.testing.assert_allclose(model.jnt_range[jid], _floats(j.get("range")), rtol=0, atol=1e-9)
        np.testing.assert_allclose(model.jnt_axis[jid], _floats(j.get("axis")), rtol=0, atol=1e-12)


def _assert_same_rotation(quat, reference: str) -> None:
    """``quat`` is the reference quaternion (text, not normalised), up to sign."""
    expected = _floats(reference)
    expected /= np.linalg.norm(expected)
    if expected @ quat < 0:
        expected = -expected
    np.testing.assert_allclose(quat, expected, rtol=0, atol=1e-9)


def test_body_tree_and_poses_match_reference(model, ref_bodies):
    assert model.nbody - 1 == len(ref_bodies)
    for name, (parent, elem) in ref_bodies.items():
        b = model.body(name)
        assert model.body(b.parentid[0]).name == parent, name
        np.testing.assert_allclose(b.pos, _floats(elem.get("pos")), rtol=0, atol=1e-12)
        _assert_same_rotation(b.quat, elem.get("quat"))


def test_inertials_match_reference(model, ref_bodies):
    """Masses, centres of mass and inertia tensors come from the reference alone: geoms add nothing."""
    for name, (_, elem) in ref_bodies.items():
        inertial = elem.find("inertial")
        b = model.body(name)
        assert b.mass[0] == pytest.approx(float(inertial.get("mass")), rel=1e-12), name
        np.testing.assert_allclose(b.ipos, _floats(inertial.get("pos")), rtol=0, atol=1e-12)
        ixx, iyy, izz, ixy, ixz, iyz = _floats(inertial.get("fullinertia"))
        ref_tensor = np.array([[ixx, ixy, ixz], [ixy, iyy, iyz], [ixz, iyz, izz]])
        rot = np.zeros(9)
        mujoco.mju_quat2Mat(rot, b.iquat)
        rot = rot.reshape(3, 3)
        tensor = rot @ np.diag(b.inertia) @ rot.T
        # MuJoCo stores the principal axes from an iterative eigensolver: exact to ~1e-7 of the scale.
        np.testing.assert_allclose(tensor, ref_tensor, rtol=0, atol=1e-6 * np.abs(ref_tensor).max())


def test_total_mass(model, ref_bodies):
    ref_total = sum(float(e.find("inertial").get("mass")) for _, e in ref_bodies.values())
    assert ref_total == pytest.approx(C.TOTAL_MASS, rel=0.01)
    assert model.body_subtreemass[model.body(C.ROOT_BODY).id] == pytest.approx(ref_total, rel=1e-12)
    assert model.body_mass.sum() == pytest.approx(C.TOTAL_MASS, rel=0.01)


def test_actuators_and_joints_use_reference_chosen_actuator_class(model, ref_robot, ref_chosen_actuator):
    # Every reference joint and actuator uses `chosen_actuator`.
    assert {j.get("class") for j in ref_robot.find("worldbody").iter("joint")} == {"chosen_actuator"}
    assert {a.get("class") for a in ref_robot.find("actuator")} == {"chosen_actuator"}
    joint = ref_chosen_actuator.find("joint")
    pos = ref_chosen_actuator.find("position")
    kp, kv = float(pos.get("kp")), float(pos.get("kv"))
    dofs = model.jnt_dofadr[1:]
    np.testing.assert_array_equal(model.dof_damping[dofs], float(joint.get("damping")))
    np.testing.assert_array_equal(model.dof_frictionloss[dofs], float(joint.get("frictionloss")))
    np.testing.assert_array_equal(model.dof_armature[dofs], float(joint.get("armature")))
    np.testing.assert_array_equal(model.dof_damping[:6], 0.0)  # the free joint ignores defaults
    np.testing.assert_array_equal(model.actuator_gaintype, mujoco.mjtGain.mjGAIN_FIXED)
    np.testing.assert_array_equal(model.actuator_biastype, mujoco.mjtBias.mjBIAS_AFFINE)
    np.testing.assert_array_equal(model.actuator_gainprm[:, 0], kp)
    np.testing.assert_array_equal(model.actuator_biasprm[:, :3], np.tile([0.0, -kp, -kv], (model.nu, 1)))
    assert all(model.actuator_forcelimited) and all(model.actuator_ctrllimited)
    np.testing.assert_array_equal(model.actuator_forcerange, np.tile(_floats(pos.get("forcerange")), (model.nu, 1)))
    np.testing.assert_array_equal(model.actuator_ctrlrange, np.tile(_floats(pos.get("ctrlrange")), (model.nu, 1)))


def test_sites_and_cameras_match_reference(model, ref_robot, ref_bodies):
    def check(kind, elem, parent):
        obj = model.site(elem.get("name")) if kind == "site" else model.cam(elem.get("name"))
        assert model.body(obj.bodyid[0]).name == parent
        np.testing.assert_allclose(obj.pos, _floats(elem.get("pos")), rtol=0, atol=1e-12)
        _assert_same_rotation(obj.quat, elem.get("quat"))

    names = set()
    for body, (_, elem) in ref_bodies.items():
        for kind in ("site", "camera"):
            for child in elem.findall(kind):
                check(kind, child, body)
                names.add(child.get("name"))
    assert {C.IMU_SITE, *C.FOOT_SITES, "head_camera", "tof", "head_imu", "mouth_tip"} <= names


def test_sensors_match_reference(model, ref_robot):
    types = {
        "framequat": mujoco.mjtSensor.mjSENS_FRAMEQUAT,
        "gyro": mujoco.mjtSensor.mjSENS_GYRO,
        "velocimeter": mujoco.mjtSensor.mjSENS_VELOCIMETER,
        "accelerometer": mujoco.mjtSensor.mjSENS_ACCELEROMETER,
        "subtreeangmom": mujoco.mjtSensor.mjSENS_SUBTREEANGMOM,
    }
    ref = list(ref_robot.find("sensor"))
    assert model.nsensor == len(ref)
    for i, elem in enumerate(ref):
        s = model.sensor(i)
        assert s.name == elem.get("name")
        assert model.sensor_type[i] == types[elem.tag]
        assert s.noise[0] == float(elem.get("noise", 0.0))
        obj = elem.get("site") or elem.get("objname") or elem.get("body")
        name_of = model.body if elem.tag == "subtreeangmom" else model.site
        assert name_of(model.sensor_objid[i]).name == obj


def test_keyframes_match_reference(model, ref_scene):
    keys = ref_scene.find("keyframe").findall("key")
    assert tuple(k.get("name") for k in keys) == C.KEYFRAMES
    assert model.nkey == len(keys)
    for key in keys:
        k = model.key(key.get("name"))
        np.testing.assert_allclose(k.qpos, _floats(key.get("qpos")), rtol=0, atol=1e-12)
        np.testing.assert_allclose(k.ctrl, _floats(key.get("ctrl")), rtol=0, atol=1e-12)
    assert model.key(C.STAND_KEYFRAME).qpos[2] == C.STANDING_HEIGHT


# --------------------------------------------------------------------------- geometry


def test_only_coarse_robot_geoms_collide_and_only_with_the_floor(model):
    colliding = {model.geom(g).name for g in range(model.ngeom) if model.geom_contype[g] or model.geom_conaffinity[g]}
    assert colliding == ROBOT_COLLISION_GEOMS | {"floor"}

    def can_touch(a: str, b: str) -> bool:
        ga, gb = model.geom(a).id, model.geom(b).id
        return bool(
            model.geom_contype[ga] & model.geom_conaffinity[gb] or model.geom_contype[gb] & model.geom_conaffinity[ga]
        )

    for name in ROBOT_COLLISION_GEOMS:
        assert can_touch(name, "floor"), name
        assert model.geom(name).type == mujoco.mjtGeom.mjGEOM_BOX
    for a, b in itertools.combinations(sorted(ROBOT_COLLISION_GEOMS), 2):
        assert not can_touch(a, b), (a, b)
    # Reference friction (unspecified there, so MuJoCo's default) on the soles.
    default_friction = mujoco.MjModel.from_xml_string(
        "<mujoco><worldbody><geom size='1'/></worldbody></mujoco>"
    ).geom_friction[0]
    for name in C.FOOT_GEOMS:
        np.testing.assert_array_equal(model.geom(name).friction, default_friction)


def test_visual_geoms_do_not_collide(model):
    visual = [g for g in range(model.ngeom) if model.geom_group[g] == 2]
    assert len(visual) > 40
    for g in visual:
        assert model.geom_contype[g] == 0 and model.geom_conaffinity[g] == 0
    bodies_with_visuals = {model.body(model.geom_bodyid[g]).name for g in visual}
    assert {C.ROOT_BODY, "jaw_soft", "ankle_left", "ankle_right", "neck"} <= bodies_with_visuals


def test_stand_keyframe_has_both_soles_on_the_floor(model):
    data = _stand_data(model)
    assert data.qpos[2] == pytest.approx(C.STANDING_HEIGHT)
    assert _floor_contacts(model, data) == set(C.FOOT_GEOMS)
    for name in C.FOOT_GEOMS:
        assert -1e-3 < _box_bottom(model, data, name) < 0.0, name
    for name in ROBOT_COLLISION_GEOMS - set(C.FOOT_GEOMS):
        assert _box_bottom(model, data, name) > 0.05, name


def test_tracking_camera_frames_the_robot(model):
    cam = model.cam(C.TRACKING_CAMERA)
    assert model.body(cam.bodyid[0]).name == C.ROOT_BODY
    assert model.cam_mode[cam.id] == mujoco.mjtCamLight.mjCAMLIGHT_TRACKCOM
    data = _stand_data(model)
    com = data.subtree_com[model.body(C.ROOT_BODY).id]
    offset = com - data.cam_xpos[cam.id]
    assert 0.4 < np.linalg.norm(offset) < 0.6
    assert data.cam_xpos[cam.id][0] > com[0]  # in front of the robot
    forward = -data.cam_xmat[cam.id].reshape(3, 3)[:, 2]
    assert forward @ offset / np.linalg.norm(offset) > 0.99


# --------------------------------------------------------------------------- dynamics


def _hold_stand(model: mujoco.MjModel, seconds: float) -> tuple[np.ndarray, np.ndarray, mujoco.MjData]:
    data = _stand_data(model)
    ctrl = data.ctrl.copy()
    heights, upright = [], []
    for _ in range(round(seconds / model.opt.timestep)):
        data.ctrl[:] = ctrl
        mujoco.mj_step(model, data)
        heights.append(data.qpos[2])
        upright.append(_upright(data))
    return np.array(heights), np.array(upright), data


def test_soles_support_the_stand_pose_with_stiff_servos():
    """The soles carry the robot: with the STAND ctrl held by 5x stiffer servos it stands still.

    The reference's own servos (kp 0.55 N m/rad) are too soft to hold STAND without
    feedback (see the test below); they need about 1.4 N m/rad. Stiffening them
    here isolates what this model adds, the sole geometry, from the reference gains.
    """
    model = mujoco.MjModel.from_xml_path(str(C.EMBEDDED_SCENE))
    kp = 5 * model.actuator_gainprm[0, 0]
    model.actuator_gainprm[:, 0] = kp
    model.actuator_biasprm[:, 1] = -kp
    heights, upright, data = _hold_stand(model, 2.0)
    assert np.abs(heights - C.STANDING_HEIGHT).max() < 0.005
    assert upright.min() > np.cos(np.radians(5))
    assert np.linalg.norm(data.qpos[:2]) < 0.005
    assert _floor_contacts(model, data) == set(C.FOOT_GEOMS)
    assert np.abs(data.qvel).max() < 0.05  # settled


def test_reference_servos_cannot_hold_the_stand_pose_passively(model):
    """The reference servos (kp 0.55 N m/rad, chosen_actuator) are too soft for STAND.

    Hip and ankle pitch give way, the robot sits back and tips over backwards
    within about a second, so even standing needs a balancing policy. The env's
    fall detection, the docs and the training defaults rely on this.
    """
    heights, upright, _ = _hold_stand(model, 2.0)
    assert upright.min() < np.cos(np.radians(45))
    assert heights.min() < 0.55 * C.STANDING_HEIGHT + 0.01
