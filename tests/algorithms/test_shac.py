"""SHAC: the losses by hand, the update plumbing, and learning on the point mass."""

import math

import pytest
import torch
from helpers.diff_point_env import DiffPointEnv
from torch import nn

from waddle.algorithms.shac import SHAC, SHACConfig, actor_loss, critic_loss, polyak_update
from waddle.collectors import DifferentiableCollector

T, F = True, False


SMALL = dict(actor_hidden_sizes=(16,), critic_hidden_sizes=(16,), num_epochs=2, num_minibatches=2)


def test_actor_loss_adds_the_bootstrapped_value_where_each_env_stops():
    rewards = torch.tensor([[1.0, 2.0], [2.0, math.nan], [4.0, 8.0]])
    alive = torch.tensor([[T, T], [T, F], [T, F]])
    next_values = torch.tensor([[10.0, 20.0], [30.0, 40.0], [50.0, 60.0]])
    truncated_only = torch.zeros(3, 2, dtype=torch.bool)
    # env 0: 1 + 0.5 * 2 + 0.25 * 4 + 0.125 * 50 = 9.25
    # env 1 (truncated at step 0): 2 + 0.5 * 20 = 12;   loss = -(9.25 + 12) / (3 * 2)
    loss = actor_loss(rewards, alive, next_values, truncated_only, 0.5)
    torch.testing.assert_close(loss, torch.tensor(-21.25 / 6.0))
    terminated = torch.tensor([[F, T], [F, F], [F, F]])  # env 1 terminated instead: no value
    loss = actor_loss(rewards, alive, next_values, terminated, 0.5)
    torch.testing.assert_close(loss, torch.tensor(-11.25 / 6.0))


def test_critic_loss_is_the_mean_squared_error():
    # ((1 - 0)^2 + (2 - 4)^2) / 2 = 2.5
    torch.testing.assert_close(critic_loss(torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0])), torch.tensor(2.5))


def test_polyak_update_keeps_alpha_of_the_target():
    target, source = nn.Linear(2, 1), nn.Linear(2, 1)
    nn.init.zeros_(target.weight), nn.init.zeros_(target.bias)
    nn.init.ones_(source.weight), nn.init.ones_(source.bias)
    polyak_update(target, source, 0.2)
    torch.testing.assert_close(target.weight, torch.full((1, 2), 0.8))
    torch.testing.assert_close(target.bias, torch.full((1,), 0.8))


def test_one_iteration_updates_target_critic_normalizer_and_cuts_the_graph():
    torch.manual_seed(0)
    env = DiffPointEnv(4)
    trainer = SHAC(env, SHACConfig(horizon=5, target_critic_alpha=0.2, **SMALL))
    target_before = [p.detach().clone() for p in trainer.target_critic.parameters()]
    metrics = trainer.train_iteration()
    for old, new, critic in zip(target_before, trainer.target_critic.parameters(), trainer.critic.parameters()):
        torch.testing.assert_close(new, 0.2 * old + 0.8 * critic)
    assert not any(p.requires_grad for p in trainer.target_critic.parameters())
    assert trainer.normalizer.count.item() == 5 * 4
    assert env.pos.grad_fn is None  # the collector called the env's graph cut
    assert metrics["charts/actor_update_skipped"] == 0.0
    assert metrics["charts/critic_updates_skipped"] == 0.0
    assert math.isfinite(metrics["losses/critic_loss"])


def test_non_finite_rewards_skip_both_updates_and_say_so():
    torch.manual_seed(0)
    env = DiffPointEnv(4)
    trainer = SHAC(env, SHACConfig(horizon=4, **SMALL))
    actor_before = [p.detach().clone() for p in trainer.actor.parameters()]
    critic_before = [p.detach().clone() for p in trainer.critic.parameters()]
    env.poison_reward = True
    metrics = trainer.train_iteration()
    assert metrics["charts/actor_update_skipped"] == 1.0
    assert metrics["charts/critic_updates_skipped"] == 2 * 2  # every minibatch step
    assert all(torch.equal(p, q) for p, q in zip(trainer.actor.parameters(), actor_before))
    assert all(torch.equal(p, q) for p, q in zip(trainer.critic.parameters(), critic_before))


def test_state_dict_round_trip():
    torch.manual_seed(0)
    config = SHACConfig(horizon=3, **SMALL)
    trainer = SHAC(DiffPointEnv(4), config)
    trainer.train_iteration()
    state = trainer.state_dict()
    assert set(state) == {
        "task_library",
        "actor",
        "critic",
        "target_critic",
        "actor_optimizer",
        "critic_optimizer",
        "normalizer",
        "iteration",
    }
    restored = SHAC(DiffPointEnv(4), config)
    restored.load_state_dict(state)
    for name in ("actor", "critic", "target_critic", "normalizer"):
        for key, value in getattr(trainer, name).state_dict().items():
            torch.testing.assert_close(getattr(restored, name).state_dict()[key], value)
    assert restored.iteration == 1


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="gae_lambda"):
        SHACConfig(gae_lambda=1.5)
    with pytest.raises(ValueError, match="target_critic_alpha"):
        SHACConfig(target_critic_alpha=1.0)
    with pytest.raises(ValueError, match="num_minibatches"):
        SHACConfig(num_minibatches=0)
    with pytest.raises(ValueError, match="horizon"):
        SHACConfig(horizon=0)


