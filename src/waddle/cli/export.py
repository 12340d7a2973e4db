"""``waddle export``: write a checkpoint's deterministic policy as an ONNX graph and its deployment sidecar.

The graph maps one observation ``[1, N]`` to one action ``[1, 14]`` with the
observation normaliser baked in as constants, so a robot-side runtime feeds it
raw observations. The observation is the one the policy was trained on: the
robot's sensor layout (``sensor_observation``, N = 53) for a policy trained
with ``--actor-observation sensors``, the env's full observation (N = 56)
otherwise. A policy trained on a library of several tasks also takes
the task id, ``task_id`` ``[1, 1]`` int64, as a second input; the graph's
metadata (``metadata_props``) lists the library's task names by id under
``task_names`` (:func:`policy_metadata`). After writing, the graph is run in
onnxruntime on random observations (and task ids) and compared with the torch
policy; a mismatch is an error.

Beside the graph (``policy.onnx`` -> ``policy.json``, or ``--sidecar``) goes a
JSON sidecar (:mod:`waddle.deploy.sidecar`): the joint names in actuator
order, the STAND pose, the action scale and control law, the control rate, the
observation layout with indices and units, the command ranges, the gait clock
and prior of each task, the latency it was trained with and the task names.
``waddle sim2sim`` runs the policy from these two files alone.

A policy trained on the robot's own contract (``--actor-observation robot``
with ``--action-mode robot``, as ``waddle train --task joystick`` trains) is
written as the file the MicroDuck's daemon loads instead, and nothing else:
input ``obs`` float32 ``[1, 61]``, output ``actions`` float32 ``[1, 14]``,
opset 18, the normaliser inside, and one ``metadata_props`` entry
``microduck`` holding the JSON the daemon checks, every value read from the
training env (:func:`waddle.envs.microduck.robot.robot_metadata`).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from waddle.algorithms.checkpoint import CheckpointError, atomic_write, load_checkpoint
from waddle.algorithms.task_library import saved_task_library
from waddle.cli.evaluate import add_policy_arguments, checkpoint_path
from waddle.modules.networks import ROBOT_OBSERVATION_KEY
from waddle.modules.task_embedding import reads_task_id

INPUT_NAME = "observation"
TASK_INPUT_NAME = "task_id"
OUTPUT_NAME = "action"
OPSET = 17
"""Opset of the sidecar exports."""
ROBOT_INPUT_NAME = "obs"
ROBOT_OUTPUT_NAME = "actions"
ROBOT_OPSET = 18
"""The daemon's contract: input ``obs``, output ``actions``, opset 18."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="a checkpoint.pt written by waddle train (or its run directory)"
    )
    parser.add_argument("--onnx", required=True, metavar="PATH", help="where to write the ONNX graph")
    parser.add_argument(
        "--sidecar",
        metavar="PATH",
        help="where to write the JSON deployment sidecar (default: the --onnx path with .json)",
    )
    add_policy_arguments(parser)
    parser.add_argument(
        "--samples", type=int, default=256, metavar="N", help="random observations of the parity check (default 256)"
    )
    parser.add_argument(
        "--atol", type=float, default=1e-4, metavar="X", help="largest |onnx - torch| accepted (default 1e-4)"
    )


def policy_metadata(task_names: Sequence[str], policy: torch.nn.Module) -> dict[str, str]:
    """What a runtime needs to know beside the graph, as ``metadata_props`` strings.

    ``inputs`` lists the graph's input names in order; ``task_names`` is the
    JSON list of the library's task names, index = task id (present when the
    policy reads the task id). The deployment sidecar carries these same entries.
    """
    inputs = [INPUT_NAME, TASK_INPUT_NAME] if reads_task_id(policy) else [INPUT_NAME]
    metadata = {"inputs": json.dumps(inputs)}
    if reads_task_id(policy):
        metadata["task_names"] = json.dumps(list(task_names))
    return metadata


def export_onnx(
    policy: torch.nn.Module,
    observation_dim: int,
    path: str | Path,
    *,
    metadata: Mapping[str, str] | None = None,
    input_name: str = INPUT_NAME,
    output_name: str = OUTPUT_NAME,
    opset: int = OPSET,
) -> None:
    """Write ``policy`` to ``path`` atomically: ``[1, observation_dim] -> [1, action_dim]``, with a
    second input ``task_id`` ``[1, 1]`` int64 when the policy reads the task id.

    ``metadata`` goes into the model's ``metadata_props``.
    """
    import io
    import warnings

    inputs: tuple[torch.Tensor, ...] = (torch.zeros(1, observation_dim),)
    names = [input_name]
    if reads_task_id(policy):
        inputs += (torch.zeros(1, 1, dtype=torch.long),)
        names.append(TASK_INPUT_NAME)
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            policy.eval(),
            inputs,
            buffer,
            input_names=names,
            output_names=[output_name],
            dynamo=False,
            opset_version=opset,
        )
    data = buffer.getvalue()
    if metadata:
        import onnx

        model = onnx.load_from_string(data)
        onnx.helper.set_model_props(model, dict(metadata))
        data = model.SerializeToString()
    atomic_write(path, lambda file: file.write(data))


