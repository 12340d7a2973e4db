"""Native MuJoCo backend: every env stepped in C by ``mujoco.rollout``'s thread pool.

One ``MjModel``, one scratch ``MjData`` per thread, and the state of all envs
in one ``(num_envs, nstate)`` array. A :meth:`NativeBackend.step` is a single
call into C that advances every env by ``frame_skip`` substeps on
``num_threads`` threads; there is no per-env Python on the step path.

Site positions and contact flags are read in bulk through sensors this backend
adds to its copy of the model (``framepos`` for each tracked site, a
``contact`` sensor counting the contacts of each tracked geom). MuJoCo fills
sensors in the forward pass of each substep, so they describe the state before
the last substep's integration, as ``MjData.site_xpos`` does after ``mj_step``.

Per-env model parameters (:meth:`NativeBackend.set_model_fields`) give each
env its own ``MjModel``: ``mujoco.rollout`` takes one model per rollout, so a
step stays one call into C. The copies are of a lean build of the model
(textures shrunk to a texel, which the physics never reads), about 65 kB each
for the MicroDuck; the values are written into them at reset only.

Forces held on bodies (:meth:`NativeBackend.apply_forces`, MuJoCo's
``xfrc_applied``) travel with the controls, as ``mujoco.rollout`` takes them
(``mjSTATE_CTRL | mjSTATE_XFRC_APPLIED``); a step without them passes the
controls alone.

MuJoCo resets a simulator whose state becomes non-finite or huge (with a
warning) and keeps stepping from ``qpos0``. The backend spots that by the
simulator's clock falling behind and reports the env in :attr:`diverged`, with
its state set to NaN so the env layer terminates it; the other envs are
unaffected.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping

import mujoco
import numpy as np
import torch
from mujoco import rollout

from waddle.physics.base import PhysicsBackend

_STATE = mujoco.mjtState.mjSTATE_FULLPHYSICS
_CTRL = mujoco.mjtState.mjSTATE_CTRL
_CTRL_FORCES = mujoco.mjtState.mjSTATE_CTRL | mujoco.mjtState.mjSTATE_XFRC_APPLIED


class NativeBackend(PhysicsBackend):
    """MuJoCo C engine, all envs stepped by a thread pool.

    Args:
        num_threads: threads of the rollout pool. Defaults to the number of
            CPUs this process may use.

    See :class:`~waddle.physics.base.PhysicsBackend` for the other arguments.

    Example:
        >>> spec = mujoco.MjSpec.from_string(
        ...     "<mujoco><worldbody><body><joint name='hinge'/>"
        ...     "<geom type='capsule' size='0.05' fromto='0 0 0 0 0 0.5'/></body></worldbody>"
        ...     "<actuator><motor joint='hinge'/></actuator></mujoco>"
        ... )
        >>> sim = NativeBackend(spec, num_envs=4, frame_skip=10, num_threads=1)
        >>> sim.step(torch.ones(4, sim.nu))  # one control step: 10 physics steps of 2 ms
        >>> sim.time
        tensor([0.0200, 0.0200, 0.0200, 0.0200])
    """

    name = "mujoco"

    def __init__(self, model, *, num_threads: int | None = None, **kwargs) -> None:
        super().__init__(model, **kwargs)
        self._physics_spec = None
        if self.site_ids or self.contact_geom_ids:
            self._physics_spec = self._instrumented_spec(kwargs)
            self.model = self._physics_spec.compile()
        model = self.model
        # One model per env once set_model_fields is called; until then all envs share self.model.
        self._models: list[mujoco.MjModel] | None = None
        self._field_views: dict[str, list[np.ndarray]] = {}
        self.num_threads = int(num_threads or len(os.sched_getaffinity(0)))
        self._pool = rollout.Rollout(nthread=self.num_threads)
        self._scratch = [mujoco.MjData(model) for _ in range(self.num_threads)]

        nstate = mujoco.mj_stateSize(model, _STATE)
        self._qpos_slice = slice(1, 1 + model.nq)
        self._qvel_slice = slice(1 + model.nq, 1 + model.nq + model.nv)
        self._state = np.empty((self.num_envs, nstate))
        mujoco.mj_getState(model, self._scratch[0], self._state[0], _STATE)
        self._state[:] = self._state[0]
        self._trajectory = np.empty((self.num_envs, self.frame_skip, nstate))
        self._sensor_trajectory = np.empty((self.num_envs, self.frame_skip, model.nsensordata))
        self._sensors = np.zeros((self.num_envs, model.nsensordata))
        # The controls held over the substeps, laid out as mujoco.rollout reads them, so that a step can
        # skip the wrapper's checks and singleton tiling (a quarter of a millisecond per call).
        self._ctrl = np.zeros((self.num_envs, self.frame_skip, model.nu))
        # With forces held on the bodies, the controls are followed by them (mujoco.rollout's layout of
        # CTRL | XFRC_APPLIED); None while there are none, so that an unforced step copies nothing more.
        self._forced_ctrl: np.ndarray | None = None
        self._shared_models = [model] * self.num_envs
        self._step_time = self.frame_skip * model.opt.timestep
        self._diverged = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        self._refresh_sensors(np.arange(self.num_envs))

    def _instrumented_spec(self, kwargs) -> mujoco.MjSpec:
        if self.spec is None:
            raise ValueError(
                "The native backend reads sites and contacts through sensors it adds to "
                "the model, so it needs the model as a mujoco.MjSpec "
                "(mujoco.MjSpec.from_file(path)), not a compiled MjModel."
            )
        spec = self.spec.copy()
        # Our sensors go last so the model's own sensordata keeps its layout.
        self._site_sensor_start = self.model.nsensordata
        for name in kwargs.get("site_names", ()):
            spec.add_sensor(
                name=f"waddle_site_{name}",
                type=mujoco.mjtSensor.mjSENS_FRAMEPOS,
                objtype=mujoco.mjtObj.mjOBJ_SITE,
                objname=name,
            )
        self._contact_sensor_start = self._site_sensor_start + 3 * len(self.site_ids)
        for name in kwargs.get("contact_geom_names", ()):
            # intprm = (data: found, reduce: none, num: 1): the count of contacts
            # involving the geom, against anything.
            spec.add_sensor(
                name=f"waddle_contact_{name}",
                type=mujoco.mjtSensor.mjSENS_CONTACT,
                objtype=mujoco.mjtObj.mjOBJ_GEOM,
                objname=name,
                intprm=[1, 0, 1],
            )
        return spec

    @property
    def per_env_models(self) -> bool:
        return True

    def model_of(self, env: int) -> mujoco.MjModel:
        """The ``MjModel`` env ``env`` is simulated with (``model`` until fields were set per env)."""
        return self.model if self._models is None else self._models[env]

    def _per_env_models(self) -> list[mujoco.MjModel]:
        if self._models is None:
            if self._physics_spec is not None:
                spec = self._physics_spec.copy()
                for texture in spec.textures:
                    # Texels are for rendering; a skybox needs its six faces.
                    texture.width = 1
                    texture.height = 6 if texture.type == mujoco.mjtTexture.mjTEXTURE_SKYBOX else 1
                template = spec.compile()
            else:
                template = copy.copy(self.model)
            # MuJoCo fills the mass matrix rows of 'simple' dofs from dof_M0, which the compiler
            # derived from the nominal masses; without the shortcut they come from the per-env ones.
            template.dof_simplenum[:] = 0
            self._models = [copy.copy(template) for _ in range(self.num_envs)]
        return self._models

    def set_model_fields(self, fields: Mapping[str, torch.Tensor], mask: torch.Tensor | None = None) -> None:
        rows = np.arange(self.num_envs) if mask is None else mask.detach().cpu().numpy().reshape(-1).nonzero()[0]
        arrays = {}
        for name, value in fields.items():
            nominal = getattr(self.model, name, None)
            if not isinstance(nominal, np.ndarray):
                raise ValueError(f"set_model_fields: {name!r} is not an array field of MjModel.")
            array = value.detach().cpu().double().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
            if array.shape != (self.num_envs, *nominal.shape):
                raise ValueError(
                    f"set_model_fields: {name} must have shape {(self.num_envs, *nominal.shape)}, got {array.shape}."
                )
            arrays[name] = array
        if rows.size == 0:
            return
        models = self._per_env_models()
        for name, array in arrays.items():
            views = self._field_views.get(name)
            if views is None:
                views = self._field_views[name] = [getattr(m, name) for m in models]
            # One small copy per reset env and field kind; the step path never loops over envs.
            for row in rows:
                views[row][...] = array[row]

    @property
    def applies_forces(self) -> bool:
        return True

    def apply_forces(self, xfrc: torch.Tensor | None) -> None:
        if xfrc is None:
            self._forced_ctrl = None
            return
        expected = (self.num_envs, self.model.nbody, 6)
        if tuple(xfrc.shape) != expected:
            raise ValueError(f"apply_forces: xfrc must have shape {expected}, got {tuple(xfrc.shape)}.")
        if self._forced_ctrl is None:
            self._forced_ctrl = np.zeros((self.num_envs, self.frame_skip, self.model.nu + 6 * self.model.nbody))
        forces = xfrc.detach().cpu().double().numpy().reshape(self.num_envs, 1, -1)
        self._forced_ctrl[:, :, self.model.nu :] = forces

    def set_qvel(self, qvel: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        rows = np.arange(self.num_envs) if mask is None else mask.detach().cpu().numpy().reshape(-1).nonzero()[0]
        if rows.size:
            self._state[rows, self._qvel_slice] = qvel.detach().cpu().double().numpy()[rows]

    def reset(self, qpos, qvel, mask=None) -> None:
        rows = np.arange(self.num_envs) if mask is None else mask.detach().cpu().numpy().nonzero()[0]
        if rows.size == 0:
            return
        qpos = qpos.detach().cpu().double().numpy()
        qvel = qvel.detach().cpu().double().numpy()
        self._state[rows] = 0.0
        self._state[rows, self._qpos_slice] = qpos[rows]
        self._state[rows, self._qvel_slice] = qvel[rows]
        self._diverged[torch.as_tensor(rows, device=self.device)] = False
        self._refresh_sensors(rows)

    def _refresh_sensors(self, rows: np.ndarray) -> None:
        """Run MuJoCo's forward pass for ``rows`` so sensors describe their new state."""
        data = self._scratch[0]
        for row in rows:
            model = self.model_of(row)
            mujoco.mj_setState(model, data, self._state[row], _STATE)
            mujoco.mj_forward(model, data)
            self._sensors[row] = data.sensordata

    def step(self, ctrl: torch.Tensor) -> None:
        if self._forced_ctrl is None:
            control, control_spec = self._ctrl, _CTRL
        else:
            control, control_spec = self._forced_ctrl, _CTRL_FORCES
        control[:, :, : self.model.nu] = ctrl.detach().cpu().numpy()[:, None, :]
        start_time = self._state[:, 0].copy()
        # Straight to C: the models (one shared, or one per env of one size signature by construction)
        # and every array already have exactly the shapes and types the rollout expects.
        self._pool.rollout(
            self._shared_models if self._models is None else self._models,
            self._scratch,
            self._state,
            control,
            control_spec=control_spec,
            skip_checks=True,
            nstep=self.frame_skip,
            state=self._trajectory,
            sensordata=self._sensor_trajectory,
        )
        self._state[:] = self._trajectory[:, -1]
        self._sensors[:] = self._sensor_trajectory[:, -1]
        # MuJoCo's automatic reset of an unstable simulator restarts its clock.
        diverged = np.abs(self._state[:, 0] - (start_time + self._step_time)) > 1e-9
        diverged |= ~np.isfinite(self._state).all(axis=1)
        if diverged.any():
            self._state[diverged, 1:] = np.nan
        self._diverged = torch.from_numpy(diverged).to(self.device)

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device, self.dtype)

    @property
    def qpos(self) -> torch.Tensor:
        return self._tensor(self._state[:, self._qpos_slice])

    @property
    def qvel(self) -> torch.Tensor:
        return self._tensor(self._state[:, self._qvel_slice])

    @property
    def time(self) -> torch.Tensor:
        return self._tensor(self._state[:, 0])

    @property
    def diverged(self) -> torch.Tensor:
        return self._diverged

    def site_positions(self) -> torch.Tensor:
        start = getattr(self, "_site_sensor_start", 0)
        block = self._sensors[:, start : start + 3 * len(self.site_ids)]
        return self._tensor(block).reshape(self.num_envs, len(self.site_ids), 3)

    def contacts(self) -> torch.Tensor:
        start = getattr(self, "_contact_sensor_start", 0)
        found = self._sensors[:, start : start + len(self.contact_geom_ids)]
        return torch.from_numpy(found > 0).to(self.device)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None
