"""The native backend against MuJoCo C stepped by hand, one MjData at a time."""

import mujoco
import numpy as np
import pytest
import torch

from waddle.physics import make_backend

# A box with an actuated arm, dropped on a floor: contacts, a site, a motor.
XML = """
<mujoco>
  <worldbody>
    <geom name="floor" type="plane" size="1 1 .1"/>
    <body name="box" pos="0 0 0.2">
      <freejoint/>
      <geom name="box" type="box" size=".05 .05 .05"/>
      <site name="top" pos="0 0 .05"/>
      <body name="arm" pos="0 0 0.05">
        <joint name="hinge" type="hinge" axis="0 1 0"/>
        <geom name="arm" type="capsule" fromto="0 0 0 0.1 0 0" size=".01" contype="0" conaffinity="0"/>
        <site name="tip" pos="0.1 0 0"/>
      </body>
    </body>
  </worldbody>
  <actuator><position joint="hinge" kp="2"/></actuator>
</mujoco>
"""
FRAME_SKIP = 5


def _backend(num_envs, **kwargs):
    spec = mujoco.MjSpec.from_string(XML)
    return make_backend(
        "mujoco",
        spec,
        num_envs=num_envs,
        frame_skip=FRAME_SKIP,
        site_names=["tip", "top"],
        contact_geom_names=["box"],
        dtype=torch.float64,
        **kwargs,
    )


def _initial_state(model, num_envs, seed=0):
    rng = np.random.default_rng(seed)
    qpos = np.tile(model.qpos0, (num_envs, 1))
    qpos[:, 2] = rng.uniform(0.05, 0.3, num_envs)
    qpos[:, 7] = rng.uniform(-1, 1, num_envs)
    qvel = rng.normal(scale=0.5, size=(num_envs, model.nv))
    return qpos, qvel


def test_trajectories_match_mj_step():
    num_envs, steps = 6, 20
    sim = _backend(num_envs, num_threads=2)
    qpos, qvel = _initial_state(sim.model, num_envs)
    sim.reset(torch.from_numpy(qpos), torch.from_numpy(qvel))
    ctrl = np.random.default_rng(1).uniform(-1, 1, (steps, num_envs, 1))

    datas = [mujoco.MjData(sim.model) for _ in range(num_envs)]
    for data, q, v in zip(datas, qpos, qvel):
        data.qpos[:], data.qvel[:] = q, v
    for t in range(steps):
        sim.step(torch.from_numpy(ctrl[t]))
        for i, data in enumerate(datas):
            data.ctrl[:] = ctrl[t, i]
            for _ in range(FRAME_SKIP):
                mujoco.mj_step(sim.model, data)

    # The rollout does not carry the solver's warm start across calls, so the
    # contact solution differs at the solver tolerance, not more.
    expected_qpos = np.stack([d.qpos for d in datas])
    np.testing.assert_allclose(sim.qpos.numpy(), expected_qpos, atol=1e-6)
    np.testing.assert_allclose(sim.qvel.numpy(), np.stack([d.qvel for d in datas]), atol=1e-4)
    np.testing.assert_allclose(sim.time.numpy(), steps * FRAME_SKIP * sim.model.opt.timestep)
    np.testing.assert_allclose(sim.site_positions().numpy(), np.stack([d.site_xpos[[1, 0]] for d in datas]), atol=1e-6)
    box = mujoco.mj_name2id(sim.model, mujoco.mjtObj.mjOBJ_GEOM, "box")
    touching = [any(box in (c.geom1, c.geom2) for c in d.contact) for d in datas]
    assert sim.contacts()[:, 0].tolist() == touching
    assert any(touching)
    sim.close()


