"""The sim2sim runner: torch-free, its observation is MuJoCo's own sensors laid out as MicroDuckEnv's
sensor observation, its control law is the env's, and bad policy/sidecar pairs are refused clearly."""

from __future__ import annotations

import json
import math
from pathlib import Path

import mujoco
import numpy as np
import pytest
import torch
from helpers.torch_free import run_without_torch

from waddle.deploy.contract import SidecarError, parse_sidecar, read_sidecar
from waddle.deploy.sidecar import build_sidecar, write_sidecar
from waddle.deploy.sim2sim import OnnxPolicy, Sim2Sim, run_episodes
from waddle.envs.microduck import MicroDuckEnv, MicroDuckRandomization
from waddle.envs.microduck.tasks import WALKING_PRIOR

SRC = Path(__file__).resolve().parents[2] / "src"


def walk_env(delay: int = 0, dtype: torch.dtype = torch.float64, history: int = 1) -> MicroDuckEnv:
    # Noise and random delays off; only the robot's fixed one-step-late joint velocity, when asked.
    return MicroDuckEnv(
        tasks=[MicroDuckEnv.tracking_task(0.2, **WALKING_PRIOR)],
        num_envs=1,
        seed=3,
        dtype=dtype,
        randomization=MicroDuckRandomization(joint_velocity_delay=delay),
        sensor_history=history,
    )


def sensors_sidecar(env: MicroDuckEnv, **changes) -> dict:
    sidecar = build_sidecar(env, observation_key="sensor_observation", inputs=["observation"])
    sidecar.update(changes)
    return sidecar


def write_policy(path: Path, observation_dim: int, action_dim: int = 14, seed: int = 0) -> None:
    from waddle.cli.export import export_onnx
    from waddle.modules.networks import GaussianPolicy, PolicyMean
    from waddle.modules.normalizer import RunningNormalizer

    torch.manual_seed(seed)
    policy = GaussianPolicy(RunningNormalizer(observation_dim), action_dim, (16,))
    export_onnx(PolicyMean(policy), observation_dim, path)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """A random 53-input policy with the sidecar of the walking task, as waddle export writes them."""
    folder = tmp_path_factory.mktemp("deployed")
    env = walk_env(dtype=torch.float32)
    write_sidecar(folder / "policy.json", sensors_sidecar(env, onnx="policy.onnx"))
    env.close()
    write_policy(folder / "policy.onnx", 53)
    return folder


# ---------------------------------------------------------------------------
# No torch, no waddle env
# ---------------------------------------------------------------------------


