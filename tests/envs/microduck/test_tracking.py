"""TrackingWindow on its own: a trunk moved by hand along a known path, its velocity and yaw rate by hand."""

from __future__ import annotations

import math

import pytest
import torch

from waddle.envs.microduck.tracking import TrackingWindow

DT = 0.02


def state(xy, heading, body_velocity=(9.0, 9.0), yaw_rate=7.0):
    n = len(heading)
    qpos = torch.zeros(n, 7, dtype=torch.float64)
    qpos[:, :2] = torch.tensor(xy, dtype=torch.float64)
    qvel = torch.zeros(n, 6, dtype=torch.float64)
    qvel[:, 5] = yaw_rate
    return {
        "qpos": qpos,
        "qvel": qvel,
        "heading": torch.tensor(heading, dtype=torch.float64),
        "body_velocity": torch.tensor([body_velocity] * n, dtype=torch.float64),
    }


def test_a_stride_is_tracked_in_the_heading_frame_and_turns_unwrap_past_pi():
    """Env 0 walks 0.1 m/s along world +y facing +y while it turns 0.05 rad a step through +-pi; env 1 has no
    window and reads the instantaneous values."""
    window = TrackingWindow(2, 5, control_dt=DT, dtype=torch.float64, device="cpu")
    rows = torch.tensor([True, True])
    start_heading = math.pi - 0.12
    window.reset(rows, state([[0.0, 0.0]] * 2, [start_heading] * 2)["qpos"], torch.tensor([start_heading] * 2))
    steps = torch.tensor([5, 0])
    for k in range(1, 9):
        heading = math.remainder(start_heading + 0.05 * k, 2 * math.pi)
        y = 0.1 * DT * k
        window.advance(state([[0.0, y], [0.0, y]], [heading, heading]), steps, torch.tensor([k, k]))
        # Over min(5, k) steps the world displacement is 0.1 m/s along +y; in the frame of a trunk facing
        # `heading`, forward is sin(heading) * 0.1 and leftward cos(heading) * 0.1.
        expected = torch.tensor([math.sin(heading) * 0.1, math.cos(heading) * 0.1], dtype=torch.float64)
        torch.testing.assert_close(window.velocity[0], expected)
        assert float(window.yaw_rate[0]) == pytest.approx(0.05 / DT)  # no 2 pi jump where the heading wraps
        assert window.velocity[1].tolist() == [9.0, 9.0] and float(window.yaw_rate[1]) == 7.0


def test_a_reset_starts_the_window_where_the_robot_stands():
    window = TrackingWindow(2, 3, control_dt=DT, dtype=torch.float64, device="cpu")
    both = torch.tensor([True, True])
    window.reset(both, state([[0.0, 0.0], [0.0, 0.0]], [0.0, 0.0])["qpos"], torch.zeros(2))
    for k in range(1, 4):
        window.advance(state([[0.01 * k, 0.0]] * 2, [0.0, 0.0]), torch.tensor([3, 3]), torch.tensor([k, k]))
    # Env 1 starts over 1 m away; its first step back (0.002 m) is measured from there, not from env 0's past.
    window.reset(torch.tensor([False, True]), state([[0.0, 0.0], [1.0, 0.0]], [0.0, 0.0])["qpos"], torch.zeros(2))
    assert window.velocity[1].tolist() == [0.0, 0.0] and float(window.yaw_rate[1]) == 0.0
    window.advance(state([[0.04, 0.0], [1.002, 0.0]], [0.0, 0.0]), torch.tensor([3, 3]), torch.tensor([4, 1]))
    torch.testing.assert_close(window.velocity[:, 0], torch.tensor([0.03 / (3 * DT), 0.002 / DT], dtype=torch.float64))


def test_without_a_window_no_ring_is_kept():
    window = TrackingWindow(3, None, control_dt=DT, dtype=torch.float64, device="cpu")
    assert not window.keeps_ring
    window.advance(state([[0.0, 0.0]] * 3, [0.0] * 3, yaw_rate=0.25), torch.zeros(3, dtype=torch.long), torch.ones(3))
    assert window.yaw_rate.tolist() == [0.25] * 3
