"""Physics backends: batched MuJoCo simulation behind one small contract.

``make_backend(name, model, ...)`` builds one by name. Backends whose packages
are optional are imported only when asked for, so the core install stays lean.
"""

from __future__ import annotations

import importlib

import mujoco
import torch

from waddle.physics.base import PhysicsBackend

# name -> (module, class, pip extra that provides its packages)
BACKENDS: dict[str, tuple[str, str, str | None]] = {
    "mujoco": ("waddle.physics.native", "NativeBackend", None),
    "mjx": ("waddle.physics.mjx", "MjxBackend", "mjx"),
    "mujoco-torch": ("waddle.physics.torch_sim", "MujocoTorchBackend", "torch-sim"),
}


def backend_class(name: str) -> type[PhysicsBackend]:
    """Return the backend class registered under ``name``, importing it on demand."""
    if name not in BACKENDS:
        raise ValueError(f"Unknown backend {name!r}; choose one of {sorted(BACKENDS)}.")
    module_name, class_name, extra = BACKENDS[name]
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        hint = f"pip install 'waddle[{extra}]'" if extra else "pip install waddle"
        raise ImportError(
            f"The {name!r} backend needs packages that are not installed ({err}). Install them with: {hint}"
        ) from err
    return getattr(module, class_name)


def backend_available(name: str) -> bool:
    """Whether ``name``'s packages import on this machine."""
    try:
        backend_class(name)
    except ImportError:
        return False
    return True


def differentiable_backends() -> tuple[str, ...]:
    """Names of the installed backends that carry gradients, in :data:`BACKENDS` order.

    Read from each class's :attr:`PhysicsBackend.differentiable`, so the
    backends' modules are imported; a backend whose packages are not installed
    is left out (it cannot run here).
    """
    return tuple(name for name in BACKENDS if backend_available(name) and backend_class(name).differentiable)


def has_friction_loss(spec: mujoco.MjSpec) -> bool:
    """Whether any joint or tendon of ``spec`` has friction loss (mujoco-torch 0.2.0 cannot simulate it)."""
    return any(joint.frictionloss > 0 for joint in spec.joints) or any(
        tendon.frictionloss > 0 for tendon in spec.tendons
    )


def default_backend(device: torch.device | str, spec: mujoco.MjSpec | None = None) -> str:
    """The best backend available for ``device`` (and the model ``spec``, when given).

    Native MuJoCo on a CPU. On CUDA, mujoco-torch when it imports and can
    simulate the model (no joint or tendon friction loss, which the
    MicroDuck has), else MJX.
    """
    if torch.device(device).type == "cpu":
        return "mujoco"
    candidates = ("mujoco-torch", "mjx")
    if spec is not None and has_friction_loss(spec):
        candidates = ("mjx",)
    for name in candidates:
        if backend_available(name):
            return name
    hint = (
        "pip install 'waddle[mjx]'"
        if len(candidates) == 1
        else ("pip install 'waddle[torch-sim]' or pip install 'waddle[mjx]'")
    )
    raise ImportError(
        f"No GPU physics backend for this model is installed for device {device!r}. Install one with: {hint}"
    )


def make_backend(name: str, model: mujoco.MjModel, **kwargs) -> PhysicsBackend:
    """Build the backend ``name`` over ``model``; see :class:`PhysicsBackend` for kwargs."""
    return backend_class(name)(model, **kwargs)


__all__ = [
    "BACKENDS",
    "PhysicsBackend",
    "backend_available",
    "backend_class",
    "default_backend",
    "differentiable_backends",
    "has_friction_loss",
    "make_backend",
]
