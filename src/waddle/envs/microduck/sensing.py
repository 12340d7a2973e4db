"""What the robot's IMU and servo encoders read, as the randomization makes them read it.

:class:`Sensors` turns the simulator's state into the readings a policy on the
robot gets: gravity and gyro in the IMU's frame (its mounting tilt drawn per
env), encoder angles off by a drawn bias, readings late by drawn delays, and
uniform noise. It writes the two observations built from them:

* ``"sensor_observation"``: :data:`~waddle.envs.microduck.sensors.SENSOR_FIELDS`,
  ``sensor_history`` frames, newest first;
* ``"robot_observation"``: the daemon's 61 floats
  (:data:`~waddle.envs.microduck.robot.ROBOT_FIELDS`), its joint velocity at
  least one control step old as the servo firmware's is.

    sensors = Sensors(num_envs, randomization, imu_site_rotation, sensor_history=1, ...)
    sensors.adopt(drawn_values, rows)                          # at a reset, after the randomization's draw
    readings = sensors.read(state, reset_rows)                 # at a reset and after every step
    sensors.sensor_observation(readings, command, previous_action, uniform, reset_rows)
    sensors.robot_observation(readings, command, yaw_rate, previous_action, generator)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from waddle.envs.microduck.randomization import DelayLine, MicroDuckRandomization, tilt_rotation
from waddle.envs.microduck.robot import ROBOT_FIELDS, ROBOT_OBSERVATION_DIM
from waddle.envs.microduck.sensors import NOISY_FIELDS, SENSOR_DIM, SENSOR_FIELDS

ROBOT_NOISY_FIELDS: dict[str, str] = {
    "base_ang_vel": "gyro_noise",
    "projected_gravity": "gravity_noise",
    "joint_pos": "joint_position_noise",
    "joint_vel": "joint_velocity_noise",
}
"""Robot observation field -> the randomization attribute holding its noise half-width."""


def delay_line(num_envs: int, width: int, max_delay: int, *, dtype: torch.dtype, device) -> DelayLine | None:
    """A :class:`DelayLine` of ``max_delay`` steps, or ``None`` where nothing is delayed."""
    if max_delay == 0:
        return None
    return DelayLine(num_envs, width, max_delay, dtype=dtype, device=device)


class Sensors:
    """The sensors of ``num_envs`` robots under ``randomization``.

    Args:
        imu_site_rotation: ``(3, 3)`` the IMU site's axes in the trunk frame (columns).
        sensor_history: frames of ``"sensor_observation"``.
        num_joints: the robot's joints.
    """

    def __init__(
        self,
        num_envs: int,
        randomization: MicroDuckRandomization,
        imu_site_rotation: torch.Tensor,
        *,
        sensor_history: int,
        num_joints: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        n, config = num_envs, randomization
        self.dtype, self.device = dtype, device
        self.joint_offset = torch.zeros(n, num_joints, dtype=dtype, device=device)
        """``(num_envs, 14)`` each encoder's bias, rad: it reads the joint's angle plus this."""
        self.imu_site_rotation = imu_site_rotation
        self.imu_rotation = imu_site_rotation.expand(n, 3, 3).clone()
        """``(num_envs, 3, 3)`` the IMU's axes in the trunk frame: its site's, then the drawn mounting tilt."""
        self.imu_line = delay_line(n, 6, config.imu_delay[1], dtype=dtype, device=device)
        self.joint_velocity_line = delay_line(n, num_joints, config.joint_velocity_delay, dtype=dtype, device=device)
        every = torch.ones(n, dtype=torch.bool, device=device)
        if self.joint_velocity_line is not None:
            self.joint_velocity_line.set_delay(torch.full((n,), config.joint_velocity_delay), every)
        # The servo firmware's velocity is one control step old at least.
        robot_lag = max(1, config.joint_velocity_delay)
        self.robot_joint_velocity_line = delay_line(n, num_joints, robot_lag, dtype=dtype, device=device)
        self.robot_joint_velocity_line.set_delay(torch.full((n,), robot_lag), every)
        self.sensor_noise = self._noise_scale(config, SENSOR_DIM, SENSOR_FIELDS, NOISY_FIELDS)
        self.robot_noise = self._noise_scale(config, ROBOT_OBSERVATION_DIM, ROBOT_FIELDS, ROBOT_NOISY_FIELDS)
        self.frames = torch.zeros(n, sensor_history, SENSOR_DIM, dtype=dtype, device=device)
        """``(num_envs, sensor_history, SENSOR_DIM)`` the sensor observation's frames, newest first."""
        self._no_pose_command = torch.zeros(
            1, ROBOT_FIELDS["head_command"].size + ROBOT_FIELDS["body_command"].size, dtype=dtype, device=device
        )

    def _noise_scale(self, config, width, fields, noisy) -> torch.Tensor | None:
        if not config.noisy:
            return None
        scale = torch.zeros(width, dtype=self.dtype, device=self.device)
        for field, attribute in noisy.items():
            scale[fields[field].indices] = getattr(config, attribute)
        return scale

    def adopt(self, values: Mapping[str, torch.Tensor], rows: torch.Tensor) -> None:
        """Take the randomization's drawn ``values`` (every env's, the ``rows`` just drawn): encoder bias, IMU
        tilt, IMU delay."""
        self.joint_offset = values["joint_offset"]
        self.imu_rotation = self.imu_site_rotation @ tilt_rotation(values["imu_tilt"])
        if self.imu_line is not None:
            self.imu_line.set_delay(values["imu_delay"].squeeze(-1), rows)

    def read(
        self, state: Mapping[str, torch.Tensor], home_joints: torch.Tensor, reset_rows: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        """What the IMU and encoders read after a step, or at a reset of ``reset_rows``, before noise.

        ``imu`` is gravity and gyro in the IMU frame, ``joint_position`` the encoder
        angle (its bias included) minus ``home_joints``, ``joint_velocity`` the
        encoder velocity through the randomization's delay, and
        ``robot_joint_velocity`` the same at least one control step old. At a
        reset the delay lines of the reset envs are filled with the current readings.
        """
        qvel = state["qvel"]
        n = qvel.shape[0]
        # Row vectors times the IMU's axes: each reading expressed in the IMU frame.
        body = torch.stack([state["gravity"], qvel[:, 3:6]], dim=1)
        imu = (body @ self.imu_rotation).reshape(n, 6)
        joint_velocity = qvel[:, 6:]
        lines = (
            (self.imu_line, imu),
            (self.joint_velocity_line, joint_velocity),
            (self.robot_joint_velocity_line, joint_velocity),
        )
        delayed = []
        for line, value in lines:
            if line is None:
                delayed.append(value)
            elif reset_rows is None:
                delayed.append(line.push(value))
            else:
                line.fill(value, reset_rows)
                delayed.append(line.read())
        imu, joint_velocity, robot_joint_velocity = delayed
        return {
            "imu": imu,
            "joint_position": state["qpos"][:, 7:] + self.joint_offset - home_joints,
            "joint_velocity": joint_velocity,
            "robot_joint_velocity": robot_joint_velocity,
            "clock": state["clock"],
        }

    def sensor_observation(
        self,
        readings: Mapping[str, torch.Tensor],
        command: torch.Tensor,
        previous_action: torch.Tensor,
        uniform: Callable[..., torch.Tensor],
        reset_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The ``(num_envs, sensor_history * SENSOR_DIM)`` sensor observation; ``uniform(*shape)`` draws the
        noise in [-1, 1). At a reset the history of the reset envs is filled with the current reading and the
        other envs keep the frames they had."""
        n = readings["imu"].shape[0]
        sensor = torch.cat(
            [
                readings["imu"],
                command,
                readings["joint_position"],
                readings["joint_velocity"],
                readings["clock"],
                previous_action,
            ],
            dim=-1,
        )
        if self.sensor_noise is not None:
            sensor = sensor + self.sensor_noise * uniform(n, SENSOR_DIM)
        if reset_rows is not None:
            frames = torch.where(reset_rows.view(n, 1, 1), sensor.unsqueeze(1), self.frames)
        elif self.frames.shape[1] == 1:
            frames = sensor.unsqueeze(1)
        else:
            frames = torch.cat([sensor.unsqueeze(1), self.frames[:, :-1]], dim=1)
        self.frames = frames
        return frames.reshape(n, -1)

    def robot_observation(
        self,
        readings: Mapping[str, torch.Tensor],
        command: torch.Tensor,
        yaw_rate: torch.Tensor,
        previous_action: torch.Tensor,
        generator: torch.Generator | None,
    ) -> torch.Tensor:
        """The robot daemon's 61 floats: gyro, gravity, joints, lagged joint velocities, the previous raw
        action, the twist, and zero head and body commands; noise drawn from ``generator``."""
        n = readings["imu"].shape[0]
        imu = readings["imu"]
        observation = torch.cat(
            [
                imu[:, 3:6],
                imu[:, :3],
                readings["joint_position"],
                readings["robot_joint_velocity"],
                previous_action,
                command,
                yaw_rate.unsqueeze(-1),
                self._no_pose_command.expand(n, -1),
            ],
            dim=-1,
        )
        if self.robot_noise is not None:
            fraction = torch.rand(n, ROBOT_OBSERVATION_DIM, generator=generator, device=self.device)
            observation = observation + self.robot_noise * (2.0 * fraction.to(self.dtype) - 1.0)
        return observation

    def detach(self) -> None:
        """Cut the autograd history the readings carry into the next step."""
        self.frames = self.frames.detach()
        for line in (self.imu_line, self.joint_velocity_line, self.robot_joint_velocity_line):
            if line is not None:
                line.detach()


__all__ = ["ROBOT_NOISY_FIELDS", "Sensors", "delay_line"]
