"""Native MuJoCo, MJX and mujoco-torch on the embedded MicroDuck model.

Every backend starts from the STAND keyframe with small noise (joints 0.02 rad,
velocities 0.05) and replays the same 20 random actions (STAND's ctrl + 0.2
noise) at frame_skip 10 (0.4 s, 200 substeps) in float64; each is compared with
an independent MuJoCo C rollout (``mj_step`` on plain ``MjData``), so any two
backends agree within the sum of their tolerances. The robot stands on its two
box soles, stumbles and shifts its weight: the contact set changes, which is
where implementations part.

Tolerances (max abs over qpos in rad/m, over sites in m), and why:

* native: 1e-9. The same C engine (``mujoco.rollout``); observed 5e-16.
* MJX: 1e-8 at the first control step and 5e-3 over the 20 steps (observed
  8e-16 throughout for this seed). MJX's plane-box collision keeps only the
  corners within 1 mm of the deepest one, MuJoCo C every penetrating corner:
  when a sole grazes the floor with one corner (1e-5 m deep) while another is
  1 mm deep, MuJoCo C has one contact more. That is a different (valid)
  contact model, not rounding, and its effect grows through later contact
  events: with other seeds we saw 1.5e-3 after 20 steps, while the first
  step stayed exact. The first-step bound catches any mismatch of state,
  actions, frame skip or actuation; the overall bound leaves room for one such
  event and is still 60x below a real fault (mujoco-torch's uncapped friction
  loss is off by 0.3 rad).
* mujoco-torch: 5e-4 at the first step, 5e-3 over 20 steps, sites 1e-3
  (observed 4e-5, 3.4e-4 and 4e-5; 3.1e-3 over 20 steps with another seed),
  on the model with friction loss removed, from the reference too:
  mujoco-torch 0.2.0 cannot simulate joint friction loss (the backend refuses
  such a model), and it puts box contacts at the corner instead of midway
  between the surfaces, which shifts the contact torque arms by half the
  penetration depth from the very first substep.
* contact flags: equal in at least 95% of the (step, env, foot) entries
  (observed: all); a grazing foot is where the collision models differ.

The MJX and mujoco-torch rollouts take minutes on a CPU (compilation, eager
dispatch) and are marked slow.
"""

from __future__ import annotations

import mujoco
import numpy as np
import pytest
import torch
from helpers.compile_options import MJX_FAST_COMPILE
from helpers.mujoco_c import c_rollout
from helpers.rollout import backend_rollout

from waddle.envs.microduck.constants import (
    EMBEDDED_SCENE,
    FOOT_GEOMS,
    FOOT_SITES,
    IMU_SITE,
    STAND_KEYFRAME,
)
from waddle.physics import backend_available, make_backend

NUM_ENVS, FRAME_SKIP, STEPS = 2, 10, 20
SITES = (*FOOT_SITES, IMU_SITE)
GEOMS = FOOT_GEOMS


def duck_spec(frictionloss: bool = True) -> mujoco.MjSpec:
    spec = mujoco.MjSpec.from_file(str(EMBEDDED_SCENE))
    if not frictionloss:
        for joint in spec.joints:
            joint.frictionloss = 0.0
    return spec


def start_and_actions(model: mujoco.MjModel):
    key = model.key(STAND_KEYFRAME)
    gen = np.random.default_rng(0)
    qpos = np.tile(key.qpos, (NUM_ENVS, 1))
    qpos[:, 7:] += 0.02 * gen.standard_normal((NUM_ENVS, model.nq - 7))
    qvel = 0.05 * gen.standard_normal((NUM_ENVS, model.nv))
    actions = key.ctrl + 0.2 * gen.standard_normal((STEPS, NUM_ENVS, model.nu))
    return qpos, qvel, actions


