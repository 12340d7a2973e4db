"""The MJX backend against MuJoCo C (``mj_step`` on plain ``MjData``).

The models (tests/helpers/ball_arm.py): a ball dropped on a plane next to a motor-driven arm
(contacts appear during the rollout), and a contact-free double pendulum for
gradients. Every jitted program costs a compilation of tens of seconds on a
CPU, so one backend per configuration is shared by the tests of a module and
the programs are compiled with ``xla_llvm_disable_expensive_passes`` (same
results, ~40% less compile time).
"""

from __future__ import annotations

import copy
import importlib
import sys

import mujoco
import numpy as np
import pytest
import torch

pytest.importorskip("mujoco.mjx", reason="needs the mjx extra: pip install 'waddle[mjx]'")

from helpers.ball_arm import (  # noqa: E402
    BALL_ARM_XML,
    FRAME_SKIP,
    GEOMS,
    NUM_ENVS,
    PENDULUM_XML,
    SITES,
    ball_arm_start,
)
from helpers.compile_options import MJX_FAST_COMPILE  # noqa: E402
from helpers.gradients import assert_pendulum_gradients  # noqa: E402
from helpers.mujoco_c import c_rollout  # noqa: E402
from helpers.rollout import backend_rollout  # noqa: E402

from waddle.physics.mjx import MjxBackend  # noqa: E402

STEPS = 20


@pytest.fixture(scope="module")
def ball_arm():
    return mujoco.MjModel.from_xml_string(BALL_ARM_XML)


def _ball_arm_sim(model, dtype) -> MjxBackend:
    return MjxBackend(
        model,
        num_envs=NUM_ENVS,
        frame_skip=FRAME_SKIP,
        site_names=SITES,
        contact_geom_names=GEOMS,
        dtype=dtype,
        compiler_options=MJX_FAST_COMPILE,
    )


@pytest.fixture(scope="module")
def sim64(ball_arm):
    return _ball_arm_sim(ball_arm, torch.float64)


def _run(sim, model):
    qpos, qvel = ball_arm_start(model)
    controls = np.random.default_rng(0).uniform(-1, 1, (STEPS, NUM_ENVS, model.nu))
    ref = c_rollout(model, qpos, qvel, controls, FRAME_SKIP, SITES, GEOMS)
    return ref, backend_rollout(sim, qpos, qvel, controls)


def test_trajectory_sites_and_contacts_match_mujoco_c(sim64, ball_arm):
    ref, got = _run(sim64, ball_arm)
    assert ref["contacts"][:, :, 0].any() and not ref["contacts"][:, :, 0].all()  # the ball lands
    # float64 MJX reproduces MuJoCo C to solver tolerance (observed ~1e-11).
    np.testing.assert_allclose(got["qpos"], ref["qpos"], atol=1e-8, rtol=0)
    np.testing.assert_allclose(got["qvel"], ref["qvel"], atol=1e-6, rtol=0)
    np.testing.assert_allclose(got["time"], ref["time"], atol=1e-12, rtol=0)
    np.testing.assert_allclose(got["sites"], ref["sites"], atol=1e-8, rtol=0)
    np.testing.assert_array_equal(got["contacts"], ref["contacts"])
    assert sim64.qpos.dtype == torch.float64 and sim64.contacts().dtype == torch.bool
    assert not sim64.diverged.any()


