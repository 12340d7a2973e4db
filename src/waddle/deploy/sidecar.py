"""Writing the deployment sidecar of an exported MicroDuck policy (the reading side is
:mod:`waddle.deploy.contract`, which needs no torch).

Every value is read from the env the policy was trained in (its model, task
library, randomization and constants), so the sidecar describes that env and
nothing else: a runtime that follows it feeds the policy what training fed it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import mujoco

from waddle.deploy.contract import FORMAT, VERSION
from waddle.envs.microduck import constants
from waddle.envs.microduck.sensors import OBSERVATION_FIELDS, SENSOR_FIELDS
from waddle.files import atomic_write

LAYOUTS = {"sensor_observation": SENSOR_FIELDS, "observation": OBSERVATION_FIELDS}
"""Observation entry a policy reads -> its field table."""

CONTROL_LAW = "ctrl = stand.ctrl + gait_prior(t) + action.scale * clip(action, action.low, action.high)"
PHASE = "phase = gait.phase_offset + 2 pi (task.gait_frequency_hz + task.gait_frequency_per_mps |command|) t"
RAMP = "ramp = min(t / gait.ramp_duration_s, 1)"
CLOCK = "gait_clock = (sin(phase), cos(phase), ramp), t = control steps since reset * control.dt"
PRIOR = (
    "swing = sin(phase) (negated when command vx < 0); gait_prior = task.gait_prior_lift ramp "
    "(max(swing, 0) gait.swing_lift_left + max(-swing, 0) gait.swing_lift_right) "
    "+ task.gait_prior_stride_per_mps vx cos(phase) ramp gait.stride"
)

FRAMES = (
    "the policy input is `history` frames of `size` values laid end to end, newest first: values "
    "k size .. (k + 1) size - 1 are the frame read k control steps ago; at the first step of an episode "
    "every frame is the first reading"
)


def _actuated_joints(model: mujoco.MjModel) -> list[str]:
    """The joint each actuator drives, in actuator order."""
    names = []
    for actuator in range(model.nu):
        if model.actuator_trntype[actuator] != mujoco.mjtTrn.mjTRN_JOINT:
            raise ValueError(f"actuator {model.actuator(actuator).name!r} does not drive a joint.")
        names.append(model.joint(model.actuator_trnid[actuator, 0]).name)
    return names


def _floats(values: Any) -> list[float]:
    return [float(v) for v in values]


def build_sidecar(
    env: Any,
    *,
    observation_key: str,
    inputs: Sequence[str],
    task_names: Sequence[str] | None = None,
    training: Mapping[str, Any] | None = None,
    onnx_file: str | None = None,
) -> dict[str, Any]:
    """The sidecar of a policy that reads ``observation_key`` of ``env`` (a MicroDuckEnv).

    Args:
        env: the training env, or one built like it (same task library and randomization).
        observation_key: ``"sensor_observation"`` or ``"observation"``.
        inputs: the ONNX graph's input names, in order.
        task_names: the library's task names by id, for a task-conditioned policy.
        training: what the policy was trained with (algorithm, task, randomization, ...), recorded as is.
        onnx_file: the graph's file name, recorded for the reader.

    Raises:
        ValueError: ``observation_key`` is not one of :data:`LAYOUTS`.
    """
    if observation_key not in LAYOUTS:
        raise ValueError(f"observation_key must be one of {sorted(LAYOUTS)}, got {observation_key!r}.")
    model = env.model
    stand = model.key(constants.STAND_KEYFRAME)
    joints = _actuated_joints(model)
    joint_addresses = [model.jnt_qposadr[model.joint(name).id] for name in joints]
    low, high = env.action_spec.space.low, env.action_spec.space.high
    layout = LAYOUTS[observation_key]
    tasks = env.tasks
    names = [tasks.name] if isinstance(tasks.name, str) else list(tasks.name)
    randomization = env.randomization
    standing_height = float(stand.qpos[2])
    history = int(getattr(env, "sensor_history", 1)) if observation_key == "sensor_observation" else 1
    sidecar: dict[str, Any] = {
        "format": FORMAT,
        "version": VERSION,
        "robot": "microduck",
        "onnx": onnx_file,
        "inputs": list(inputs),
        "output": "action",
        "joint_names": joints,
        "stand": {
            "keyframe": constants.STAND_KEYFRAME,
            "joint_positions": _floats(stand.qpos[joint_addresses]),
            "ctrl": _floats(stand.ctrl),
            "trunk_height": standing_height,
            "unit": "rad (joints), m (trunk height)",
        },
        "action": {
            "size": len(joints),
            "low": float(low.min()),
            "high": float(high.max()),
            "scale": float(env.action_scale),
            "unit": "rad of servo target per unit of action",
            "control_law": CONTROL_LAW,
        },
        "control": {
            "rate_hz": 1.0 / float(env.control_dt),
            "dt": float(env.control_dt),
            "physics_timestep": float(model.opt.timestep),
            "substeps": int(round(env.control_dt / model.opt.timestep)),
        },
        "observation": {
            "key": observation_key,
            "size": sum(field.size for field in layout.values()),
            "dtype": "float32",
            "normalizer": "inside the ONNX graph: feed raw values",
            "fields": [{**field.to_dict(), "scale": 1.0} for field in layout.values()],
            "history": history,
            "frames": FRAMES,
        },
        "imu": {
            "site": constants.IMU_SITE,
            "projected_gravity": "world (0, 0, -1) expressed in the IMU frame (from its orientation quaternion)",
            "gyro": "angular velocity in the IMU frame, rad/s",
        },
        "gait": {
            "phase_offset": float(env.GAIT_PHASE_OFFSET),
            "ramp_duration_s": float(env.GAIT_RAMP_DURATION_S),
            "phase": PHASE,
            "ramp": RAMP,
            "clock": CLOCK,
            "prior": PRIOR,
            "swing_lift_left": _floats(constants.SWING_LIFT_LEFT),
            "swing_lift_right": _floats(constants.SWING_LIFT_RIGHT),
            "stride": _floats(constants.STRIDE),
        },
        "commands": {
            "unit": "m/s, (vx, vy) in the trunk's heading frame, fixed for an episode",
            "low": _floats(tasks.command_low.min(0).values.tolist()),
            "high": _floats(tasks.command_high.max(0).values.tolist()),
        },
        "tasks": [
            {
                "name": name,
                "task_id": index,
                "command_low": _floats(tasks.command_low[index].tolist()),
                "command_high": _floats(tasks.command_high[index].tolist()),
                "gait_frequency_hz": float(tasks.gait_frequency_hz[index]),
                "gait_frequency_per_mps": float(tasks.gait_frequency_per_mps[index]),
                "gait_prior_lift": float(tasks.gait_prior_lift[index]),
                "gait_prior_stride_per_mps": float(tasks.gait_prior_stride_per_mps[index]),
                "joint_reset_noise": float(tasks.joint_reset_noise_scale[index]),
            }
            for index, name in enumerate(names)
        ],
        "latency": {
            "joint_velocity_steps": int(randomization.joint_velocity_delay),
            "action_steps": list(randomization.action_delay),
            "imu_steps": list(randomization.imu_delay),
            "note": "as trained: the joint velocity is this many control steps late; action and IMU delays were "
            "drawn per episode in these ranges",
        },
        "termination": {
            "min_trunk_height": float(env.MIN_HEIGHT_RATIO) * standing_height,
            "min_upright": float(env.MIN_UPRIGHT),
            "note": "an episode has fallen when the trunk is lower, or its up axis' cosine with the vertical smaller",
        },
    }
    if task_names is not None:
        sidecar["task_names"] = list(task_names)
    if training is not None:
        sidecar["training"] = dict(training)
    return sidecar


def write_sidecar(path: str | Path, sidecar: Mapping[str, Any]) -> None:
    """Write ``sidecar`` as indented JSON to ``path``, atomically."""
    text = json.dumps(sidecar, indent=2) + "\n"
    atomic_write(path, lambda file: file.write(text), mode="w")
