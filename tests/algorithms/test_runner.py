"""The runner: outputs, resume (metrics appended, rows past the checkpoint dropped), NaN and Ctrl-C stops."""

from __future__ import annotations

import json
import math

import torch

from tests.helpers.diff_point_env import DiffPointEnv
from waddle.algorithms.checkpoint import load_checkpoint
from waddle.algorithms.ppo import PPO, PPOConfig
from waddle.algorithms.runner import (
    Runner,
    largest_reward_terms,
    non_finite_losses,
    plot_curve,
    read_metrics,
    state_is_finite,
)

CONFIG = PPOConfig(num_steps=4, num_epochs=1, num_minibatches=2, actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))
STEPS = 4 * 8  # num_steps x num_envs


def make_runner(out, *, total_iterations, checkpoint_every=2, trainer=None):
    trainer = trainer or PPO(DiffPointEnv(8, action_bound=1.0, max_steps=6), CONFIG)
    return Runner(
        trainer,
        out,
        algo="ppo",
        config={"run": {"task": "point"}, "algorithm": {"num_steps": 4}},
        total_steps=total_iterations * STEPS,
        checkpoint_every=checkpoint_every,
        plot_every_s=3600.0,  # the final redraw is enough
        progress=False,
    )


class Interrupting:
    """Wraps a trainer; its ``stop_at``-th iteration raises what ``error`` makes."""

    def __init__(self, trainer, stop_at, error=KeyboardInterrupt):
        self.trainer, self.stop_at, self.error, self.calls = trainer, stop_at, error, 0
        self.steps_per_iteration = trainer.steps_per_iteration

    def train_iteration(self):
        self.calls += 1
        if self.calls == self.stop_at:
            raise self.error()
        return self.trainer.train_iteration()

    def state_dict(self):
        return self.trainer.state_dict()

    def load_state_dict(self, state):
        self.trainer.load_state_dict(state)


