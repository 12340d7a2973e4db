"""``waddle sim2sim``: drive a MicroDuck in MuJoCo from an exported ONNX policy and its sidecar alone.

This is the loop a robot runtime runs, with MuJoCo standing in for the robot.
It imports ``mujoco``, ``numpy`` and (when a policy is run) ``onnxruntime``,
never torch nor waddle's envs: every number it needs comes from the sidecar
(:mod:`waddle.deploy.contract`) and every reading from MuJoCo's own sensors.

* The scene is waddle's MicroDuck with the servo encoders as sensors
  (``assets/microduck/scene_sensors.xml``), or any ``--scene`` with the
  sidecar's joints; sensors it lacks (the IMU's orientation and gyro on the
  sidecar's IMU site, a position and a velocity sensor per joint) are added
  to it before compiling. Sensors do not change the dynamics.
* Each control step (``control.dt``, 50 Hz for MicroDuck) it reads the
  sensors, builds the observation field by field as the sidecar lays it out,
  runs the policy, and holds ``ctrl = stand.ctrl + gait_prior + scale *
  clip(action)`` for the step's physics substeps, each target stopped at its
  joint's range as a servo stops.
* An episode starts in the STAND pose (joints jittered by the task's reset
  noise), at rest, and ends when the trunk falls (the sidecar's termination
  thresholds) or after ``--max-steps``.

It prints the survival over the episodes, the mean forward (and lateral) speed
of the episodes that did not fall against the command, and their yaw drift
(mean and 95th percentile of the absolute heading change over an episode).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from waddle.deploy.contract import (
    SENSOR_FIELD_NAMES,
    GaitClock,
    Sidecar,
    SidecarError,
    TaskRow,
    default_sidecar_path,
    read_sidecar,
)

DEFAULT_SCENE = Path(__file__).resolve().parents[1] / "assets" / "microduck" / "scene_sensors.xml"
"""waddle's MicroDuck scene with a position and a velocity sensor per servo."""

GROUND_TRUTH_FIELDS = {
    "body_velocity": "the trunk's linear velocity",
    "angular_velocity": "the free joint's angular velocity",
}
"""Fields of waddle's full observation that come from the simulator's state rather than from a sensor."""


