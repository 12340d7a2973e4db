"""Asymmetric PPO: the actor reads what the robot senses, the critic the full state and the drawn
randomization; the default (full observation, no randomization) keeps today's networks."""

from __future__ import annotations

import pytest
import torch

from waddle.algorithms.ppo import PPO, ActorObservationError, PPOConfig
from waddle.envs.microduck import MicroDuckEnv

TINY = dict(num_steps=4, num_epochs=1, num_minibatches=2, actor_hidden_sizes=(16,), critic_hidden_sizes=(16,))
RANDOMIZATION_NAMES = [
    "friction",
    "mass",
    "trunk_com",
    "head_com",
    "armature",
    "frictionloss",
    "damping",
    "voltage",
    "joint_offset",
    "imu_tilt",
    "action_delay",
    "imu_delay",
]
# Widths of the drawn values: friction 1, mass 15 (the robot's links), trunk and head CoM 3 each,
# armature, friction loss and damping 14 each, voltage 1, joint offsets 14, IMU tilt 2, two delays 1 each.
RANDOMIZATION_WIDTH = 1 + 15 + 3 + 3 + 14 + 14 + 14 + 1 + 14 + 2 + 1 + 1


def walk_env(randomization: str = "none", num_envs: int = 4) -> MicroDuckEnv:
    return MicroDuckEnv(tasks=[MicroDuckEnv.tracking_task(0.2)], num_envs=num_envs, seed=0, randomization=randomization)


@pytest.fixture(scope="module")
def upstream_env():
    env = walk_env("upstream")
    yield env
    env.close()


def test_sensors_actor_and_privileged_critic_read_their_entries(upstream_env):
    trainer = PPO(upstream_env, PPOConfig(actor_observation="sensors", **TINY))
    assert trainer.actor.in_keys == ["sensor_observation"]
    assert trainer.critic.in_keys == ["observation", *[("randomization", name) for name in RANDOMIZATION_NAMES]]
    assert trainer.policy.net[0].in_features == 53
    assert trainer.value.net[0].in_features == 56 + RANDOMIZATION_WIDTH
    # Two inputs of different layout: two normalisers.
    assert trainer.value.normalizer is not trainer.policy.normalizer
    assert trainer.deterministic_policy().observation_key == "sensor_observation"


def test_full_actor_on_a_randomized_env_still_gives_the_critic_the_drawn_values(upstream_env):
    trainer = PPO(upstream_env, PPOConfig(**TINY))
    assert trainer.actor.in_keys == ["observation"]
    assert trainer.value.net[0].in_features == 56 + RANDOMIZATION_WIDTH
    assert trainer.policy.net[0].in_features == 56


def test_the_critic_value_follows_the_randomization_values(upstream_env):
    trainer = PPO(upstream_env, PPOConfig(actor_observation="sensors", **TINY))
    td = upstream_env.reset()
    with torch.no_grad():
        trainer.value.normalizer.var.fill_(1.0)  # identity statistics: the raw values reach the network
        before = trainer.critic(td.clone())["state_value"]
        heavier = td.clone()
        heavier["randomization", "friction"] = heavier["randomization", "friction"] + 5.0
        after = trainer.critic(heavier)["state_value"]
    assert not torch.allclose(before, after)


def test_each_normaliser_learns_the_statistics_of_its_own_input(upstream_env):
    trainer = PPO(upstream_env, PPOConfig(actor_observation="sensors", **TINY))
    batches = []
    collect = trainer.collect

    def keep():
        batch = collect()
        batches.append(batch)
        return batch

    trainer.collect = keep
    trainer.train_iteration()
    (batch,) = batches
    sensors = batch["sensor_observation"].reshape(-1, 53)
    torch.testing.assert_close(trainer.normalizer.mean, sensors.mean(0), rtol=1e-5, atol=1e-5)
    critic_input = torch.cat(
        [batch["observation"].reshape(-1, 56)]
        + [batch["randomization", name].reshape(sensors.shape[0], -1) for name in RANDOMIZATION_NAMES],
        dim=-1,
    )
    torch.testing.assert_close(trainer.value.normalizer.mean, critic_input.mean(0), rtol=1e-5, atol=1e-5)
    state = trainer.state_dict()
    torch.testing.assert_close(state["critic_normalizer"]["mean"], critic_input.mean(0), rtol=1e-5, atol=1e-5)


def test_the_default_keeps_one_shared_normaliser_and_the_old_state_layout():
    env = walk_env()
    trainer = PPO(env, PPOConfig(**TINY))
    env.close()
    assert trainer.critic_normalizer is None and trainer.value.normalizer is trainer.policy.normalizer
    assert trainer.critic.in_keys == ["observation"]
    assert "critic_normalizer" not in trainer.state_dict()


def test_a_state_trained_on_sensors_is_refused_by_a_full_trainer_and_back(upstream_env):
    sensors = PPO(upstream_env, PPOConfig(actor_observation="sensors", **TINY)).state_dict()
    full = PPO(upstream_env, PPOConfig(**TINY))
    with pytest.raises(ActorObservationError) as info:
        full.load_state_dict(sensors)
    message = str(info.value)
    assert "'sensors'" in message and "'full'" in message and "53 values" in message and "linear velocity" in message
    with pytest.raises(ActorObservationError, match="trained on actor_observation 'full'"):
        PPO(upstream_env, PPOConfig(actor_observation="sensors", **TINY)).load_state_dict(full.state_dict())


def test_bad_actor_observation_names_the_choices():
    with pytest.raises(ValueError, match=r"actor_observation must be one of \('full', 'sensors', 'robot'\), got 'imu'"):
        PPOConfig(actor_observation="imu")


def test_an_env_without_sensor_observation_is_refused_by_name():
    from tests.helpers.diff_point_env import DiffPointEnv

    with pytest.raises(ValueError, match="reads 'sensor_observation', which this env does not report"):
        PPO(DiffPointEnv(2, action_bound=1.0), PPOConfig(actor_observation="sensors", **TINY))
