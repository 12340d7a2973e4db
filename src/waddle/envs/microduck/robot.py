"""What the MicroDuck's own software feeds its policy, and what it does with the answer.

The robot's daemon runs one stateless ONNX graph: 61 raw floats in, 14 out.
:data:`ROBOT_FIELDS` is that input's layout, in the daemon's order and with
its names, and :data:`DEFAULT_JOINT_POS` the pose the actions are offsets from
(upstream's HOME pose). On the robot

    target = DEFAULT_JOINT_POS + action_scale * action

goes to the servos at 50 Hz, nothing clipped and nothing added. An env built
with ``action_mode="robot"`` applies exactly that law and reports this
observation as ``"robot_observation"``; ``waddle export`` writes the metadata
the daemon checks (:func:`robot_metadata`).

=====================  =======  ======  ==============================================================
field                  indices  unit    what
=====================  =======  ======  ==============================================================
``base_ang_vel``       0-2      rad/s   gyro, IMU frame
``projected_gravity``  3-5      1       unit gravity direction, IMU frame
``joint_pos``          6-19     rad     encoder angle minus ``DEFAULT_JOINT_POS``, joint order
``joint_vel``          20-33    rad/s   encoder velocity one control step old (the servo firmware
                                        computes it over the previous sample window)
``actions``            34-47    1       the previous tick's raw network output
``command``            48-50    m/s,    twist: ``vx``, ``vy`` (m/s) and ``vyaw`` (rad/s)
                                rad/s
``head_command``       51-54    rad     neck pitch, head pitch, head yaw, head roll (zeros: not trained)
``body_command``       55-60    m, rad  body x, y, z, roll, pitch, yaw (zeros: not trained)
=====================  =======  ======  ==============================================================

There is no gait clock, no phase and no linear velocity: whatever gait the
policy walks with has to come out of the network and these readings.
"""

from __future__ import annotations

from typing import Any

from waddle.envs.microduck.constants import CONTROL_DT, JOINT_NAMES, NUM_JOINTS
from waddle.envs.microduck.sensors import SensorField, layout

ROBOT_FIELDS: dict[str, SensorField] = layout(
    (
        ("base_ang_vel", 3, "rad/s", "angular velocity of the trunk in the IMU frame (gyro)"),
        ("projected_gravity", 3, "1", "unit gravity direction (0, 0, -1) in the IMU frame, mounting tilt included"),
        ("joint_pos", NUM_JOINTS, "rad", "encoder angle minus default_joint_pos, in joint_names order"),
        ("joint_vel", NUM_JOINTS, "rad/s", "encoder angular velocity one control step old, in joint_names order"),
        ("actions", NUM_JOINTS, "1", "the raw network output of the previous control step"),
        ("command", 3, "m/s, m/s, rad/s", "twist command: vx, vy in the trunk heading frame and yaw rate vyaw"),
        ("head_command", 4, "rad", "neck pitch, head pitch, head yaw, head roll command (zeros when not trained)"),
        ("body_command", 6, "m, rad", "body x, y, z, roll, pitch, yaw command (zeros when not trained)"),
    )
)
"""The robot's observation fields by name, in the daemon's order."""

ROBOT_OBSERVATION_DIM: int = sum(field.size for field in ROBOT_FIELDS.values())
"""Width of ``"robot_observation"`` and of the ONNX graph's input (61)."""

ACTION_DIM: int = NUM_JOINTS
"""Width of the ONNX graph's output (14)."""

DEFAULT_JOINT_POS: tuple[float, ...] = (
    0.0,
    -0.0873,
    -0.4579,
    -0.0049,
    0.4530,
    0.3491,
    0.3491,
    0.0,
    0.0,
    0.0,
    0.0873,
    0.4579,
    0.0049,
    -0.4530,
)
"""Upstream's HOME pose in :data:`~waddle.envs.microduck.constants.JOINT_NAMES` order, radians, as the
robot's daemon holds it. It differs from the embedded STAND keyframe in head pitch (+0.3491 here,
-0.3491 there: STAND looks up and puts the centre of mass behind the ankles) and in the last digits of
the legs (STAND's are rounded differently); the daemon refuses a pose off its own beyond a small
tolerance."""