class MujocoMicroDuck:
    """The simulated robot: a MuJoCo model whose sensors give what the sidecar's observation needs.

    Args:
        sidecar: the policy's sidecar.
        scene: an MJCF file (default :data:`DEFAULT_SCENE`).

    Raises:
        SidecarError: a joint, actuator or the IMU site the sidecar names is not in the model,
            or the control period is not a whole number of physics steps.
    """

    def __init__(self, sidecar: Sidecar, scene: str | Path | None = None) -> None:
        self.sidecar = sidecar
        self.scene = Path(scene) if scene is not None else DEFAULT_SCENE
        if not self.scene.is_file():
            raise SidecarError(f"scene {self.scene} does not exist.")
        spec = mujoco.MjSpec.from_file(str(self.scene))
        model = spec.compile()
        self._check_names(model)
        wanted = self._wanted_sensors(model)
        missing = [key for key in wanted if self._sensor_address(model, *key) is None]
        if missing:
            # A scene without encoder or IMU sensors gets them; the names mark them as ours.
            for sensor_type, object_type, object_id in missing:
                name = mujoco.mj_id2name(model, object_type, object_id)
                spec.add_sensor(
                    name=f"sim2sim_{sensor_type.name.lower()}_{name}",
                    type=sensor_type,
                    objtype=object_type,
                    objname=name,
                )
            model = spec.compile()
        self.model = model
        self.data = mujoco.MjData(model)
        self.added_sensors = len(missing)
        joint_ids = [model.joint(name).id for name in sidecar.joint_names]
        self.qpos_addresses = np.array([model.jnt_qposadr[j] for j in joint_ids])
        self.dof_addresses = np.array([model.jnt_dofadr[j] for j in joint_ids])
        self.actuators = np.array(
            [self._actuator_of(model, j, name) for j, name in zip(joint_ids, sidecar.joint_names)]
        )
        free = [j for j in range(model.njnt) if model.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE]
        if not free:
            raise SidecarError(f"scene {self.scene} has no free joint: the robot's trunk must float.")
        self.free_qpos = int(model.jnt_qposadr[free[0]])
        self.free_dof = int(model.jnt_dofadr[free[0]])
        site = model.site(sidecar.imu_site).id
        site_kind = mujoco.mjtObj.mjOBJ_SITE
        self.orientation = self._sensor_address(model, mujoco.mjtSensor.mjSENS_FRAMEQUAT, site_kind, site)
        self.gyro = self._sensor_address(model, mujoco.mjtSensor.mjSENS_GYRO, site_kind, site)
        joint_kind = mujoco.mjtObj.mjOBJ_JOINT
        self.joint_position = [
            self._sensor_address(model, mujoco.mjtSensor.mjSENS_JOINTPOS, joint_kind, j) for j in joint_ids
        ]
        self.joint_velocity = [
            self._sensor_address(model, mujoco.mjtSensor.mjSENS_JOINTVEL, joint_kind, j) for j in joint_ids
        ]
        substeps = sidecar.control_dt / model.opt.timestep
        if abs(substeps - round(substeps)) > 1e-6:
            raise SidecarError(
                f"control.dt {sidecar.control_dt} s of {sidecar.source} is not a whole number of the scene's "
                f"{model.opt.timestep} s physics steps."
            )
        self.substeps = int(round(substeps))
        limited = model.jnt_limited[joint_ids].astype(bool)
        ranges = model.jnt_range[joint_ids]
        self._limited, self._ranges = limited, ranges

    def place(
        self,
        pose: np.ndarray,
        trunk_height: float,
        *,
        jitter: float = 0.0,
        ctrl: np.ndarray | None = None,
        qpos: np.ndarray | None = None,
        qvel: np.ndarray | None = None,
        rng: np.random.Generator | None = None,
    ) -> None:
        """Stand the robot at rest, its trunk level at ``trunk_height`` and its joints in ``pose`` (jittered
        uniformly by ``jitter`` rad when ``rng`` is given), the servos holding ``ctrl`` (default ``pose``);
        ``qpos`` and ``qvel`` (full MuJoCo vectors) replace that state."""
        model, data = self.model, self.data
        mujoco.mj_resetData(model, data)
        if qpos is None:
            qpos = model.qpos0.copy()
            qpos[self.free_qpos : self.free_qpos + 7] = [0.0, 0.0, trunk_height, 1.0, 0.0, 0.0, 0.0]
            joints = np.array(pose, dtype=np.float64)
            if rng is not None:
                joints += jitter * rng.uniform(-1.0, 1.0, joints.size)
            qpos[self.qpos_addresses] = joints
        data.qpos[:] = qpos
        data.qvel[:] = 0.0 if qvel is None else qvel
        data.ctrl[self.actuators] = pose if ctrl is None else ctrl
        mujoco.mj_forward(model, data)

    def servo_limits(self, default: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The servo targets the joints can take, joint order: each joint's range, or half a turn either
        way from ``default`` for a joint without one."""
        low = np.where(self._limited, self._ranges[:, 0], default - np.pi)
        high = np.where(self._limited, self._ranges[:, 1], default + np.pi)
        return low, high

    def _check_names(self, model: mujoco.MjModel) -> None:
        hinges = [model.joint(j).name for j in range(model.njnt) if model.jnt_type[j] != mujoco.mjtJoint.mjJNT_FREE]
        unknown = [name for name in self.sidecar.joint_names if name not in hinges]
        if unknown:
            raise SidecarError(
                f"sidecar {self.sidecar.source} names joints {unknown} that scene {self.scene} does not have; "
                f"its joints: {hinges}."
            )
        sites = [model.site(s).name for s in range(model.nsite)]
        if self.sidecar.imu_site not in sites:
            raise SidecarError(
                f"sidecar {self.sidecar.source} reads the IMU at site {self.sidecar.imu_site!r}, which scene "
                f"{self.scene} does not have; its sites: {sites}."
            )

    def _wanted_sensors(self, model: mujoco.MjModel) -> list[tuple[mujoco.mjtSensor, mujoco.mjtObj, int]]:
        site = model.site(self.sidecar.imu_site).id
        wanted = [
            (mujoco.mjtSensor.mjSENS_FRAMEQUAT, mujoco.mjtObj.mjOBJ_SITE, site),
            (mujoco.mjtSensor.mjSENS_GYRO, mujoco.mjtObj.mjOBJ_SITE, site),
        ]
        for name in self.sidecar.joint_names:
            joint = model.joint(name).id
            wanted.append((mujoco.mjtSensor.mjSENS_JOINTPOS, mujoco.mjtObj.mjOBJ_JOINT, joint))
            wanted.append((mujoco.mjtSensor.mjSENS_JOINTVEL, mujoco.mjtObj.mjOBJ_JOINT, joint))
        return wanted

    @staticmethod
    def _sensor_address(
        model: mujoco.MjModel, sensor_type: mujoco.mjtSensor, object_type: mujoco.mjtObj, object_id: int
    ) -> int | None:
        for sensor in range(model.nsensor):
            if (
                model.sensor_type[sensor] == sensor_type
                and model.sensor_objtype[sensor] == object_type
                and model.sensor_objid[sensor] == object_id
            ):
                return int(model.sensor_adr[sensor])
        return None

    def _actuator_of(self, model: mujoco.MjModel, joint: int, name: str) -> int:
        for actuator in range(model.nu):
            if (
                model.actuator_trntype[actuator] == mujoco.mjtTrn.mjTRN_JOINT
                and model.actuator_trnid[actuator, 0] == joint
            ):
                return actuator
        raise SidecarError(
            f"scene {self.scene} has no actuator driving joint {name!r} of sidecar {self.sidecar.source}."
        )

    # Readings ---------------------------------------------------------------

    def projected_gravity(self) -> np.ndarray:
        """World ``(0, 0, -1)`` in the IMU frame, from the IMU's orientation sensor."""
        quaternion = self.data.sensordata[self.orientation : self.orientation + 4]
        rotation = np.empty(9)
        mujoco.mju_quat2Mat(rotation, quaternion / np.linalg.norm(quaternion))
        # The IMU-to-world rotation's bottom row is the world z axis in the IMU frame.
        return -rotation.reshape(3, 3)[2]

    def gyro_reading(self) -> np.ndarray:
        return self.data.sensordata[self.gyro : self.gyro + 3].copy()

    def joint_positions(self) -> np.ndarray:
        return np.array([self.data.sensordata[a] for a in self.joint_position])

    def joint_velocities(self) -> np.ndarray:
        return np.array([self.data.sensordata[a] for a in self.joint_velocity])

    # Ground truth, for the report only --------------------------------------

    def trunk_rotation(self) -> np.ndarray:
        rotation = np.empty(9)
        mujoco.mju_quat2Mat(rotation, self.data.qpos[self.free_qpos + 3 : self.free_qpos + 7])
        return rotation.reshape(3, 3)

    def heading(self) -> float:
        """Trunk yaw, rad: the direction of its x axis on the floor."""
        rotation = self.trunk_rotation()
        return math.atan2(rotation[1, 0], rotation[0, 0])

    def body_velocity(self) -> np.ndarray:
        """The trunk's linear velocity in its own frame, m/s (a free joint's is in the world frame)."""
        return self.trunk_rotation().T @ self.data.qvel[self.free_dof : self.free_dof + 3]

    def fallen(self) -> bool:
        height = self.data.qpos[self.free_qpos + 2]
        upright = self.trunk_rotation()[2, 2]
        finite = np.isfinite(self.data.qpos).all() and np.isfinite(self.data.qvel).all()
        return bool(not finite or height < self.sidecar.min_trunk_height or upright < self.sidecar.min_upright)


class Sim2Sim:
    """One robot following the sidecar's control law: reset, observe, step.

    Args:
        sidecar: the policy's sidecar.
        scene: an MJCF file (default :data:`DEFAULT_SCENE`).
        task: the name of the task to run (default: the sidecar's first).

    Raises:
        SidecarError: the sidecar lays out a field no sensor gives, or does not fit the scene.
    """

    def __init__(self, sidecar: Sidecar, *, scene: str | Path | None = None, task: str | None = None) -> None:
        unmeasured = [field.name for field in sidecar.fields if field.name not in SENSOR_FIELD_NAMES]
        if unmeasured:
            truth = [f"{name} ({GROUND_TRUTH_FIELDS[name]})" for name in unmeasured if name in GROUND_TRUTH_FIELDS]
            hint = (
                f"; {', '.join(truth)} come from the simulator, not a sensor: train with --actor-observation sensors"
                if truth
                else ""
            )
            raise SidecarError(
                f"sidecar {sidecar.source} lays out observation fields {unmeasured} that a robot does not measure; "
                f"sim2sim builds {list(SENSOR_FIELD_NAMES)}{hint}."
            )
        self.sidecar = sidecar
        self.robot = MujocoMicroDuck(sidecar, scene)
        self.target_low, self.target_high = self.robot.servo_limits(sidecar.stand_ctrl)
        self.task: TaskRow = sidecar.task(task)
        self.task_id = self.task.task_id
        self.step_count = 0
        self.command = np.zeros(2)
        self.previous_action = np.zeros(sidecar.num_joints)
        self.clock = GaitClock.for_task(sidecar, self.task, self.command)
        self._velocities: deque[np.ndarray] = deque(maxlen=sidecar.joint_velocity_delay + 1)
        self._frames: deque[np.ndarray] = deque(maxlen=sidecar.history)

    def reset(
        self,
        command: Sequence[float] | None = None,
        *,
        qpos: np.ndarray | None = None,
        qvel: np.ndarray | None = None,
        rng: np.random.Generator | None = None,
    ) -> np.ndarray:
        """Start an episode under ``command`` (the task's default by default) and return the first observation.

        The robot stands in the sidecar's STAND pose at rest, its joints jittered
        uniformly by the task's ``joint_reset_noise`` when ``rng`` is given;
        ``qpos`` and ``qvel`` (full MuJoCo vectors) replace that state.
        """
        sidecar, robot = self.sidecar, self.robot
        robot.place(
            sidecar.stand_qpos,
            sidecar.trunk_height,
            jitter=self.task.joint_reset_noise,
            ctrl=sidecar.stand_ctrl,
            qpos=qpos,
            qvel=qvel,
            rng=rng,
        )
        self.command = np.asarray(self.task.default_command if command is None else command, dtype=np.float64)
        self.clock = GaitClock.for_task(sidecar, self.task, self.command)
        self.step_count = 0
        self.previous_action = np.zeros(sidecar.num_joints)
        # A robot at rest has read the same velocity for a while: the delay line starts full of it.
        velocity = robot.joint_velocities()
        self._velocities.clear()
        self._velocities.extend([velocity] * self._velocities.maxlen)
        self._frames.clear()
        self._frames.extend([self._read_frame()] * sidecar.history)
        return self.observation()

    def observation(self) -> np.ndarray:
        """The policy's input now: the sidecar's ``history`` frames, newest first (float64; the policy
        takes it as float32)."""
        return np.concatenate(self._frames)

    def _read_frame(self) -> np.ndarray:
        """One frame of the sidecar's layout, read now."""
        robot = self.robot
        values = {
            "projected_gravity": robot.projected_gravity,
            "gyro": robot.gyro_reading,
            "command": lambda: self.command,
            "joint_position": lambda: robot.joint_positions() - self.sidecar.stand_qpos,
            "joint_velocity": lambda: self._velocities[0],
            "gait_clock": lambda: self.clock.features(self.step_count),
            "previous_action": lambda: self.previous_action,
        }
        observation = np.zeros(self.sidecar.observation_size)
        for field in self.sidecar.fields:
            observation[field.indices] = field.scale * np.asarray(values[field.name](), dtype=np.float64)
        return observation

    def control(self, action: np.ndarray) -> np.ndarray:
        """The servo targets, actuator order, for ``action`` at this step."""
        sidecar = self.sidecar
        clipped = np.clip(np.asarray(action, dtype=np.float64), sidecar.action_low, sidecar.action_high)
        target = sidecar.stand_ctrl + self.clock.prior(self.step_count) + sidecar.action_scale * clipped
        return np.clip(target, self.target_low, self.target_high)  # a servo stops at its joint's range

    def step(self, action: np.ndarray) -> np.ndarray:
        """Hold the targets of ``action`` for one control period; return the next observation."""
        sidecar, robot = self.sidecar, self.robot
        action = np.asarray(action, dtype=np.float64).reshape(-1)
        if action.shape != (sidecar.num_joints,):
            raise ValueError(f"action must have {sidecar.num_joints} values, got shape {action.shape}.")
        robot.data.ctrl[robot.actuators] = self.control(action)
        mujoco.mj_step(robot.model, robot.data, nstep=robot.substeps)
        # mj_step evaluates sensors before integrating; a forward pass makes them describe the new state.
        mujoco.mj_forward(robot.model, robot.data)
        self.step_count += 1
        self.previous_action = np.clip(action, sidecar.action_low, sidecar.action_high)
        self._velocities.append(robot.joint_velocities())
        self._frames.appendleft(self._read_frame())
        return self.observation()


class OnnxPolicy:
    """An exported policy in onnxruntime, checked against its sidecar.

    Raises:
        SidecarError: the graph's observation width or action width is not the sidecar's
            (both widths are named), or the graph wants a task id the sidecar has no tasks for.
    """

    def __init__(self, path: str | Path, sidecar: Sidecar) -> None:
        import onnxruntime

        self.path = Path(path)
        if not self.path.is_file():
            raise SidecarError(f"ONNX policy {self.path} does not exist.")
        try:
            self.session = onnxruntime.InferenceSession(str(self.path), providers=["CPUExecutionProvider"])
        except Exception as err:  # noqa: BLE001 - onnxruntime raises its own exception types for a bad file
            raise SidecarError(f"{self.path} is not an ONNX model onnxruntime can load ({str(err)[:160]}).") from None
        inputs = {node.name: node for node in self.session.get_inputs()}
        observation = inputs.get("observation") or self.session.get_inputs()[0]
        self.observation_name = observation.name
        width = observation.shape[-1]
        if isinstance(width, int) and width != sidecar.input_size:
            frames = f"{sidecar.history} frames of {sidecar.observation_size} = " if sidecar.history > 1 else ""
            raise SidecarError(
                f"ONNX policy {self.path} takes an observation of width {width}, but sidecar {sidecar.source} "
                f"lays out {frames}{sidecar.input_size} values; use the sidecar exported with this policy."
            )
        self.task_input = "task_id" if "task_id" in inputs else None
        output = self.session.get_outputs()[0]
        self.output_name = output.name
        actions = output.shape[-1]
        if isinstance(actions, int) and actions != sidecar.num_joints:
            raise SidecarError(
                f"ONNX policy {self.path} writes {actions} actions, but sidecar {sidecar.source} names "
                f"{sidecar.num_joints} joints."
            )

    def __call__(self, observation: np.ndarray, task_id: int = 0) -> np.ndarray:
        feed = {self.observation_name: observation.reshape(1, -1).astype(np.float32)}
        if self.task_input is not None:
            feed[self.task_input] = np.array([[task_id]], dtype=np.int64)
        (action,) = self.session.run([self.output_name], feed)
        return np.asarray(action, dtype=np.float64).reshape(-1)


@dataclass(frozen=True)
class Sim2SimReport:
    """What ``waddle sim2sim`` prints, over ``episodes`` episodes of at most ``max_steps`` steps."""

    episodes: int
    max_steps: int
    command: tuple[float, ...]
    """``(vx, vy)``, or ``(vx, vy, vyaw)`` for a twist."""
    survival: float
    """Fraction of episodes that did not fall."""
    mean_forward_speed: float
    """Mean over the episodes that did not fall of their mean forward body-frame speed, m/s."""
    mean_lateral_speed: float
    yaw_drift_deg: float
    """Mean over the episodes that did not fall of |heading change| from reset to the end, degrees."""
    yaw_drift_p95_deg: float
    mean_episode_steps: float
    mean_yaw_rate: float = float("nan")
    """Mean over the episodes that did not fall of their heading change over their duration, rad/s."""


def run_episodes(
    runner: Sim2Sim,
    policy: Callable[[np.ndarray, int], np.ndarray],
    *,
    episodes: int,
    max_steps: int,
    command: Sequence[float] | None = None,
    seed: int = 0,
) -> Sim2SimReport:
    """Run ``episodes`` episodes one after the other and measure them."""
    rng = np.random.default_rng(seed)
    fell, speeds, drifts, lengths, turns = [], [], [], [], []
    for _ in range(episodes):
        observation = runner.reset(command, rng=rng)
        heading = runner.robot.heading()
        drift, velocity_sum, steps, fallen = 0.0, np.zeros(2), 0, False
        for _ in range(max_steps):
            observation = runner.step(policy(observation, runner.task_id))
            steps += 1
            velocity_sum += runner.robot.body_velocity()[:2]
            if runner.robot.fallen():
                fallen = True
                break
            new_heading = runner.robot.heading()
            drift += (new_heading - heading + math.pi) % (2.0 * math.pi) - math.pi
            heading = new_heading
        fell.append(fallen)
        lengths.append(steps)
        if not fallen:
            speeds.append(velocity_sum / steps)
            drifts.append(abs(math.degrees(drift)))
            turns.append(drift / (steps * runner.robot.substeps * runner.robot.model.opt.timestep))
    standing = len(speeds)
    nan = float("nan")
    mean_speed = np.mean(speeds, axis=0) if standing else np.array([nan, nan])
    return Sim2SimReport(
        episodes=episodes,
        max_steps=max_steps,
        command=tuple(float(value) for value in runner.command),
        survival=1.0 - float(np.mean(fell)),
        mean_forward_speed=float(mean_speed[0]),
        mean_lateral_speed=float(mean_speed[1]),
        yaw_drift_deg=float(np.mean(drifts)) if standing else nan,
        yaw_drift_p95_deg=float(np.percentile(drifts, 95)) if standing else nan,
        mean_episode_steps=float(np.mean(lengths)),
        mean_yaw_rate=float(np.mean(turns)) if standing else nan,
    )


def format_report(report: Sim2SimReport, control_dt: float) -> str:
    """The report as ``waddle sim2sim`` prints it; speeds and drift read ``-`` when every episode fell."""
    vx, vy = report.command[:2]
    turning = len(report.command) == 3
    seconds = report.max_steps * control_dt
    standing = round(report.survival * report.episodes)
    yaw = f", vyaw {report.command[2]:+.3f} rad/s" if turning else ""
    lines = [
        f"{report.episodes} episodes of at most {report.max_steps} steps ({seconds:.1f} s at {1 / control_dt:.0f} Hz), "
        f"command vx {vx:+.3f}, vy {vy:+.3f} m/s{yaw}",
        f"survival       {100 * report.survival:6.1f} %   ({standing} of {report.episodes} episodes did not fall; "
        f"mean length {report.mean_episode_steps:.0f} steps)",
    ]
    if standing == 0:
        lines.append("forward speed       - (every episode fell)")
        lines.append("yaw drift           -")
        return "\n".join(lines)
    lines += [
        f"forward speed  {report.mean_forward_speed:6.3f} m/s (command {vx:.3f}, "
        f"error {report.mean_forward_speed - vx:+.3f})",
        f"lateral speed  {report.mean_lateral_speed:6.3f} m/s (command {vy:.3f})",
    ]
    if turning and report.command[2] != 0:
        lines.append(f"yaw rate       {report.mean_yaw_rate:6.3f} rad/s (command {report.command[2]:.3f})")
    else:
        lines.append(
            f"yaw drift      {report.yaw_drift_deg:6.1f} deg mean, {report.yaw_drift_p95_deg:.1f} deg p95 over an episode"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "policy",
        metavar="POLICY.onnx",
        help="a policy written by waddle export: a robot policy file (its own metadata) or a graph with its sidecar",
    )
    parser.add_argument(
        "--sidecar", metavar="PATH", help="its sidecar (default: the ONNX path with .json, as waddle export writes it)"
    )
    parser.add_argument("--episodes", type=int, default=16, metavar="N", help="episodes to run (default 16)")
    parser.add_argument(
        "--max-steps", type=int, default=1000, metavar="N", help="control steps per episode (default 1000 = 20 s)"
    )
    parser.add_argument(
        "--command",
        type=float,
        nargs="+",
        metavar="V",
        help="VX VY [VYAW]: the twist in m/s and rad/s (VYAW, for a robot policy file, defaults to 0); "
        "default: the centre of the task's command range, or standing still for a robot policy file",
    )
    parser.add_argument("--task", metavar="NAME", help="task to run, by name (default: the sidecar's first)")
    parser.add_argument(
        "--scene", metavar="XML", help=f"MuJoCo scene (default {DEFAULT_SCENE.name}, waddle's MicroDuck)"
    )
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the reset jitter (default 0)")


def _error(message: str) -> int:
    print(f"waddle sim2sim: error: {message}", file=sys.stderr)
    return 1


def run(args: argparse.Namespace) -> int:
    for flag, value in (("--episodes", args.episodes), ("--max-steps", args.max_steps)):
        if value < 1:
            return _error(f"{flag} must be >= 1, got {value}")
    if args.command is not None:
        from waddle.deploy.daemon import command_problem

        problem = command_problem(args.command)
        if problem is not None:
            return _error(f"--command {problem}")
    if args.sidecar is None:
        try:
            from waddle.deploy.daemon import read_policy_metadata

            robot_file = read_policy_metadata(args.policy) is not None
        except SidecarError as err:
            return _error(str(err))
        if robot_file:
            return _run_robot_file(args)
    if args.command is not None and len(args.command) == 3:
        if args.command[2] != 0:
            return _error(
                "--command: a policy with a sidecar was trained on planar commands (vx, vy); it takes no yaw rate"
            )
        args.command = args.command[:2]
    sidecar_path = Path(args.sidecar) if args.sidecar else default_sidecar_path(args.policy)
    try:
        sidecar = read_sidecar(sidecar_path)
        runner = Sim2Sim(sidecar, scene=args.scene, task=args.task)
        policy = OnnxPolicy(args.policy, sidecar)
    except SidecarError as err:
        return _error(str(err))
    command = runner.task.default_command if args.command is None else tuple(args.command)
    if not runner.task.contains(command):
        low, high = runner.task.command_low, runner.task.command_high
        print(
            f"waddle sim2sim: warning: --command {command[0]:+.3f} {command[1]:+.3f} lies outside task "
            f"{runner.task.name!r}'s trained range vx [{low[0]:+.3f}, {high[0]:+.3f}], vy [{low[1]:+.3f}, "
            f"{high[1]:+.3f}]",
            file=sys.stderr,
        )
    report = run_episodes(
        runner, policy, episodes=args.episodes, max_steps=args.max_steps, command=command, seed=args.seed
    )
    added = f", {runner.robot.added_sensors} sensors added" if runner.robot.added_sensors else ""
    print(
        f"sim2sim: {args.policy} with {sidecar_path} on {runner.robot.scene.name}{added} "
        f"(MuJoCo {mujoco.__version__}), task {runner.task.name}"
    )
    print(format_report(report, sidecar.control_dt))
    return 0


def _run_robot_file(args: argparse.Namespace) -> int:
    """Drive a robot policy file (``microduck`` metadata, no sidecar) as the robot's daemon would."""
    from waddle.deploy.daemon import DaemonLoop, RobotPolicy, parse_policy_file

    if args.task is not None:
        return _error("--task: a robot policy file holds one policy, steered by --command alone")
    try:
        spec = parse_policy_file(args.policy)
        runner = DaemonLoop(spec, scene=args.scene)
        policy = RobotPolicy(args.policy, spec)
    except SidecarError as err:
        return _error(str(err))
    command = tuple(args.command) if args.command is not None else (0.0, 0.0, 0.0)
    report = run_episodes(
        runner, policy, episodes=args.episodes, max_steps=args.max_steps, command=command, seed=args.seed
    )
    print(
        f"sim2sim: {args.policy} as the MicroDuck daemon runs it (obs [1, {spec.obs_len}] -> actions "
        f"[1, {spec.action_len}], action scale {spec.action_scale}) on {runner.robot.scene.name} (MuJoCo "
        f"{mujoco.__version__})"
    )
    print(format_report(report, spec.control_dt))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m waddle.deploy.sim2sim", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
