"""Two small MuJoCo models and an independent MuJoCo C reference for the backend tests.

* ``BALL_ARM_XML``: a ball dropped on a plane next to a motor-driven arm
  (contacts appear during the rollout); :func:`ball_arm_start` gives
  ``NUM_ENVS`` start states that fall, land and rest.
* ``PENDULUM_XML``: a contact-free double pendulum, for gradients.
* :func:`c_rollout`: MuJoCo C (``mj_step`` on plain ``MjData``), the
  reference the batched backends are compared with.
"""

from __future__ import annotations

import mujoco
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


def c_rollout(model, qpos, qvel, controls, frame_skip, site_names, geom_names):
    """MuJoCo C, one ``MjData`` per env: per control step qpos, qvel, time, sites, contacts."""
    site_ids = [model.site(n).id for n in site_names]
    geom_ids = [model.geom(n).id for n in geom_names]
    datas = []
    for q, v in zip(qpos, qvel):
        d = mujoco.MjData(model)
        d.qpos[:], d.qvel[:] = q, v
        datas.append(d)
    out = {k: [] for k in ("qpos", "qvel", "time", "sites", "contacts")}
    for ctrl in controls:
        for d, u in zip(datas, ctrl):
            d.ctrl[:] = u
            for _ in range(frame_skip):
                mujoco.mj_step(model, d)
        out["qpos"].append(np.stack([d.qpos.copy() for d in datas]))
        out["qvel"].append(np.stack([d.qvel.copy() for d in datas]))
        out["time"].append(np.array([d.time for d in datas]))
        out["sites"].append(np.stack([d.site_xpos[site_ids].copy() for d in datas]))
        out["contacts"].append(
            np.array(
                [[bool((d.contact.geom[: d.ncon] == g).any()) for g in geom_ids] for d in datas]
            )
        )
    return {k: np.stack(v) for k, v in out.items()}


def ball_arm_start(model):
    qpos = np.tile(model.qpos0, (NUM_ENVS, 1))
    qpos[:, 0] = [0.0, 0.1, -0.2]  # ball x
    qpos[:, 2] = [0.3, 0.2, 0.12]  # ball height (radius 0.1): falls, lands, rests
    qpos[:, 7] = [0.0, 0.4, -0.3]  # arm angle
    qvel = np.zeros((NUM_ENVS, model.nv))
    qvel[:, 0] = [0.0, 0.5, -0.3]
    qvel[:, 6] = [0.0, 1.0, -1.0]
    return qpos, qvel
