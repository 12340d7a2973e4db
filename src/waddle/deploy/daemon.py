"""The MicroDuck daemon's loop in MuJoCo: a policy file of the robot's contract, driven with nothing beside it.

The robot's daemon loads one ONNX graph, ``obs [1, 61] -> actions [1, 14]``,
whose ``microduck`` metadata gives the joints, the default pose, the action
scale and the observation layout (:mod:`waddle.envs.microduck.robot`). Every
tick (50 Hz) it reads the IMU and the servos, lays out the 61 floats, runs the
graph and sends ``default_joint_pos + action_scale * action`` to the servos.
:class:`DaemonLoop` does the same on waddle's MuJoCo MicroDuck; like
:mod:`waddle.deploy.sim2sim` it imports neither torch nor waddle's envs, and
reads its numbers from the file alone.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from waddle.deploy.contract import SidecarError

METADATA_KEY = "microduck"
"""The ``metadata_props`` key holding the daemon's JSON."""

OBSERVATION_LAYOUT: tuple[tuple[str, int], ...] = (
    ("base_ang_vel", 3),
    ("projected_gravity", 3),
    ("joint_pos", 14),
    ("joint_vel", 14),
    ("actions", 14),
    ("command", 3),
    ("head_command", 4),
    ("body_command", 6),
)
"""The contract's observation, ``[name, width]`` in order, as the daemon checks it."""

IMU_SITE = "imu"
"""The MJCF site of the MicroDuck's IMU."""

STANDING_HEIGHT = 0.12
"""Trunk height of the MicroDuck's standing pose, m."""

MIN_HEIGHT_RATIO = 0.55
MIN_UPRIGHT = 0.35
"""A trunk under this fraction of the standing height, or tilted past this cosine, has fallen (as in training)."""


TWIST_LIMITS: dict[str, float] = {"vx": 0.7, "vy": 0.7, "vyaw": 2.0}
"""The most the MicroDuck's gamepad runtime commands (m/s, m/s, rad/s) once it scales its sticks: a
command past these is nothing the robot is ever asked to do."""


def command_problem(command: Sequence[float]) -> str | None:
    """Why ``command`` (the values of ``--command``) is refused, or ``None``: it must be 2 or 3 finite
    numbers within what the MicroDuck's gamepad ever commands (:data:`TWIST_LIMITS`).

    Example:
        >>> command_problem([9.0, 0.0])
        'vx 9 m/s is beyond what the MicroDuck is ever commanded: |vx| <= 0.7 m/s, |vy| <= 0.7 m/s, |vyaw| <= 2 rad/s'
        >>> command_problem([0.2, 0.0, 0.5]) is None
        True
    """
    values = list(command)
    if len(values) not in (2, 3) or not all(math.isfinite(value) for value in values):
        return f"takes VX VY [VYAW], 2 or 3 finite numbers (m/s, m/s, rad/s); got {values}"
    units = {"vx": "m/s", "vy": "m/s", "vyaw": "rad/s"}
    limits = ", ".join(f"|{name}| <= {limit:g} {units[name]}" for name, limit in TWIST_LIMITS.items())
    for (name, limit), value in zip(TWIST_LIMITS.items(), values):
        if abs(value) > limit:
            return f"{name} {value:g} {units[name]} is beyond what the MicroDuck is ever commanded: {limits}"
    return None


@dataclass(frozen=True)
class RobotPolicyFile:
    """What a robot policy file's metadata says, checked against the contract."""

    source: str
    joint_names: tuple[str, ...]
    default_joint_pos: np.ndarray
    action_scale: float
    control_hz: int
    obs_len: int
    action_len: int

    # What MujocoMicroDuck reads from a sidecar.
    imu_site: str = IMU_SITE
    min_trunk_height: float = MIN_HEIGHT_RATIO * STANDING_HEIGHT
    min_upright: float = MIN_UPRIGHT

    @property
    def control_dt(self) -> float:
        return 1.0 / self.control_hz

    @property
    def num_joints(self) -> int:
        return len(self.joint_names)


