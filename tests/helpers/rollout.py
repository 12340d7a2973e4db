"""A backend's side of a comparison with :func:`helpers.mujoco_c.c_rollout`."""

from __future__ import annotations

import numpy as np
import torch


def backend_rollout(sim, qpos, qvel, controls) -> dict[str, np.ndarray]:
    """Reset ``sim`` to ``(qpos, qvel)`` and step it through ``controls``
    ``(steps, num_envs, nu)``; per control step qpos, qvel, time, sites and
    contacts as float64/bool arrays, keyed as :func:`c_rollout`'s."""
    dtype = sim.dtype
    sim.reset(torch.as_tensor(qpos).to(dtype), torch.as_tensor(qvel).to(dtype))
    out = {k: [] for k in ("qpos", "qvel", "time", "sites", "contacts")}
    for ctrl in torch.as_tensor(controls).to(dtype):
        sim.step(ctrl)
        out["qpos"].append(sim.qpos.detach().double().numpy().copy())
        out["qvel"].append(sim.qvel.detach().double().numpy().copy())
        out["time"].append(sim.time.detach().double().numpy().copy())
        out["sites"].append(sim.site_positions().detach().double().numpy().copy())
        out["contacts"].append(sim.contacts().numpy().copy())
    return {k: np.stack(v) for k, v in out.items()}