def test_masked_reset_leaves_other_envs_untouched(sim64, ball_arm):
    qpos, qvel = ball_arm_start(ball_arm)
    sim64.reset(torch.from_numpy(qpos), torch.from_numpy(qvel))
    for _ in range(3):
        sim64.step(torch.ones(NUM_ENVS, ball_arm.nu, dtype=torch.float64))
    before = {
        "qpos": sim64.qpos.clone(),
        "qvel": sim64.qvel.clone(),
        "time": sim64.time.clone(),
        "sites": sim64.site_positions().clone(),
        "contacts": sim64.contacts().clone(),
    }
    new_qpos = np.tile(ball_arm.qpos0, (NUM_ENVS, 1))
    new_qpos[:, 2] = 0.5
    new_qpos[:, 7] = 0.7
    new_qvel = np.full((NUM_ENVS, ball_arm.nv), 0.1)
    mask = torch.tensor([False, True, False])
    sim64.reset(torch.from_numpy(new_qpos), torch.from_numpy(new_qvel), mask)

    keep = ~mask
    for key, value in (
        ("qpos", sim64.qpos),
        ("qvel", sim64.qvel),
        ("time", sim64.time),
        ("sites", sim64.site_positions()),
        ("contacts", sim64.contacts()),
    ):
        assert torch.equal(value[keep], before[key][keep]), key
    assert sim64.time[1] == 0
    np.testing.assert_array_equal(sim64.qpos[1].numpy(), new_qpos[1])
    np.testing.assert_array_equal(sim64.qvel[1].numpy(), new_qvel[1])

    # The reset env restarts cleanly: site positions as MuJoCo C's mj_forward, and
    # its next step as MuJoCo C's from a fresh MjData (no stale warm start).
    d = mujoco.MjData(ball_arm)
    d.qpos[:], d.qvel[:] = new_qpos[1], new_qvel[1]
    mujoco.mj_forward(ball_arm, d)
    site_ids = [ball_arm.site(n).id for n in SITES]
    np.testing.assert_allclose(sim64.site_positions()[1].numpy(), d.site_xpos[site_ids], atol=1e-12)
    ctrl = torch.full((NUM_ENVS, ball_arm.nu), -0.5, dtype=torch.float64)
    sim64.step(ctrl)
    d.ctrl[:] = -0.5
    for _ in range(FRAME_SKIP):
        mujoco.mj_step(ball_arm, d)
    np.testing.assert_allclose(sim64.qpos[1].numpy(), d.qpos, atol=1e-10)


@pytest.mark.slow
def test_float32_matches_mujoco_c_loosely(ball_arm):
    sim = _ball_arm_sim(ball_arm, torch.float32)
    ref, got = _run(sim, ball_arm)
    assert sim.qpos.dtype == torch.float32
    # float32 rounding through contacts: observed ~2e-5 over the 0.4 s rollout.
    np.testing.assert_allclose(got["qpos"], ref["qpos"], atol=1e-3, rtol=0)
    np.testing.assert_allclose(got["sites"], ref["sites"], atol=1e-3, rtol=0)
    np.testing.assert_array_equal(got["contacts"], ref["contacts"])


@pytest.mark.slow
@pytest.mark.parametrize("batch_chunks", [1, 2])
def test_gradients_match_central_differences(batch_chunks):
    """Contact-free float64 model: autograd through the JAX VJP vs central
    differences, with the batch in one block and in one block per env."""
    model = mujoco.MjModel.from_xml_string(PENDULUM_XML)
    sim = MjxBackend(
        model,
        num_envs=2,
        frame_skip=5,
        site_names=["tip"],
        dtype=torch.float64,
        requires_grad=True,
        batch_chunks=batch_chunks,
        compiler_options=MJX_FAST_COMPILE,
    )
    assert sim._diff_step.batch_chunks == batch_chunks

    # with grad recording on in the central differences, so the compiled
    # differentiable forward is reused
    assert_pendulum_gradients(sim, model, record_grad=True)

    sim.detach()
    assert not sim.qpos.requires_grad and not sim.site_positions().requires_grad


