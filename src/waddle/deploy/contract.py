"""The sidecar ``waddle export`` writes beside an ONNX policy, read back with numpy alone.

A robot runtime needs more than the graph: which joint each action drives,
the pose the actions are offsets from, their scale, the control rate, the
layout of the observation, the commands the policy was trained on and the
gait clock it expects. ``waddle export`` writes all of it to a JSON file
(``policy.onnx`` -> ``policy.json``); :func:`read_sidecar` parses and checks
it, and :class:`GaitClock` computes the clock features and the gait prior the
way the training env did. This module imports neither torch nor waddle's
envs: it is what a runtime outside waddle would implement.

The control law at step ``k`` (``t = k * dt`` seconds after a reset)::

    observation_k = layout(projected gravity, gyro, command, joint positions - STAND,
                           joint velocities, clock(t), previous action)
    action_k      = policy(observation_k)                      # normaliser inside
    ctrl_k        = stand.ctrl + gait_prior(t) + action.scale * clip(action_k, low, high)
                    # each target stopped at its joint's range, as a servo stops

with ``ctrl`` in actuator order (``joint_names``), held for ``control.dt``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "waddle-policy-sidecar"
"""The marker every sidecar carries under ``"format"``."""
VERSION = 1
"""The sidecar layout version this module writes and reads."""

REQUIRED_FIELDS: tuple[str, ...] = (
    "format",
    "version",
    "joint_names",
    "stand",
    "action",
    "control",
    "observation",
    "imu",
    "gait",
    "tasks",
    "latency",
    "termination",
)
"""Top-level entries every sidecar must have."""

SENSOR_FIELD_NAMES: tuple[str, ...] = (
    "projected_gravity",
    "gyro",
    "command",
    "joint_position",
    "joint_velocity",
    "gait_clock",
    "previous_action",
)
"""The observation fields a runtime can compute on the robot (IMU, encoders, its own state)."""


class SidecarError(ValueError):
    """A sidecar is missing, malformed, or does not fit the policy or the model it is used with."""


@dataclass(frozen=True)
class ObservationField:
    """One block of the policy's observation vector."""

    name: str
    """What the values are (see :data:`SENSOR_FIELD_NAMES`)."""
    start: int
    """Index of the first value."""
    size: int
    """Number of values."""
    unit: str
    """Physical unit of the values before ``scale`` (``"1"``: dimensionless)."""
    scale: float
    """The policy is fed ``scale * value``."""

    @property
    def indices(self) -> slice:
        return slice(self.start, self.start + self.size)


@dataclass(frozen=True)
class TaskRow:
    """One task the policy was trained on: its command box and gait clock."""

    name: str
    task_id: int
    command_low: tuple[float, float]
    command_high: tuple[float, float]
    gait_frequency_hz: float
    gait_frequency_per_mps: float
    gait_prior_lift: float
    gait_prior_stride_per_mps: float
    joint_reset_noise: float

    def contains(self, command: Sequence[float]) -> bool:
        """Whether ``command`` lies in the task's box (to within 1e-6 m/s)."""
        return all(lo - 1e-6 <= c <= hi + 1e-6 for c, lo, hi in zip(command, self.command_low, self.command_high))

    @property
    def default_command(self) -> tuple[float, float]:
        """The centre of the command box."""
        return tuple((lo + hi) / 2.0 for lo, hi in zip(self.command_low, self.command_high))  # type: ignore[return-value]


@dataclass(frozen=True)
class Sidecar:
    """A parsed, checked sidecar (see :func:`read_sidecar`)."""

    source: str
    """Where it was read from, for messages."""
    joint_names: tuple[str, ...]
    """Actuated joints in actuator (action) order."""
    stand_qpos: np.ndarray
    """Joint angles of the STAND pose, rad, actuator order."""
    stand_ctrl: np.ndarray
    """Servo targets of the STAND pose, rad, actuator order."""
    trunk_height: float
    """Trunk height of the STAND pose, m."""
    action_scale: float
    """Radians of servo target per unit of action."""
    action_low: float
    action_high: float
    control_dt: float
    """Seconds between two policy steps."""
    observation_key: str
    """Which waddle observation the layout is (``"sensor_observation"`` or ``"observation"``)."""
    observation_size: int
    """Values of one frame of the layout."""
    fields: tuple[ObservationField, ...]
    imu_site: str
    """The MJCF site of the IMU the gravity and gyro are read at."""
    gait_phase_offset: float
    gait_ramp_duration_s: float
    swing_lift_left: np.ndarray
    swing_lift_right: np.ndarray
    stride: np.ndarray
    tasks: tuple[TaskRow, ...]
    joint_velocity_delay: int
    """Control steps by which the joint velocity the policy reads lags (the robot's is one step late)."""
    min_trunk_height: float
    min_upright: float
    inputs: tuple[str, ...]
    """The ONNX graph's input names, in order."""
    raw: Mapping[str, Any]
    history: int = 1
    """Frames of the layout the policy reads, newest first (``observation.history``; 1 when absent)."""

    @property
    def num_joints(self) -> int:
        return len(self.joint_names)

    @property
    def input_size(self) -> int:
        """Width of the policy's observation input: ``history`` frames of ``observation_size`` values."""
        return self.observation_size * self.history

    def field(self, name: str) -> ObservationField | None:
        return next((field for field in self.fields if field.name == name), None)

    def task(self, name: str | None = None) -> TaskRow:
        """The task called ``name``; the only task, or the first, when ``name`` is ``None``."""
        if name is None:
            return self.tasks[0]
        for row in self.tasks:
            if row.name == name:
                return row
        raise SidecarError(
            f"task must be one of {[row.name for row in self.tasks]} (from {self.source}), got {name!r}."
        )