def read_policy_metadata(path: str | Path) -> dict | None:
    """The ``microduck`` JSON object of the ONNX file at ``path``, or ``None`` when it has none."""
    import onnxruntime

    path = Path(path)
    if not path.is_file():
        raise SidecarError(f"ONNX policy {path} does not exist.")
    try:
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as err:  # noqa: BLE001 - onnxruntime raises its own exception types for a bad file
        raise SidecarError(f"{path} is not an ONNX model onnxruntime can load ({str(err)[:160]}).") from None
    text = session.get_modelmeta().custom_metadata_map.get(METADATA_KEY)
    if text is None:
        return None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as err:
        raise SidecarError(f"{path}: its {METADATA_KEY!r} metadata is not JSON ({err}).") from None
    if not isinstance(meta, dict):
        raise SidecarError(f"{path}: its {METADATA_KEY!r} metadata must be a JSON object.")
    return meta


def parse_policy_file(path: str | Path) -> RobotPolicyFile:
    """The robot policy file at ``path``, its metadata checked as the daemon checks it.

    Raises:
        SidecarError: no ``microduck`` metadata, or a field the daemon refuses (named in the message).
    """
    meta = read_policy_metadata(path)
    if meta is None:
        raise SidecarError(f"{path} has no {METADATA_KEY!r} metadata: it is not a robot policy file.")
    layout = [tuple(entry) for entry in meta.get("observation", [])]
    checks = {
        "obs_len": (meta.get("obs_len"), 61),
        "action_len": (meta.get("action_len"), 14),
        "control_hz": (meta.get("control_hz"), 50),
        "observation": (layout, list(OBSERVATION_LAYOUT)),
    }
    for field, (got, expected) in checks.items():
        if got != expected:
            raise SidecarError(f"{path}: metadata {field!r} is {got!r}; the daemon runs only {expected!r}.")
    names = meta.get("joint_names")
    pose = meta.get("default_joint_pos")
    if not isinstance(names, list) or len(names) != 14:
        raise SidecarError(f"{path}: metadata 'joint_names' must list 14 joints, got {names!r}.")
    if not isinstance(pose, list) or len(pose) != 14:
        raise SidecarError(f"{path}: metadata 'default_joint_pos' must hold 14 angles, got {pose!r}.")
    scale = meta.get("action_scale")
    if not isinstance(scale, (int, float)) or not scale > 0:
        raise SidecarError(f"{path}: metadata 'action_scale' must be a number > 0, got {scale!r}.")
    return RobotPolicyFile(
        source=str(path),
        joint_names=tuple(names),
        default_joint_pos=np.asarray(pose, dtype=np.float64),
        action_scale=float(scale),
        control_hz=int(meta["control_hz"]),
        obs_len=int(meta["obs_len"]),
        action_len=int(meta["action_len"]),
    )


class RobotPolicy:
    """The file's graph in onnxruntime: ``policy(obs)`` for a ``(61,)`` observation -> ``(14,)`` actions."""

    def __init__(self, path: str | Path, spec: RobotPolicyFile) -> None:
        import onnxruntime

        self.session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        inputs, outputs = self.session.get_inputs(), self.session.get_outputs()
        shapes = ([node.name for node in inputs], [list(inputs[0].shape)], [node.name for node in outputs])
        if shapes != (["obs"], [[1, spec.obs_len]], ["actions"]):
            raise SidecarError(
                f"{path}: the graph must take obs [1, {spec.obs_len}] and return actions; it takes "
                f"{shapes[0]} {shapes[1]} and returns {shapes[2]}."
            )

    def __call__(self, observation: np.ndarray, task_id: int = 0) -> np.ndarray:
        (action,) = self.session.run(["actions"], {"obs": observation.reshape(1, -1).astype(np.float32)})
        return np.asarray(action, dtype=np.float64).reshape(-1)


