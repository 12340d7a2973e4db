"""A joystick run with a heading memory exports a file the daemon runs as it is, the memory in its graph."""

from __future__ import annotations

import json
import math

import numpy as np
import onnx
import onnxruntime
import pytest
import torch

from waddle.cli.main import main
from waddle.envs.microduck import MicroDuckEnv

HEAD_ROLL, GYRO_Z, PREVIOUS, YAW_COMMAND = 8, 2, 34, 50  # robot_contract.md's table, by hand
HEAD_ROLL_RANGE = 0.4363  # rad, the MJCF's head_roll range, by hand
TIME_CONSTANT_S, CONTROL_DT = 4.0, 0.02


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    folder = tmp_path_factory.mktemp("memory")
    run = folder / "run"
    argv = ["train", "--task", "joystick", "--out", str(run), "--total-steps", "1024", "--num-envs", "16"]
    argv += ["--gait-prior-fade-steps", "512", "--video-frames", "0", "--no-progress"]
    argv += ["--heading-memory-s", str(TIME_CONSTANT_S)]
    assert main(argv) == 0
    assert main(["export", str(run), "--onnx", str(folder / "policy.onnx"), "--samples", "32"]) == 0
    return folder / "policy.onnx"


def test_the_files_head_roll_is_the_leaky_integral_of_the_unasked_turn(exported):
    """Driven as the daemon drives it (its own output fed back), the file's head-roll action is
    ``exp(-dt/tau) * previous - dt / action_scale * (gyro_z - vyaw)``, computed here from the contract's
    indices and the file's metadata alone; the other 13 actions stay the network's."""
    model = onnx.load(str(exported))
    (entry,) = [prop for prop in model.metadata_props if prop.key == "microduck"]
    scale = json.loads(entry.value)["action_scale"]
    session = onnxruntime.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    env = MicroDuckEnv(
        tasks=[MicroDuckEnv.joystick_task()], num_envs=4, seed=3, action_mode="robot", action_scale=scale
    )
    td = env.reset()
    decay = math.exp(-CONTROL_DT / TIME_CONSTANT_S)
    moved = 0.0
    for _ in range(15):
        rows = td["robot_observation"].numpy().astype(np.float32)
        actions = np.stack([session.run(["actions"], {"obs": row[None]})[0][0] for row in rows])
        expected = decay * rows[:, PREVIOUS + HEAD_ROLL] - CONTROL_DT / scale * (rows[:, GYRO_Z] - rows[:, YAW_COMMAND])
        np.testing.assert_allclose(
            actions[:, HEAD_ROLL],
            np.clip(expected, -HEAD_ROLL_RANGE / scale, HEAD_ROLL_RANGE / scale),
            atol=1e-6,
            rtol=0,
        )
        moved = max(moved, float(np.abs(actions[:, HEAD_ROLL]).max()))
        td = env.step(td.set("action", torch.from_numpy(actions)))["next"]
    env.close()
    assert moved > 1e-3  # the robot turned a little, and the memory holds it


def test_the_daemon_takes_the_memory_file_as_it_is(exported):
    from waddle.deploy.daemon import RobotPolicy, parse_policy_file

    spec = parse_policy_file(exported)  # the daemon's checks: one obs [1, 61], one actions [1, 14], metadata
    policy = RobotPolicy(exported, spec)
    row = np.zeros(61, dtype=np.float32)
    row[GYRO_Z], row[PREVIOUS + HEAD_ROLL] = 0.5, 0.2  # turning left, unasked, with a memory of 0.2
    want = math.exp(-CONTROL_DT / TIME_CONSTANT_S) * 0.2 - CONTROL_DT / spec.action_scale * 0.5
    assert policy(row)[HEAD_ROLL] == pytest.approx(want, abs=1e-6)
