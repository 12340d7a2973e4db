"""PPO with a heading memory on the robot's observation: the head's roll entry carries the heading error."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from waddle.algorithms.ppo import PPO, PPOConfig
from waddle.envs.microduck import MicroDuckEnv
from waddle.envs.microduck.constants import JOINT_NAMES
from waddle.envs.microduck.robot import ROBOT_FIELDS
from waddle.envs.microduck.symmetry import MIRRORS

TINY = dict(actor_hidden_sizes=(16,), critic_hidden_sizes=(16,), num_steps=8)
CARRIER = JOINT_NAMES.index("head_roll")
GYRO_Z = ROBOT_FIELDS["base_ang_vel"].start + 2
PREVIOUS_CARRIER = ROBOT_FIELDS["actions"].start + CARRIER
YAW_COMMAND = ROBOT_FIELDS["command"].start + 2


def robot_env(num_envs: int = 8, **options) -> MicroDuckEnv:
    return MicroDuckEnv(
        tasks=[MicroDuckEnv.joystick_task()],
        num_envs=num_envs,
        seed=0,
        action_mode="robot",
        action_scale=0.7,
        **options,
    )


def test_the_memory_of_a_standing_robot_told_to_turn_is_its_heading_error():
    """Fed back through the env, the entry integrates the gyro: times the action scale it is minus the
    heading error the env measures from the trunk's orientation (an independent reading of the same turn)."""
    env = robot_env(4)
    trainer = PPO(env, PPOConfig(actor_observation="robot", heading_memory_s=math.inf, **TINY))
    memory = trainer.policy.memory
    td = env.reset(TensorDict(command=torch.zeros(4, 2), yaw_rate_command=torch.full((4, 1), 0.5), batch_size=[4]))
    for _ in range(25):  # 0.5 s: the robot stands in HOME and does not turn; the command turns at 0.5 rad/s
        observation = td["robot_observation"]
        action = memory.insert(torch.zeros(4, 14), observation)
        td = env.step(td.set("action", action))["next"]
        torch.testing.assert_close(td["robot_observation"][:, PREVIOUS_CARRIER], action[:, CARRIER])
    estimate = memory(td["robot_observation"]) * 0.7
    error = td["heading_error"].squeeze(-1)
    assert error.abs().min() > 0.2  # about 0.25 rad behind the command
    torch.testing.assert_close(estimate, -error, atol=0.015, rtol=0)
    env.close()


def test_the_memory_never_sets_a_head_roll_target_past_the_joints_range():
    """However far the robot turns unasked, the carrier's servo target stays inside the head roll's range
    as the simulated model declares it: the servo is never driven against its stop."""
    env = robot_env(2)
    joint = env.model.joint("head_roll")
    reach = min(-float(joint.range[0]), float(joint.range[1]))
    trainer = PPO(env, PPOConfig(actor_observation="robot", heading_memory_s=math.inf, **TINY))
    observation = torch.zeros(2, 61)
    observation[:, GYRO_Z] = torch.tensor([5.0, -5.0])  # a fast turn the command did not ask for
    for _ in range(200):
        value = trainer.policy.memory(observation)
        observation[:, PREVIOUS_CARRIER] = value
    targets = value * env.action_scale
    assert reach - 1e-3 <= float(targets.abs().min()) <= reach  # saturated, at the range and not past it
    env.close()


def test_rollouts_carry_the_memory_unsampled_and_the_update_leaves_its_entry_alone():
    torch.manual_seed(0)
    env = robot_env(8)
    trainer = PPO(env, PPOConfig(actor_observation="robot", heading_memory_s=10.0, init_log_std=-0.5, **TINY))
    before = trainer.policy.log_std.detach().clone()
    batch = trainer.collect()
    observation, action = batch["robot_observation"], batch["action"]
    torch.testing.assert_close(action[..., CARRIER], trainer.policy.memory(observation), atol=1e-6, rtol=0)
    torch.testing.assert_close(batch["next", "robot_observation"][..., PREVIOUS_CARRIER], action[..., CARRIER])
    free = [i for i in range(14) if i != CARRIER]
    normal = torch.distributions.Normal(batch["loc"][..., free], batch["scale"][..., free])
    torch.testing.assert_close(batch["action_log_prob"], normal.log_prob(action[..., free]).sum(-1))
    stats = trainer.update(batch)
    assert math.isfinite(stats["losses/policy_loss"])
    after = trainer.policy.log_std.detach()
    assert after[CARRIER] == before[CARRIER]  # nothing to explore there, so no gradient
    assert (after[free] != before[free]).any()
    env.close()


def test_the_symmetric_policy_with_a_memory_stays_equivariant():
    torch.manual_seed(0)
    env = robot_env(6)
    trainer = PPO(env, PPOConfig(actor_observation="robot", mirror_loss_coef=0.3, heading_memory_s=10.0, **TINY))
    td = env.reset()
    for _ in range(3):
        td = env.step(td.set("action", torch.rand(6, 14) * 0.6 - 0.3))["next"]
    observation = td["robot_observation"]
    env.close()
    policy = trainer.deterministic_policy()
    observe, act = MIRRORS["robot_observation"], MIRRORS["action"]
    with torch.no_grad():
        direct, reflected = policy(observation), policy(observe(observation))
    torch.testing.assert_close(reflected, act(direct), atol=1e-6, rtol=0)
    torch.testing.assert_close(direct[:, CARRIER], trainer.policy.memory(observation))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"heading_memory_s": -1.0}, "PPOConfig.heading_memory_s must be a number >= 0"),
        ({"heading_memory_s": True}, "PPOConfig.heading_memory_s must be a number >= 0"),
    ],
)
def test_a_bad_memory_time_constant_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        PPOConfig(**fields)


def test_a_memory_for_an_observation_without_one_is_refused_naming_the_choice():
    env = robot_env(2)
    with pytest.raises(ValueError, match=r"names one for \['robot_observation'\].*actor_observation='robot'"):
        PPO(env, PPOConfig(heading_memory_s=10.0, **TINY))
    env.close()
