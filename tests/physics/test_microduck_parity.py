"""Native MuJoCo and MJX (plain and differentiable) on the MicroDuck: same start, same actions, same trajectory.

Contacts make the dynamics non-smooth, so this is the contact-rich check: both
backends resolve the foot contacts with their own solvers, and in float64 they
stay within 1e-4 rad/m of each other over 20 control steps (0.4 s, 200
substeps) of random actions while the robot stands, stumbles and starts to fall.
mujoco-torch 0.2.0 does not meet this bound with contacts (its trajectory
leaves MuJoCo C's by about 1e-2 after one control step); it is checked against
MuJoCo C on a contact-free model in ``test_differentiable_backends.py``.
"""

import pytest
import torch
from helpers.compile_options import MJX_FAST_COMPILE
from tensordict import TensorDict

from waddle.envs.microduck import MicroDuckEnv, MicroDuckRandomization

pytest.importorskip("jax", reason="the mjx extra is part of the test install: pip install -e '.[all,dev]'")


def _trajectory(backend, actions, **kwargs):
    env = MicroDuckEnv(
        num_envs=2, backend=backend, seed=0, dtype=torch.float64, tasks=MicroDuckEnv.standing_task(), **kwargs
    )
    env.reset()
    states = []
    for action in actions:
        env.step(TensorDict(action=action, batch_size=[2]))
        states.append(torch.cat([env.get_state()["qpos"], env.foot_heights()], -1).clone())
    contacts = env.foot_contacts().clone()
    env.close()
    return torch.stack(states), contacts


def test_native_and_mjx_agree_over_twenty_control_steps():
    actions = 0.3 * (2 * torch.rand(20, 2, 14, generator=torch.Generator().manual_seed(1), dtype=torch.float64) - 1)
    native, native_contacts = _trajectory("mujoco", actions)
    mjx, mjx_contacts = _trajectory("mjx", actions, compiler_options=MJX_FAST_COMPILE)
    assert (native[-1] - native[0]).abs().max() > 1e-2  # the robot moved
    torch.testing.assert_close(mjx, native, atol=1e-4, rtol=0)
    assert torch.equal(mjx_contacts, native_contacts)


def test_differentiable_mjx_simulates_the_robot_native_mujoco_simulates():
    # requires_grad=True differentiates the converged solve; its trajectory must still be MuJoCo's
    # (the one-Newton-iteration solve it replaced was off by 5e-3 after one control step).
    actions = 0.3 * (2 * torch.rand(20, 2, 14, generator=torch.Generator().manual_seed(1), dtype=torch.float64) - 1)
    native, native_contacts = _trajectory("mujoco", actions)
    with torch.no_grad():
        differentiable, differentiable_contacts = _trajectory(
            "mjx", actions, requires_grad=True, compiler_options=MJX_FAST_COMPILE
        )
    torch.testing.assert_close(differentiable, native, atol=1e-4, rtol=0)
    assert torch.equal(differentiable_contacts, native_contacts)


def test_native_and_mjx_agree_under_upstream_randomization():
    # Same seed, same draws: every env runs its own friction, masses and servo constants on both
    # backends (per-env MjModels against batched mjx.Model fields), with pushes and delays.
    config = MicroDuckRandomization.preset("upstream", push_interval=(0.1, 0.2))
    actions = 0.3 * (2 * torch.rand(15, 2, 14, generator=torch.Generator().manual_seed(1), dtype=torch.float64) - 1)
    trajectories = {}
    for backend in ("mujoco", "mjx"):
        env = MicroDuckEnv(
            num_envs=2,
            backend=backend,
            seed=0,
            dtype=torch.float64,
            tasks=MicroDuckEnv.standing_task(),
            randomization=config,
            **({"compiler_options": MJX_FAST_COMPILE} if backend == "mjx" else {}),
        )
        td = env.reset()
        states = []
        for action in actions:
            td["action"] = action
            td = env.step(td)["next"]
            states.append(torch.cat([env.get_state()["qpos"], td["sensor_observation"]], -1).clone())
        trajectories[backend] = (torch.stack(states), td["randomization"].clone())
        env.close()
    (native, native_values), (mjx, mjx_values) = trajectories["mujoco"], trajectories["mjx"]
    assert (native_values == mjx_values).all()
    assert not torch.equal(native_values["friction"][0], native_values["friction"][1])
    torch.testing.assert_close(mjx, native, atol=1e-4, rtol=0)