def duck_rollout(name, spec, qpos, qvel, actions, **kwargs):
    sim = make_backend(
        name,
        spec,
        num_envs=NUM_ENVS,
        frame_skip=FRAME_SKIP,
        site_names=SITES,
        contact_geom_names=GEOMS,
        dtype=torch.float64,
        **kwargs,
    )
    try:
        return backend_rollout(sim, qpos, qvel, actions)
    finally:
        sim.close()


def assert_close_trajectory(got, ref, *, first_step, overall, sites, contact_agreement):
    """``first_step``/``overall``: qpos bounds at step 1 / over all steps; sites: overall."""
    qpos_err = np.abs(got["qpos"] - ref["qpos"]).reshape(STEPS, -1).max(axis=1)
    assert qpos_err[0] <= first_step, f"first control step off by {qpos_err[0]:.2e}"
    assert qpos_err.max() <= overall, f"qpos error per step: {np.array2string(qpos_err, precision=2)}"
    site_err = np.abs(got["sites"] - ref["sites"]).max()
    assert site_err <= sites, f"site positions off by {site_err:.2e}"
    agreement = (got["contacts"] == ref["contacts"]).mean()
    assert agreement >= contact_agreement, f"contact flags agree in {agreement:.0%} of entries"


@pytest.fixture(scope="module")
def duck():
    spec = duck_spec()
    model = spec.compile()
    qpos, qvel, actions = start_and_actions(model)
    ref = c_rollout(model, qpos, qvel, actions, FRAME_SKIP, SITES, GEOMS)
    # The rollout exercises contacts: both feet touch at some point, and the
    # robot moves well beyond every tolerance below.
    assert ref["contacts"].any(axis=(0, 1)).all()
    assert np.abs(ref["qpos"][-1] - qpos).max() > 0.1
    return qpos, qvel, actions, ref


def test_native_matches_mujoco_c(duck):
    qpos, qvel, actions, ref = duck
    got = duck_rollout("mujoco", duck_spec(), qpos, qvel, actions)
    assert_close_trajectory(got, ref, first_step=1e-9, overall=1e-9, sites=1e-9, contact_agreement=1.0)


@pytest.mark.slow
@pytest.mark.skipif(not backend_available("mjx"), reason="needs pip install 'waddle[mjx]'")
def test_mjx_matches_mujoco_c(duck):
    qpos, qvel, actions, ref = duck
    got = duck_rollout(
        "mjx",
        duck_spec(),
        qpos,
        qvel,
        actions,
        compiler_options=MJX_FAST_COMPILE,
    )
    assert_close_trajectory(got, ref, first_step=1e-8, overall=5e-3, sites=2e-3, contact_agreement=0.95)


@pytest.mark.skipif(not backend_available("mujoco-torch"), reason="needs pip install 'waddle[torch-sim]'")
def test_mujoco_torch_refuses_microduck_friction_loss():
    with pytest.raises(NotImplementedError, match="friction loss"):
        make_backend("mujoco-torch", duck_spec(), num_envs=1, frame_skip=FRAME_SKIP)


@pytest.mark.slow
@pytest.mark.skipif(not backend_available("mujoco-torch"), reason="needs pip install 'waddle[torch-sim]'")
def test_mujoco_torch_matches_mujoco_c_without_friction_loss():
    spec = duck_spec(frictionloss=False)
    model = spec.compile()
    qpos, qvel, actions = start_and_actions(model)
    ref = c_rollout(model, qpos, qvel, actions, FRAME_SKIP, SITES, GEOMS)
    got = duck_rollout("mujoco-torch", duck_spec(frictionloss=False), qpos, qvel, actions)
    assert_close_trajectory(got, ref, first_step=5e-4, overall=5e-3, sites=1e-3, contact_agreement=0.95)


def test_native_refuses_requires_grad():
    with pytest.raises(ValueError, match="not differentiable"):
        make_backend("mujoco", duck_spec(), num_envs=1, frame_skip=1, requires_grad=True)
