"""GaitClock on its own: the clock and the prior worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from waddle.envs.microduck import constants
from waddle.envs.microduck.gait import PHASE_OFFSET, GaitClock

ROW = {
    "gait_frequency_hz": torch.tensor([1.5, 1.5]),
    "gait_frequency_per_mps": torch.tensor([0.5, 0.5]),
    "gait_prior_lift": torch.tensor([0.3, 0.3]),
    "gait_prior_stride_per_mps": torch.tensor([0.8, 0.8]),
}


def test_the_clock_turns_at_the_tasks_frequency_for_the_commanded_speed():
    clock = GaitClock(2, control_dt=0.02, dtype=torch.float64, device="cpu")
    clock.adopt(ROW, torch.tensor([[0.3, 0.4], [0.0, 0.0]]))  # speeds 0.5 and 0 m/s
    assert clock.frequency.tolist() == pytest.approx([1.75, 1.5])
    phase, ramp = clock.read(torch.tensor([10, 30]))
    assert phase.tolist() == pytest.approx(
        [PHASE_OFFSET + 2 * math.pi * 1.75 * 0.2, PHASE_OFFSET + 2 * math.pi * 1.5 * 0.6]
    )
    assert ramp.tolist() == pytest.approx([0.5, 1.0])  # 0.2 s of a 0.4 s ramp; past it


def test_the_prior_lifts_the_clocks_swing_leg_and_strides_with_the_command():
    clock = GaitClock(2, control_dt=0.02, dtype=torch.float64, device="cpu")
    command = torch.tensor([[0.2, 0.0], [-0.2, 0.0]])
    clock.adopt(ROW, command)
    steps = torch.tensor([40, 40])  # ramp 1
    phase, _ = clock.read(steps)
    offsets = clock.prior(ROW, command, steps, 0.5)
    left = torch.tensor(constants.SWING_LIFT_LEFT, dtype=torch.float64)
    right = torch.tensor(constants.SWING_LIFT_RIGHT, dtype=torch.float64)
    stride = torch.tensor(constants.STRIDE, dtype=torch.float64)
    for env, direction in ((0, 1.0), (1, -1.0)):
        swing = direction * math.sin(float(phase[env]))
        lift = 0.3 * 0.5
        expected = max(swing, 0.0) * lift * left + max(-swing, 0.0) * lift * right
        expected = expected + 0.8 * float(command[env, 0]) * math.cos(float(phase[env])) * 0.5 * stride
        torch.testing.assert_close(offsets[env], expected)
    assert clock.prior(ROW, command, torch.zeros(2, dtype=torch.long), 1.0).abs().max() == 0  # ramp 0 at the start