KP_FIRMWARE: int = 200
"""The servo firmware's position P gain in Dynamixel register units, as upstream's robot sets it."""

CONTROL_HZ: int = round(1.0 / CONTROL_DT)
"""The daemon's control rate; it refuses any other."""

SCHEMA_VERSION: int = 1
"""Version of the ``microduck`` metadata layout written by :func:`robot_metadata`."""

METADATA_KEY: str = "microduck"
"""The ONNX ``metadata_props`` key the daemon reads its JSON from."""

HEADING_MEMORY_LIMIT_RAD: float = 0.4363
"""Largest head-roll target a heading memory sets, radians: the joint's range in the MJCF (25 degrees), so
the servo never presses against its stop. Past it the memory saturates: a heading error above 25 degrees
reads as 25."""

HEADING_MEMORY_LAYOUT: dict[str, float] = {
    "channel": JOINT_NAMES.index("head_roll"),
    "previous_action_start": ROBOT_FIELDS["actions"].start,
    "gyro_index": ROBOT_FIELDS["base_ang_vel"].start + 2,
    "yaw_command_index": ROBOT_FIELDS["command"].start + 2,
    "limit_rad": HEADING_MEMORY_LIMIT_RAD,
}
"""Where a :class:`~waddle.modules.heading_memory.HeadingMemory` of a robot actor reads and writes: the head's
roll carries it, from the previous raw output, the gyro's yaw rate and the yaw-rate command of the robot's
observation. The roll moves no inertia about yaw and hardly shifts the centre of mass. The head's yaw
carried it first; that policy held its heading but walked at 40 % of its command, and one reading (not
tested apart) is that a yaw carrier counter-rotates the head against the trunk at every stride
(docs/deploy.md has both carriers' figures)."""


if len(DEFAULT_JOINT_POS) != NUM_JOINTS or ROBOT_OBSERVATION_DIM != 61:
    raise AssertionError("the robot contract is written for the 14-joint MicroDuck and a 61-float observation.")


def robot_metadata(*, action_scale: float, default_joint_pos: tuple[float, ...] = DEFAULT_JOINT_POS) -> dict[str, Any]:
    """The ``microduck`` metadata object the daemon checks, from the training env's values.

    Example:
        >>> meta = robot_metadata(action_scale=0.7)
        >>> meta["obs_len"], meta["action_len"], meta["control_hz"], meta["observation"][5]
        (61, 14, 50, ['command', 3])
    """
    if len(default_joint_pos) != NUM_JOINTS:
        raise ValueError(f"default_joint_pos must hold {NUM_JOINTS} angles, got {len(default_joint_pos)}.")
    return {
        "schema_version": SCHEMA_VERSION,
        "obs_len": ROBOT_OBSERVATION_DIM,
        "action_len": ACTION_DIM,
        "control_hz": CONTROL_HZ,
        "joint_names": list(JOINT_NAMES),
        "default_joint_pos": [float(value) for value in default_joint_pos],
        "action_scale": float(action_scale),
        "kp_fw": KP_FIRMWARE,
        "observation": [[field.name, field.size] for field in ROBOT_FIELDS.values()],
    }


__all__ = [
    "ACTION_DIM",
    "CONTROL_HZ",
    "DEFAULT_JOINT_POS",
    "HEADING_MEMORY_LAYOUT",
    "HEADING_MEMORY_LIMIT_RAD",
    "KP_FIRMWARE",
    "METADATA_KEY",
    "ROBOT_FIELDS",
    "ROBOT_OBSERVATION_DIM",
    "SCHEMA_VERSION",
    "robot_metadata",
]