def default_sidecar_path(onnx_path: str | Path) -> Path:
    """Where ``waddle export`` puts the sidecar of ``onnx_path``: the same name with ``.json``."""
    return Path(onnx_path).with_suffix(".json")


def read_sidecar(path: str | Path) -> Sidecar:
    """Read and check the sidecar at ``path``.

    Raises:
        SidecarError: the file is missing or not JSON, or an entry is missing or malformed
            (the message names it).
    """
    path = Path(path)
    if not path.is_file():
        raise SidecarError(f"sidecar {path} does not exist; waddle export writes it beside the ONNX file.")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SidecarError(f"sidecar {path} is not a JSON file ({str(err).splitlines()[0]}).") from None
    return parse_sidecar(data, source=str(path))


def parse_sidecar(data: Any, *, source: str = "<sidecar>") -> Sidecar:
    """Check a sidecar already parsed from JSON; see :func:`read_sidecar`."""
    if not isinstance(data, Mapping):
        raise SidecarError(f"sidecar {source} must hold a JSON object, got {type(data).__name__}.")
    missing = [name for name in REQUIRED_FIELDS if name not in data]
    if missing:
        raise SidecarError(f"sidecar {source} lacks {missing}; a sidecar has {list(REQUIRED_FIELDS)}.")
    if data["format"] != FORMAT:
        raise SidecarError(f"{source} is not a waddle policy sidecar (format {data['format']!r}, expected {FORMAT!r}).")
    if data["version"] != VERSION:
        raise SidecarError(f"sidecar {source} has version {data['version']!r}; this reader takes version {VERSION}.")

    def entry(section: str, name: str) -> Any:
        block = data[section]
        if not isinstance(block, Mapping) or name not in block:
            raise SidecarError(f"sidecar {source} lacks {section}.{name}.")
        return block[name]

    def number(section: str, name: str, *, positive: bool = False) -> float:
        value = entry(section, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise SidecarError(f"sidecar {source}: {section}.{name} must be a finite number, got {value!r}.")
        if positive and value <= 0:
            raise SidecarError(f"sidecar {source}: {section}.{name} must be > 0, got {value!r}.")
        return float(value)

    joint_names = data["joint_names"]
    if not isinstance(joint_names, list) or not joint_names or not all(isinstance(n, str) for n in joint_names):
        raise SidecarError(f"sidecar {source}: joint_names must be a non-empty list of joint names.")
    num_joints = len(joint_names)

    def vector(section: str, name: str, size: int = num_joints) -> np.ndarray:
        value = entry(section, name)
        try:
            array = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError):
            array = None
        if array is None or array.shape != (size,) or not np.isfinite(array).all():
            raise SidecarError(f"sidecar {source}: {section}.{name} must be {size} finite numbers, got {value!r}.")
        return array

    fields = _fields(data["observation"], source)
    size = int(number("observation", "size", positive=True))
    end = max(field.start + field.size for field in fields)
    if end > size:
        raise SidecarError(
            f"sidecar {source}: observation fields reach index {end - 1} but observation.size is {size}."
        )
    covered = sum(field.size for field in fields)
    if covered != size:
        raise SidecarError(
            f"sidecar {source}: observation fields cover {covered} of the observation's {size} values; "
            "every index needs a field."
        )
    for field, width in (
        ("joint_position", num_joints),
        ("joint_velocity", num_joints),
        ("previous_action", num_joints),
    ):
        found = next((f for f in fields if f.name == field), None)
        if found is not None and found.size != width:
            raise SidecarError(
                f"sidecar {source}: observation field {field!r} has {found.size} values for {num_joints} joints."
            )

    history = data["observation"].get("history", 1)
    if isinstance(history, bool) or not isinstance(history, int) or history < 1:
        raise SidecarError(f"sidecar {source}: observation.history must be an integer >= 1, got {history!r}.")

    tasks = data["tasks"]
    if not isinstance(tasks, list) or not tasks:
        raise SidecarError(f"sidecar {source}: tasks must be a non-empty list of task rows.")
    rows = tuple(_task_row(row, index, source) for index, row in enumerate(tasks))
    latency = data["latency"]
    delay = latency.get("joint_velocity_steps", 0) if isinstance(latency, Mapping) else None
    if isinstance(delay, bool) or not isinstance(delay, int) or delay < 0:
        raise SidecarError(f"sidecar {source}: latency.joint_velocity_steps must be an integer >= 0, got {delay!r}.")
    inputs = data.get("inputs", ["observation"])
    return Sidecar(
        source=source,
        joint_names=tuple(joint_names),
        stand_qpos=vector("stand", "joint_positions"),
        stand_ctrl=vector("stand", "ctrl"),
        trunk_height=number("stand", "trunk_height", positive=True),
        action_scale=number("action", "scale", positive=True),
        action_low=number("action", "low"),
        action_high=number("action", "high"),
        control_dt=number("control", "dt", positive=True),
        observation_key=str(entry("observation", "key")),
        observation_size=size,
        fields=fields,
        imu_site=str(entry("imu", "site")),
        gait_phase_offset=number("gait", "phase_offset"),
        gait_ramp_duration_s=number("gait", "ramp_duration_s", positive=True),
        swing_lift_left=vector("gait", "swing_lift_left"),
        swing_lift_right=vector("gait", "swing_lift_right"),
        stride=vector("gait", "stride"),
        tasks=rows,
        joint_velocity_delay=delay,
        min_trunk_height=number("termination", "min_trunk_height"),
        min_upright=number("termination", "min_upright"),
        inputs=tuple(str(name) for name in inputs),
        raw=data,
        history=history,
    )