def test_config_rejects_a_bad_learning_rate_schedule():
    with pytest.raises(ValueError, match="lr_schedule must be one of linear, constant; got 'cosine'"):
        SHACConfig(lr_schedule="cosine")
    for steps in (0, -5, 2.5, True):
        with pytest.raises(ValueError, match="lr_decay_steps must be an integer >= 1"):
            SHACConfig(lr_decay_steps=steps)


def _learning_rates(trainer: SHAC) -> tuple[float, float]:
    return trainer.actor_optimizer.param_groups[0]["lr"], trainer.critic_optimizer.param_groups[0]["lr"]


def test_linear_schedule_takes_both_learning_rates_to_zero_over_the_decay_steps():
    torch.manual_seed(0)
    env = DiffPointEnv(4, max_steps=100)  # 4 envs x 2 steps = 8 env steps a window
    config = SHACConfig(horizon=2, learning_rate=1e-2, critic_learning_rate=4e-3, lr_decay_steps=24, **SMALL)
    trainer = SHAC(env, config)
    seen = []
    for _ in range(4):
        metrics = trainer.train_iteration()
        seen.append((*_learning_rates(trainer), metrics["charts/learning_rate"]))
    # windows start at 0, 8, 16 and 24 env steps of 24: 1, 2/3, 1/3 and 0 of the starting rates
    for (actor_lr, critic_lr, logged), fraction in zip(seen, (1.0, 2 / 3, 1 / 3, 0.0), strict=True):
        assert actor_lr == pytest.approx(1e-2 * fraction) and logged == pytest.approx(1e-2 * fraction)
        assert critic_lr == pytest.approx(4e-3 * fraction)
    before = [p.detach().clone() for p in [*trainer.actor.parameters(), *trainer.critic.parameters()]]
    trainer.train_iteration()  # past the schedule: nothing moves
    after = [*trainer.actor.parameters(), *trainer.critic.parameters()]
    assert all(torch.equal(b, a) for b, a in zip(before, after, strict=True))


def test_constant_schedule_keeps_the_learning_rates_and_a_restored_trainer_resumes_the_schedule():
    torch.manual_seed(0)
    constant = SHAC(DiffPointEnv(4, max_steps=100), SHACConfig(horizon=2, lr_schedule="constant", **SMALL))
    for _ in range(3):
        constant.train_iteration()
    assert _learning_rates(constant) == (2e-3, 2e-3)

    config = SHACConfig(horizon=2, lr_decay_steps=32, **SMALL)
    trainer = SHAC(DiffPointEnv(4, max_steps=100), config)
    for _ in range(2):
        trainer.train_iteration()
    restored = SHAC(DiffPointEnv(4, max_steps=100), config)
    restored.load_state_dict(trainer.state_dict())
    restored.train_iteration()  # its third window starts at 16 of 32 env steps
    assert _learning_rates(restored) == pytest.approx((1e-3, 1e-3))


def _evaluate(trainer: SHAC) -> float:
    """Mean 40-step return of the deterministic policy from fixed start states."""
    env = DiffPointEnv(64, max_steps=40, bound=3.0, action_bound=1.0, init_scale=1.0, seed=123)
    collector = DifferentiableCollector(
        env, trainer.actor, "cpu", observation_normalizer=trainer.normalizer, clip_actions_to_space=True
    )
    with torch.no_grad():
        rollout = collector.collect(40, deterministic=True)
    return float((rollout.rewards * rollout.alive_mask).sum(0).mean())


def test_shac_improves_the_return_on_the_point_mass():
    torch.manual_seed(0)
    env = DiffPointEnv(16, max_steps=40, bound=3.0, action_bound=1.0, init_scale=1.0)
    config = SHACConfig(
        horizon=16,
        gamma=0.95,
        learning_rate=1e-2,
        critic_learning_rate=5e-3,
        actor_hidden_sizes=(32, 32),
        critic_hidden_sizes=(32, 32),
        num_epochs=4,
        num_minibatches=2,
        normalize_observations=False,
    )
    trainer = SHAC(env, config)
    before = _evaluate(trainer)
    for _ in range(8):
        trainer.train_iteration()
    after = _evaluate(trainer)
    assert after > before + 5.0, (before, after)