def test_run_writes_every_output(tmp_path):
    result = make_runner(tmp_path, total_iterations=3).run()
    assert result.status == "finished"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "config.json", "curve.png", "metrics.csv"]
    header, rows = read_metrics(tmp_path / "metrics.csv")
    assert header[:4] == ["iteration", "env_steps", "wall_time_s", "steps_per_second"]
    assert "charts/episode_return" in header and "losses/value_loss" in header
    assert [row["iteration"] for row in rows] == [1, 2, 3]
    assert [row["env_steps"] for row in rows] == [STEPS, 2 * STEPS, 3 * STEPS]
    checkpoint = load_checkpoint(tmp_path / "checkpoint.pt")
    assert checkpoint["iteration"] == 3 and checkpoint["env_steps"] == 3 * STEPS
    assert json.loads((tmp_path / "config.json").read_text())["algo"] == "ppo"
    assert (tmp_path / "curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_resume_appends_metrics(tmp_path):
    make_runner(tmp_path, total_iterations=2).run()
    runner = make_runner(tmp_path, total_iterations=4)
    runner.restore(load_checkpoint(tmp_path / "checkpoint.pt"))
    assert runner.trainer.iteration == 2
    assert runner.run().status == "finished"
    _, rows = read_metrics(tmp_path / "metrics.csv")
    assert [row["iteration"] for row in rows] == [1, 2, 3, 4]
    assert [row["env_steps"] for row in rows] == [STEPS * i for i in (1, 2, 3, 4)]
    assert rows[2]["wall_time_s"] >= rows[1]["wall_time_s"]
    assert load_checkpoint(tmp_path / "checkpoint.pt")["env_steps"] == 4 * STEPS


def test_ctrl_c_keeps_the_last_checkpoint_and_resume_drops_later_rows(tmp_path):
    trainer = Interrupting(PPO(DiffPointEnv(8, action_bound=1.0, max_steps=6), CONFIG), stop_at=4)
    result = make_runner(tmp_path, total_iterations=10, trainer=trainer).run()
    assert result.status == "interrupted"
    assert "step 64" in result.message and "is kept" in result.message
    # Checkpoint at iteration 2; iterations 1-3 were logged.
    assert load_checkpoint(tmp_path / "checkpoint.pt")["iteration"] == 2
    assert len(read_metrics(tmp_path / "metrics.csv")[1]) == 3

    runner = make_runner(tmp_path, total_iterations=4)
    runner.restore(load_checkpoint(tmp_path / "checkpoint.pt"))
    assert [row["iteration"] for row in read_metrics(tmp_path / "metrics.csv")[1]] == [1, 2]
    runner.run()
    assert [row["iteration"] for row in read_metrics(tmp_path / "metrics.csv")[1]] == [1, 2, 3, 4]


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    env = DiffPointEnv(8, action_bound=1.0, max_steps=6)
    runner = make_runner(tmp_path, total_iterations=10, trainer=PPO(env, CONFIG))
    original = runner.trainer.train_iteration

    def poisoned_after_two():
        if runner.iteration == 2:
            env.poison_reward = True
        return original()

    runner.trainer.train_iteration = poisoned_after_two
    result = runner.run()
    assert result.status == "non-finite"
    assert "PPO loss is nan at iteration 3" in result.message and "is kept" in result.message
    checkpoint = load_checkpoint(tmp_path / "checkpoint.pt")
    assert checkpoint["iteration"] == 2 and state_is_finite(checkpoint["trainer"])


def test_nan_in_reported_losses_stops_without_saving(tmp_path):
    class NaNTrainer:
        saved = False
        steps_per_iteration = STEPS

        def train_iteration(self):
            return {"losses/actor_loss": math.nan, "charts/reward_mean": 0.0}

        def state_dict(self):
            NaNTrainer.saved = True
            return {}

        def load_state_dict(self, state):
            pass

    result = make_runner(tmp_path, total_iterations=3, checkpoint_every=1, trainer=NaNTrainer()).run()
    assert result.status == "non-finite" and "losses/actor_loss=nan" in result.message
    assert "no checkpoint was written yet" in result.message
    assert not NaNTrainer.saved and not (tmp_path / "checkpoint.pt").exists()


def test_pure_helpers():
    assert non_finite_losses({"losses/a": 1.0, "losses/b": math.inf, "charts/c": math.nan}) == ["losses/b"]
    assert state_is_finite({"a": torch.ones(2), "b": [torch.zeros(1), 3], "c": torch.arange(3)})
    assert not state_is_finite({"a": {"b": torch.tensor([0.0, math.nan])}})


def test_largest_reward_terms_rank_by_mean_absolute_value():
    rows = [
        {"reward/upright": 1.0, "reward/pose": -3.0, "reward/jump": 0.0, "reward/drift": math.nan, "charts/x": 9.0},
        {"reward/upright": 2.0, "reward/pose": -1.0, "reward/jump": 0.0, "reward/drift": -0.5, "charts/x": 9.0},
    ]
    # mean |.|: pose 2.0, upright 1.5, drift 0.5 (NaN skipped), jump 0 (left out)
    assert largest_reward_terms(rows) == ["reward/pose", "reward/upright", "reward/drift"]
    assert largest_reward_terms(rows, count=1) == ["reward/pose"]


def png_size(path):
    """(width, height) from a PNG's IHDR chunk."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_curve_gains_a_reward_term_panel(tmp_path):
    rows = [
        {
            "env_steps": 32.0 * i,
            "charts/episode_return": float(i),
            "charts/episode_length": 10.0,
            "reward/upright": 0.1 * i,
            "reward/pose": -0.05,
        }
        for i in range(1, 4)
    ]
    plot_curve(rows, tmp_path / "with.png")
    plot_curve(
        [{key: value for key, value in row.items() if not key.startswith("reward/")} for row in rows],
        tmp_path / "without.png",
    )
    assert png_size(tmp_path / "without.png") == (700, 600)  # 7 x 3 inches per panel at 100 dpi
    assert png_size(tmp_path / "with.png") == (700, 900)