def _fields(block: Any, source: str) -> tuple[ObservationField, ...]:
    items = block.get("fields") if isinstance(block, Mapping) else None
    if not isinstance(items, list) or not items:
        raise SidecarError(f"sidecar {source} lacks observation.fields (a list of {{name, start, size, ...}}).")
    fields = []
    for index, item in enumerate(items):
        missing = [
            key
            for key in ("name", "start", "size", "unit", "scale")
            if not isinstance(item, Mapping) or key not in item
        ]
        if missing:
            raise SidecarError(f"sidecar {source}: observation.fields[{index}] lacks {missing}.")
        start, size, scale = item["start"], item["size"], item["scale"]
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (start, size)) or start < 0 or size < 1:
            raise SidecarError(
                f"sidecar {source}: observation field {item['name']!r} needs integer start >= 0 and size >= 1, "
                f"got start={start!r}, size={size!r}."
            )
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise SidecarError(f"sidecar {source}: observation field {item['name']!r} has scale {scale!r}.")
        fields.append(ObservationField(str(item["name"]), start, size, str(item["unit"]), float(scale)))
    taken: dict[int, str] = {}
    for field in fields:
        for index in range(field.start, field.start + field.size):
            if index in taken:
                raise SidecarError(
                    f"sidecar {source}: observation fields {taken[index]!r} and {field.name!r} overlap at index {index}."
                )
            taken[index] = field.name
    return tuple(fields)


def _task_row(row: Any, index: int, source: str) -> TaskRow:
    keys = (
        "name",
        "command_low",
        "command_high",
        "gait_frequency_hz",
        "gait_frequency_per_mps",
        "gait_prior_lift",
        "gait_prior_stride_per_mps",
    )
    missing = [key for key in keys if not isinstance(row, Mapping) or key not in row]
    if missing:
        raise SidecarError(f"sidecar {source}: tasks[{index}] lacks {missing}.")
    try:
        low = tuple(float(v) for v in row["command_low"])
        high = tuple(float(v) for v in row["command_high"])
        numbers = {key: float(row[key]) for key in keys[3:]}
        noise = float(row.get("joint_reset_noise", 0.0))
    except (TypeError, ValueError):
        raise SidecarError(f"sidecar {source}: tasks[{index}] holds a value that is not a number.") from None
    if len(low) != 2 or len(high) != 2:
        raise SidecarError(f"sidecar {source}: tasks[{index}] command_low/high must be (vx, vy) pairs.")
    return TaskRow(
        name=str(row["name"]),
        task_id=int(row.get("task_id", index)),
        command_low=low,  # type: ignore[arg-type]
        command_high=high,  # type: ignore[arg-type]
        joint_reset_noise=noise,
        **numbers,
    )