def test_missing_jax_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "jax", None)
    monkeypatch.delitem(sys.modules, "waddle.physics.mjx", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'waddle\[mjx\]'"):
        importlib.import_module("waddle.physics.mjx")


def test_differentiating_a_non_newton_model_is_refused_with_the_fix(ball_arm):
    model = copy.deepcopy(ball_arm)
    model.opt.solver = mujoco.mjtSolver.mjSOL_CG
    with pytest.raises(ValueError, match=r"requires_grad=True.*uses the CG solver.*solver=\"Newton\""):
        MjxBackend(model, num_envs=1, frame_skip=1, requires_grad=True)
    MjxBackend(model, num_envs=1, frame_skip=1)  # the plain path runs any solver


def test_batch_chunks_must_divide_the_envs(ball_arm):
    with pytest.raises(ValueError, match=r"backend='mjx': batch_chunks=2 must divide the number of envs \(3\)"):
        MjxBackend(ball_arm, num_envs=3, frame_skip=1, requires_grad=True, batch_chunks=2)
    with pytest.raises(ValueError, match="backend='mjx': batch_chunks must be 'auto' or a positive integer"):
        MjxBackend(ball_arm, num_envs=3, frame_skip=1, batch_chunks="all")


def test_the_backward_pass_of_the_differentiable_step_calls_no_lapack_kernel(ball_arm):
    """jaxlib 0.10's batched LAPACK kernels split their batch over XLA's CPU thread pool and block until
    the parts are done. A backward pass holding several independent ones (a Cholesky's) filled a 2-core
    pool with waiting kernels: the MicroDuck's first SHAC window at 64 envs never returned. The implicit
    solve's backward pass is a product by a saved inverse, with no LAPACK call left to wait."""
    import jax
    import jax.numpy as jnp
    from mujoco import mjx

    from waddle.physics import mjx_implicit

    mjx_model = mjx.put_model(ball_arm)
    qpos, qvel = ball_arm_start(ball_arm)
    data = mjx.make_data(ball_arm).replace(qpos=jnp.asarray(qpos[0]), qvel=jnp.asarray(qvel[0]))

    def accelerations(ctrl):  # two envs, as the backend vmaps them
        return jax.vmap(lambda c: mjx_implicit.step(mjx_model, data.replace(ctrl=c)).qacc)(ctrl)

    ctrl = jnp.full((2, ball_arm.nu), 0.3)
    out, backward = jax.vjp(accelerations, ctrl)
    forward_program = jax.jit(accelerations).lower(ctrl).as_text()
    backward_program = jax.jit(lambda vjp, cotangent: vjp(cotangent)).lower(backward, jnp.ones_like(out)).as_text()
    assert "lapack_" in forward_program  # MJX's converged Newton solve: the check sees LAPACK calls
    assert "lapack_" not in backward_program


def test_the_lapack_free_inverse_matches_numpy_on_a_positive_definite_matrix():
    import jax
    import jax.numpy as jnp

    from waddle.physics.mjx_implicit import spd_inverse

    factor = np.random.default_rng(0).normal(size=(20, 20))
    matrix = factor @ factor.T + 0.5 * np.eye(20)  # the MicroDuck's nv, conditioned ~1e3
    with jax.enable_x64(True):
        got = np.asarray(jax.jit(jax.vmap(spd_inverse))(jnp.asarray(np.stack([matrix, 2.0 * matrix]))))
    np.testing.assert_allclose(got[0], np.linalg.inv(matrix), rtol=0, atol=1e-9)
    np.testing.assert_allclose(got[1], 0.5 * np.linalg.inv(matrix), rtol=0, atol=1e-9)


def test_auto_row_blocks_leave_a_model_with_constraints_in_one_block(ball_arm):
    from waddle.bridge import auto_batch_chunks

    pendulum = mujoco.MjModel.from_xml_string(PENDULUM_XML)  # no contact, limit or friction: no solve
    free = MjxBackend(pendulum, num_envs=16, frame_skip=1, requires_grad=True)
    constrained = MjxBackend(ball_arm, num_envs=16, frame_skip=1, requires_grad=True)
    assert free.batch_chunks == auto_batch_chunks(16, "cpu")
    assert constrained.batch_chunks == 1  # its Newton solve calls LAPACK (see the test above)
    assert MjxBackend(ball_arm, num_envs=16, frame_skip=1, requires_grad=True, batch_chunks=2).batch_chunks == 2
