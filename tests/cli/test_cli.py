"""``waddle train``, ``eval`` and ``export`` end to end on the real MicroDuckEnv (tiny runs).

One short training run (a few thousand env steps) is shared by the tests;
each command runs in-process through ``waddle.cli.main.main`` except the
bad-checkpoint test, which runs the installed entry point to see exactly what
a user sees. Filming needs an OpenGL backend: the tests that check videos are
marked ``rendering`` (skipped only where no backend works, failed there in CI).
"""

from __future__ import annotations

import csv
import json
import math
import stat
import subprocess
import sys

import numpy as np
import pytest
import torch

from waddle.cli.main import main
from waddle.envs.microduck import MicroDuckRandomization
from waddle.files import default_file_mode

TINY = [
    "--num-envs",
    "16",
    "--num-steps",
    "16",
    "--num-epochs",
    "2",
    "--num-minibatches",
    "2",
    "--actor-hidden-sizes",
    "32",
    "32",
    "--critic-hidden-sizes",
    "32",
    "32",
    "--checkpoint-every",
    "3",
    "--video-frames",
    "10",
    "--no-progress",
]
STEPS_PER_ITERATION = 16 * 16


@pytest.fixture(autouse=True)
def _restore_threads():
    """``waddle train`` sets torch's thread count; later tests keep conftest's."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def read_rows(path):
    with open(path, newline="") as file:
        return list(csv.DictReader(file))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 2048-step PPO run on the standing task."""
    out = tmp_path_factory.mktemp("run")
    code = main(["train", "--task", "standing", "--total-steps", "2048", "--out", str(out), *TINY])
    assert code == 0
    return out


@pytest.mark.rendering
def test_train_writes_every_output(trained, capsys):
    names = sorted(path.name for path in trained.iterdir())
    assert names == ["checkpoint.pt", "config.json", "curve.png", "metrics.csv", "video.mp4"]
    rows = read_rows(trained / "metrics.csv")
    assert len(rows) == 2048 // STEPS_PER_ITERATION
    assert rows[-1]["env_steps"] == "2048"
    for column in ("charts/episode_return", "charts/episode_length", "steps_per_second", "losses/policy_loss"):
        assert column in rows[0]
    config = json.loads((trained / "config.json").read_text())
    assert config["run"]["task"] == "standing" and config["algorithm"]["actor_hidden_sizes"] == [32, 32]
    assert (trained / "curve.png").read_bytes()[:4] == b"\x89PNG"
    height = int.from_bytes((trained / "curve.png").read_bytes()[20:24], "big")
    assert height == 900  # return, length and reward-term panels, 300 px each
    assert (trained / "video.mp4").stat().st_size > 1000
    for path in trained.iterdir():  # readable by others under the usual umask, like any file open() makes
        assert stat.S_IMODE(path.stat().st_mode) == default_file_mode(), path.name


def test_metrics_hold_every_reward_term_summing_to_the_mean_reward(trained):
    from waddle.envs.microduck import MicroDuckEnv

    rows = read_rows(trained / "metrics.csv")
    terms = [column for column in rows[0] if column.startswith("reward/")]
    assert sorted(terms) == sorted(f"reward/{name}" for name in MicroDuckEnv.REWARD_TERMS)
    for row in rows:
        total = sum(float(row[column]) for column in terms)
        assert total == pytest.approx(float(row["charts/reward_mean"]), rel=1e-5, abs=1e-6)


def test_resume_continues_and_appends(trained, tmp_path, capsys):
    out = tmp_path / "resumed"
    out.mkdir()
    for name in ("checkpoint.pt", "metrics.csv", "config.json"):
        (out / name).write_bytes((trained / name).read_bytes())
    argv = ["train", "--out", str(out), "--resume", "--total-steps", "3072", "--video-frames", "0", "--no-progress"]
    code = main(argv)
    assert code == 0
    rows = read_rows(out / "metrics.csv")
    assert [int(row["iteration"]) for row in rows] == list(range(1, 13))
    assert int(rows[-1]["env_steps"]) == 3072
    assert "trained 3072 env steps" in capsys.readouterr().out


def test_resume_refuses_an_incompatible_config(trained, capsys):
    code = main(["train", "--out", str(trained), "--resume", "--task", "walk", "--total-steps", "4096"])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "run.task differs" in err and "'standing'" in err and "'walk'" in err
    code = main(["train", "--out", str(trained), "--resume", "--actor-hidden-sizes", "64", "--total-steps", "4096"])
    assert code == 1
    assert "algorithm.actor_hidden_sizes differs" in capsys.readouterr().err


