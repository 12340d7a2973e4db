"""MicroDuck on MJX: autograd through the physics against central differences.

With the floor in the scene the loss jumps whenever a sole corner makes or
breaks contact, and central differences do not converge (in float32 or
float64). So the robot falls freely here (the floor is removed, and its geoms
never collide with each other): every joint, servo, inertia and the servos'
friction loss are the real model's, the dynamics are smooth, and the
derivative of the computed loss must match central differences of the same
computation. Float64, eps 1e-5: the truncation error is ~eps^2 times the third
derivative and the rounding error ~1e-16 / eps, both far below the tolerance
(relative 1e-5). Contact-rich agreement is tested against MuJoCo C in
``test_microduck_parity.py`` and ``test_backend_parity.py``.
"""

from __future__ import annotations

import mujoco
import pytest
import torch

pytest.importorskip("mujoco.mjx", reason="needs the mjx extra: pip install 'waddle[mjx]'")

from helpers.gradients import central_difference  # noqa: E402

from waddle.envs.microduck.constants import EMBEDDED_SCENE, FOOT_SITES, IMU_SITE, STAND_KEYFRAME  # noqa: E402
from waddle.physics import make_backend  # noqa: E402

FRAME_SKIP, STEPS, NUM_ENVS = 10, 3, 2


@pytest.mark.slow
def test_microduck_mjx_gradients_match_central_differences():
    spec = mujoco.MjSpec.from_file(str(EMBEDDED_SCENE))
    spec.delete(spec.geom("floor"))
    model = spec.compile()
    sim = make_backend(
        "mjx",
        spec,
        num_envs=NUM_ENVS,
        frame_skip=FRAME_SKIP,
        site_names=(*FOOT_SITES, IMU_SITE),
        dtype=torch.float64,
        requires_grad=True,
        compiler_options={"xla_llvm_disable_expensive_passes": True},
    )
    key = model.key(STAND_KEYFRAME)
    gen = torch.Generator().manual_seed(0)
    qpos0 = torch.tensor(key.qpos, dtype=torch.float64).repeat(NUM_ENVS, 1)
    qpos0[:, 7:] += 0.05 * torch.randn(NUM_ENVS, model.nq - 7, generator=gen, dtype=torch.float64)
    qvel0 = 0.1 * torch.randn(NUM_ENVS, model.nv, generator=gen, dtype=torch.float64)
    controls = torch.tensor(key.ctrl, dtype=torch.float64) + 0.2 * torch.randn(
        STEPS, NUM_ENVS, model.nu, generator=gen, dtype=torch.float64
    )
    site_weights = torch.randn(NUM_ENVS, 3, 3, generator=gen, dtype=torch.float64)
    joint_weights = torch.randn(NUM_ENVS, model.nq - 7, generator=gen, dtype=torch.float64)

    def loss(controls, qvel0):
        sim.reset(qpos0, qvel0)
        for ctrl in controls:
            sim.step(ctrl)
        return (sim.site_positions() * site_weights).sum() + (sim.qpos[:, 7:] * joint_weights).sum()

    controls_var = controls.clone().requires_grad_(True)
    qvel_var = qvel0.clone().requires_grad_(True)
    value = loss(controls_var, qvel_var)
    value.backward()
    assert torch.isfinite(value)
    # no contacts at all (the smoothness the comparison relies on): MuJoCo C,
    # stepped through the same controls, never finds one
    data = mujoco.MjData(model)
    data.qpos[:], data.qvel[:] = qpos0[0].numpy(), qvel0[0].numpy()
    for ctrl in controls[:, 0]:
        data.ctrl[:] = ctrl.numpy()
        for _ in range(FRAME_SKIP):
            mujoco.mj_step(model, data)
            assert data.ncon == 0

    for index, grad, point in ((0, controls_var.grad, "ctrl"), (1, qvel_var.grad, "qvel")):
        direction = torch.randn(grad.shape, generator=gen, dtype=torch.float64)
        # evaluated with grad recording on, so the compiled differentiable
        # forward is reused instead of compiling the no-grad program too
        finite_difference = central_difference(loss, (controls, qvel0), index, direction, record_grad=True)
        autograd = (grad * direction).sum().item()
        assert abs(autograd) > 1e-3, point  # a derivative worth comparing
        assert autograd == pytest.approx(finite_difference, rel=1e-5, abs=1e-8), point
