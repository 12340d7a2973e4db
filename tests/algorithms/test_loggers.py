"""``--logger``: the runner's rows reach TorchRL's loggers value for value; a missing package says what to install."""

from __future__ import annotations

import csv
import sys

import pytest

from tests.helpers.diff_point_env import DiffPointEnv
from waddle.algorithms.loggers import make_logger
from waddle.algorithms.ppo import PPO, PPOConfig
from waddle.algorithms.runner import Runner, read_metrics

CONFIG = PPOConfig(num_steps=4, num_epochs=1, num_minibatches=2, actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))


def run_three_iterations(out, logger):
    trainer = PPO(DiffPointEnv(8, action_bound=1.0, max_steps=6), CONFIG)
    runner = Runner(
        trainer,
        out,
        algo="ppo",
        config={"run": {"task": "point"}},
        total_steps=3 * 32,
        plot_every_s=3600.0,
        progress=False,
        logger=logger,
    )
    assert runner.run().status == "finished"
    if logger is not None:
        logger.close()
    return read_metrics(out / "metrics.csv")


def test_csv_logger_holds_the_metrics_rows_at_their_env_steps(tmp_path):
    header, rows = run_three_iterations(tmp_path, make_logger("csv", tmp_path))
    scalars = tmp_path / "csv" / "scalars"
    for name in ("charts/reward_mean", "losses/value_loss", "charts/learning_rate", "steps_per_second"):
        with open(scalars / f"{name}.csv", newline="") as file:
            logged = [(int(step), float(value)) for step, value in csv.reader(file)]
        assert logged == [(int(row["env_steps"]), row[name]) for row in rows], name
    assert [row["env_steps"] for row in rows] == [32, 64, 96]
    # one file per metrics.csv column but the step itself (and the iteration count)
    files = {str(path.relative_to(scalars))[: -len(".csv")] for path in scalars.rglob("*.csv")}
    assert files == set(header) - {"iteration", "env_steps"}


def test_tensorboard_logger_writes_the_same_values(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _, rows = run_three_iterations(tmp_path, make_logger("tensorboard", tmp_path))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    logged = [(event.step, event.value) for event in events.Scalars("charts/reward_mean")]
    assert [step for step, _ in logged] == [32, 64, 96]
    assert [value for _, value in logged] == pytest.approx([row["charts/reward_mean"] for row in rows], rel=1e-6)


def test_wandb_logger_runs_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    _, rows = run_three_iterations(tmp_path, make_logger("wandb", tmp_path, run_name="test"))
    assert len(rows) == 3
    assert any((tmp_path / "wandb").glob("offline-run-*"))


@pytest.mark.parametrize(
    ("name", "install"),
    [("tensorboard", "pip install tensorboard"), ("wandb", "pip install wandb")],
)
def test_a_missing_package_says_what_to_install(name, install, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, name, None)  # import now fails as if it were not installed
    with pytest.raises(ImportError, match=f"--logger {name} needs the {name} package") as err:
        make_logger(name, tmp_path)
    assert install in str(err.value)
    assert not any(tmp_path.iterdir())  # nothing written


def test_unknown_logger_names_the_choices(tmp_path):
    with pytest.raises(ValueError, match="logger must be one of none, csv, tensorboard, wandb; got 'mlflow'"):
        make_logger("mlflow", tmp_path)
    assert make_logger("none", tmp_path) is None
