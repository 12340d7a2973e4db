"""PushSchedule on its own: timers and kicks worked out by hand."""

from __future__ import annotations

import dataclasses

import torch

from waddle.envs.microduck import MicroDuckRandomization
from waddle.envs.microduck.pushes import PushSchedule


def schedule(interval=(1.0, 1.0), velocity=(0.5, 0.5), num_envs=3) -> PushSchedule:
    config = dataclasses.replace(
        MicroDuckRandomization.preset("upstream"), push_interval=interval, push_velocity=velocity
    )
    return PushSchedule(num_envs, config, control_dt=0.25, dtype=torch.float64, device="cpu")


def test_a_push_comes_when_the_interval_has_passed_and_only_to_the_envs_due():
    pushes, generator = schedule(), torch.Generator().manual_seed(0)
    pushes.begin(torch.tensor([True, True, False]), generator)  # env 2 keeps its timer at 0: due at once
    first = pushes.tick(generator)
    assert first is not None
    due, kick = first
    assert due.tolist() == [False, False, True]
    assert kick.tolist() == [[0.0, 0.0], [0.0, 0.0], [0.5, 0.5]]
    assert pushes.tick(generator) is None and pushes.tick(generator) is None  # 0.5 s, 0.75 s
    due, kick = pushes.tick(generator)  # 1 s: envs 0 and 1; env 2's second interval ends at 1.25 s
    assert due.tolist() == [True, True, False] and kick[:2].eq(0.5).all() and kick[2].eq(0).all()
    assert pushes.timer.tolist() == [1.0, 1.0, 0.25]


def test_kicks_and_intervals_are_drawn_from_their_ranges():
    pushes, generator = schedule(interval=(0.25, 2.0), velocity=(-1.0, 1.0), num_envs=4000), torch.Generator()
    pushes.begin(torch.ones(4000, dtype=torch.bool), generator.manual_seed(1))
    assert 0.25 <= float(pushes.timer.min()) and float(pushes.timer.max()) <= 2.0
    started = pushes.timer.clone()
    pushes.tick(generator)
    due, kick = pushes.tick(generator)  # 0.5 s: the envs whose first interval was at most 0.5 s (about 14 %)
    assert due.tolist() == (started <= 0.5).tolist()
    assert due.any() and not due.all()
    assert kick[due].abs().max() <= 1.0 and kick[due].min() < -0.9 and kick[due].max() > 0.9
    assert (pushes.timer[due] >= 0.25).all()
