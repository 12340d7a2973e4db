"""The get-up curriculum's lift: a share of the robot's weight held up at the trunk."""

from __future__ import annotations

import math

import mujoco
import numpy as np
import pytest
import torch

from waddle.envs.microduck import MicroDuckEnv
from waddle.envs.microduck.lift_assist import LiftAssist

ROBOT_MASS = 0.73724318
"""kg: the embedded MicroDuck's bodies summed (the spec's 737.2 g); the limbs' collision boxes weigh nothing."""


def test_the_lift_holds_its_share_of_the_weight_on_every_trunk():
    assist = LiftAssist(num_envs=3, nbody=5, trunk=1, weight=8.0, dtype=torch.float64, device=torch.device("cpu"))
    assert not assist.forces().any()
    assist.share = 0.25
    expected = torch.zeros(3, 5, 6, dtype=torch.float64)
    expected[:, 1, 2] = 2.0
    assert torch.equal(assist.forces(), expected)


@pytest.mark.parametrize("share", [-0.1, 1.5, math.nan, True, "0.5"])
def test_a_share_outside_zero_to_one_is_refused(share):
    assist = LiftAssist(num_envs=1, nbody=2, trunk=1, weight=1.0, dtype=torch.float32, device=torch.device("cpu"))
    with pytest.raises(ValueError, match=r"lift assist share must be .*in \[0, 1\]"):
        assist.share = share
    assert assist.share == 0.0 and not assist.active


def centre_of_mass_velocity(model: mujoco.MjModel, qpos: torch.Tensor, qvel: torch.Tensor) -> np.ndarray:
    """Per env, the whole robot's centre-of-mass velocity, from MuJoCo's own subtree velocities."""
    data = mujoco.MjData(model)
    out = []
    for q, v in zip(qpos.double().numpy(), qvel.double().numpy()):
        data.qpos[:], data.qvel[:] = q, v
        mujoco.mj_forward(model, data)
        mujoco.mj_subtreeVel(model, data)
        out.append(data.subtree_linvel[1].copy())
        assert data.ncon == 0  # still in the air: gravity and the lift are the only forces from outside
    return np.array(out)


def centre_of_mass_acceleration(share: float, *, seed: int = 3, lifted_before: bool = False) -> np.ndarray:
    """Per env, the centre of mass's mean acceleration over the first control step of a drop, lifted by
    ``share`` (after a step lifted at 0.6 and a new reset when ``lifted_before``)."""
    env = MicroDuckEnv(tasks=[MicroDuckEnv.getup_task()], num_envs=4, seed=seed, action_mode="robot", action_scale=1)
    if lifted_before:
        td = env.reset()
        env.lift_assist = 0.6
        env.step(td.set("action", torch.zeros(4, 14)))
        env.rng.manual_seed(seed)
    td = env.reset()
    env.lift_assist = share
    before = centre_of_mass_velocity(env.physics.model, env.physics.qpos, env.physics.qvel)
    env.step(td.set("action", torch.zeros(4, 14)))
    after = centre_of_mass_velocity(env.physics.model, env.physics.qpos, env.physics.qvel)
    return (after - before) / env.control_dt


def test_a_dropped_robot_falls_slower_by_the_lifted_share_of_g():
    """In the air, the lift adds ``share * g`` of upward acceleration to the centre of mass, whatever the joints
    do: a hand-derived figure, read through MuJoCo's subtree velocities. (The servos' rotor inertia,
    ``dof_armature``, is not a body's mass, so a robot that moves its joints in the air falls at g only
    within 1 %; paired drops, the same but for the lift, cancel it.)"""
    env = MicroDuckEnv(tasks=[MicroDuckEnv.getup_task()], num_envs=1, seed=0)
    gravity = float(np.linalg.norm(env.physics.model.opt.gravity))
    assert env._lift.weight == pytest.approx(ROBOT_MASS * gravity, rel=1e-7)
    free, lifted = centre_of_mass_acceleration(0.0), centre_of_mass_acceleration(0.6)
    np.testing.assert_allclose(free[:, 2], -gravity, rtol=1e-2)
    np.testing.assert_allclose((lifted - free)[:, 2], 0.6 * gravity, rtol=1e-2)
    np.testing.assert_allclose((lifted - free)[:, :2], 0.0, atol=2e-2)


def test_setting_the_lift_back_to_zero_clears_the_force():
    np.testing.assert_allclose(
        centre_of_mass_acceleration(0.0, lifted_before=True), centre_of_mass_acceleration(0.0), atol=1e-9
    )


def test_a_backend_that_cannot_push_on_bodies_refuses_the_lift():
    env = MicroDuckEnv(backend="mujoco-torch", frictionloss="ignore", num_envs=1, seed=0)
    with pytest.raises(ValueError, match=r"lift_assist needs a backend that applies forces.*use backend='mujoco'"):
        env.lift_assist = 0.5
    assert env.lift_assist == 0.0
    env.lift_assist = 0.0  # no force asked: nothing to refuse
