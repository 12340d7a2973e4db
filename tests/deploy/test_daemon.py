"""The robot's own contract: the daemon loop reads MuJoCo's sensors as the env's robot observation, applies
the env's action law, and the file waddle export writes is what the daemon checks, and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from helpers.torch_free import run_without_torch

from waddle.cli.main import main
from waddle.deploy.contract import SidecarError
from waddle.deploy.daemon import DaemonLoop, RobotPolicy, command_problem, parse_policy_file
from waddle.envs.microduck import MicroDuckEnv, MicroDuckRandomization

SRC = Path(__file__).resolve().parents[2] / "src"

# The contract's table (robot_contract.md), written out by hand.
HOME = [0.0, -0.0873, -0.4579, -0.0049, 0.4530, 0.3491, 0.3491, 0.0, 0.0, 0.0, 0.0873, 0.4579, 0.0049, -0.4530]
JOINTS = (
    "left_hip_yaw left_hip_roll left_hip_pitch left_knee left_ankle neck_pitch head_pitch head_yaw head_roll "
    "right_hip_yaw right_hip_roll right_hip_pitch right_knee right_ankle"
).split()
LAYOUT = [
    ["base_ang_vel", 3],
    ["projected_gravity", 3],
    ["joint_pos", 14],
    ["joint_vel", 14],
    ["actions", 14],
    ["command", 3],
    ["head_command", 4],
    ["body_command", 6],
]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A short ``waddle train --task joystick`` run, past its prior's fade, exported as the robot's file."""
    folder = tmp_path_factory.mktemp("joystick")
    run = folder / "run"
    argv = ["train", "--task", "joystick", "--out", str(run), "--total-steps", "1024", "--num-envs", "16"]
    argv += ["--gait-prior-fade-steps", "512", "--video-frames", "0", "--no-progress", "--action-scale", "0.6"]
    assert main(argv) == 0
    assert main(["export", str(run), "--onnx", str(folder / "policy.onnx"), "--samples", "32"]) == 0
    return run, folder / "policy.onnx"


# ---------------------------------------------------------------------------
# The file
# ---------------------------------------------------------------------------


def test_the_export_is_the_daemons_file_and_nothing_else(exported):
    run, path = exported
    model = onnx.load(str(path))
    assert [opset.version for opset in model.opset_import if opset.domain in ("", "ai.onnx")] == [18]
    (graph_input,) = model.graph.input
    (graph_output,) = model.graph.output
    shape = lambda value: [d.dim_value for d in value.type.tensor_type.shape.dim]  # noqa: E731
    assert (graph_input.name, shape(graph_input)) == ("obs", [1, 61])
    assert (graph_output.name, shape(graph_output)) == ("actions", [1, 14])
    assert graph_input.type.tensor_type.elem_type == graph_output.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    props = {prop.key: prop.value for prop in model.metadata_props}
    assert list(props) == ["microduck"]
    meta = json.loads(props["microduck"])
    assert meta == {
        "schema_version": 1,
        "obs_len": 61,
        "action_len": 14,
        "control_hz": 50,
        "joint_names": JOINTS,
        "default_joint_pos": HOME,
        "action_scale": 0.6,  # the run's, not a constant
        "kp_fw": 200,
        "observation": LAYOUT,
    }
    assert sorted(p.name for p in path.parent.iterdir()) == ["policy.onnx", "run"]  # no sidecar beside it


def test_the_files_actions_are_the_torch_actors_on_the_robots_observations(exported):
    from waddle.algorithms.checkpoint import load_checkpoint
    from waddle.algorithms.evaluation import policy_from_checkpoint
    from waddle.algorithms.presets import make_env

    run, path = exported
    env = make_env("joystick", num_envs=8, seed=4, randomization="upstream", action_mode="robot", action_scale=0.6)
    env.gait_prior_scale = 0.0
    policy = policy_from_checkpoint(load_checkpoint(run / "checkpoint.pt"), env)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    td = env.reset()
    for _ in range(5):
        observations = td["robot_observation"]
        with torch.no_grad():
            expected = policy(observations).numpy()
        for row, want in zip(observations.numpy(), expected):
            (got,) = session.run(["actions"], {"obs": row[None].astype(np.float32)})
            np.testing.assert_allclose(got[0], want, atol=1e-5, rtol=0)
        td = env.step(td.set("action", torch.from_numpy(expected)))["next"]
    env.close()


def test_the_file_answers_the_mirrored_robot_with_the_mirrored_action(exported):
    """The joystick recipe's file is the actor averaged with its mirror image: a robot reflected left to right
    gets the reflected action, to float32 rounding, so the file has no turn of its own."""
    from waddle.envs.microduck.symmetry import MIRRORS

    _, path = exported
    observe, act = MIRRORS["robot_observation"], MIRRORS["action"]
    env = MicroDuckEnv(tasks=[MicroDuckEnv.joystick_task()], num_envs=6, seed=7, action_mode="robot")
    td = env.reset()
    for _ in range(4):
        td = env.step(td.set("action", torch.rand(6, 14) - 0.5))["next"]
    observations = td["robot_observation"].double()
    env.close()
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    run = lambda rows: np.stack(  # noqa: E731
        [session.run(["actions"], {"obs": row[None].astype(np.float32)})[0][0] for row in rows.numpy()]
    )
    direct, reflected = run(observations), run(observe(observations))
    np.testing.assert_allclose(reflected, act(torch.from_numpy(direct).double()).numpy(), atol=2e-6, rtol=0)
    assert np.abs(direct).max() > 1e-2  # not the trivially symmetric zero policy