def test_applied_forces_match_mj_step_with_xfrc_applied_and_clear():
    num_envs, steps = 4, 10
    sim = _backend(num_envs, num_threads=2)
    qpos, qvel = _initial_state(sim.model, num_envs)
    sim.reset(torch.from_numpy(qpos), torch.from_numpy(qvel))
    xfrc = np.zeros((num_envs, sim.model.nbody, 6))
    box, arm = sim.model.body("box").id, sim.model.body("arm").id
    xfrc[:, box] = np.random.default_rng(2).normal(scale=2.0, size=(num_envs, 6))
    xfrc[1, arm, 2] = 0.5
    datas = [mujoco.MjData(sim.model) for _ in range(num_envs)]
    for data, q, v in zip(datas, qpos, qvel):
        data.qpos[:], data.qvel[:] = q, v
    for t in range(steps):
        forced = t < steps // 2  # the second half after clearing them
        sim.apply_forces(torch.from_numpy(xfrc) if forced else None)
        sim.step(torch.full((num_envs, 1), 0.3, dtype=torch.float64))
        for i, data in enumerate(datas):
            data.ctrl[:] = 0.3
            data.xfrc_applied[:] = xfrc[i] if forced else 0.0
            for _ in range(FRAME_SKIP):
                mujoco.mj_step(sim.model, data)
        np.testing.assert_allclose(sim.qpos.numpy(), np.stack([d.qpos for d in datas]), atol=1e-6)
    # The forces moved the envs apart from where they go without them.
    free = _backend(num_envs)
    free.reset(torch.from_numpy(qpos), torch.from_numpy(qvel))
    for _ in range(steps):
        free.step(torch.full((num_envs, 1), 0.3, dtype=torch.float64))
    assert (free.qpos - sim.qpos).abs().amax(-1).min() > 1e-3
    with pytest.raises(ValueError, match=r"xfrc must have shape \(4, 3, 6\), got \(4, 6\)"):
        sim.apply_forces(torch.zeros(4, 6))
    sim.close()
    free.close()


def test_masked_reset_leaves_other_envs_alone():
    sim = _backend(4)
    qpos, qvel = _initial_state(sim.model, 4)
    sim.reset(torch.from_numpy(qpos), torch.from_numpy(qvel))
    for _ in range(3):
        sim.step(torch.zeros(4, 1))
    before_qpos, before_time = sim.qpos.clone(), sim.time.clone()

    new_qpos = torch.from_numpy(qpos) + 1.0
    mask = torch.tensor([False, True, False, True])
    sim.reset(new_qpos, torch.zeros(4, sim.nv, dtype=torch.float64), mask)

    assert torch.equal(sim.qpos[~mask], before_qpos[~mask])
    assert torch.equal(sim.time[~mask], before_time[~mask])
    assert torch.allclose(sim.qpos[mask], new_qpos[mask])
    assert torch.all(sim.time[mask] == 0)
    # Sensors of reset envs describe the new state: the tip follows the box.
    data = mujoco.MjData(sim.model)
    data.qpos[:] = new_qpos[1].numpy()
    mujoco.mj_forward(sim.model, data)
    np.testing.assert_allclose(sim.site_positions()[1, 0].numpy(), data.site_xpos[1], atol=1e-9)


def test_unstable_env_is_reported_and_others_keep_stepping():
    sim = _backend(3)
    qpos, qvel = _initial_state(sim.model, 3)
    qvel[1, 2] = 1e30  # MuJoCo resets this simulator as unstable
    sim.reset(torch.from_numpy(qpos), torch.from_numpy(qvel))
    sim.step(torch.zeros(3, 1))
    assert sim.diverged.tolist() == [False, True, False]
    assert torch.isnan(sim.qpos[1]).all()
    assert torch.isfinite(sim.qpos[[0, 2]]).all()

    sim.reset(torch.from_numpy(qpos), torch.zeros(3, sim.nv, dtype=torch.float64), torch.tensor([False, True, False]))
    sim.step(torch.zeros(3, 1))
    assert not sim.diverged.any()


def test_requires_grad_is_refused_with_a_pointer_to_differentiable_backends():
    with pytest.raises(ValueError, match="mjx.*mujoco-torch"):
        _backend(1, requires_grad=True)


def test_compiled_model_without_spec_is_refused_when_tracking():
    model = mujoco.MjModel.from_xml_string(XML)
    with pytest.raises(ValueError, match="MjSpec"):
        make_backend("mujoco", model, num_envs=1, frame_skip=1, site_names=["tip"])


def test_unknown_names_and_backends():
    spec = mujoco.MjSpec.from_string(XML)
    with pytest.raises(ValueError, match="no site named 'nose'"):
        make_backend("mujoco", spec, num_envs=1, frame_skip=1, site_names=["nose"])
    with pytest.raises(ValueError, match="choose one of"):
        make_backend("bullet", spec, num_envs=1, frame_skip=1)
    with pytest.raises(ValueError, match="num_envs"):
        make_backend("mujoco", spec, num_envs=0, frame_skip=1)
