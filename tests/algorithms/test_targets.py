"""The shared return/target maths against values worked by hand (gamma = 0.5)."""

import math

import pytest
import torch

from waddle.algorithms.targets import (
    discounts,
    horizon_returns,
    segment_ends,
    td_lambda_targets,
)

T, F = True, False


def test_discounts_are_powers_of_gamma():
    expected = torch.tensor([[1.0], [0.5], [0.25]])
    torch.testing.assert_close(discounts(3, 0.5, torch.zeros(())), expected)


# Two envs over three steps. Env 0 runs through the window; env 1 is done after
# step 0, and its later rewards (one of them NaN) belong to the next episode.
REWARDS = torch.tensor([[1.0, 2.0], [2.0, math.nan], [4.0, 8.0]])
ALIVE = torch.tensor([[T, T], [T, F], [T, F]])
NEXT_VALUES = torch.tensor([[10.0, 20.0], [30.0, 40.0], [50.0, 60.0]])


def test_segment_ends_mark_first_done_or_window_end():
    assert segment_ends(ALIVE).tolist() == [[F, T], [F, F], [T, F]]


def test_horizon_returns_without_bootstrap():
    # env 0: 1 + 0.5 * 2 + 0.25 * 4 = 3;  env 1: 2 (the NaN after its done is ignored)
    torch.testing.assert_close(horizon_returns(REWARDS, ALIVE, 0.5), torch.tensor([3.0, 2.0]))


def test_horizon_returns_bootstrap_truncations_but_not_terminations():
    # env 0 reaches the window end: 3 + 0.5^3 * V(s_3) = 3 + 0.125 * 50 = 9.25
    # env 1 truncated at step 0: 2 + 0.5 * V(s_1) = 2 + 0.5 * 20 = 12
    truncated_only = torch.zeros(3, 2, dtype=torch.bool)
    out = horizon_returns(REWARDS, ALIVE, 0.5, next_values=NEXT_VALUES, terminated=truncated_only)
    torch.testing.assert_close(out, torch.tensor([9.25, 12.0]))
    # env 1 terminated at step 0 instead: no value after a terminal state
    terminated = torch.tensor([[F, T], [F, F], [F, F]])
    out = horizon_returns(REWARDS, ALIVE, 0.5, next_values=NEXT_VALUES, terminated=terminated)
    torch.testing.assert_close(out, torch.tensor([9.25, 2.0]))


def test_horizon_returns_keep_the_graph():
    rewards = REWARDS.nan_to_num().clone().requires_grad_(True)
    horizon_returns(rewards, ALIVE, 0.5).sum().backward()
    torch.testing.assert_close(rewards.grad, torch.tensor([[1.0, 1.0], [0.5, 0.0], [0.25, 0.0]]))


def test_horizon_returns_need_terminated_with_values():
    with pytest.raises(ValueError, match="terminated"):
        horizon_returns(REWARDS, ALIVE, 0.5, next_values=NEXT_VALUES)


# One env, three steps, rewards [1, 2, 3], next-state values [10, 20, 30].
R = torch.tensor([[1.0], [2.0], [3.0]])
V = torch.tensor([[10.0], [20.0], [30.0]])
NONE = torch.zeros(3, 1, dtype=torch.bool)
MIDDLE = torch.tensor([[F], [T], [F]])


@pytest.mark.parametrize(
    ("lam", "expected"),
    [
        # lam = 0: r_t + 0.5 V_{t+1}
        (0.0, [6.0, 12.0, 18.0]),
        # lam = 1: G2 = 3 + 0.5 * 30 = 18, G1 = 2 + 0.5 * 18 = 11, G0 = 1 + 0.5 * 11 = 6.5
        (1.0, [6.5, 11.0, 18.0]),
        # lam = 0.5: G2 = 18, G1 = 2 + 0.5 (0.5 * 20 + 0.5 * 18) = 11.5,
        #            G0 = 1 + 0.5 (0.5 * 10 + 0.5 * 11.5) = 6.375
        (0.5, [6.375, 11.5, 18.0]),
    ],
)
def test_td_lambda_targets_without_dones(lam, expected):
    out = td_lambda_targets(R, V, NONE, NONE, 0.5, lam)
    torch.testing.assert_close(out, torch.tensor(expected)[:, None])


def test_td_lambda_targets_stop_at_a_termination():
    # G1 = 2 (terminal), G0 = 1 + 0.5 (0.5 * 10 + 0.5 * 2) = 4; G2 starts a new episode: 18
    out = td_lambda_targets(R, V, MIDDLE, MIDDLE, 0.5, 0.5)
    torch.testing.assert_close(out, torch.tensor([[4.0], [2.0], [18.0]]))


def test_td_lambda_targets_bootstrap_a_truncation():
    # G1 = 2 + 0.5 * V(s_2) = 12, G0 = 1 + 0.5 (0.5 * 10 + 0.5 * 12) = 6.5
    out = td_lambda_targets(R, V, NONE, MIDDLE, 0.5, 0.5)
    torch.testing.assert_close(out, torch.tensor([[6.5], [12.0], [18.0]]))


def test_td_one_target_at_window_start_equals_bootstrapped_horizon_return():
    torch.manual_seed(0)
    rewards, values = torch.randn(5, 4), torch.randn(5, 4)
    dones = torch.rand(5, 4) < 0.3
    terminated = dones & (torch.rand(5, 4) < 0.5)
    alive = (torch.cumsum(dones.long(), 0) - dones.long()) == 0
    targets = td_lambda_targets(rewards, values, terminated, dones, 0.9, 1.0)
    returns = horizon_returns(rewards, alive, 0.9, next_values=values, terminated=terminated)
    torch.testing.assert_close(targets[0], returns)


def test_td_lambda_rejects_lambda_outside_unit_interval():
    with pytest.raises(ValueError, match="lam"):
        td_lambda_targets(R, V, NONE, NONE, 0.5, 1.5)
