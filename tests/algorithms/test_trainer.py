"""Every trainer is a :class:`Trainer`: counts its steps and exports its normalised, clamped mean action."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.diff_point_env import DiffPointEnv
from waddle.algorithms.apg import APG, APGConfig
from waddle.algorithms.ppo import PPO, PPOConfig
from waddle.algorithms.shac import SHAC, SHACConfig
from waddle.algorithms.trainer import Trainer


def point_env():
    return DiffPointEnv(4, action_bound=1.0, max_steps=5)


def test_ppo_policy_is_its_clamped_mean():
    trainer = PPO(point_env(), PPOConfig(num_steps=3, actor_hidden_sizes=(8,), critic_hidden_sizes=(8,)))
    trainer.train_iteration()
    observation = torch.randn(6, 2)
    with torch.no_grad():
        expected = trainer.policy(observation)[0].clamp(-1, 1)
    assert torch.equal(trainer.deterministic_policy()(observation), expected)


@pytest.mark.parametrize("stochastic", [False, True])
def test_apg_policy_is_its_normalised_mean(stochastic):
    trainer = APG(point_env(), APGConfig(horizon=3, actor_hidden_sizes=(8,), stochastic_policy=stochastic))
    trainer.train_iteration()
    assert int(trainer.normalizer.count) > 0  # the statistics are really in play
    observation = torch.randn(6, 2)
    net = trainer.actor[0].module.net if stochastic else trainer.actor.module
    with torch.no_grad():
        expected = net(trainer.normalizer(observation)).clamp(-1, 1)
    assert torch.allclose(trainer.deterministic_policy()(observation), expected)


@pytest.mark.parametrize("stochastic", [False, True])
def test_shac_policy_is_its_normalised_mean(stochastic):
    config = SHACConfig(
        horizon=3, actor_hidden_sizes=(8,), critic_hidden_sizes=(8,), num_epochs=1, stochastic_policy=stochastic
    )
    trainer = SHAC(point_env(), config)
    trainer.train_iteration()
    observation = torch.randn(6, 2)
    net = trainer.actor[0].module.net if stochastic else trainer.actor.module
    with torch.no_grad():
        expected = net(trainer.normalizer(observation)).clamp(-1, 1)
    assert torch.allclose(trainer.deterministic_policy()(observation), expected)


@pytest.mark.parametrize(
    ("make", "steps"),
    [
        (lambda env: PPO(env, PPOConfig(num_steps=3, actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))), 3 * 4),
        (lambda env: APG(env, APGConfig(horizon=5, actor_hidden_sizes=(8,))), 5 * 4),
        (lambda env: SHAC(env, SHACConfig(horizon=2, actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))), 2 * 4),
    ],
    ids=["ppo", "apg", "shac"],
)
def test_every_trainer_is_a_trainer_counting_its_env_steps(make, steps):
    env = point_env()
    trainer = make(env)
    assert isinstance(trainer, Trainer)
    assert trainer.steps_per_iteration == steps  # steps per env x 4 envs
    rollout_steps = []
    original_step = env.step

    def counting_step(td):
        rollout_steps.append(td.batch_size.numel())
        return original_step(td)

    env.step = counting_step
    trainer.train_iteration()
    assert sum(rollout_steps) == trainer.steps_per_iteration
