"""Two small MuJoCo models for the backend tests.

* ``BALL_ARM_XML``: a ball dropped on a plane next to a motor-driven arm
  (contacts appear during the rollout); :func:`ball_arm_start` gives
  ``NUM_ENVS`` start states that fall, land and rest.
* ``PENDULUM_XML``: a contact-free double pendulum, for gradients.
"""

from __future__ import annotations

import numpy as np

BALL_ARM_XML = """
<mujoco>
  <option timestep="0.005"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 .1"/>
    <body name="ball" pos="0 0 .3">
      <freejoint/>
      <geom name="ball" type="sphere" size=".1" mass="1"/>
      <site name="ball_side" pos=".1 0 0"/>
    </body>
    <body name="arm" pos="1 0 .6">
      <joint name="hinge" type="hinge" axis="0 1 0" damping=".1"/>
      <geom name="arm" type="capsule" fromto="0 0 0 0 0 -.5" size=".05"/>
      <site name="tip" pos="0 0 -.55"/>
    </body>
  </worldbody>
  <actuator><motor joint="hinge" gear="2"/></actuator>
</mujoco>
"""

PENDULUM_XML = """
<mujoco>
  <option timestep="0.01"/>
  <worldbody>
    <body pos="0 0 1">
      <joint name="j1" type="hinge" axis="0 1 0" damping=".05"/>
      <geom type="capsule" fromto="0 0 0 .3 0 0" size=".03" contype="0" conaffinity="0"/>
      <body pos=".3 0 0">
        <joint name="j2" type="hinge" axis="0 1 0" damping=".05"/>
        <geom type="capsule" fromto="0 0 0 .3 0 0" size=".03" contype="0" conaffinity="0"/>
        <site name="tip" pos=".3 0 0"/>
      </body>
    </body>
  </worldbody>
  <actuator><motor joint="j1"/><motor joint="j2"/></actuator>
</mujoco>
"""

SITES = ("ball_side", "tip")
GEOMS = ("ball", "arm")
NUM_ENVS = 3
FRAME_SKIP = 4
"""Substeps per control step. Test modules that build the same MJX backend (model, envs, substeps,
sites, precision, compiler options) share one compiled program through the session's compilation cache."""


def ball_arm_start(model):
    qpos = np.tile(model.qpos0, (NUM_ENVS, 1))
    qpos[:, 0] = [0.0, 0.1, -0.2]  # ball x
    qpos[:, 2] = [0.3, 0.2, 0.12]  # ball height (radius 0.1): falls, lands, rests
    qpos[:, 7] = [0.0, 0.4, -0.3]  # arm angle
    qvel = np.zeros((NUM_ENVS, model.nv))
    qvel[:, 0] = [0.0, 0.5, -0.3]
    qvel[:, 6] = [0.0, 1.0, -1.0]
    return qpos, qvel