class GaitClock:
    """The gait clock and gait prior of one task under one command, as the training env computes them.

    At ``step`` control steps after a reset (``t = step * dt``)::

        frequency = gait_frequency_hz + gait_frequency_per_mps * |command|
        phase     = phase_offset + 2 pi frequency t
        ramp      = min(t / ramp_duration_s, 1)
        clock     = (sin phase, cos phase, ramp)

    and the prior (a residual the action corrects; zero for tasks without one)::

        swing = sin(phase), negated for a backward command
        prior = lift ramp (max(swing, 0) swing_lift_left + max(-swing, 0) swing_lift_right)
              + stride_per_mps vx cos(phase) ramp stride

    Example:
        >>> clock = GaitClock(phase_offset=0.0, ramp_duration_s=0.4, dt=0.02, frequency_hz=1.5,
        ...                   frequency_per_mps=5.0, command=(0.2, 0.0))  # 1.5 + 5 x 0.2 = 2.5 Hz
        >>> [round(v, 6) for v in clock.features(5).tolist()]  # t = 0.1 s: a quarter turn, a quarter of the ramp
        [1.0, 0.0, 0.25]
    """

    def __init__(
        self,
        *,
        phase_offset: float,
        ramp_duration_s: float,
        dt: float,
        frequency_hz: float,
        frequency_per_mps: float,
        command: Sequence[float],
        lift: float = 0.0,
        stride_per_mps: float = 0.0,
        swing_lift_left: np.ndarray | None = None,
        swing_lift_right: np.ndarray | None = None,
        stride: np.ndarray | None = None,
    ) -> None:
        self.phase_offset = float(phase_offset)
        self.ramp_duration_s = float(ramp_duration_s)
        self.dt = float(dt)
        self.command = np.asarray(command, dtype=np.float64)
        self.frequency_hz = float(frequency_hz) + float(frequency_per_mps) * float(np.linalg.norm(self.command))
        self.lift = float(lift)
        self.stride_per_mps = float(stride_per_mps)
        self.swing_lift_left = swing_lift_left
        self.swing_lift_right = swing_lift_right
        self.stride = stride

    @classmethod
    def for_task(cls, sidecar: Sidecar, task: TaskRow, command: Sequence[float]) -> GaitClock:
        return cls(
            phase_offset=sidecar.gait_phase_offset,
            ramp_duration_s=sidecar.gait_ramp_duration_s,
            dt=sidecar.control_dt,
            frequency_hz=task.gait_frequency_hz,
            frequency_per_mps=task.gait_frequency_per_mps,
            command=command,
            lift=task.gait_prior_lift,
            stride_per_mps=task.gait_prior_stride_per_mps,
            swing_lift_left=sidecar.swing_lift_left,
            swing_lift_right=sidecar.swing_lift_right,
            stride=sidecar.stride,
        )

    def phase_and_ramp(self, step: int) -> tuple[float, float]:
        elapsed = step * self.dt
        phase = self.phase_offset + 2.0 * math.pi * self.frequency_hz * elapsed
        return phase, min(elapsed / self.ramp_duration_s, 1.0)

    def features(self, step: int) -> np.ndarray:
        """``(sin phase, cos phase, ramp)`` at ``step``."""
        phase, ramp = self.phase_and_ramp(step)
        return np.array([math.sin(phase), math.cos(phase), ramp])

    def prior(self, step: int) -> np.ndarray:
        """The servo-target offset, rad, the gait prior adds at ``step`` (zeros without a prior)."""
        if self.swing_lift_left is None or self.swing_lift_right is None or self.stride is None:
            raise ValueError("GaitClock.prior needs the swing_lift_left, swing_lift_right and stride patterns.")
        phase, ramp = self.phase_and_ramp(step)
        direction = -1.0 if self.command[0] < 0 else 1.0
        swing = direction * math.sin(phase)
        lift = self.lift * ramp
        stride = self.stride_per_mps * float(self.command[0]) * math.cos(phase) * ramp
        return (
            max(swing, 0.0) * lift * self.swing_lift_left
            + max(-swing, 0.0) * lift * self.swing_lift_right
            + stride * self.stride
        )


__all__ = [
    "FORMAT",
    "REQUIRED_FIELDS",
    "SENSOR_FIELD_NAMES",
    "VERSION",
    "GaitClock",
    "ObservationField",
    "Sidecar",
    "SidecarError",
    "TaskRow",
    "default_sidecar_path",
    "parse_sidecar",
    "read_sidecar",
]
