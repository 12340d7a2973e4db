"""``waddle train --randomization --actor-observation``, then ``eval``, ``export`` with its sidecar and
``sim2sim`` on what it wrote (tiny runs on the real MicroDuckEnv)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from waddle.cli.main import main

OLD = Path(__file__).resolve().parents[1] / "data" / "old_checkpoints"
TINY = [
    "--num-envs",
    "16",
    "--num-steps",
    "16",
    "--num-epochs",
    "1",
    "--num-minibatches",
    "2",
    "--actor-hidden-sizes",
    "32",
    "32",
    "--critic-hidden-sizes",
    "32",
    "32",
    "--video-frames",
    "0",
    "--no-progress",
]


@pytest.fixture(autouse=True)
def _restore_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def sensors_run(tmp_path_factory):
    """512 PPO steps on walk, the actor on the sensors, under the upstream randomization."""
    out = tmp_path_factory.mktemp("sensors")
    argv = ["train", "--task", "walk", "--randomization", "upstream", "--actor-observation", "sensors"]
    assert main([*argv, "--total-steps", "512", "--out", str(out), *TINY]) == 0
    return out


@pytest.fixture(scope="module")
def exported(sensors_run, tmp_path_factory):
    folder = tmp_path_factory.mktemp("export")
    assert main(["export", str(sensors_run), "--onnx", str(folder / "walk.onnx"), "--samples", "16"]) == 0
    return folder


def test_the_run_records_its_randomization_and_actor_observation(sensors_run):
    config = json.loads((sensors_run / "config.json").read_text())
    assert config["run"]["randomization"] == "upstream"
    assert config["algorithm"]["actor_observation"] == "sensors"
    checkpoint = torch.load(sensors_run / "checkpoint.pt", weights_only=True)
    assert checkpoint["config"]["run"]["randomization"] == "upstream"
    assert checkpoint["trainer"]["policy"]["net.0.weight"].shape[1] == 53  # the sensor layout's width
    assert "critic_normalizer" in checkpoint["trainer"]


def test_eval_draws_the_checkpoints_randomization_unless_told(sensors_run, capsys):
    assert main(["eval", str(sensors_run), "--episodes", "2", "--max-steps", "20"]) == 0
    out = capsys.readouterr().out
    assert "policy reads sensor_observation; envs drawn with randomization 'upstream'" in out
    argv = ["eval", str(sensors_run), "--episodes", "2", "--max-steps", "20", "--randomization", "none"]
    assert main(argv) == 0
    assert "randomization 'none'" in capsys.readouterr().out


@pytest.mark.parametrize("command", ["eval", "export"])
def test_a_sensors_checkpoint_asked_to_read_the_full_observation_is_refused(sensors_run, tmp_path, command, capsys):
    argv = [command, str(sensors_run), "--actor-observation", "full"]
    argv += ["--onnx", str(tmp_path / "p.onnx")] if command == "export" else ["--episodes", "2"]
    assert main(argv) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"waddle {command}: error:")
    assert "trained on actor_observation 'sensors'" in lines[0] and "'full' was asked for" in lines[0]
    assert not (tmp_path / "p.onnx").exists()


def test_an_old_full_checkpoint_asked_to_read_the_sensors_is_refused(capsys):
    argv = ["eval", str(OLD / "ppo_standing.pt"), "--actor-observation", "sensors", "--episodes", "2"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "trained on actor_observation 'full'" in err and "'sensors' was asked for" in err


def test_export_writes_the_sensor_layout_and_its_sidecar(exported, capsys):
    import onnx

    model = onnx.load(str(exported / "walk.onnx"))
    dims = lambda value: [d.dim_value for d in value.type.tensor_type.shape.dim]  # noqa: E731
    assert dims(model.graph.input[0]) == [1, 53] and dims(model.graph.output[0]) == [1, 14]
    sidecar = json.loads((exported / "walk.json").read_text())
    assert sidecar["onnx"] == "walk.onnx" and sidecar["inputs"] == ["observation"]
    assert sidecar["observation"]["key"] == "sensor_observation" and sidecar["observation"]["size"] == 53
    assert sidecar["latency"]["joint_velocity_steps"] == 1  # the upstream preset: velocity one step late
    assert sidecar["training"]["randomization"] == "upstream"
    assert sidecar["training"]["actor_observation"] == "sensors"
    assert [task["name"] for task in sidecar["tasks"]] == ["tracking+0.20"]


def test_the_onnx_acts_as_the_torch_policy_on_real_sensor_observations(sensors_run, exported):
    import onnxruntime

    from waddle.algorithms.checkpoint import load_checkpoint
    from waddle.algorithms.evaluation import policy_from_checkpoint
    from waddle.algorithms.presets import make_env

    env = make_env("walk", num_envs=4, seed=5, randomization="upstream")
    policy = policy_from_checkpoint(load_checkpoint(sensors_run / "checkpoint.pt"), env)
    with torch.no_grad():
        rollout = env.rollout(15, policy=lambda td: td.set("action", policy(td["sensor_observation"])))
    env.close()
    observations = rollout["sensor_observation"].reshape(-1, 53)
    session = onnxruntime.InferenceSession(str(exported / "walk.onnx"), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        for row in observations[::5]:
            (action,) = session.run(None, {"observation": row.reshape(1, 53).numpy()})
            np.testing.assert_allclose(action, policy(row.reshape(1, 53)).numpy(), rtol=0, atol=1e-5)


def test_sim2sim_runs_the_exported_pair(exported, capsys):
    argv = ["sim2sim", str(exported / "walk.onnx"), "--episodes", "2", "--max-steps", "20"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "task tracking+0.20" in out and "2 episodes of at most 20 steps" in out and "survival" in out


def test_an_old_checkpoint_exports_a_full_layout_that_sim2sim_refuses(tmp_path, capsys):
    onnx_path = tmp_path / "old.onnx"
    assert main(["export", str(OLD / "ppo_standing.pt"), "--onnx", str(onnx_path), "--samples", "8"]) == 0
    sidecar = json.loads((tmp_path / "old.json").read_text())
    assert sidecar["observation"]["key"] == "observation" and sidecar["observation"]["size"] == 56
    assert sidecar["training"]["randomization"] == "none" and sidecar["latency"]["joint_velocity_steps"] == 0
    capsys.readouterr()
    assert main(["sim2sim", str(onnx_path), "--episodes", "1", "--max-steps", "2"]) == 1
    assert "body_velocity" in capsys.readouterr().err


def test_a_checkpoint_from_before_the_choices_resumes(sensors_run, tmp_path, capsys):
    out = tmp_path / "old-config"
    out.mkdir()
    source = OLD / "ppo_standing.pt"
    checkpoint = torch.load(source, weights_only=True)
    assert "randomization" not in checkpoint["config"]["run"]
    assert "actor_observation" not in checkpoint["config"]["algorithm"]
    (out / "checkpoint.pt").write_bytes(source.read_bytes())
    total = checkpoint["env_steps"] + 64
    argv = ["train", "--out", str(out), "--resume", "--total-steps", str(total), "--video-frames", "0"]
    assert main([*argv, "--no-progress"]) == 0, capsys.readouterr().err
    resumed = torch.load(out / "checkpoint.pt", weights_only=True)
    assert resumed["config"]["run"]["randomization"] == "none"
    assert resumed["config"]["algorithm"]["actor_observation"] == "full"


def test_init_from_a_sensors_run_keeps_its_actor_observation_and_refuses_another(sensors_run, tmp_path, capsys):
    argv = ["train", "--task", "walk", "--init-from", str(sensors_run), "--randomization", "upstream"]
    assert main([*argv, "--out", str(tmp_path / "a"), "--total-steps", "256", *TINY[:4], "--video-frames", "0"]) == 0
    assert json.loads((tmp_path / "a" / "config.json").read_text())["algorithm"]["actor_observation"] == "sensors"
    capsys.readouterr()
    argv += ["--actor-observation", "full", "--out", str(tmp_path / "b"), "--total-steps", "256"]
    assert main(argv) == 1
    assert "differs in actor_observation: the source has 'sensors', this run asks for 'full'" in capsys.readouterr().err
    argv = ["train", "--task", "walk", "--init-from", str(sensors_run), "--out", str(tmp_path / "c")]
    assert main([*argv, "--total-steps", "256", *TINY[:4], "--video-frames", "0"]) == 1
    assert "train with the source's --randomization" in capsys.readouterr().err


# ---------------------------------------------------------------------------
# A stack of sensor frames (--sensor-history)
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def history_run(tmp_path_factory):
    """512 PPO steps on walk, the actor on three frames of the sensors at 0.5 rad per unit of action, under
    the upstream randomization."""
    out = tmp_path_factory.mktemp("history")
    argv = ["train", "--task", "walk", "--randomization", "upstream", "--actor-observation", "sensors"]
    argv += ["--sensor-history", "3", "--action-scale", "0.5"]
    assert main([*argv, "--total-steps", "512", "--out", str(out), *TINY]) == 0
    return out


def test_a_history_run_trains_evaluates_exports_and_runs_in_sim2sim_on_three_frames(history_run, tmp_path, capsys):
    import onnx

    checkpoint = torch.load(history_run / "checkpoint.pt", weights_only=True)
    assert checkpoint["config"]["run"]["sensor_history"] == 3
    assert checkpoint["config"]["run"]["action_scale"] == 0.5
    assert checkpoint["trainer"]["policy"]["net.0.weight"].shape[1] == 3 * 53
    assert main(["eval", str(history_run), "--episodes", "2", "--max-steps", "20"]) == 0
    assert "policy reads sensor_observation" in capsys.readouterr().out
    onnx_path = tmp_path / "walk3.onnx"
    assert main(["export", str(history_run), "--onnx", str(onnx_path), "--samples", "16"]) == 0
    graph = onnx.load(str(onnx_path)).graph
    assert [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim] == [1, 159]
    sidecar = json.loads(onnx_path.with_suffix(".json").read_text())
    assert (sidecar["observation"]["size"], sidecar["observation"]["history"]) == (53, 3)
    assert sidecar["training"]["sensor_history"] == 3
    assert sidecar["action"]["scale"] == sidecar["training"]["action_scale"] == 0.5
    capsys.readouterr()
    assert main(["sim2sim", str(onnx_path), "--episodes", "2", "--max-steps", "20"]) == 0
    assert "2 episodes of at most 20 steps" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"action_scale": 0.5}, r"reads 3 frame\(s\) .* the env stacks 1: .*sensor_history=3"),
        ({"sensor_history": 3}, r"action_scale=0.5 rad per unit and the env's is 0.35: .*action_scale=0.5"),
    ],
    ids=["frames", "action-scale"],
)
def test_a_checkpoint_on_an_env_of_another_history_or_action_scale_is_refused(history_run, options, message):
    from waddle.algorithms.checkpoint import CheckpointError, load_checkpoint
    from waddle.algorithms.evaluation import policy_from_checkpoint, trained_env_options
    from waddle.algorithms.presets import make_env

    checkpoint = load_checkpoint(history_run / "checkpoint.pt")
    assert trained_env_options(checkpoint) == {"sensor_history": 3, "action_scale": 0.5, "action_mode": "residual"}
    env = make_env("walk", num_envs=2, seed=0, randomization="upstream", **options)
    with pytest.raises(CheckpointError, match=message):
        policy_from_checkpoint(checkpoint, env)
    env.close()


def test_a_history_for_an_actor_that_does_not_read_the_sensors_is_refused(tmp_path):
    from waddle.cli.main import build_parser
    from waddle.cli.train import resolve_config

    args = build_parser().parse_args(["train", "--out", str(tmp_path / "run"), "--sensor-history", "3"])
    with pytest.raises(ValueError, match="--sensor-history 3 .* add --actor-observation sensors"):
        resolve_config(args)


def test_a_run_started_from_a_history_checkpoint_keeps_its_frames(history_run, tmp_path):
    from waddle.cli.main import build_parser
    from waddle.cli.train import resolve_config

    argv = ["train", "--out", str(tmp_path / "run"), "--task", "walk", "--init-from", str(history_run)]
    config, _ = resolve_config(build_parser().parse_args(argv))
    assert (config["run"]["sensor_history"], config["run"]["action_scale"]) == (3, 0.5)
    config, _ = resolve_config(build_parser().parse_args([*argv, "--action-scale", "0.4"]))
    assert config["run"]["action_scale"] == 0.4  # a given flag wins


@pytest.mark.parametrize("scale", ["0", "-0.3", "nan"])
def test_an_action_scale_that_is_not_positive_is_refused(scale, tmp_path):
    from waddle.cli.main import build_parser
    from waddle.cli.train import resolve_config

    args = build_parser().parse_args(["train", "--out", str(tmp_path / "run"), "--action-scale", scale])
    with pytest.raises(ValueError, match="action_scale must be a finite number > 0"):
        resolve_config(args)