class DaemonLoop:
    """One simulated MicroDuck run as the daemon runs the robot: reset, observe, step.

    Args:
        spec: the policy file's checked metadata.
        scene: an MJCF file (default: waddle's MicroDuck with its encoders as sensors).
    """

    task_id = 0

    def __init__(self, spec: RobotPolicyFile, *, scene: str | Path | None = None) -> None:
        from waddle.deploy.sim2sim import MujocoMicroDuck

        self.spec = spec
        self.robot = MujocoMicroDuck(spec, scene)  # type: ignore[arg-type]  # it reads the names a sidecar has
        self.command = np.zeros(3)
        self.previous_action = np.zeros(spec.num_joints)
        self._last_velocity = np.zeros(spec.num_joints)
        # The servos' own limits: a target stops at its joint's range.
        self.target_low, self.target_high = self.robot.servo_limits(spec.default_joint_pos)

    def reset(
        self,
        command: Sequence[float] | None = None,
        *,
        qpos: np.ndarray | None = None,
        qvel: np.ndarray | None = None,
        rng: np.random.Generator | None = None,
    ) -> np.ndarray:
        """Stand the robot in the default pose at rest (joints jittered by 0.02 rad when ``rng`` is given)
        under the twist ``command`` ``(vx, vy[, vyaw])``; return the first observation. ``qpos`` and
        ``qvel`` (full MuJoCo vectors) replace that state."""
        spec, robot = self.spec, self.robot
        robot.place(spec.default_joint_pos, STANDING_HEIGHT, jitter=0.02, qpos=qpos, qvel=qvel, rng=rng)
        self.command = twist(command)
        self.previous_action = np.zeros(spec.num_joints)
        self._last_velocity = robot.joint_velocities()
        return self.observation(self._last_velocity)

    def observation(self, joint_velocity: np.ndarray) -> np.ndarray:
        """The 61 floats, with ``joint_velocity`` as the firmware's (one control step old) reading."""
        robot = self.robot
        return np.concatenate(
            [
                robot.gyro_reading(),
                robot.projected_gravity(),
                robot.joint_positions() - self.spec.default_joint_pos,
                joint_velocity,
                self.previous_action,
                self.command,
                np.zeros(10),
            ]
        )

    def control(self, action: np.ndarray) -> np.ndarray:
        """The servo targets for ``action``: ``default_joint_pos + action_scale * action``, where the
        servos take it: within their joints' ranges."""
        target = self.spec.default_joint_pos + self.spec.action_scale * action
        return np.clip(target, self.target_low, self.target_high)

    def step(self, action: np.ndarray) -> np.ndarray:
        """Hold the targets of ``action`` for one control period; return the next observation."""
        robot = self.robot
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (self.spec.num_joints,):
            raise ValueError(f"action must have {self.spec.num_joints} values, got shape {action.shape}.")
        robot.data.ctrl[robot.actuators] = self.control(action)
        mujoco.mj_step(robot.model, robot.data, nstep=robot.substeps)
        mujoco.mj_forward(robot.model, robot.data)
        self.previous_action = action
        lagged, self._last_velocity = self._last_velocity, robot.joint_velocities()
        return self.observation(lagged)


def twist(command: Sequence[float] | None) -> np.ndarray:
    """``(vx, vy)`` or ``(vx, vy, vyaw)`` as a 3-vector (no yaw rate: 0); ``None`` is standing still.

    Raises:
        ValueError: not 2 or 3 finite numbers.
    """
    if command is None:
        return np.zeros(3)
    values = np.asarray(command, dtype=np.float64).reshape(-1)
    if values.size not in (2, 3) or not np.isfinite(values).all():
        raise ValueError(f"a command is 2 or 3 finite numbers (vx vy [vyaw]), got {list(command)!r}.")
    return np.concatenate([values, np.zeros(3 - values.size)])
