"""The heading memory: a leaky integral carried in one action entry, and the distribution that does not draw it."""

from __future__ import annotations

import math

import pytest
import torch

from waddle.modules.heading_memory import HeadingMemory
from waddle.modules.networks import GaussianPolicy, PinnedNormal, PolicyMean
from waddle.modules.normalizer import RunningNormalizer

LAYOUT = {"channel": 1, "previous_action_start": 3, "gyro_index": 0, "yaw_command_index": 2}


def observation(gyro: float, command: float, previous: float) -> torch.Tensor:
    """``[gyro, unused, command, action 0, action 1 (the memory), action 2]``."""
    return torch.tensor([[gyro, 9.0, command, 9.0, previous, 9.0]], dtype=torch.float64)


def test_fed_its_own_output_the_memory_is_the_closed_form_leaky_integral():
    dt, scale, tau = 0.02, 0.7, 2.0
    memory = HeadingMemory(**LAYOUT, control_dt=dt, action_scale=scale, time_constant_s=tau, limit=10.0)
    rate, command = 0.3, 0.1  # turning 0.2 rad/s more than asked
    value = 0.0
    for _ in range(50):
        value = float(memory(observation(rate, command, value)))
    decay = math.exp(-dt / tau)
    # m_n = -(dt / scale) * r * (1 - d^n) / (1 - d): a geometric sum, written out by hand.
    expected = -(dt / scale) * (rate - command) * (1 - decay**50) / (1 - decay)
    assert value == pytest.approx(expected, rel=1e-9)


def test_without_forgetting_the_memory_is_the_heading_error_over_the_action_scale_up_to_its_limit():
    memory = HeadingMemory(**LAYOUT, control_dt=0.02, action_scale=0.5, time_constant_s=math.inf, limit=1.0)
    value = 0.0
    for _ in range(10):  # 0.2 s at 1 rad/s unasked: 0.2 rad, 0.4 in action units
        value = float(memory(observation(1.0, 0.0, value)))
    assert value == pytest.approx(-0.4, abs=1e-12)
    for _ in range(100):
        value = float(memory(observation(1.0, 0.0, value)))
    assert value == -1.0  # held at the limit, not beyond


def test_insert_replaces_only_the_memory_entry():
    memory = HeadingMemory(**LAYOUT, control_dt=0.02, action_scale=1.0, time_constant_s=math.inf)
    action = torch.tensor([[0.1, 0.2, 0.3]], dtype=torch.float64)
    out = memory.insert(action, observation(1.0, 0.0, 0.5))
    assert out.tolist() == [[0.1, pytest.approx(0.48), 0.3]]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("control_dt", 0.0, "control_dt must be a finite number > 0"),
        ("action_scale", -1.0, "action_scale must be a finite number > 0"),
        ("time_constant_s", 0.0, "time_constant_s must be > 0"),
    ],
)
def test_bad_settings_are_refused_by_name(field, value, message):
    settings = {"control_dt": 0.02, "action_scale": 0.7, "time_constant_s": 10.0, field: value}
    with pytest.raises(ValueError, match=message):
        HeadingMemory(**LAYOUT, **settings)


def test_the_pinned_distribution_never_draws_the_memory_and_leaves_it_out_of_log_prob_and_entropy():
    torch.manual_seed(0)
    loc, scale = torch.randn(256, 3), torch.rand(256, 3) + 0.1
    pinned = torch.tensor([False, True, False])
    dist = PinnedNormal(loc, scale, pinned=pinned)
    samples = dist.sample()
    assert torch.equal(samples[:, 1], loc[:, 1])
    assert (samples[:, [0, 2]] != loc[:, [0, 2]]).all()
    free = torch.distributions.Normal(loc[:, [0, 2]], scale[:, [0, 2]])
    action = torch.randn(256, 3)
    torch.testing.assert_close(dist.log_prob(action), free.log_prob(action[:, [0, 2]]).sum(-1))
    torch.testing.assert_close(dist.entropy(), free.entropy().sum(-1))


def test_a_policy_with_a_memory_computes_that_entry_in_training_and_in_its_deterministic_mean():
    torch.manual_seed(0)
    memory = HeadingMemory(**LAYOUT, control_dt=0.02, action_scale=0.7, time_constant_s=5.0)
    policy = GaussianPolicy(RunningNormalizer(6), 3, (16,), memory=memory)
    with torch.no_grad():
        policy.net[-1].bias.fill_(0.3)  # the MLP's own answer for the entry is 0.3; the memory's is not
    rows = torch.randn(8, 6)
    loc, scale = policy(rows)
    expected = memory(rows)
    torch.testing.assert_close(loc[:, 1], expected)
    assert (scale[:, 1] == 1).all()  # a placeholder the distribution never reads
    torch.testing.assert_close(PolicyMean(policy, -10, 10)(rows)[:, 1], expected)
    assert policy.pinned.tolist() == [False, True, False]
