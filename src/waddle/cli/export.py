"""``waddle export``: write a checkpoint's deterministic policy as an ONNX graph.

The graph maps one observation ``[1, 56]`` to one action ``[1, 14]`` with the
observation normaliser baked in as constants, so a robot-side runtime feeds it
raw observations. After writing, the graph is run in onnxruntime on random
observations and compared with the torch policy; a mismatch is an error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from waddle.algorithms.checkpoint import CheckpointError, atomic_write, load_checkpoint
from waddle.cli.evaluate import checkpoint_path

INPUT_NAME = "observation"
OUTPUT_NAME = "action"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "checkpoint", metavar="CHECKPOINT", help="a checkpoint.pt written by waddle train (or its run directory)"
    )
    parser.add_argument("--onnx", required=True, metavar="PATH", help="where to write the ONNX graph")
    parser.add_argument(
        "--samples", type=int, default=256, metavar="N", help="random observations of the parity check (default 256)"
    )
    parser.add_argument(
        "--atol", type=float, default=1e-4, metavar="X", help="largest |onnx - torch| accepted (default 1e-4)"
    )


def export_onnx(policy: torch.nn.Module, observation_dim: int, path: str | Path) -> None:
    """Write ``policy`` (``[1, observation_dim] -> [1, action_dim]``) to ``path`` atomically."""
    import io
    import warnings

    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(
            policy.eval(),
            (torch.zeros(1, observation_dim),),
            buffer,
            input_names=[INPUT_NAME],
            output_names=[OUTPUT_NAME],
            dynamo=False,
            opset_version=17,
        )
    atomic_write(path, lambda file: file.write(buffer.getvalue()))


def onnx_parity(policy: torch.nn.Module, path: str | Path, observations: torch.Tensor) -> float:
    """Largest ``|onnxruntime(path)(obs) - policy(obs)|`` over the rows of ``observations``, one at a time."""
    import numpy as np
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    worst = 0.0
    with torch.no_grad():
        for row in observations:
            row = row.reshape(1, -1).float()
            (onnx_action,) = session.run([OUTPUT_NAME], {INPUT_NAME: row.numpy()})
            worst = max(worst, float(np.abs(onnx_action - policy(row).numpy()).max()))
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
    from waddle.algorithms.evaluation import policy_from_checkpoint
    from waddle.algorithms.presets import make_env

    path = checkpoint_path(args.checkpoint)
    try:
        checkpoint = load_checkpoint(path)
        run_config = checkpoint["config"]["run"]
        env = make_env(run_config["task"], num_envs=1, seed=0, backend="mujoco")
        policy = policy_from_checkpoint(checkpoint, env)
    except CheckpointError as err:
        print(f"waddle export: error: {err}", file=sys.stderr)
        return 1
    except (KeyError, TypeError, ValueError) as err:
        print(f"waddle export: error: {path} cannot be exported: {str(err).splitlines()[0]}", file=sys.stderr)
        return 1
    observation_dim = env.observation_spec["observation"].shape[-1]
    action_dim = env.action_spec.shape[-1]
    env.close()
    policy = policy.cpu()

    export_onnx(policy, observation_dim, args.onnx)
    worst = onnx_parity(policy, args.onnx, random_observations(policy, observation_dim, args.samples))
    if not worst <= args.atol:
        message = f"{args.onnx} differs from the torch policy by {worst:.3g} > --atol {args.atol}"
        print(f"waddle export: error: {message}", file=sys.stderr)
        return 1
    shapes = f"{INPUT_NAME} [1, {observation_dim}] -> {OUTPUT_NAME} [1, {action_dim}]"
    print(f"wrote {args.onnx}: {shapes}, normaliser included")
    print(f"parity: max |onnx - torch| = {worst:.2e} over {args.samples} random observations")
    return 0
