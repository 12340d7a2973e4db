"""Every task of ``waddle.algorithms.presets.TASKS`` builds and steps.

The CLI and the benchmarks reach MicroDuck through these names only, so a
preset that cannot build, or whose env draws tasks outside its own library,
would first show up in a training run. Each one is stepped a few times on the
native backend with random actions.
"""

from __future__ import annotations

import pytest
import torch

from waddle.algorithms.presets import TASKS, make_env

NUM_ENVS, STEPS = 4, 3


@pytest.mark.parametrize("task", sorted(TASKS))
def test_preset_builds_and_steps_finite_within_its_library(task):
    library = TASKS[task]()
    env = make_env(task, num_envs=NUM_ENVS, seed=0)
    try:
        assert list(env.tasks.name) == [t.name for t in library]
        torch.manual_seed(0)  # the random actions of rollout() without a policy
        rollout = env.rollout(STEPS, break_when_any_done=False)
    finally:
        env.close()
    out = rollout["next"]
    assert out["observation"].shape == (NUM_ENVS, STEPS, 56)
    assert out["reward"].shape == (NUM_ENVS, STEPS, 1)
    assert torch.isfinite(out["observation"]).all() and torch.isfinite(out["reward"]).all()

    # Each env runs a task of the preset's library, and its command lies in
    # that task's command box.
    task_id = out["task_id"].reshape(-1)
    assert ((task_id >= 0) & (task_id < len(library))).all()
    for command, i in zip(out["command"].reshape(-1, 2), task_id.tolist()):
        low, high = library[i].command_low, library[i].command_high
        assert ((command >= low - 1e-6) & (command <= high + 1e-6)).all(), (task, library[i].name, command)
