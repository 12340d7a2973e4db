"""APG: the loss by hand, and training to the known optimal gain of a linear system."""

import math

import numpy as np
import pytest
import torch
from helpers.diff_point_env import DiffPointEnv, LinearSystemEnv

from waddle.algorithms.apg import APG, APGConfig, apg_loss

T, F = True, False


def test_apg_loss_is_minus_the_alive_discounted_return_per_env_step():
    rewards = torch.tensor([[1.0, 2.0], [2.0, math.nan], [4.0, 8.0]])
    alive = torch.tensor([[T, T], [T, F], [T, F]])
    # returns: env 0: 1 + 0.5 * 2 + 0.25 * 4 = 3, env 1: 2; over T * N = 6
    torch.testing.assert_close(apg_loss(rewards, alive, 0.5), torch.tensor(-5.0 / 6.0))


def optimal_static_gain(a, b, rho, horizon, gamma):
    """Best K for u = -K x maximising sum_t gamma^t r_t with r_t = -(x_{t+1}^2 + rho u_t^2).

    With m = a - b K, x_t = m^t x_0 and r_t = -x_0^2 m^(2t) (m^2 + rho K^2), so the
    objective is x_0^2 times a polynomial in K; we minimise it on a fine grid.
    """
    k = np.linspace(-5.0, 5.0, 1_000_001)
    m = a - b * k
    cost = sum(gamma**t * m ** (2 * t) * (m**2 + rho * k**2) for t in range(horizon))
    return k[np.argmin(cost)]


def test_apg_learns_the_optimal_linear_gain():
    a, b, rho, horizon, gamma = 1.1, 0.5, 0.1, 3, 0.9
    k_star = optimal_static_gain(a, b, rho, horizon, gamma)
    assert 1.6 < k_star < 1.8  # a non-trivial answer: neither 0 nor the one-step a b / (b^2 + rho)

    torch.manual_seed(0)
    env = LinearSystemEnv(64, a=a, b=b, rho=rho, max_steps=horizon)  # fresh x_0 every window
    config = APGConfig(
        horizon=horizon,
        gamma=gamma,
        learning_rate=0.1,
        adam_betas=(0.9, 0.999),
        max_grad_norm=0.0,
        actor_hidden_sizes=(),  # u = w x + c
        normalize_observations=False,
    )
    trainer = APG(env, config)
    for _ in range(120):
        metrics = trainer.train_iteration()
    layer = trainer.actor.module[0]
    assert -layer.weight.item() == pytest.approx(k_star, abs=0.02)
    assert abs(layer.bias.item()) < 0.02
    assert metrics["charts/actor_update_skipped"] == 0.0
    assert trainer.iteration == 120


def test_non_finite_loss_skips_the_update_and_says_so():
    torch.manual_seed(0)
    env = DiffPointEnv(4)
    trainer = APG(env, APGConfig(horizon=4, actor_hidden_sizes=(8,)))
    before = [p.detach().clone() for p in trainer.actor.parameters()]
    env.poison_reward = True
    metrics = trainer.train_iteration()
    assert metrics["charts/actor_update_skipped"] == 1.0
    assert math.isnan(metrics["losses/actor_loss"])
    assert all(torch.equal(p, q) for p, q in zip(trainer.actor.parameters(), before))
    env.poison_reward = False
    assert trainer.train_iteration()["charts/actor_update_skipped"] == 0.0


def test_stochastic_apg_with_adjoint_clipping_reports_its_statistics():
    torch.manual_seed(0)
    config = APGConfig(horizon=3, actor_hidden_sizes=(8,), stochastic_policy=True, action_adjoint_max_norm=1e-3)
    metrics = APG(DiffPointEnv(4, action_bound=1.0), config).train_iteration()
    assert metrics["action_adjoint/num_samples"] == 12.0
    assert 0.0 <= metrics["action_adjoint/clipped_fraction"] <= 1.0


def test_state_dict_round_trip():
    torch.manual_seed(0)
    config = APGConfig(horizon=3, actor_hidden_sizes=(8,))
    trainer = APG(DiffPointEnv(4), config)
    trainer.train_iteration()
    trainer.train_iteration()
    state = trainer.state_dict()
    restored = APG(DiffPointEnv(4), config)
    restored.load_state_dict(state)
    for p, q in zip(trainer.actor.parameters(), restored.actor.parameters()):
        torch.testing.assert_close(p, q)
    torch.testing.assert_close(restored.normalizer.mean, trainer.normalizer.mean)
    assert restored.normalizer.count.item() == 24
    assert restored.optimizer.state_dict()["state"].keys() == state["optimizer"]["state"].keys()
    assert restored.iteration == 2


@pytest.mark.parametrize(
    ("field", "value"),
    [("horizon", 0), ("gamma", 0.0), ("max_grad_norm", -1.0), ("action_adjoint_max_norm", -1.0)],
)
def test_config_rejects_bad_values(field, value):
    with pytest.raises(ValueError, match=field):
        APGConfig(**{field: value})
