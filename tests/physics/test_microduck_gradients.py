"""MicroDuck on MJX: autograd through ``requires_grad=True`` against central
differences of ``requires_grad=False``.

The finite differences run the plain path (MJX's own solver, iterating to its
tolerance), so these tests check that the differentiable path differentiates
the robot that the plain path simulates, not only its own program.

With the floor in the scene the loss jumps whenever a sole corner makes or
breaks contact, and central differences do not converge (in float32 or
float64). So the robot falls freely here (the floor is removed, and its geoms
never collide with each other): every joint, servo, inertia and the servos'
friction loss (a constraint the solver iterates on) are the real model's, and
the dynamics are smooth. Float64, eps 1e-5: the truncation error is ~eps^2
times the third derivative and the rounding error ~1e-16 / eps. Contact-rich
agreement is tested against MuJoCo C in ``test_microduck_parity.py`` and
``test_backend_parity.py``.
"""

from __future__ import annotations

import mujoco
import pytest
import torch

pytest.importorskip("mujoco.mjx", reason="needs the mjx extra: pip install 'waddle[mjx]'")

from helpers.compile_options import MJX_FAST_COMPILE  # noqa: E402
from helpers.gradients import central_difference  # noqa: E402

from waddle.envs.microduck import MicroDuckEnv  # noqa: E402
from waddle.envs.microduck.constants import EMBEDDED_SCENE, STAND_KEYFRAME  # noqa: E402

STEPS, NUM_ENVS = 3, 2

# Both tests differentiate the same floorless env: they share one pair of compiled MJX programs
# (plain and differentiable), which is most of their time.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def floorless_envs(tmp_path_factory):
    """``{requires_grad: MicroDuckEnv}`` on the embedded scene without its floor, float64, on MJX."""
    spec = mujoco.MjSpec.from_file(str(EMBEDDED_SCENE))
    spec.delete(spec.geom("floor"))
    scene = tmp_path_factory.mktemp("floorless") / "floorless.xml"
    scene.write_text(spec.to_xml())
    envs = {
        requires_grad: MicroDuckEnv(
            scene,
            num_envs=NUM_ENVS,
            backend="mjx",
            seed=0,
            dtype=torch.float64,
            requires_grad=requires_grad,
            compiler_options=MJX_FAST_COMPILE,
        )
        for requires_grad in (True, False)
    }
    yield envs
    for env in envs.values():
        env.close()


def test_microduck_mjx_gradients_match_central_differences(floorless_envs):
    """The backend alone: site positions and joint angles after 3 control steps, against the
    controls and the initial velocity."""
    sims = {requires_grad: env.physics for requires_grad, env in floorless_envs.items()}
    model = sims[False].model
    frame_skip = sims[False].frame_skip
    key = model.key(STAND_KEYFRAME)
    gen = torch.Generator().manual_seed(0)
    qpos0 = torch.tensor(key.qpos, dtype=torch.float64).repeat(NUM_ENVS, 1)
    qpos0[:, 7:] += 0.05 * torch.randn(NUM_ENVS, model.nq - 7, generator=gen, dtype=torch.float64)
    qvel0 = 0.1 * torch.randn(NUM_ENVS, model.nv, generator=gen, dtype=torch.float64)
    controls = torch.tensor(key.ctrl, dtype=torch.float64) + 0.2 * torch.randn(
        STEPS, NUM_ENVS, model.nu, generator=gen, dtype=torch.float64
    )
    num_sites = sims[False].site_positions().shape[1]
    site_weights = torch.randn(NUM_ENVS, num_sites, 3, generator=gen, dtype=torch.float64)
    joint_weights = torch.randn(NUM_ENVS, model.nq - 7, generator=gen, dtype=torch.float64)

    def loss(controls, qvel0, sim=sims[True]):
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
        for _ in range(frame_skip):
            mujoco.mj_step(model, data)
            assert data.ncon == 0

    for index, grad, point in ((0, controls_var.grad, "ctrl"), (1, qvel_var.grad, "qvel")):
        direction = torch.randn(grad.shape, generator=gen, dtype=torch.float64)
        finite_difference = central_difference(
            lambda controls, qvel0: loss(controls, qvel0, sims[False]), (controls, qvel0), index, direction
        )
        autograd = (grad * direction).sum().item()
        assert abs(autograd) > 1e-3, point  # a derivative worth comparing
        assert autograd == pytest.approx(finite_difference, rel=1e-5, abs=1e-8), point


def test_microduck_env_policy_gradient_matches_central_differences_of_the_plain_path(floorless_envs):
    """The env end to end: a 4-step rollout of a tanh-linear policy, loss = mean
    reward; the policy's gradient through ``requires_grad=True`` against central
    differences of the same loss on ``requires_grad=False``."""
    envs = floorless_envs
    obs_dim = envs[True].observation_spec["observation"].shape[-1]
    gen = torch.Generator().manual_seed(0)
    weight = 0.05 * torch.randn(14, obs_dim, generator=gen, dtype=torch.float64)

    def mean_reward(weight, env):
        env.set_seed(0)  # the same reset draws (start pose, command) for every evaluation
        td = env.reset()
        rewards = []
        for _ in range(4):
            td["action"] = torch.tanh(td["observation"] @ weight.T)
            td = env.step(td)
            assert not td["next", "done"].any()  # the episode, and the function, is smooth
            rewards.append(td["next", "reward"])
            td = td["next"]
        return torch.stack(rewards).mean()

    weight_var = weight.clone().requires_grad_(True)
    mean_reward(weight_var, envs[True]).backward()
    direction = torch.randn(weight.shape, generator=gen, dtype=torch.float64)
    autograd = (weight_var.grad * direction).sum().item()
    finite_difference = central_difference(lambda w: mean_reward(w, envs[False]), (weight,), 0, direction)
    assert abs(finite_difference) > 1e-4  # a derivative worth comparing
    assert autograd == pytest.approx(finite_difference, rel=1e-2)
