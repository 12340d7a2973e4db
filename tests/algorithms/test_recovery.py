"""RecoveryTracker: falls, get-ups, time to stand and time lying, counted on hand-made sequences."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from waddle.algorithms.recovery import RecoveryTracker

UP = (True, False)  # stands, down
KNEEL = (False, False)  # upright but low: neither down nor standing
DOWN = (False, True)


def run(sequences: list[list[tuple[bool, bool]]], lengths: list[int] | None = None, dt: float = 0.5):
    steps = len(sequences[0])
    tracker = RecoveryTracker(len(sequences), dt)
    for t in range(steps):
        standing = torch.tensor([s[t][0] for s in sequences])
        down = torch.tensor([s[t][1] for s in sequences])
        counted = torch.tensor([t < (lengths[i] if lengths else steps) for i in range(len(sequences))])
        tracker.observe(standing, down, counted)
    return tracker.summary()


def test_a_start_on_the_floor_is_a_fall_and_standing_ends_it():
    # Env 0 lies 3 moments, kneels 1, stands at moment 4: time to stand 4 * 0.5 s, lying 3 * 0.5 s.
    # Env 1 never falls; env 2 falls at moment 2 and stands at moment 5 (1.5 s), lying 2 moments.
    summary = run(
        [
            [DOWN, DOWN, DOWN, KNEEL, UP, UP],
            [UP] * 6,
            [UP, UP, DOWN, DOWN, KNEEL, UP],
        ]
    )
    assert summary.falls == 2 and summary.recovered_fraction == 1.0
    assert summary.time_to_stand_s == pytest.approx((2.0 + 1.5) / 2)
    assert summary.time_to_stand_p95_s == pytest.approx(1.5 + 0.95 * 0.5)
    assert summary.time_lying_s == pytest.approx((1.5 + 1.0) / 2)


def test_the_share_recovered_within_a_time():
    tracker = RecoveryTracker(3, 0.5)
    for state in ([DOWN, DOWN, UP], [DOWN, UP, UP], [UP, UP, DOWN], [UP, UP, DOWN]):
        standing, down = (torch.tensor(column) for column in zip(*state))
        tracker.observe(standing, down, torch.ones(3, dtype=torch.bool))
    # Falls: env 0 stood after 1.0 s, env 1 after 0.5 s, env 2 fell at moment 2 and stays down.
    assert tracker.share_recovered_within(0.5) == pytest.approx(1 / 3)
    assert tracker.share_recovered_within(1.0) == pytest.approx(2 / 3)
    assert math.isnan(RecoveryTracker(1, 0.5).share_recovered_within(1.0))


def test_a_fall_not_recovered_counts_against_and_a_second_fall_counts_again():
    # Env 0 falls, stands, falls again and stays down to the end: 2 falls, 1 recovered.
    # Env 1 kneels after its fall and never stands: its fall stays open.
    summary = run([[DOWN, UP, DOWN, DOWN], [UP, DOWN, KNEEL, KNEEL]])
    assert summary.falls == 3
    assert summary.recovered_fraction == pytest.approx(1 / 3)
    assert summary.time_to_stand_s == pytest.approx(0.5)
    # Lying: the recovered fall 0.5 s, env 0's open fall 1.0 s, env 1's 0.5 s.
    assert summary.time_lying_s == pytest.approx((0.5 + 1.0 + 0.5) / 3)


def test_an_ended_episode_stops_counting_and_no_fall_gives_nan():
    summary = run([[UP, DOWN, DOWN, UP]], lengths=[3])  # the episode ends before the robot stands
    assert summary.falls == 1 and summary.recovered_fraction == 0.0 and math.isnan(summary.time_to_stand_s)
    none = run([[UP, UP]])
    assert none.falls == 0 and math.isnan(none.recovered_fraction) and math.isnan(none.time_lying_s)


class StillThenTeleported(torch.nn.Module):
    """Holds HOME; before its ``lift_at``-th step (0-based) it sets every robot on its feet, as a get-up would."""

    observation_key = "robot_observation"

    def __init__(self, env, lift_at: int | None) -> None:
        super().__init__()
        self.env, self.lift_at, self.calls = env, lift_at, 0

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        if self.calls == self.lift_at:
            home = self.env._home_qpos.expand(self.env.num_envs, -1).clone()
            self.env.physics.reset(home, torch.zeros(self.env.num_envs, self.env.physics.nv))
        self.calls += 1
        return torch.zeros(observation.shape[0], 14)


def test_evaluate_reports_the_falls_and_get_ups_of_a_getup_task():
    from waddle.algorithms.evaluation import evaluate_tasks
    from waddle.envs.microduck import MicroDuckEnv

    env = MicroDuckEnv(tasks=[MicroDuckEnv.getup_task()], num_envs=4, seed=0, action_mode="robot", action_scale=0.7)
    (still,) = evaluate_tasks(env, StillThenTeleported(env, None), max_steps=30)
    assert still.recovery_task and still.survival == 1.0  # a fall does not end a getup episode
    assert still.falls == 4 and still.recovered_fraction == 0.0 and math.isnan(still.time_to_stand_s)
    assert still.time_lying_s == pytest.approx(31 * 0.02)  # the reset's moment and 30 steps, all down
    (lifted,) = evaluate_tasks(env, StillThenTeleported(env, 10), max_steps=30)
    # Down at the reset and after steps 1-10; the 11th step starts on its feet.
    assert lifted.falls == 4 and lifted.recovered_fraction == 1.0
    assert lifted.time_to_stand_s == pytest.approx(11 * 0.02) and lifted.time_lying_s == pytest.approx(11 * 0.02)
    env.close()


def test_the_eval_table_and_csv_show_recovery_only_for_tasks_that_go_on_after_a_fall():
    from waddle.algorithms.evaluation import EvaluationResult
    from waddle.cli.evaluate import RECOVERY_HEADER, csv_row, format_table

    figures = dict.fromkeys(
        (
            "mean_return",
            "mean_episode_length",
            "velocity_tracking_error",
            "mean_forward_speed",
            "mean_lateral_speed",
            "fall_rate",
            "yaw_drift_deg",
            "yaw_drift_p95_deg",
            "foot_clearance",
            "step_frequency_hz",
        ),
        0.0,
    )
    walk = EvaluationResult(episodes=4, command=(0.2, 0.0), task="walk", **figures)
    getup = EvaluationResult(
        episodes=4,
        command=(0.0, 0.0),
        task="getup",
        falls=5,
        recovered_fraction=0.8,
        time_to_stand_s=1.25,
        time_to_stand_p95_s=2.0,
        time_lying_s=0.75,
        recovery_task=True,
        **figures,
    )
    assert "falls" not in format_table([walk])
    header, _, walk_row, getup_row = format_table([walk, getup]).splitlines()
    assert header.endswith(RECOVERY_HEADER) and RECOVERY_HEADER.split() == [
        "falls",
        "got",
        "up",
        "to",
        "stand",
        "lying",
    ]
    assert walk_row.split()[-4:] == ["-", "-", "-", "-"]
    assert getup_row.split()[-4:] == ["5", "80.0", "1.25", "0.75"]
    none_up = dataclasses.replace(getup, recovered_fraction=0.0, time_to_stand_s=math.nan)
    assert format_table([none_up]).splitlines()[-1].split()[-4:] == ["5", "0.0", "-", "0.75"]
    assert csv_row(walk)["falls"] == "" and csv_row(walk)["recovered_fraction"] == ""
    row = csv_row(getup)
    assert (row["falls"], row["recovered_fraction"], row["time_to_stand_p95_s"], row["time_lying_s"]) == (
        5,
        0.8,
        2.0,
        0.75,
    )
