"""TorchRL environments: MuJoCo tasks over the physics backends, and Brax.

``BraxEnv``/``BraxWrapper`` live in ``waddle.envs.brax`` and import JAX and
Brax only when used.
"""

from waddle.envs.microduck import MicroDuckEnv, MicroDuckTask, MicroDuckTaskSampler
from waddle.envs.mujoco_env import MujocoEnv

__all__ = ["MicroDuckEnv", "MicroDuckTask", "MicroDuckTaskSampler", "MujocoEnv"]
