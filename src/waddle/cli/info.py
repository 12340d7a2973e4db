"""``waddle info``: versions, which backends import here, and the MicroDuck model in use."""

from __future__ import annotations

import argparse
import importlib.metadata
import platform

from waddle import gl_backend
from waddle.physics import BACKENDS, backend_available

_PACKAGES = ("waddle", "torch", "torchrl", "tensordict", "mujoco", "mujoco-mjx", "jax", "brax", "mujoco-torch")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--microduck-root", default=None, help="resolve the model from this path instead")


def run(args: argparse.Namespace) -> int:
    import torch

    from waddle.envs.microduck import MicroDuckEnv
    from waddle.envs.microduck.constants import EMBEDDED_SCENE

    print(f"python {platform.python_version()} on {platform.machine()}")
    for name in _PACKAGES:
        try:
            version = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"
        print(f"  {name:<13} {version}")
    print(f"cuda available: {torch.cuda.is_available()}")
    print(f"rendering: {gl_backend.configure().describe()}")
    print("backends:")
    for name in BACKENDS:
        print(f"  {name:<13} {'available' if backend_available(name) else 'missing (see README for its extra)'}")
    scene = MicroDuckEnv.resolve_scene(args.microduck_root)
    kind = "embedded mesh-free model" if scene == EMBEDDED_SCENE else "upstream microduck_rl assets"
    print(f"MicroDuck model: {scene} ({kind})")
    return 0
