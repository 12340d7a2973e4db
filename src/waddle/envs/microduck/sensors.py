"""What a real MicroDuck measures on board: the layout of ``"sensor_observation"``.

One table, :data:`SENSOR_FIELDS`, defines the policy input a robot runtime can
rebuild from its own IMU, servo encoders and controller state. The env, the
exporters and any runner outside waddle read the indices from here, so the
layout is written down once.

=====================  =======  ======  ==============================================================
field                  indices  unit    what
=====================  =======  ======  ==============================================================
``projected_gravity``  0-2      1       unit gravity direction in the IMU frame (from its mounting)
``gyro``               3-5      rad/s   angular velocity in the IMU frame
``command``            6-7      m/s     planar ``(vx, vy)`` command of the episode
``joint_position``     8-21     rad     encoder reading minus the STAND keyframe, actuator order
``joint_velocity``     22-35    rad/s   encoder velocity, actuator order (one control step late
                                        on the robot; see ``joint_velocity_delay``)
``gait_clock``         36-38    1       sin and cos of the gait phase, and the 0->1 ramp after reset
``previous_action``    39-52    1       the normalized action the policy sent at the last step
=====================  =======  ======  ==============================================================

Nothing here is ground truth the robot cannot measure: no linear velocity, no
contacts, no trunk height.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from waddle.envs.microduck.constants import NUM_JOINTS


@dataclasses.dataclass(frozen=True)
class SensorField:
    """One named block of the sensor observation.

    Args:
        name: the field's name (a key of :data:`SENSOR_FIELDS`).
        start: index of its first value in the sensor observation.
        size: number of values.
        unit: physical unit of every value (``"1"``: dimensionless).
        description: what the values are and where a robot gets them.
    """

    name: str
    start: int
    size: int
    unit: str
    description: str

    @property
    def stop(self) -> int:
        """One past the index of the field's last value."""
        return self.start + self.size

    @property
    def indices(self) -> slice:
        """The field's ``slice`` of the sensor observation's last dimension."""
        return slice(self.start, self.stop)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description: name, start, stop, size, unit, description."""
        return {
            "name": self.name,
            "start": self.start,
            "stop": self.stop,
            "size": self.size,
            "unit": self.unit,
            "description": self.description,
        }


def layout(rows: tuple[tuple[str, int, str, str], ...]) -> dict[str, SensorField]:
    """Fields laid end to end from ``(name, size, unit, description)`` rows, in order."""
    fields, start = {}, 0
    for name, size, unit, description in rows:
        fields[name] = SensorField(name, start, size, unit, description)
        start += size
    return fields


SENSOR_FIELDS: dict[str, SensorField] = layout(
    (
        (
            "projected_gravity",
            3,
            "1",
            "unit gravity direction (0, 0, -1) in the IMU frame, including its mounting tilt",
        ),
        ("gyro", 3, "rad/s", "angular velocity of the trunk in the IMU frame"),
        ("command", 2, "m/s", "planar (vx, vy) velocity command, trunk heading frame"),
        ("joint_position", NUM_JOINTS, "rad", "encoder angle minus the STAND keyframe, in actuator order"),
        ("joint_velocity", NUM_JOINTS, "rad/s", "encoder angular velocity, in actuator order"),
        ("gait_clock", 3, "1", "sin and cos of the gait phase, then a ramp from 0 to 1 over 0.4 s after reset"),
        ("previous_action", NUM_JOINTS, "1", "the normalized action in [-1, 1] sent at the previous control step"),
    )
)
"""The sensor observation's fields by name, in order; each knows its indices and unit."""

SENSOR_DIM: int = sum(field.size for field in SENSOR_FIELDS.values())
"""Width of the sensor observation (53)."""

OBSERVATION_FIELDS: dict[str, SensorField] = layout(
    (
        ("projected_gravity", 3, "1", "unit gravity direction (0, 0, -1) in the trunk frame"),
        ("angular_velocity", 3, "rad/s", "free-joint angular velocity of the trunk, trunk frame"),
        ("body_velocity", 3, "m/s", "free-joint linear velocity in the trunk frame (simulator ground truth)"),
        ("command", 2, "m/s", "planar (vx, vy) velocity command, trunk heading frame"),
        ("joint_position", NUM_JOINTS, "rad", "joint angle minus the STAND keyframe, in actuator order"),
        ("joint_velocity", NUM_JOINTS, "rad/s", "joint angular velocity, in actuator order"),
        ("gait_clock", 3, "1", "sin and cos of the gait phase, then a ramp from 0 to 1 over 0.4 s after reset"),
        ("previous_action", NUM_JOINTS, "1", "the normalized action in [-1, 1] applied by the previous step"),
    )
)
"""The layout of the env's noise-free ``"observation"`` (56 values, a critic's input), in the same form:
what an exporter writes for a policy that reads it. Its ``body_velocity`` is not measured on the robot."""

NOISY_FIELDS: dict[str, str] = {
    "projected_gravity": "gravity_noise",
    "gyro": "gyro_noise",
    "joint_position": "joint_position_noise",
    "joint_velocity": "joint_velocity_noise",
}
"""Sensor field -> the :class:`~waddle.envs.microduck.randomization.MicroDuckRandomization`
attribute holding the half-width of its uniform noise."""


def sensor_field(name: str) -> SensorField:
    """The field called ``name``; a :class:`ValueError` lists the names when there is none."""
    try:
        return SENSOR_FIELDS[name]
    except KeyError:
        raise ValueError(f"sensor field must be one of {list(SENSOR_FIELDS)}, got {name!r}.") from None


def sensor_layout() -> list[dict[str, Any]]:
    """The layout as a JSON-ready list of :meth:`SensorField.to_dict` rows, in index order."""
    return [field.to_dict() for field in SENSOR_FIELDS.values()]


__all__ = [
    "NOISY_FIELDS",
    "OBSERVATION_FIELDS",
    "SENSOR_DIM",
    "SENSOR_FIELDS",
    "SensorField",
    "layout",
    "sensor_field",
    "sensor_layout",
]
