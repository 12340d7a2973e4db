"""MuJoCo C (``mj_step`` on plain ``MjData``): the independent reference the
batched backends are compared with."""

from __future__ import annotations

import mujoco
import numpy as np


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
            np.array([[bool((d.contact.geom[: d.ncon] == g).any()) for g in geom_ids] for d in datas])
        )
    return {k: np.stack(v) for k, v in out.items()}
