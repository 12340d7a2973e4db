"""waddle: batched, differentiable legged-robot reinforcement learning in PyTorch."""

from waddle import gl_backend as _gl_backend

# Before anything imports mujoco: a MUJOCO_GL naming a missing library makes
# `import mujoco` raise, so a working backend is chosen first.
_gl_backend.configure()

__version__ = "0.1.0"
