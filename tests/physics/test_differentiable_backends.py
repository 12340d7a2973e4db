"""MJX and mujoco-torch against MuJoCo C, and their gradients against finite differences.

The model is contact-free (a free-floating arm with damping, friction loss and
armature, driven by position servos) so the dynamics are smooth: trajectories
must agree with MuJoCo C to solver precision, and autograd directional
derivatives must match central differences. Contact-rich agreement on the
MicroDuck is checked in ``test_microduck_parity.py``.
"""

import mujoco
import pytest
import torch
from helpers.compile_options import MJX_FAST_COMPILE
from helpers.gradients import central_difference

from waddle.physics import make_backend

pytest.importorskip("jax", reason="the mjx extra is part of the test install: pip install -e '.[all,dev]'")

XML = """
<mujoco>
  <option gravity="0 0 -9.81"/>
  <worldbody>
    <body name="base" pos="0 0 1">
      <joint name="slide" type="slide" axis="0 0 1" damping="0.5"/>
      <geom type="box" size=".05 .05 .05" mass="0.3"/>
      <body name="arm" pos="0 0 0.05">
        <joint name="hinge" type="hinge" axis="0 1 0" damping="0.05" armature="0.002"/>
        <geom type="capsule" fromto="0 0 0 0.1 0 0" size=".01" mass="0.05"/>
        <site name="tip" pos="0.1 0 0"/>
      </body>
    </body>
  </worldbody>
  <actuator>
    <position joint="hinge" kp="2"/>
    <motor joint="slide" gear="1"/>
  </actuator>
</mujoco>
"""
BACKENDS = ["mjx", "mujoco-torch"]
FRAME_SKIP = 4


def _backend(name, num_envs=2, **kwargs):
    if name == "mjx":
        kwargs.setdefault("compiler_options", MJX_FAST_COMPILE)
    return make_backend(
        name,
        mujoco.MjSpec.from_string(XML),
        num_envs=num_envs,
        frame_skip=FRAME_SKIP,
        site_names=["tip"],
        dtype=torch.float64,
        **kwargs,
    )


def _start(sim):
    qpos = torch.tensor([[0.0, 0.3], [0.1, -0.5]], dtype=torch.float64)
    qvel = torch.tensor([[0.2, 0.0], [-0.1, 1.0]], dtype=torch.float64)
    return qpos, qvel


def _controls(steps):
    t = torch.arange(steps, dtype=torch.float64).unsqueeze(-1)
    return torch.stack(
        [torch.cat([0.5 * torch.sin(t), 2.0 + 0.0 * t], -1), torch.cat([-0.3 + 0.0 * t, 3.0 * torch.cos(t)], -1)], 1
    )


@pytest.mark.parametrize("name", BACKENDS)
def test_trajectory_matches_mujoco_c_without_contacts(name):
    steps = 20
    reference = _backend("mujoco")
    sim = _backend(name)
    for backend in (reference, sim):
        backend.reset(*_start(backend))
    for ctrl in _controls(steps):
        reference.step(ctrl)
        sim.step(ctrl)
    torch.testing.assert_close(sim.qpos, reference.qpos, atol=1e-6, rtol=0)
    torch.testing.assert_close(sim.qvel, reference.qvel, atol=1e-5, rtol=0)
    torch.testing.assert_close(sim.site_positions(), reference.site_positions(), atol=1e-6, rtol=0)
    torch.testing.assert_close(sim.time, reference.time)


@pytest.mark.parametrize("name", BACKENDS)
def test_masked_reset_leaves_other_envs_alone(name):
    sim = _backend(name)
    sim.reset(*_start(sim))
    sim.step(_controls(1)[0])
    before = sim.qpos.clone()
    qpos, qvel = _start(sim)
    sim.reset(qpos + 1.0, qvel, torch.tensor([False, True]))
    assert torch.equal(sim.qpos[0], before[0])
    torch.testing.assert_close(sim.qpos[1], qpos[1] + 1.0)
    assert sim.time[1] == 0


@pytest.mark.parametrize("name", BACKENDS)
def test_gradients_match_central_differences(name):
    """d loss / d controls along a random direction; the loss reads qpos and the tip site."""
    steps = 5
    sim = _backend(name, requires_grad=True)
    controls = _controls(steps)
    qpos0, qvel0 = _start(sim)

    def loss(controls, qvel0):
        sim.reset(qpos0, qvel0)
        for ctrl in controls:
            sim.step(ctrl)
        return sim.qpos.square().sum() + sim.site_positions()[..., 2].sum()

    controls_var = controls.clone().requires_grad_(True)
    value = loss(controls_var, qvel0)
    (gradient,) = torch.autograd.grad(value, controls_var)

    direction = torch.randn(controls.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    finite_difference = central_difference(loss, (controls, qvel0), 0, direction)
    assert gradient.abs().sum() > 0
    assert (gradient * direction).sum().item() == pytest.approx(finite_difference, abs=1e-6, rel=1e-5)