def onnx_parity(
    policy: torch.nn.Module,
    path: str | Path,
    observations: torch.Tensor,
    task_ids: torch.Tensor | None = None,
    *,
    input_name: str = INPUT_NAME,
    output_name: str = OUTPUT_NAME,
) -> float:
    """Largest ``|onnxruntime(path)(obs[, task_id]) - policy(obs[, task_id])|`` over the rows of
    ``observations`` (and ``task_ids``, one id per row), one at a time."""
    import numpy as np
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    with torch.no_grad():
        for index, row in enumerate(observations):
            row = row.reshape(1, -1).float()
            feed = {input_name: row.numpy()}
            args: tuple[torch.Tensor, ...] = (row,)
            if task_ids is not None:
                task = task_ids[index].reshape(1, 1).long()
                feed[TASK_INPUT_NAME] = task.numpy()
                args += (task,)
            (onnx_action,) = session.run([output_name], feed)
            worst = max(worst, float(np.abs(onnx_action - policy(*args).numpy()).max()))
    return worst


def random_observations(policy: torch.nn.Module, observation_dim: int, samples: int, seed: int = 0) -> torch.Tensor:
    """Observations drawn around the policy's normaliser statistics (standard normal without one)."""
    generator = torch.Generator().manual_seed(seed)
    noise = torch.randn(samples, observation_dim, generator=generator)
    from waddle.modules.normalizer import RunningNormalizer

    normalizer = next((m for m in policy.modules() if isinstance(m, RunningNormalizer)), None)
    if normalizer is None:
        return noise
    return normalizer.mean + 2.0 * noise * torch.sqrt(normalizer.var + normalizer.eps)


