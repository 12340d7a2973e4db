"""Checkpoints: round trip, every way a file can be unusable, resume compatibility, atomicity."""

from __future__ import annotations

import pickle

import pytest
import torch

from waddle import files as files_module
from waddle.algorithms import checkpoint as checkpoint_module
from waddle.algorithms.checkpoint import (
    FORMAT,
    CheckpointError,
    atomic_write,
    check_compatible,
    config_differences,
    load_checkpoint,
    save_checkpoint,
)

CONFIG = {
    "run": {"task": "standing", "algo": "ppo", "num_envs": 8, "total_steps": 1000},
    "algorithm": {"actor_hidden_sizes": [64, 64], "learning_rate": 1e-3},
}


def write(path, **overrides):
    kwargs = dict(
        algo="ppo",
        config=CONFIG,
        trainer_state={"policy": {"weight": torch.arange(6.0).reshape(2, 3)}, "iteration": 3},
        env_steps=1234,
        iteration=3,
        wall_time_s=5.5,
    )
    kwargs.update(overrides)
    save_checkpoint(path, **kwargs)


def one_line(err: pytest.ExceptionInfo) -> str:
    message = str(err.value)
    assert "\n" not in message, message
    return message


def test_round_trip(tmp_path):
    path = tmp_path / "checkpoint.pt"
    write(path)
    payload = load_checkpoint(path)
    assert payload["format"] == FORMAT
    assert payload["algo"] == "ppo"
    assert payload["config"] == CONFIG
    assert payload["env_steps"] == 1234 and payload["iteration"] == 3
    assert payload["wall_time_s"] == 5.5
    assert torch.equal(payload["trainer"]["policy"]["weight"], torch.arange(6.0).reshape(2, 3))
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]  # no temporary file left


def test_missing(tmp_path):
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path / "nope.pt")
    assert "does not exist" in one_line(err)


def test_directory(tmp_path):
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path)
    assert "is a directory" in one_line(err)


@pytest.mark.parametrize("keep", [0, 10, 0.5, -20])
def test_truncated(tmp_path, keep):
    path = tmp_path / "checkpoint.pt"
    write(path)
    data = path.read_bytes()
    cut = int(len(data) * keep) if isinstance(keep, float) else (keep if keep >= 0 else len(data) + keep)
    path.write_bytes(data[:cut])
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert "cannot be read" in one_line(err)


def test_foreign_torch_file(tmp_path):
    path = tmp_path / "model.pt"
    torch.save({"state_dict": {"weight": torch.zeros(2)}}, path)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert "not a waddle checkpoint" in one_line(err)


def test_foreign_text_file(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert "cannot be read" in one_line(err)


class _Payload:
    def __reduce__(self):  # would run code if unpickled without weights_only
        return (print, ("pwned",))


def test_foreign_pickle_is_not_executed(tmp_path, capsys):
    path = tmp_path / "evil.pt"
    torch.save({"format": FORMAT, "x": _Payload()}, path, pickle_module=pickle)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    one_line(err)
    assert "pwned" not in capsys.readouterr().out


def test_other_version(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"format": FORMAT, "version": 99}, path)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert "version 99" in one_line(err)


def test_missing_fields(tmp_path):
    path = tmp_path / "checkpoint.pt"
    torch.save({"format": FORMAT, "version": checkpoint_module.VERSION, "algo": "ppo"}, path)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    assert "lacks config, env_steps, iteration, trainer" in one_line(err)


# ---------------------------------------------------------------------------
# Resume compatibility
# ---------------------------------------------------------------------------


def test_compatible_configs_pass():
    same = {"run": dict(CONFIG["run"]), "algorithm": {"actor_hidden_sizes": (64, 64), "learning_rate": 1e-3}}
    check_compatible(CONFIG, same)  # a tuple equals the list JSON gave back


def test_other_task_names_the_field():
    other = {"run": {**CONFIG["run"], "task": "walk"}, "algorithm": CONFIG["algorithm"]}
    with pytest.raises(CheckpointError) as err:
        check_compatible(CONFIG, other)
    message = one_line(err)
    assert "run.task differs" in message and "'standing'" in message and "'walk'" in message


def test_other_network_shape_names_the_field():
    other = {"run": CONFIG["run"], "algorithm": {**CONFIG["algorithm"], "actor_hidden_sizes": [128, 128]}}
    with pytest.raises(CheckpointError) as err:
        check_compatible(CONFIG, other)
    assert "algorithm.actor_hidden_sizes differs" in one_line(err)


def test_ignored_fields_may_change():
    longer = {"run": {**CONFIG["run"], "total_steps": 5000}, "algorithm": CONFIG["algorithm"]}
    check_compatible(CONFIG, longer, ignore=["run.total_steps"])
    assert config_differences(CONFIG, longer) == [("run.total_steps", 1000, 5000)]


def test_added_field_is_a_difference():
    other = {"run": {**CONFIG["run"], "extra": 1}, "algorithm": CONFIG["algorithm"]}
    assert config_differences(CONFIG, other) == [("run.extra", "<absent>", 1)]


# ---------------------------------------------------------------------------
# Atomicity
# ---------------------------------------------------------------------------


def test_crash_mid_write_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    write(path, env_steps=100)
    before = path.read_bytes()

    def crashing_save(obj, file, *args, **kwargs):
        file.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt  # Ctrl-C in the middle of the write

    monkeypatch.setattr(checkpoint_module.torch, "save", crashing_save)
    with pytest.raises(KeyboardInterrupt):
        write(path, env_steps=200)
    assert path.read_bytes() == before
    assert load_checkpoint(path)["env_steps"] == 100
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def test_crash_before_rename_keeps_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "curve.png"
    path.write_bytes(b"old")

    def failing_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(files_module.os, "replace", failing_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write(path, lambda file: file.write(b"new"))
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["curve.png"]


def test_atomic_write_replaces(tmp_path):
    path = tmp_path / "sub" / "config.json"
    atomic_write(path, lambda file: file.write("{}\n"), mode="w")
    atomic_write(path, lambda file: file.write('{"a": 1}\n'), mode="w")
    assert path.read_text() == '{"a": 1}\n'
