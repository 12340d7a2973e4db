"""Sensors on its own: readings, bias, tilt, lag and frames worked out by hand."""

from __future__ import annotations

import dataclasses
import math

import torch

from waddle.envs.microduck import MicroDuckRandomization
from waddle.envs.microduck.randomization import nominal_values

N, J = 2, 14


def sensors(history=1, **fields):
    from waddle.envs.microduck.sensing import Sensors

    config = dataclasses.replace(MicroDuckRandomization.preset("none"), **fields)
    return Sensors(
        N,
        config,
        torch.eye(3, dtype=torch.float64),
        sensor_history=history,
        num_joints=J,
        dtype=torch.float64,
        device="cpu",
    )


def state(gravity, gyro, joints, joint_velocity):
    qpos = torch.zeros(N, 7 + J, dtype=torch.float64)
    qpos[:, 7:] = joints
    qvel = torch.zeros(N, 6 + J, dtype=torch.float64)
    qvel[:, 3:6], qvel[:, 6:] = gyro, joint_velocity
    clock = torch.zeros(N, 3, dtype=torch.float64)
    return {
        "qpos": qpos,
        "qvel": qvel,
        "gravity": torch.as_tensor(gravity, dtype=torch.float64).expand(N, 3),
        "clock": clock,
    }


def test_the_imu_reads_in_its_tilted_frame_and_the_encoders_with_their_bias():
    sense = sensors()
    values = nominal_values(N, 1, dtype=torch.float64, device="cpu")
    values["imu_tilt"] = torch.tensor([[0.0, 0.0], [0.1, 0.0]], dtype=torch.float64)  # env 1: 0.1 rad about x
    values["joint_offset"] = torch.full((N, J), 0.02, dtype=torch.float64)
    sense.adopt(values, torch.ones(N, dtype=torch.bool))
    home = torch.full((J,), 0.5, dtype=torch.float64)
    readings = sense.read(state([0.0, 0.0, -1.0], torch.zeros(3), 0.75, 0.0), home)
    # Gravity (0, 0, -1) seen from axes rotated 0.1 rad about x: (0, -sin 0.1, -cos 0.1).
    torch.testing.assert_close(readings["imu"][0, :3], torch.tensor([0.0, 0.0, -1.0], dtype=torch.float64))
    expected = torch.tensor([0.0, -math.sin(0.1), -math.cos(0.1)], dtype=torch.float64)
    torch.testing.assert_close(readings["imu"][1, :3], expected)
    torch.testing.assert_close(readings["joint_position"], torch.full((N, J), 0.27, dtype=torch.float64))


def test_the_robot_observation_is_the_contracts_layout_with_the_joint_velocity_a_step_old():
    sense = sensors()
    home = torch.zeros(J, dtype=torch.float64)
    reset = torch.ones(N, dtype=torch.bool)
    sense.read(state([0.0, 0.0, -1.0], torch.zeros(3), 0.0, 1.0), home, reset)  # the lag is filled with 1.0
    readings = sense.read(state([0.0, 0.0, -1.0], torch.tensor([0.1, 0.2, 0.3]), 0.1, 2.0), home)
    command, yaw_rate = (
        torch.tensor([[0.2, -0.1]] * N, dtype=torch.float64),
        torch.tensor([0.5] * N, dtype=torch.float64),
    )
    previous = torch.full((N, J), -0.3, dtype=torch.float64)
    observation = sense.robot_observation(readings, command, yaw_rate, previous, torch.Generator())
    expected = torch.cat(
        [
            torch.tensor([0.1, 0.2, 0.3, 0.0, 0.0, -1.0]),
            torch.full((J,), 0.1),
            torch.full((J,), 1.0),
            torch.full((J,), -0.3),
            torch.tensor([0.2, -0.1, 0.5]),
            torch.zeros(10),
        ]
    ).double()
    assert observation.shape == (N, 61)
    torch.testing.assert_close(observation[0], expected)
    assert readings["joint_velocity"].eq(2.0).all()  # the sensor observation's own velocity is not delayed here


def test_the_sensor_frames_are_newest_first_and_a_reset_fills_them():
    sense = sensors(history=3)
    home = torch.zeros(J, dtype=torch.float64)
    no_noise = lambda *shape: torch.zeros(*shape, dtype=torch.float64)  # noqa: E731
    command, previous = torch.zeros(N, 2, dtype=torch.float64), torch.zeros(N, J, dtype=torch.float64)
    reset = torch.ones(N, dtype=torch.bool)
    first = sense.sensor_observation(
        sense.read(state([0, 0, -1.0], torch.zeros(3), 1.0, 0.0), home, reset), command, previous, no_noise, reset
    )
    joints = slice(8, 22)
    assert [float(first[0, k * 53 + 8]) for k in range(3)] == [1.0, 1.0, 1.0]
    for angle in (2.0, 3.0):
        frames = sense.sensor_observation(
            sense.read(state([0, 0, -1.0], torch.zeros(3), angle, 0.0), home), command, previous, no_noise
        )
    assert [float(frames[0, k * 53 + 8]) for k in range(3)] == [3.0, 2.0, 1.0]
    assert frames.reshape(N, 3, 53)[:, 0, joints].eq(3.0).all()