def test_export_refuses_a_robot_actor_whose_env_still_adds_the_prior(exported, tmp_path, capsys):
    run, _ = exported
    unfinished = tmp_path / "unfinished"
    argv = ["train", "--task", "joystick", "--out", str(unfinished), "--total-steps", "512", "--num-envs", "16"]
    assert main(argv + ["--video-frames", "0", "--no-progress"]) == 0  # 512 of the recipe's 6M-step fade
    assert main(["export", str(unfinished), "--onnx", str(tmp_path / "p.onnx")]) == 1
    assert "still added 1.00 of the gait prior" in capsys.readouterr().err
    assert not (tmp_path / "p.onnx").exists()


# ---------------------------------------------------------------------------
# The daemon loop
# ---------------------------------------------------------------------------


def test_the_daemon_loop_reads_the_envs_robot_observation_from_mujocos_sensors(exported):
    _, path = exported
    spec = parse_policy_file(path)
    env = MicroDuckEnv(
        tasks=[MicroDuckEnv.joystick_task(joint_reset_noise_scale=0.0)],
        num_envs=1,
        seed=3,
        dtype=torch.float64,
        randomization=MicroDuckRandomization(),
        action_mode="robot",
        action_scale=spec.action_scale,
    )
    runner = DaemonLoop(spec)
    twist = {
        "command": torch.tensor([[0.2, -0.1]], dtype=torch.float64),
        "yaw_rate_command": torch.tensor([[0.4]], dtype=torch.float64),
    }
    from tensordict import TensorDict

    td = env.reset(TensorDict(twist, batch_size=[1]))
    observation = runner.reset((0.2, -0.1, 0.4), qpos=env.physics.qpos[0].numpy(), qvel=env.physics.qvel[0].numpy())
    np.testing.assert_allclose(observation, td["robot_observation"][0].numpy(), rtol=0, atol=1e-9)
    rng = np.random.default_rng(0)
    previous_velocity = runner.robot.data.qvel[6:].copy()
    for _ in range(40):
        action = rng.uniform(-1.5, 1.5, 14)  # past any [-1, 1]: nothing clips it but the joints' ranges
        td = env.step(td.set("action", torch.from_numpy(action)[None]))
        observation = runner.step(action)
        np.testing.assert_allclose(observation, td["next", "robot_observation"][0].numpy(), rtol=0, atol=1e-9)
        # Independently of the env: velocities one control step old, the raw action, the twist, zeros.
        np.testing.assert_allclose(observation[20:34], previous_velocity, rtol=0, atol=1e-12)
        np.testing.assert_array_equal(observation[34:48], action)
        np.testing.assert_array_equal(observation[48:61], [0.2, -0.1, 0.4] + [0.0] * 10)
        previous_velocity = runner.robot.data.qvel[6:].copy()
        if td["next", "done"].any():
            break
        td = td["next"]
    env.close()


def test_the_daemon_law_is_home_plus_scale_times_action_at_the_servos_stops(exported):
    _, path = exported
    runner = DaemonLoop(parse_policy_file(path))
    np.testing.assert_array_equal(runner.control(np.zeros(14)), HOME)
    action = np.zeros(14)
    action[1], action[2] = 1.0, 0.5  # left hip roll: -0.0873 + 0.6 is past its 0.384 rad stop
    target = runner.control(action)
    assert target[1] == pytest.approx(0.383972, abs=1e-6) and target[2] == pytest.approx(-0.4579 + 0.3)


def test_sim2sim_drives_the_file_alone_without_torch(exported):
    _, path = exported
    done = run_without_torch(
        f"""
        from waddle.deploy.sim2sim import main
        raise SystemExit(main([{str(path)!r}, "--episodes", "2", "--max-steps", "5", "--command", "0.1", "0", "0.3"]))
        """
    )
    assert done.returncode == 0, done.stderr
    assert "as the MicroDuck daemon runs it" in done.stdout
    assert "vyaw +0.300 rad/s" in done.stdout and "yaw rate" in done.stdout


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("obs_len", 53, "'obs_len' is 53; the daemon runs only 61"),
        ("control_hz", 100, "'control_hz' is 100"),
        ("default_joint_pos", [0.0] * 13, "14 angles"),
        ("action_scale", 0, "'action_scale' must be a number > 0"),
    ],
)
def test_a_file_the_daemon_would_refuse_is_refused_by_name(exported, tmp_path, field, value, message):
    _, path = exported
    model = onnx.load(str(path))
    meta = json.loads(model.metadata_props[0].value)
    meta[field] = value
    model.metadata_props[0].value = json.dumps(meta)
    bad = tmp_path / "bad.onnx"
    onnx.save(model, str(bad))
    with pytest.raises(SidecarError, match=message):
        RobotPolicy(bad, parse_policy_file(bad))


def test_commands_past_the_gamepads_limits_are_refused_with_the_limits():
    assert "vx 9 m/s is beyond" in command_problem([9.0, 0.0]) and "|vyaw| <= 2 rad/s" in command_problem([9.0, 0])
    assert "vyaw -2.5 rad/s" in command_problem([0.0, 0.0, -2.5])
    assert "2 or 3 finite numbers" in command_problem([0.1])
    assert command_problem([0.7, -0.7, 2.0]) is None
