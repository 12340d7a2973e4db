"""TwistCommands on its own: a redraw when a timer runs out, and nothing drawn for a library that holds commands."""

from __future__ import annotations

import math

import torch

from waddle.envs.microduck.commands import TwistCommands
from waddle.envs.microduck.tasks import joystick_task, tracking_task

FIELDS = (
    "command_low",
    "command_high",
    "yaw_rate_range",
    "standing_fraction",
    "turn_in_place_fraction",
    "sidestep_fraction",
)


def rows_of(task, n: int) -> dict[str, torch.Tensor]:
    """The per-env task fields the env hands over: one row per env."""
    stacked = torch.stack([task] * n)
    return {field: getattr(stacked, field) for field in (*FIELDS, "command_resample_s")}


def test_a_timer_that_runs_out_redraws_that_env_and_aims_it_at_its_heading():
    task = rows_of(joystick_task(command_resample_s=(0.05, 0.05)), 3)  # 2.5 steps of 0.02 s
    commands = TwistCommands(3, control_dt=0.02, varies=True, dtype=torch.float32, device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    rows = torch.tensor([True, True, False])
    command, yaw_rate = commands.draw(None, task, rows, generator)
    commands.begin(rows, command, yaw_rate, task, pinned=False, generator=generator)
    commands.aim(rows, torch.tensor([0.1, 0.2, 0.3]))
    torch.testing.assert_close(commands.timer[:2], torch.tensor([0.05, 0.05]))
    assert math.isinf(commands.timer[2])
    torch.testing.assert_close(commands.target_heading, torch.tensor([0.1, 0.2, 0.0]))
    for _ in range(2):
        commands.turn()
        assert not commands.redraw_due(task, torch.tensor([1.0, 1.0, 1.0]), generator)
    expected_heading = torch.tensor([0.1, 0.2, 0.0]) + 2 * 0.02 * commands.yaw_rate
    torch.testing.assert_close(commands.target_heading, expected_heading)
    before = commands.command.clone()
    assert commands.redraw_due(task, torch.tensor([1.0, 2.0, 3.0]), generator)  # the third step: 0.06 > 0.05
    torch.testing.assert_close(
        commands.target_heading[:2], torch.tensor([1.0, 2.0])
    )  # the redrawn envs turn from where they are
    assert not torch.equal(commands.command[:2], before[:2]) and torch.equal(commands.command[2], before[2])


def test_a_library_that_holds_its_commands_draws_only_the_box():
    task = rows_of(tracking_task(0.2), 2)
    commands = TwistCommands(2, control_dt=0.02, varies=False, dtype=torch.float32, device=torch.device("cpu"))
    generator = torch.Generator().manual_seed(0)
    command, yaw_rate = commands.draw(None, task, torch.ones(2, dtype=torch.bool), generator)
    torch.testing.assert_close(command, torch.tensor([[0.2, 0.0], [0.2, 0.0]]))
    assert yaw_rate.tolist() == [0.0, 0.0]
    state = generator.get_state()
    commands.begin(torch.ones(2, dtype=torch.bool), command, yaw_rate, task, pinned=False, generator=generator)
    commands.turn()
    assert not commands.redraw_due(task, torch.zeros(2), generator)
    assert torch.equal(generator.get_state(), state)  # no draw beyond the box