def test_the_runner_imports_and_runs_with_torch_and_waddle_envs_blocked(deployed):
    done = run_without_torch(
        f"""
        from waddle.deploy.sim2sim import main
        code = main([{str(deployed / "policy.onnx")!r}, "--episodes", "2", "--max-steps", "5"])
        heavy = [m for m in sys.modules if m.split(".")[0] in ("torch", "tensordict", "torchrl") and sys.modules[m]]
        assert not heavy, heavy
        raise SystemExit(code)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "2 episodes of at most 5 steps" in done.stdout and "survival" in done.stdout


# ---------------------------------------------------------------------------
# The same robot as MicroDuckEnv
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "delay, history", [(0, 1), (1, 1), (1, 3)], ids=["no-delay", "velocity-one-step-late", "three-frames"]
)
def test_runner_and_env_give_the_same_sensor_observation_from_the_same_state(delay, history):
    env = walk_env(delay, history=history)
    sidecar = parse_sidecar(sensors_sidecar(env))
    assert (sidecar.history, sidecar.input_size) == (history, 53 * history)
    runner = Sim2Sim(sidecar)
    td = env.reset()
    observation = runner.reset(
        td["command"][0].numpy(), qpos=env.physics.qpos[0].numpy(), qvel=env.physics.qvel[0].numpy()
    )
    np.testing.assert_allclose(observation, td["sensor_observation"][0].numpy(), rtol=0, atol=1e-9)
    # At a reset every frame is the first reading.
    np.testing.assert_array_equal(observation, np.tile(observation[:53], history))
    rng = np.random.default_rng(0)
    previous_velocity = runner.robot.data.qvel[6:].copy()
    frames = [observation[:53]] * history
    steps = 0
    for _ in range(30):
        action = rng.uniform(-1.3, 1.3, 14)  # past the bounds too: both clip
        td = env.step(td.set("action", torch.from_numpy(action)[None]))
        observation = runner.step(action)
        np.testing.assert_allclose(observation, td["next", "sensor_observation"][0].numpy(), rtol=0, atol=1e-9)
        # Independently of the env: the velocity fed is MuJoCo's of `delay` steps ago, and frame k is
        # what the first frame read k steps ago.
        velocity = runner.robot.data.qvel[6:].copy()
        np.testing.assert_allclose(observation[22:36], previous_velocity if delay else velocity, rtol=0, atol=1e-12)
        frames = [observation[:53]] + frames[:-1]
        np.testing.assert_array_equal(observation, np.concatenate(frames))
        previous_velocity = velocity
        steps += 1
        if td["next", "done"].any():
            break
        td = td["next"]
    env.close()
    assert steps >= 10


def test_the_observation_is_mujocos_own_state():
    env = walk_env()
    sidecar = parse_sidecar(sensors_sidecar(env))
    key = env.model.key("STAND")
    env.close()
    runner = Sim2Sim(sidecar)
    runner.reset((0.2, 0.0))
    rng = np.random.default_rng(1)
    for step in range(1, 8):
        action = rng.uniform(-1.0, 1.0, 14)
        observation = runner.step(action)
        data = runner.robot.data
        trunk = data.xmat[runner.robot.model.body("trunk_base").id].reshape(3, 3)
        # The IMU site sits unrotated on the trunk: gravity is the world's -z in the trunk frame.
        np.testing.assert_allclose(observation[0:3], trunk.T @ [0.0, 0.0, -1.0], atol=1e-9)
        np.testing.assert_allclose(observation[3:6], data.qvel[3:6], atol=1e-9)  # free joint: trunk-frame rate
        np.testing.assert_allclose(observation[6:8], [0.2, 0.0])
        np.testing.assert_allclose(observation[8:22], data.qpos[7:] - key.qpos[7:], atol=1e-12)
        np.testing.assert_allclose(observation[22:36], data.qvel[6:], atol=1e-12)
        # Walking clock: 1.8913 Hz from phase -1.5237, ramp over 0.4 s; t = step x 20 ms (the task
        # stores its frequency in float32, hence the tolerance).
        phase = -1.5237 + 2 * math.pi * 1.8913 * step * 0.02
        clock = [math.sin(phase), math.cos(phase), min(step * 0.05, 1)]
        np.testing.assert_allclose(observation[36:39], clock, rtol=0, atol=1e-6)
        np.testing.assert_allclose(observation[39:53], action)


def test_the_control_law_is_the_envs():
    env = walk_env()
    runner = Sim2Sim(parse_sidecar(sensors_sidecar(env)))
    td = env.reset()
    runner.reset(td["command"][0].numpy(), qpos=env.physics.qpos[0].numpy())
    stand = env.model.key("STAND").ctrl
    # The servos' limits, read off the model: each joint's range (every MicroDuck joint has one).
    joints = env.model.actuator_trnid[:, 0]
    low, high = env.model.jnt_range[joints].T
    action = np.linspace(-1.5, 1.5, 14)
    # At reset the clock's ramp is 0: no prior yet, the clipped action scaled by 0.35 rad.
    expected = np.clip(stand + 0.35 * np.clip(action, -1, 1), low, high)
    assert expected[1] == low[1]  # left hip roll: -0.087 - 0.35 rad is past its -0.384 rad stop
    np.testing.assert_allclose(runner.control(action), expected, atol=1e-12)
    for _ in range(12):
        np.testing.assert_allclose(
            runner.control(action),
            np.clip(stand + env.gait_prior()[0].numpy() + 0.35 * np.clip(action, -1, 1), low, high),
            atol=1e-12,
        )
        td = env.step(td.set("action", torch.zeros(1, 14, dtype=torch.float64)))["next"]
        runner.step(np.zeros(14))
    assert np.abs(env.gait_prior()[0].numpy()).max() > 0.05  # the prior had grown in by then
    env.close()


def test_the_sidecar_describes_the_env_in_its_units():
    env = walk_env(dtype=torch.float32)
    sidecar = sensors_sidecar(env)
    model = env.model
    env.close()
    assert sidecar["joint_names"] == [model.actuator(i).name for i in range(model.nu)]  # actuators name their joints
    np.testing.assert_array_equal(sidecar["stand"]["joint_positions"], model.key("STAND").qpos[7:])
    np.testing.assert_array_equal(sidecar["stand"]["ctrl"], model.key("STAND").ctrl)
    assert sidecar["stand"]["trunk_height"] == 0.12
    assert sidecar["action"]["scale"] == 0.35 and (sidecar["action"]["low"], sidecar["action"]["high"]) == (-1, 1)
    assert sidecar["control"] == {"rate_hz": 50.0, "dt": 0.02, "physics_timestep": 0.002, "substeps": 10}
    fields = {field["name"]: field for field in sidecar["observation"]["fields"]}
    assert sidecar["observation"]["size"] == 53
    assert (fields["gyro"]["start"], fields["gyro"]["size"], fields["gyro"]["unit"]) == (3, 3, "rad/s")
    assert (fields["joint_velocity"]["start"], fields["joint_velocity"]["stop"]) == (22, 36)
    assert all(field["scale"] == 1.0 for field in fields.values())
    (task,) = sidecar["tasks"]
    assert task["command_low"] == task["command_high"] == pytest.approx([0.2, 0.0])
    assert task["gait_prior_lift"] == 0.25 and task["gait_frequency_hz"] == pytest.approx(1.8913)
    assert sidecar["termination"]["min_trunk_height"] == pytest.approx(0.55 * 0.12)
    assert "task_names" not in sidecar


def test_episodes_are_measured_on_mujocos_trunk(deployed):
    sidecar = read_sidecar(deployed / "policy.json")
    runner = Sim2Sim(sidecar)

    def still(observation, task_id):
        return np.zeros(14)

    report = run_episodes(runner, still, episodes=2, max_steps=5, seed=0)
    assert report.episodes == 2 and report.max_steps == 5 and report.command == pytest.approx((0.2, 0.0))
    assert report.survival == 1.0  # five steps of STAND do not topple it
    assert abs(report.mean_forward_speed) < 0.2 and report.yaw_drift_deg < 5.0


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


def test_an_onnx_of_another_width_is_refused_naming_both_widths(deployed, tmp_path):
    write_policy(tmp_path / "full.onnx", 56)
    with pytest.raises(SidecarError) as info:
        OnnxPolicy(tmp_path / "full.onnx", read_sidecar(deployed / "policy.json"))
    message = str(info.value)
    assert "width 56" in message and "53 values" in message and "full.onnx" in message


def test_an_onnx_of_one_frame_against_a_sidecar_of_three_is_refused_naming_the_frames(deployed, tmp_path):
    three = edited(deployed, tmp_path, lambda d: d["observation"].update(history=3))
    with pytest.raises(SidecarError) as info:
        OnnxPolicy(deployed / "policy.onnx", read_sidecar(three))
    message = str(info.value)
    assert "width 53" in message and "3 frames of 53 = 159 values" in message


def test_an_onnx_writing_another_number_of_actions_is_refused(deployed, tmp_path):
    write_policy(tmp_path / "twelve.onnx", 53, action_dim=12)
    with pytest.raises(SidecarError, match="writes 12 actions, but sidecar .* names 14 joints"):
        OnnxPolicy(tmp_path / "twelve.onnx", read_sidecar(deployed / "policy.json"))


def edited(deployed, tmp_path, edit) -> Path:
    data = json.loads((deployed / "policy.json").read_text())
    edit(data)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.pop("gait"), r"lacks \['gait'\]"),
        (lambda d: d["stand"].pop("ctrl"), "lacks stand.ctrl"),
        (lambda d: d["action"].update(scale=-1), "action.scale must be > 0"),
        (lambda d: d["observation"]["fields"].pop(), "cover 39 of the observation's 53 values"),
        (lambda d: d["observation"]["fields"][1].pop("unit"), r"observation.fields\[1\] lacks \['unit'\]"),
        (lambda d: d.update(format="something"), "is not a waddle policy sidecar"),
        (lambda d: d["stand"].update(joint_positions=[0.0] * 3), "stand.joint_positions must be 14 finite numbers"),
        (lambda d: d["observation"].update(history=0), "observation.history must be an integer >= 1, got 0"),
    ],
    ids=["no-gait", "no-stand-ctrl", "negative-scale", "field-missing", "no-unit", "format", "short-pose", "history"],
)
def test_a_sidecar_with_a_missing_or_bad_field_is_refused_by_name(deployed, tmp_path, edit, message):
    with pytest.raises(SidecarError, match=message):
        read_sidecar(edited(deployed, tmp_path, edit))


def test_joint_names_not_in_the_model_are_named(deployed, tmp_path):
    def rename(data):
        data["joint_names"][3] = "left_knee_v2"

    sidecar = read_sidecar(edited(deployed, tmp_path, rename))
    with pytest.raises(SidecarError) as info:
        Sim2Sim(sidecar)
    message = str(info.value)
    assert "['left_knee_v2']" in message and "left_knee" in message and "scene_sensors.xml" in message


def test_a_policy_on_the_full_observation_is_refused_naming_what_no_sensor_gives():
    env = walk_env(dtype=torch.float32)
    sidecar = parse_sidecar(build_sidecar(env, observation_key="observation", inputs=["observation"]))
    env.close()
    with pytest.raises(SidecarError) as info:
        Sim2Sim(sidecar)
    message = str(info.value)
    assert "['angular_velocity', 'body_velocity']" in message and "--actor-observation sensors" in message


def test_an_unknown_task_lists_the_sidecars(deployed):
    with pytest.raises(SidecarError, match=r"task must be one of \['tracking\+0.20'\]"):
        Sim2Sim(read_sidecar(deployed / "policy.json"), task="jump")


def test_a_scene_without_the_sensors_gets_them(deployed):
    scene = SRC / "waddle" / "assets" / "microduck" / "scene.xml"  # IMU sensors only, no encoders
    runner = Sim2Sim(read_sidecar(deployed / "policy.json"), scene=scene)
    assert runner.robot.added_sensors == 28  # a position and a velocity sensor for each of the 14 joints
    observation = runner.reset((0.2, 0.0))
    np.testing.assert_allclose(observation[8:22], 0.0, atol=1e-12)  # the STAND pose, read by the encoders
    assert mujoco.MjModel.from_xml_path(str(scene)).nsensor + 28 == runner.robot.model.nsensor


# ---------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------


def test_the_command_prints_the_report(deployed, capsys):
    from waddle.cli.main import main

    assert main(["sim2sim", str(deployed / "policy.onnx"), "--episodes", "2", "--max-steps", "10"]) == 0
    out = capsys.readouterr().out
    assert "2 episodes of at most 10 steps (0.2 s at 50 Hz), command vx +0.200, vy +0.000 m/s" in out
    assert "survival" in out and "yaw drift" in out


def test_the_command_refuses_a_mismatched_pair_in_one_line(deployed, tmp_path, capsys):
    from waddle.cli.main import main

    write_policy(tmp_path / "full.onnx", 56)
    argv = ["sim2sim", str(tmp_path / "full.onnx"), "--sidecar", str(deployed / "policy.json")]
    assert main(argv) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("waddle sim2sim: error:") and "width 56" in lines[0]
    assert main(["sim2sim", str(tmp_path / "full.onnx")]) == 1  # no full.json beside it
    assert "full.json does not exist" in capsys.readouterr().err


def test_a_multi_task_policy_gets_the_id_of_the_task_asked_for(tmp_path):
    from waddle.cli.export import export_onnx
    from waddle.modules.networks import GaussianPolicy, PolicyMean
    from waddle.modules.normalizer import RunningNormalizer

    tasks = [MicroDuckEnv.standing_task(), MicroDuckEnv.tracking_task(0.2), MicroDuckEnv.jump_task()]
    env = MicroDuckEnv(tasks=tasks, num_envs=1, seed=0)
    names = ["standing", "tracking+0.20", "jump"]
    data = build_sidecar(env, observation_key="sensor_observation", inputs=["observation", "task_id"], task_names=names)
    jump_frequency = float(env.tasks.gait_frequency_hz[2])
    env.close()
    assert data["task_names"] == names and [row["task_id"] for row in data["tasks"]] == [0, 1, 2]
    sidecar = parse_sidecar(data)
    torch.manual_seed(0)
    network = GaussianPolicy(RunningNormalizer(53), 14, (16,), num_tasks=3, task_embedding_dim=4)
    with torch.no_grad():
        network.task_embedding.weight.mul_(50.0)  # tasks far apart: the id visibly changes the action
    export_onnx(PolicyMean(network), 53, tmp_path / "mix.onnx")
    policy = OnnxPolicy(tmp_path / "mix.onnx", sidecar)
    assert policy.task_input == "task_id"
    runner = Sim2Sim(sidecar, task="jump")
    assert runner.task.task_id == 2 and runner.task.gait_frequency_hz == jump_frequency
    observation = runner.reset()
    assert runner.command.tolist() == [0.0, 0.0]  # the jump task's command box is the origin
    actions = {task_id: policy(observation, task_id) for task_id in range(3)}
    with torch.no_grad():
        expected = PolicyMean(network)(torch.from_numpy(observation).float()[None], torch.tensor([[2]]))
    np.testing.assert_allclose(actions[2], expected[0].numpy(), rtol=0, atol=1e-5)
    assert not np.allclose(actions[0], actions[2])


def test_a_command_outside_the_trained_range_is_run_with_a_warning(deployed, capsys):
    from waddle.cli.main import main

    argv = ["sim2sim", str(deployed / "policy.onnx"), "--episodes", "1", "--max-steps", "3", "--command", "0.5", "0"]
    assert main(argv) == 0
    captured = capsys.readouterr()
    assert "command vx +0.500" in captured.out
    assert "outside task 'tracking+0.20''s trained range vx [+0.200, +0.200]" in captured.err