def test_resume_reads_a_checkpoint_with_the_old_config_names(trained, tmp_path, capsys):
    out = tmp_path / "old"
    out.mkdir()
    checkpoint = torch.load(trained / "checkpoint.pt", weights_only=True)
    algorithm = checkpoint["config"]["algorithm"]
    algorithm["actor_hidden"] = algorithm.pop("actor_hidden_sizes")
    algorithm["critic_hidden"] = algorithm.pop("critic_hidden_sizes")
    algorithm["init_std"] = math.exp(algorithm.pop("init_log_std"))
    torch.save(checkpoint, out / "checkpoint.pt")
    argv = ["train", "--out", str(out), "--resume", "--total-steps", "2304", "--video-frames", "0", "--no-progress"]
    assert main(argv) == 0, capsys.readouterr().err
    resumed = torch.load(out / "checkpoint.pt", weights_only=True)
    assert resumed["env_steps"] == 2304
    assert resumed["config"]["algorithm"]["actor_hidden_sizes"] == [32, 32]
    assert "actor_hidden" not in resumed["config"]["algorithm"]


def test_one_flag_per_hyperparameter_shared_by_the_algorithms():
    from waddle.cli.main import build_parser

    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    helps = {flag: action.help for action in train._actions for flag in action.option_strings}
    for old in (
        "--actor-hidden",
        "--critic-hidden",
        "--init-std",
        "--lam",
        "--actor-lr",
        "--critic-lr",
        "--critic-iterations",
        "--critic-minibatches",
    ):
        assert old not in helps, old
    assert "ppo: 5; shac: 16" in helps["--num-epochs"]
    assert "ppo: 0.95; shac: 0.95" in helps["--gae-lambda"]
    assert "ppo: 128 128; shac: 400 200 100; apg: 64 64" in helps["--actor-hidden-sizes"]


def test_fresh_run_refuses_to_overwrite(trained, capsys):
    assert main(["train", "--out", str(trained), "--total-steps", "256"]) == 1
    assert "pass --resume" in capsys.readouterr().err


def _table_rows(out: str) -> list[list[str]]:
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "command vx,vy" in line) + 2  # header and units
    return [line.split() for line in lines[start:] if line.strip() and not line.startswith(("video", "table"))]


def test_eval_prints_one_row_per_command(trained, capsys):
    assert main(["eval", str(trained / "checkpoint.pt"), "--episodes", "2", "--max-steps", "50"]) == 0
    out = capsys.readouterr().out
    for label in ("survival", "forward", "lateral", "yaw drift", "clearance", "steps/s"):
        assert label in out
    rows = _table_rows(out)
    assert [row[:2] for row in rows] == [["standing", "+0.00,+0.00,+0.00"]]  # the standing task's one command
    assert 0.0 <= float(rows[0][2]) <= 100.0
    assert rows[0][-3:] == ["-", "-", "-"]  # standing does not hop
    assert main(["eval", str(trained), "--episodes", "2", "--max-steps", "30", "--command", "0.1", "-0.05"]) == 0
    rows = _table_rows(capsys.readouterr().out)
    assert [row[:2] for row in rows] == [["standing", "+0.10,-0.05,+0.00"]]


def test_eval_refuses_a_non_finite_command(trained, capsys):
    assert main(["eval", str(trained), "--command", "nan", "0"]) == 2
    assert "--command takes VX VY [VYAW], 2 or 3 finite numbers" in capsys.readouterr().err