def run(args: argparse.Namespace) -> int:
    from waddle.algorithms.evaluation import observation_key, policy_from_checkpoint
    from waddle.algorithms.presets import make_env
    from waddle.algorithms.run_plan import RunPlan
    from waddle.deploy.contract import default_sidecar_path
    from waddle.deploy.sidecar import build_sidecar, write_sidecar

    path = checkpoint_path(args.checkpoint)
    try:
        checkpoint = load_checkpoint(path)
        plan = RunPlan.from_checkpoint(checkpoint)
        # The training env's layout, randomization and latency are what the sidecar describes.
        env = make_env(
            plan.run.task,
            num_envs=1,
            seed=0,
            backend="mujoco",
            randomization=plan.run.randomization,
            **plan.policy_env_options,
        )
        try:
            policy = policy_from_checkpoint(checkpoint, env, actor_observation=args.actor_observation)
        except BaseException:
            env.close()
            raise
    except CheckpointError as err:
        print(f"waddle export: error: {err}", file=sys.stderr)
        return 1
    except (KeyError, TypeError, ValueError) as err:
        print(f"waddle export: error: {path} cannot be exported: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    key = observation_key(policy)
    if key == ROBOT_OBSERVATION_KEY:
        try:
            return _export_robot_policy(args, policy.cpu(), env)
        finally:
            env.close()
    observation_dim = env.observation_spec[key].shape[-1]
    action_dim = env.action_spec.shape[-1]
    task_names = _task_names(checkpoint, env)
    policy = policy.cpu()
    metadata = policy_metadata(task_names, policy)
    sidecar = build_sidecar(
        env,
        observation_key=key,
        inputs=json.loads(metadata["inputs"]),
        task_names=json.loads(metadata["task_names"]) if "task_names" in metadata else None,
        training={
            "checkpoint": str(path),
            "algo": checkpoint["algo"],
            "task": plan.run.task,
            "randomization": plan.run.randomization,
            "push_scale": plan.run.push_scale,
            "push_ramp_steps": plan.run.push_ramp_steps,
            "lift_assist": plan.run.lift_assist,
            "lift_assist_fade_steps": plan.run.lift_assist_fade_steps,
            "actor_observation": "sensors" if key == "sensor_observation" else "full",
            **plan.policy_env_options,
            "env_steps": int(checkpoint["env_steps"]),
        },
        onnx_file=Path(args.onnx).name,
    )
    env.close()

    export_onnx(policy, observation_dim, args.onnx, metadata=metadata)
    observations = random_observations(policy, observation_dim, args.samples)
    task_ids = None
    if reads_task_id(policy):  # every task's row is exercised: ids cycle through the library
        task_ids = torch.arange(args.samples) % len(task_names)
    worst = onnx_parity(policy, args.onnx, observations, task_ids)
    if not worst <= args.atol:
        message = f"{args.onnx} differs from the torch policy by {worst:.3g} > --atol {args.atol}"
        print(f"waddle export: error: {message}", file=sys.stderr)
        return 1
    sidecar_path = Path(args.sidecar) if args.sidecar else default_sidecar_path(args.onnx)
    write_sidecar(sidecar_path, sidecar)
    shapes = f"{INPUT_NAME} [1, {observation_dim}] -> {OUTPUT_NAME} [1, {action_dim}]"
    if task_ids is not None:
        shapes = (
            f"{INPUT_NAME} [1, {observation_dim}], {TASK_INPUT_NAME} [1, 1] int64 -> {OUTPUT_NAME} [1, {action_dim}]"
        )
    print(f"wrote {args.onnx}: {shapes}, normaliser included; the observation is the env's {key!r}")
    print(f"wrote {sidecar_path}: joints, STAND pose, action scale, control rate, observation layout, commands, gait")
    if task_ids is not None:
        print("task ids: " + ", ".join(f"{index} {name}" for index, name in enumerate(task_names)))
    what = "random observations" + (" and task ids" if task_ids is not None else "")
    print(f"parity: max |onnx - torch| = {worst:.2e} over {args.samples} {what}")
    return 0


def _export_robot_policy(args: argparse.Namespace, policy: torch.nn.Module, env: Any) -> int:
    """Write the daemon's file for a policy that reads the robot observation, check it, and say so."""
    from waddle.envs.microduck.constants import JOINT_NAMES
    from waddle.envs.microduck.robot import ACTION_DIM, METADATA_KEY, ROBOT_OBSERVATION_DIM, robot_metadata

    if args.sidecar:
        return _error("--sidecar: a robot policy's file carries its own metadata; no sidecar is written.")
    if getattr(env, "action_mode", None) != "robot":
        return _error(
            f"{args.checkpoint}: the actor reads the robot observation but its actions were trained with "
            f"action_mode={getattr(env, 'action_mode', None)!r}; the robot applies HOME + action_scale * action, "
            "so train with --action-mode robot (waddle train --task joystick does)."
        )
    if reads_task_id(policy):
        return _error(f"{args.checkpoint}: the robot's file has one input (obs); a task-conditioned policy has two.")
    if env.adds_gait_prior:
        return _error(
            f"{args.checkpoint}: its training env still added {env.gait_prior_scale:.2f} of the gait prior to the "
            "policy's action, which the robot does not add; train past --gait-prior-fade-steps first."
        )
    metadata = robot_metadata(action_scale=env.action_scale, default_joint_pos=env.default_joint_pos)
    export_onnx(
        policy,
        ROBOT_OBSERVATION_DIM,
        args.onnx,
        metadata={METADATA_KEY: json.dumps(metadata)},
        input_name=ROBOT_INPUT_NAME,
        output_name=ROBOT_OUTPUT_NAME,
        opset=ROBOT_OPSET,
    )
    observations = random_observations(policy, ROBOT_OBSERVATION_DIM, args.samples)
    worst = onnx_parity(policy, args.onnx, observations, input_name=ROBOT_INPUT_NAME, output_name=ROBOT_OUTPUT_NAME)
    if not worst <= args.atol:
        return _error(f"{args.onnx} differs from the torch policy by {worst:.3g} > --atol {args.atol}")
    print(
        f"wrote {args.onnx}: {ROBOT_INPUT_NAME} [1, {ROBOT_OBSERVATION_DIM}] float32 -> {ROBOT_OUTPUT_NAME} "
        f"[1, {ACTION_DIM}] float32, opset {ROBOT_OPSET}, normaliser included: the MicroDuck daemon's contract"
    )
    print(f"metadata {METADATA_KEY!r}: " + json.dumps(metadata))
    if getattr(policy, "symmetric", False):
        print("left-right symmetric: the graph averages the actor with its mirror image (PPOConfig.symmetric_policy)")
    memory = getattr(getattr(policy, "policy", None), "memory", None)
    if memory is not None:
        print(
            f"heading memory: action {memory.channel} ({JOINT_NAMES[memory.channel]}) is the leaky integral of gyro yaw rate minus vyaw "
            f"over {memory.time_constant_s:g} s, from the previous action (PPOConfig.heading_memory_s)"
        )
    print(f"parity: max |onnx - torch| = {worst:.2e} over {args.samples} random observations")
    return 0


def _error(message: str) -> int:
    print(f"waddle export: error: {message}", file=sys.stderr)
    return 1


def _task_names(checkpoint: Mapping[str, Any], env: Any) -> list[str]:
    """The library the checkpoint recorded, else (an older checkpoint) the env's."""
    from waddle.algorithms.task_library import task_library

    saved = saved_task_library(checkpoint["trainer"])
    return saved if saved is not None else list(task_library(env))
