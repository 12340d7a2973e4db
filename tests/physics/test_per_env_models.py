"""Per-env model parameters and mid-episode velocity changes, against MuJoCo C.

Each env gets its own friction, damping and mass (``set_model_fields``); the
reference steps one ``MjData`` per env with a copy of the model modified by
hand. MJX is compiled once for the module (tens of seconds on a CPU).
"""

from __future__ import annotations

import copy

import mujoco
import numpy as np
import pytest
import torch
from helpers.ball_arm import BALL_ARM_XML, GEOMS, NUM_ENVS, SITES, ball_arm_start
from helpers.compile_options import MJX_FAST_COMPILE

from waddle.physics import make_backend

FRAME_SKIP, STEPS = 4, 15
FRICTION = np.array([0.2, 1.0, 3.0])
DAMPING = np.array([0.01, 0.1, 1.0])
MASS = np.array([0.5, 1.0, 2.0])


def _fields(model):
    ball, hinge = model.body("ball").id, model.joint("hinge").dofadr[0]
    ball_geom = model.geom("ball").id
    friction = np.repeat(model.geom_friction[None], NUM_ENVS, 0)
    friction[:, ball_geom, 0] = FRICTION
    damping = np.repeat(model.dof_damping[None], NUM_ENVS, 0)
    damping[:, hinge] = DAMPING
    mass = np.repeat(model.body_mass[None], NUM_ENVS, 0)
    mass[:, ball] *= MASS
    inertia = np.repeat(model.body_inertia[None], NUM_ENVS, 0)
    inertia[:, ball] *= MASS[:, None]
    return {
        "geom_friction": torch.from_numpy(friction),
        "dof_damping": torch.from_numpy(damping),
        "body_mass": torch.from_numpy(mass),
        "body_inertia": torch.from_numpy(inertia),
    }


def _hand_models(model):
    """Copies of ``model`` with each env's values, and the constants MuJoCo derives from masses
    recomputed (``mj_setConst``) except the constraint weights, which stay nominal by contract."""
    models = []
    for row in range(NUM_ENVS):
        m = copy.copy(model)
        m.geom_friction[m.geom("ball").id, 0] = FRICTION[row]
        m.dof_damping[m.joint("hinge").dofadr[0]] = DAMPING[row]
        m.body_mass[m.body("ball").id] *= MASS[row]
        m.body_inertia[m.body("ball").id] *= MASS[row]
        mujoco.mj_setConst(m, mujoco.MjData(m))
        m.body_invweight0[:] = model.body_invweight0
        m.dof_invweight0[:] = model.dof_invweight0
        models.append(m)
    return models


def _start(model):
    qpos, qvel = ball_arm_start(model)
    qvel[:, 0] = 1.5  # the ball lands sliding: friction decides how fast it stops slipping
    return qpos, qvel


def _controls(model):
    return np.random.default_rng(0).uniform(-1, 1, (STEPS, NUM_ENVS, model.nu))


def _by_hand(model, qpos, qvel, controls, kicks=None):
    models = _hand_models(model)
    datas = [mujoco.MjData(m) for m in models]
    for d, q, v in zip(datas, qpos, qvel, strict=True):
        d.qpos[:], d.qvel[:] = q, v
    out = []
    for t, ctrl in enumerate(controls):
        for row, (m, d) in enumerate(zip(models, datas, strict=True)):
            if kicks is not None and t in kicks:
                d.qvel[:] = kicks[t][row]
            d.ctrl[:] = ctrl[row]
            for _ in range(FRAME_SKIP):
                mujoco.mj_step(m, d)
        out.append(np.stack([np.concatenate([d.qpos, d.qvel]) for d in datas]))
    return np.stack(out)


def _by_backend(sim, model, qpos, qvel, controls, kicks=None):
    sim.set_model_fields(_fields(model))
    sim.reset(torch.from_numpy(qpos), torch.from_numpy(qvel))
    out = []
    for t, ctrl in enumerate(controls):
        if kicks is not None and t in kicks:
            sim.set_qvel(torch.from_numpy(kicks[t]), torch.ones(NUM_ENVS, dtype=torch.bool))
        sim.step(torch.from_numpy(ctrl))
        out.append(torch.cat([sim.qpos, sim.qvel], -1).double().numpy().copy())
    return np.stack(out)