def test_eval_refuses_a_command_no_robot_does_and_warns_outside_the_trained_range(trained, capsys):
    assert main(["eval", str(trained), "--command", "9", "0"]) == 2
    err = capsys.readouterr().err
    assert "vx 9 m/s is beyond what the MicroDuck is ever commanded" in err and "|vx| <= 0.7 m/s" in err
    assert main(["eval", str(trained), "--episodes", "2", "--max-steps", "5", "--command", "0.1", "0", "0.3"]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "outside what the policy trained on (vx [+0.00, +0.00]" in warnings[0]


@pytest.mark.rendering
def test_eval_video_writes_an_mp4(trained, tmp_path, capsys):
    video = tmp_path / "eval.mp4"
    assert main(["eval", str(trained), "--episodes", "1", "--max-steps", "25", "--video", str(video)]) == 0
    import imageio.v2 as imageio

    reader = imageio.get_reader(video)
    frame = reader.get_data(0)
    num_frames = reader.count_frames()
    reader.close()
    assert 1 <= num_frames <= 25
    assert frame.ndim == 3 and frame.shape[-1] == 3 and frame.std() > 0  # a picture, not a blank


def test_export_onnx_matches_the_torch_policy(trained, tmp_path, capsys):
    import onnx
    import onnxruntime

    from waddle.algorithms.checkpoint import load_checkpoint
    from waddle.algorithms.evaluation import policy_from_checkpoint
    from waddle.algorithms.presets import make_env

    path = tmp_path / "policy.onnx"
    assert main(["export", str(trained / "checkpoint.pt"), "--onnx", str(path)]) == 0
    assert "parity" in capsys.readouterr().out
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    dims = lambda value: [d.dim_value for d in value.type.tensor_type.shape.dim]  # noqa: E731
    assert dims(model.graph.input[0]) == [1, 56] and dims(model.graph.output[0]) == [1, 14]

    # Independent parity check: real observations from the env, raw (unnormalised).
    env = make_env("standing", num_envs=8, seed=3)
    policy = policy_from_checkpoint(load_checkpoint(trained / "checkpoint.pt"), env)
    observations = env.rollout(20, break_when_any_done=False)["observation"].reshape(-1, 56)
    env.close()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        for row in observations[::7]:
            (onnx_action,) = session.run(None, {"observation": row.reshape(1, 56).numpy()})
            np.testing.assert_allclose(onnx_action, policy(row.reshape(1, 56)).numpy(), atol=1e-5)


@pytest.mark.parametrize(
    ("argv", "choices"),
    [
        (["train", "--task", "fly"], "standing, walk, speed-range, sidestep, jump, mix"),
        (["train", "--algo", "sac"], "ppo, shac, apg"),
        (["train", "--backend", "bullet"], "mujoco, mjx, mujoco-torch"),
    ],
)
def test_bad_names_are_argparse_errors(argv, choices, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice" in err and choices.replace(", ", "', '") in err


def test_a_logger_without_its_package_is_one_line_naming_the_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if wandb were not installed
    out = tmp_path / "x"
    assert main(["train", "--out", str(out), "--logger", "wandb", "--total-steps", "256", "--no-progress"]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "--logger wandb needs the wandb package" in lines[0] and "pip install wandb" in lines[0]
    assert not out.exists()  # refused before anything was built or written


def test_algorithm_flag_of_another_algorithm_is_refused(tmp_path, capsys):
    assert main(["train", "--out", str(tmp_path / "x"), "--horizon", "8"]) == 1
    assert "--horizon do(es) not apply to --algo ppo" in capsys.readouterr().err


def bad_checkpoint(kind, trained, tmp_path):
    path = tmp_path / "checkpoint.pt"
    if kind == "truncated":
        path.write_bytes((trained / "checkpoint.pt").read_bytes()[:5000])
    elif kind == "foreign":
        torch.save({"model": torch.zeros(3)}, path)
    return path


@pytest.mark.parametrize("kind", ["missing", "truncated", "foreign"])
@pytest.mark.parametrize("command", ["eval", "export"])
def test_bad_checkpoint_is_one_line_and_non_zero(kind, command, trained, tmp_path, capsys):
    path = bad_checkpoint(kind, trained, tmp_path)
    argv = [command, str(path)] + (["--onnx", str(tmp_path / "p.onnx")] if command == "export" else [])
    assert main(argv) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"waddle {command}: error:"), lines
    assert not (tmp_path / "p.onnx").exists()


def test_bad_checkpoint_from_the_shell_has_no_traceback(trained, tmp_path):
    path = bad_checkpoint("truncated", trained, tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "waddle", "eval", str(path)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("waddle eval: error:") and "truncated" in lines[0], done.stderr


def test_every_config_field_has_a_documented_flag():
    import dataclasses

    from waddle.algorithms.ppo import PPOConfig
    from waddle.algorithms.runner import TrainConfig
    from waddle.cli.main import build_parser
    from waddle.cli.train import field_docs

    parser = build_parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    helps = {flag: action.help for action in train._actions for flag in action.option_strings}
    for cls in (TrainConfig, PPOConfig):
        docs = field_docs(cls)
        for field in dataclasses.fields(cls):
            assert docs.get(field.name), f"{cls.__name__}.{field.name} has no docstring"
            flag = "--" + field.name.replace("_", "-")
            assert flag in helps and docs[field.name] in helps[flag].replace("%%", "%"), flag


def test_reward_weights_are_name_value_pairs_and_a_malformed_one_is_refused(tmp_path, capsys):
    from waddle.cli.main import build_parser

    args = build_parser().parse_args(["train", "--reward-weights", "target_past_range=-1", "pose=0.25", "pose=0"])
    assert args.reward_weights == {"target_past_range": -1.0, "pose": 0.0}  # the last value of a name wins
    for bad in ("pose", "pose=", "=1", "pose=high"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["train", "--reward-weights", bad])
        assert f"--reward-weights: {bad!r} is not NAME=X" in capsys.readouterr().err


def resolve_new_run(tmp_path, *flags):
    """What ``resolve_config`` makes of ``waddle train --out <tmp_path>/run FLAGS``: the config and checkpoint."""
    from waddle.cli.main import build_parser
    from waddle.cli.train import resolve_config

    return resolve_config(build_parser().parse_args(["train", "--out", str(tmp_path / "run"), *flags]))


@pytest.mark.parametrize(
    ("argv", "steps"),
    [
        (["--task", "walk"], 6_000_000),  # walking takes longer than standing
        (["--task", "speed-range"], 6_000_000),
        (["--task", "standing"], 1_500_000),
        (["--task", "walk", "--total-steps", "4096"], 4096),  # a given flag wins
    ],
)
def test_the_step_budget_left_out_follows_the_task(argv, steps, tmp_path):
    config, checkpoint = resolve_new_run(tmp_path, *argv)
    assert checkpoint is None
    assert config["run"]["total_steps"] == steps


@pytest.mark.parametrize(
    ("argv", "coef"),
    [
        (["--task", "walk"], 0.3),  # the walking tasks train with the mirror loss
        (["--task", "speed-range"], 0.3),
        (["--task", "standing"], 0.0),
        (["--task", "sidestep"], 0.0),
        (["--task", "walk", "--mirror-loss-coef", "0"], 0.0),  # a given flag wins
        (["--task", "standing", "--mirror-loss-coef", "0.5"], 0.5),
    ],
)
def test_the_mirror_loss_left_out_follows_the_task(argv, coef, tmp_path):
    config, _ = resolve_new_run(tmp_path, *argv)
    assert config["algorithm"]["mirror_loss_coef"] == coef


def test_the_training_episode_horizon_is_a_flag_recorded_in_the_checkpoint(tmp_path, capsys):
    from waddle.algorithms.runner import read_metrics

    out = tmp_path / "run"
    argv = ["train", "--total-steps", "512", "--out", str(out), *TINY, "--video-frames", "0"]
    assert main([*argv, "--max-episode-steps", "8"]) == 0
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    assert checkpoint["config"]["run"]["max_episode_steps"] == 8
    _, rows = read_metrics(out / "metrics.csv")
    lengths = [row["charts/episode_length"] for row in rows if math.isfinite(row["charts/episode_length"])]
    # 16 envs x 32 steps: with the default 500-step horizon no episode would end; at 8 every one is cut at 8.
    assert lengths and all(length == 8 for length in lengths)
    capsys.readouterr()
    assert main(["eval", str(out), "--episodes", "2", "--max-steps", "8"]) == 0
    assert "note: the policy trained on episodes" not in capsys.readouterr().out
    assert main(["eval", str(out), "--episodes", "2", "--max-steps", "9"]) == 0
    assert "note: the policy trained on episodes of 8 steps; past step 8" in capsys.readouterr().out


def recorded_calls(monkeypatch, module, name: str, record) -> list:
    """Wrap ``module.name`` so that each call first appends ``record(kwargs)`` to the list returned."""
    seen = []
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        seen.append(record(kwargs))
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return seen


def test_push_scale_trains_on_harder_pushes_while_eval_and_export_keep_the_preset(tmp_path, capsys, monkeypatch):
    import waddle.cli.train as train_cli

    drawn = recorded_calls(monkeypatch, train_cli, "make_env", lambda kwargs: kwargs["randomization"])
    out = tmp_path / "run"
    argv = ["train", "--task", "walk", "--total-steps", "256", *TINY, "--video-frames", "0"]
    assert main([*argv, "--out", str(out), "--randomization", "upstream", "--push-scale", "1.5"]) == 0
    # upstream kicks the trunk by up to 0.3 m/s per axis; the training env's kicks reach half again as far.
    assert drawn[0].push_velocity == pytest.approx((-0.45, 0.45))
    assert drawn[0].replace(push_velocity=(-0.3, 0.3)) == MicroDuckRandomization.preset("upstream")
    assert torch.load(out / "checkpoint.pt", weights_only=True)["config"]["run"]["push_scale"] == 1.5
    capsys.readouterr()
    assert main(["eval", str(out), "--episodes", "2", "--max-steps", "4"]) == 0
    printed = capsys.readouterr().out
    assert "envs drawn with randomization 'upstream'" in printed
    assert "note: the policy trained on pushes 1.5 times as hard as the 'upstream' preset's" in printed
    onnx = tmp_path / "policy.onnx"
    assert main(["export", str(out), "--onnx", str(onnx), "--samples", "4"]) == 0
    training = json.loads(onnx.with_suffix(".json").read_text())["training"]
    assert (training["randomization"], training["push_scale"], training["push_ramp_steps"]) == ("upstream", 1.5, 0)
    # Without the flag the training env draws the preset by name, as every run did before the option.
    drawn.clear()
    assert main([*argv, "--out", str(tmp_path / "plain"), "--randomization", "upstream"]) == 0
    assert drawn[0] == "upstream"


def _training_envs(monkeypatch) -> list:
    """The envs ``waddle train`` builds from here on, in the order it builds them."""
    import waddle.cli.train as train_cli

    built = []
    original = train_cli.make_env
    monkeypatch.setattr(
        train_cli, "make_env", lambda *args, **kwargs: built.append(original(*args, **kwargs)) or built[-1]
    )
    return built


def test_a_push_ramp_sets_the_training_envs_push_strength_before_each_iteration(tmp_path, monkeypatch):
    built = _training_envs(monkeypatch)
    out = tmp_path / "run"
    argv = ["train", "--task", "standing", "--randomization", "upstream", "--total-steps", "1280", *TINY]
    assert main([*argv, "--video-frames", "0", "--out", str(out), "--push-ramp-steps", "512"]) == 0
    assert len(built) == 1  # the training env (no video)
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    # TINY's iterations are 16 envs x 16 steps = 256 env steps; each trained at the strength its start set.
    assert [float(row["curriculum/push_strength"]) for row in rows] == [0.0, 0.5, 1.0, 1.0, 1.0]
    assert built[0].pushes.strength == 1.0
    assert torch.load(out / "checkpoint.pt", weights_only=True)["config"]["run"]["push_ramp_steps"] == 512


def test_a_lift_assist_sets_the_training_envs_lift_before_each_iteration(tmp_path, monkeypatch):
    built = _training_envs(monkeypatch)
    out = tmp_path / "run"
    argv = ["train", "--task", "getup", "--total-steps", "1280", *TINY, "--video-frames", "0", "--out", str(out)]
    assert main([*argv, "--lift-assist", "0.6", "--lift-assist-fade-steps", "512"]) == 0
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    # TINY's iterations are 256 env steps; each trained at the share its start set.
    assert [float(row["curriculum/lift_assist"]) for row in rows] == pytest.approx([0.6, 0.3, 0.0, 0.0, 0.0])
    assert built[0].lift_assist == 0.0


@pytest.mark.parametrize(
    ("flags", "threads"),
    [
        ([], 2),
        (["--overlap-rollout"], 1),
        (["--overlap-rollout", "--update-threads", "2"], 2),
        (["--update-threads", "1"], 1),
    ],
)
def test_the_update_threads_left_out_follow_the_overlap(tmp_path, monkeypatch, flags, threads):
    """Every core for the plain loop's update (the physics idles then), one for an overlapped update
    (the rollout holds the cores); given threads win."""
    import waddle.cli.train as train_cli

    monkeypatch.setattr(train_cli.os, "sched_getaffinity", lambda pid: {0, 1})
    seen = recorded_calls(monkeypatch, train_cli, "make_trainer", lambda kwargs: kwargs["update_threads"])
    argv = ["train", "--task", "standing", "--total-steps", "256", *TINY, "--video-frames", "0", "--out", str(tmp_path)]
    assert main([*argv, *flags]) == 0
    assert seen == [threads]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--push-scale", "1.5"], r"push_scale: a push scale of 1\.5 needs a randomization that pushes"),
        (["--randomization", "upstream", "--push-scale", "0"], r"push_scale: push scale must be a finite number > 0"),
        (["--randomization", "upstream", "--push-scale", "nan"], r"push scale must be a finite number > 0, got nan"),
    ],
)
def test_a_push_scale_that_cannot_apply_is_refused_naming_it(flags, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        resolve_new_run(tmp_path, *flags)


@pytest.mark.parametrize("steps", ["0", "-5"])
def test_a_training_horizon_that_is_not_positive_is_refused(steps, tmp_path):
    with pytest.raises(ValueError, match="max_episode_steps must be an integer >= 1"):
        resolve_new_run(tmp_path, "--max-episode-steps", steps)


@pytest.mark.parametrize(
    "flags, expected",
    [
        (["--algo", "shac"], {"backend": "mjx", "num_envs": 8, "max_episode_steps": 128, "total_steps": 25_600}),
        # SHAC's budget is its own on every task: walking's 6M PPO steps would be days of windows
        (["--algo", "shac", "--task", "walk"], {"backend": "mjx", "num_envs": 8, "total_steps": 25_600}),
        (
            ["--algo", "shac", "--num-envs", "8", "--backend", "mujoco-torch"],
            {"backend": "mujoco-torch", "num_envs": 8},
        ),
        (["--algo", "apg"], {"backend": "mjx", "num_envs": 256, "max_episode_steps": 500, "total_steps": 1_500_000}),
        ([], {"backend": "mujoco", "num_envs": 256, "max_episode_steps": 500, "total_steps": 1_500_000}),
        (["--task", "walk"], {"backend": "mujoco", "total_steps": 6_000_000}),
    ],
    ids=["shac", "shac-walk", "shac-given", "apg", "ppo", "ppo-walk"],
)
def test_an_algorithm_brings_its_run_defaults(tmp_path, flags, expected):
    config, _ = resolve_new_run(tmp_path, *flags)
    assert {name: config["run"][name] for name in expected} == expected


@pytest.mark.parametrize(
    "flags, decay_steps",
    [([], 25_600), (["--total-steps", "4096"], 4096), (["--total-steps", "4096", "--lr-decay-steps", "1000"], 1000)],
)
def test_shacs_learning_rate_schedule_spans_the_run_unless_given(tmp_path, flags, decay_steps):
    config, _ = resolve_new_run(tmp_path, "--algo", "shac", *flags)
    assert config["algorithm"]["lr_schedule"] == "linear"
    assert config["algorithm"]["lr_decay_steps"] == decay_steps


@pytest.mark.parametrize("algo", ["shac", "apg"])
def test_an_analytic_gradient_checkpoint_evaluates_and_exports_on_the_native_env(tmp_path, algo, capsys):
    # A SHAC or APG run trains through MJX; eval and export rebuild its networks around an env without gradients.
    from dataclasses import asdict

    from waddle.algorithms.checkpoint import load_checkpoint, save_checkpoint
    from waddle.algorithms.evaluation import policy_from_checkpoint
    from waddle.algorithms.presets import make_config, make_env, make_trainer
    from waddle.algorithms.runner import TrainConfig

    torch.manual_seed(0)
    env = make_env("standing", num_envs=4, seed=0)
    config = make_config(
        algo, {"actor_hidden_sizes": (16,), **({"critic_hidden_sizes": (16,)} if algo == "shac" else {})}
    )
    trainer = make_trainer(algo, env, config, "cpu")
    trainer.normalizer.update(env.rollout(10, break_when_any_done=False)["observation"].reshape(-1, 56))
    run = asdict(TrainConfig(algo=algo, backend="mjx", num_envs=4))
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(
        path,
        algo=algo,
        config={"run": run, "algorithm": json.loads(json.dumps(asdict(config)))},
        trainer_state=trainer.state_dict(),
        env_steps=256,
        iteration=1,
    )

    policy = policy_from_checkpoint(load_checkpoint(path), make_env("standing", num_envs=2, seed=1))
    observations = env.rollout(5, break_when_any_done=False)["observation"].reshape(-1, 56)
    with torch.no_grad():
        torch.testing.assert_close(policy(observations), trainer.deterministic_policy()(observations))
    assert main(["eval", str(path), "--episodes", "2", "--max-steps", "20"]) == 0
    assert main(["export", str(path), "--onnx", str(tmp_path / "policy.onnx")]) == 0
    assert (tmp_path / "policy.onnx").stat().st_size > 0
    env.close()


def test_a_task_default_of_another_algorithm_is_not_applied(tmp_path):
    config, _ = resolve_new_run(tmp_path, "--task", "walk", "--algo", "shac")
    assert "mirror_loss_coef" not in config["algorithm"]  # SHAC has no mirror loss, and is not handed one


# ---------------------------------------------------------------------------
# A library of several tasks: per-task evaluation, export with the task id
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained_mix(tmp_path_factory):
    """A 512-step PPO run on the four-task mix library (task-conditioned by default)."""
    out = tmp_path_factory.mktemp("mix")
    argv = ["train", "--task", "mix", "--total-steps", "512", "--out", str(out), *TINY, "--video-frames", "0"]
    assert main(argv) == 0
    return out


def test_a_mix_checkpoint_records_its_library(trained_mix):
    checkpoint = torch.load(trained_mix / "checkpoint.pt", weights_only=True)
    assert checkpoint["trainer"]["task_library"] == ["standing", "tracking+0.20", "sidestep+0.15", "jump"]
    assert checkpoint["config"]["algorithm"]["task_embedding_dim"] == 8
    assert checkpoint["trainer"]["policy"]["task_embedding.weight"].shape == (4, 8)


def test_eval_runs_every_task_and_writes_the_csv(trained_mix, tmp_path, capsys):
    path = tmp_path / "eval.csv"
    argv = ["eval", str(trained_mix), "--episodes", "2", "--max-steps", "20", "--csv", str(path)]
    assert main(argv) == 0
    rows = _table_rows(capsys.readouterr().out)
    assert [row[:2] for row in rows] == [
        ["standing", "+0.00,+0.00,+0.00"],
        ["tracking+0.20", "+0.20,+0.00,+0.00"],
        ["sidestep+0.15", "+0.00,+0.15,+0.00"],
        ["jump", "+0.00,+0.00,+0.00"],
    ]
    assert [row[-3:] == ["-", "-", "-"] for row in rows] == [True, True, True, False]  # hop figures: jump only
    table = read_rows(path)
    assert [row["task"] for row in table] == ["standing", "tracking+0.20", "sidestep+0.15", "jump"]
    for printed, written in zip(rows, table):  # the CSV holds the printed figures
        assert float(printed[2]) == pytest.approx(100 * float(written["survival"]), abs=0.05)
        assert float(printed[3]) == pytest.approx(float(written["episode_return"]), abs=0.005)
        assert int(written["episodes"]) == 2
    assert main(["eval", str(trained_mix), "--episodes", "2", "--max-steps", "10", "--command", "0", "0"]) == 0
    rows = _table_rows(capsys.readouterr().out)
    assert [row[1] for row in rows] == ["+0.00,+0.00,+0.00"] * 4  # the one command, in every task


def test_eval_video_task_must_name_a_task_of_the_library_and_come_with_video(trained_mix, tmp_path, capsys):
    video = tmp_path / "jump.mp4"
    argv = ["eval", str(trained_mix), "--episodes", "1", "--max-steps", "5", "--video", str(video)]
    assert main([*argv, "--video-task", "hop"]) == 2
    err = capsys.readouterr().err
    assert "--video-task 'hop' is not a task" in err and "standing, tracking+0.20, sidestep+0.15, jump" in err
    assert not video.exists()
    assert main(["eval", str(trained_mix), "--video-task", "jump"]) == 2
    assert "give --video PATH as well" in capsys.readouterr().err


@pytest.mark.rendering
def test_eval_video_task_films_that_task(trained_mix, tmp_path, capsys):
    video = tmp_path / "jump.mp4"
    argv = ["eval", str(trained_mix), "--episodes", "1", "--max-steps", "8", "--video", str(video)]
    assert main([*argv, "--video-task", "jump"]) == 0
    assert "(task jump, command +0.00, +0.00)" in capsys.readouterr().out
    import imageio.v2 as imageio

    reader = imageio.get_reader(video)
    assert 1 <= reader.count_frames() <= 8
    reader.close()


def test_eval_refuses_a_checkpoint_of_another_library(trained_mix, tmp_path, capsys):
    checkpoint = torch.load(trained_mix / "checkpoint.pt", weights_only=True)
    checkpoint["config"]["run"]["task"] = "jump-mix"  # as if its config named another library
    torch.save(checkpoint, tmp_path / "checkpoint.pt")
    assert main(["eval", str(tmp_path), "--episodes", "1", "--max-steps", "5"]) == 1
    err = capsys.readouterr().err
    assert "4 tasks [standing, tracking+0.20, sidestep+0.15, jump]" in err
    assert "3 tasks [tracking+0.20, standing, jump]" in err


def test_export_of_a_multi_task_policy_takes_the_task_id(trained_mix, tmp_path, capsys):
    import onnx
    import onnxruntime

    from waddle.algorithms.checkpoint import load_checkpoint
    from waddle.algorithms.evaluation import policy_from_checkpoint
    from waddle.algorithms.presets import make_env

    path = tmp_path / "policy.onnx"
    assert main(["export", str(trained_mix), "--onnx", str(path), "--samples", "32"]) == 0
    out = capsys.readouterr().out
    assert "task_id [1, 1] int64" in out and "3 jump" in out
    model = onnx.load(str(path))
    onnx.checker.check_model(model)
    assert [value.name for value in model.graph.input] == ["observation", "task_id"]
    metadata = {prop.key: json.loads(prop.value) for prop in model.metadata_props}
    assert metadata == {
        "inputs": ["observation", "task_id"],
        "task_names": ["standing", "tracking+0.20", "sidestep+0.15", "jump"],
    }

    # Independent parity: real observations, each with the task id its env ran.
    env = make_env("mix", num_envs=8, seed=4)
    policy = policy_from_checkpoint(load_checkpoint(trained_mix / "checkpoint.pt"), env)
    rollout = env.rollout(10, break_when_any_done=False)
    env.close()
    observations, task_ids = rollout["observation"].reshape(-1, 56), rollout["task_id"].reshape(-1, 1)
    assert len(set(task_ids.flatten().tolist())) > 1
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        for observation, task_id in zip(observations[::3], task_ids[::3]):
            feed = {"observation": observation.reshape(1, 56).numpy(), "task_id": task_id.reshape(1, 1).numpy()}
            (onnx_action,) = session.run(None, feed)
            expected = policy(observation.reshape(1, 56), task_id.reshape(1, 1)).numpy()
            np.testing.assert_allclose(onnx_action, expected, atol=1e-5)
        # The id matters: the same observation under two tasks gives two actions, in both runtimes.
        row = observations[:1]
        actions = [session.run(None, {"observation": row.numpy(), "task_id": np.array([[k]])})[0] for k in (0, 3)]
        assert not np.allclose(actions[0], actions[1])
        np.testing.assert_allclose(actions[1], policy(row, torch.tensor([[3]])).numpy(), atol=1e-5)


# ---------------------------------------------------------------------------
# --init-from
# ---------------------------------------------------------------------------


def test_init_from_starts_a_new_run_on_another_library(trained, tmp_path, capsys):
    out = tmp_path / "from-standing"
    argv = ["train", "--task", "mix", "--init-from", str(trained), "--out", str(out), "--total-steps", "256"]
    assert main([*argv, "--num-envs", "16", "--num-steps", "16", "--video-frames", "0", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "initialised from" in printed and "fresh task embedding for 4 tasks" in printed
    config = json.loads((out / "config.json").read_text())
    assert config["init_from"]["checkpoint"] == str(trained)
    assert config["init_from"]["task_library"] == ["standing"]
    # The network's shape came from the source (32 32, not the default 128 128).
    assert config["algorithm"]["actor_hidden_sizes"] == [32, 32]
    checkpoint = torch.load(out / "checkpoint.pt", weights_only=True)
    assert checkpoint["env_steps"] == 256  # its own counters
    assert checkpoint["trainer"]["task_library"] == ["standing", "tracking+0.20", "sidestep+0.15", "jump"]
    source = torch.load(trained / "checkpoint.pt", weights_only=True)["trainer"]
    assert int(checkpoint["trainer"]["normalizer"]["count"]) == int(source["normalizer"]["count"]) + 256
    # A resumed run keeps the record and loads its own checkpoint, not the source again.
    argv = ["train", "--out", str(out), "--resume", "--total-steps", "512", "--video-frames", "0", "--no-progress"]
    assert main(argv) == 0
    assert "initialised from" not in capsys.readouterr().out
    assert json.loads((out / "config.json").read_text())["init_from"] == config["init_from"]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--resume"], "--resume continues the run in --out and --init-from starts a new one"),
        (
            ["--actor-hidden-sizes", "64"],
            "differs in actor_hidden_sizes: the source has [32, 32], this run asks for [64]",
        ),
        (["--algo", "apg"], "holds ppo networks but this run trains with --algo apg"),
    ],
)
def test_init_from_refusals_are_one_line(trained, tmp_path, flags, message, capsys):
    out = tmp_path / "x"
    assert main(["train", "--init-from", str(trained), "--out", str(out), "--total-steps", "256", *flags]) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("waddle train: error:") and message in lines[0], lines
    assert not out.exists()


def test_init_from_a_missing_checkpoint(tmp_path, capsys):
    assert main(["train", "--init-from", str(tmp_path / "nope.pt"), "--out", str(tmp_path / "x")]) == 1
    assert "nope.pt does not exist" in capsys.readouterr().err


def test_eval_of_a_getup_run_starts_every_episode_with_a_drop(tmp_path, capsys, monkeypatch):
    """The getup recipe trains with reference starts along a scripted get-up; waddle eval judges from drops."""
    import waddle.algorithms.presets as presets
    import waddle.cli.train as train_cli

    built = {"train": [], "eval": []}
    for module, key in ((train_cli, "train"), (presets, "eval")):  # waddle eval imports make_env when it runs
        original = module.make_env

        def wrapper(*args, _original=original, _key=key, **kwargs):
            env = _original(*args, **kwargs)
            built[_key].append(env.tasks.reference_start_fraction.clone())
            return env

        monkeypatch.setattr(module, "make_env", wrapper)
    out = tmp_path / "run"
    argv = ["train", "--task", "getup", "--total-steps", "256", *TINY, "--video-frames", "0", "--out", str(out)]
    assert main(argv) == 0
    assert main(["eval", str(out), "--episodes", "2", "--max-steps", "4"]) == 0
    capsys.readouterr()
    assert float(built["train"][0].min()) == 0.5
    assert built["eval"] and all(float(fraction.max()) == 0.0 for fraction in built["eval"])