@pytest.fixture(scope="module")
def model():
    return mujoco.MjModel.from_xml_string(BALL_ARM_XML)


def _native(model):
    spec = mujoco.MjSpec.from_string(BALL_ARM_XML)
    return make_backend(
        "mujoco",
        spec,
        num_envs=NUM_ENVS,
        frame_skip=FRAME_SKIP,
        site_names=SITES,
        contact_geom_names=GEOMS,
        dtype=torch.float64,
    )


def test_native_envs_step_with_their_own_models(model):
    qpos, qvel = _start(model)
    controls = _controls(model)
    sim = _native(model)
    got = _by_backend(sim, model, qpos, qvel, controls)
    ref = _by_hand(model, qpos, qvel, controls)
    np.testing.assert_allclose(got, ref, atol=1e-7, rtol=0)
    # the parameters made a difference: the three envs, started alike, part ways
    same = _by_hand(model, np.repeat(qpos[:1], 3, 0), np.repeat(qvel[:1], 3, 0), np.repeat(controls[:, :1], 3, 1))
    assert np.abs(same[-1, 0] - same[-1, 2]).max() > 1e-2
    # a heavier ball still falls at g: the mass matrix follows the per-env masses
    np.testing.assert_allclose(got[0, :, 8 + 2], -9.81 * FRAME_SKIP * model.opt.timestep, rtol=1e-9)
    ball = model.geom("ball").id
    assert [sim.model_of(row).geom_friction[ball, 0] for row in range(3)] == list(FRICTION)
    assert sim.model.geom_friction[ball, 0] == 1.0  # the nominal model is untouched
    sim.close()


def test_native_masked_fields_leave_other_envs_alone(model):
    sim = _native(model)
    fields = _fields(model)
    sim.set_model_fields(fields, torch.tensor([True, False, False]))
    ball = model.geom("ball").id
    assert [sim.model_of(row).geom_friction[ball, 0] for row in range(3)] == [0.2, 1.0, 1.0]
    sim.set_model_fields(fields, torch.tensor([False, False, True]))
    assert [sim.model_of(row).geom_friction[ball, 0] for row in range(3)] == [0.2, 1.0, 3.0]
    with pytest.raises(ValueError, match=r"geom_friction must have shape \(3, 3, 3\), got \(2, 3, 3\)"):
        sim.set_model_fields({"geom_friction": fields["geom_friction"][:2]})
    with pytest.raises(ValueError, match="'geom_slipperiness' is not an array field of MjModel"):
        sim.set_model_fields({"geom_slipperiness": fields["geom_friction"]})
    sim.close()


def test_native_set_qvel_keeps_positions_and_clock(model):
    qpos, qvel = _start(model)
    controls = _controls(model)
    kicks = {5: np.full((NUM_ENVS, model.nv), 0.3)}
    sim = _native(model)
    got = _by_backend(sim, model, qpos, qvel, controls, kicks)
    ref = _by_hand(model, qpos, qvel, controls, kicks)
    np.testing.assert_allclose(got, ref, atol=1e-7, rtol=0)
    np.testing.assert_allclose(sim.time.numpy(), STEPS * FRAME_SKIP * model.opt.timestep)
    sim.close()


def test_mjx_envs_step_with_their_own_models(model):
    pytest.importorskip("mujoco.mjx", reason="needs the mjx extra: pip install 'waddle[mjx]'")
    from waddle.physics.mjx import MjxBackend

    sim = MjxBackend(
        model,
        num_envs=NUM_ENVS,
        frame_skip=FRAME_SKIP,
        site_names=SITES,
        contact_geom_names=GEOMS,
        dtype=torch.float64,
        compiler_options=MJX_FAST_COMPILE,
    )
    assert sim.per_env_models
    qpos, qvel = _start(model)
    controls = _controls(model)
    kicks = {5: np.full((NUM_ENVS, model.nv), 0.3)}
    got = _by_backend(sim, model, qpos, qvel, controls, kicks)
    ref = _by_hand(model, qpos, qvel, controls, kicks)
    np.testing.assert_allclose(got, ref, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="'geom_slipperiness' is not an array field of mjx.Model"):
        sim.set_model_fields({"geom_slipperiness": torch.zeros(3)})
