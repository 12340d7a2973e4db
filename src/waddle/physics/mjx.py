"""MJX backend: every env stepped by one compiled JAX program, on CPU or GPU.

The batch is a ``jax.vmap`` of one env's ``frame_skip`` substeps, which run in
a ``lax.scan``; the whole :meth:`MjxBackend.step` is one ``jax.jit``-compiled
call. The simulator state (an ``mjx.Data`` with a leading batch axis) stays on
the JAX device between steps, and tensors cross between torch and JAX through
DLPack, so nothing goes through host memory on a GPU.

Precision:
    ``dtype=torch.float32`` runs MJX in float32 (JAX's default);
    ``dtype=torch.float64`` runs it in float64. Double precision is switched
    on only around this backend's own JAX calls (``jax.enable_x64``), so the
    rest of the process keeps its JAX configuration.

Differentiability (``requires_grad=True``):
    A step becomes the pure function ``(qpos, qvel, ctrl) -> (qpos', qvel',
    site_xpos, contact_flags)``: the ``mjx.Data`` is rebuilt inside it from a
    template plus ``qpos``/``qvel`` (and the non-differentiated carry: the
    activations, the solver warm start and the clock). The function is wrapped
    by :class:`waddle.bridge.JaxFunction`, so backpropagating a loss on
    ``qpos``/``qvel``/``site_positions()`` reaches ``ctrl`` and the previous
    state through a VJP that JAX compiles once. Contact flags carry no
    gradient.

    MJX's constraint solver iterates in a ``lax.while_loop`` that reverse mode
    cannot differentiate. The differentiable path runs MJX's own solve, on the
    model's own settings, for the value of each substep, and takes its
    derivative from one Newton step at the converged solution (the
    implicit-function derivative; :mod:`waddle.physics.mjx_implicit`). So the
    trajectory is exactly the one ``requires_grad=False`` simulates, and a
    policy trained through gradients is evaluated on the robot it was trained
    on. The model must use the Newton solver (MuJoCo's default). Gradients
    through contacts are those of MuJoCo's soft contact model as MJX computes
    them (no smoothing is added). Site positions read right after a
    :meth:`~MjxBackend.reset` carry no gradient (those after a step do).

Contact flags: MJX evaluates every candidate geom pair each substep and pads
the contact arrays to a fixed size; a padded or separated candidate has
``dist >= includemargin`` (``includemargin = margin - gap``). A tracked geom's
flag is true when a candidate involving it has ``dist < includemargin``, which
is the set of contacts that enter MuJoCo's constraint solver (the same as
MuJoCo C's contact list whenever ``gap`` is 0, MuJoCo's default).

Per-env model parameters (:meth:`MjxBackend.set_model_fields`): the named
fields of the ``mjx.Model`` get a leading batch axis and the step vmaps over
it (``in_axes`` 0 for those fields, ``None`` for the rest), so every env runs
with its own friction, masses and servo constants in the same compiled
program. The differentiable path (``requires_grad=True``) keeps one model.

Tensors returned by the state accessors share memory with the JAX state
(zero-copy DLPack); treat them as read-only.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping

import mujoco
import numpy as np
import torch

try:
    import jax
    import jax.numpy as jnp

    # mujoco.mjx prints "Failed to import warp" when the optional MuJoCo Warp
    # backend is absent; waddle never uses it, so keep that off the user's screen.
    with contextlib.redirect_stdout(io.StringIO()):
        from mujoco import mjx
except ImportError as err:  # pragma: no cover - exercised without the extra
    raise ImportError(
        f"The 'mjx' physics backend needs JAX and MuJoCo MJX ({err}). Install them with: pip install 'waddle[mjx]'"
    ) from err

from waddle.bridge import JaxFunction, resolve_batch_chunks
from waddle.bridge.dlpack import jax_device, jax_to_torch, torch_to_jax
from waddle.physics import mjx_implicit
from waddle.physics.base import PhysicsBackend

_OUTPUTS = ("qpos", "qvel", "time", "sites", "contacts")


def _contact_flags(contact, geom_ids: np.ndarray):
    """``(len(geom_ids),)`` bool: a penetrating contact involves the geom (one env)."""
    if geom_ids.size == 0:
        return jnp.zeros((0,), dtype=bool)
    if contact.dist.shape[0] == 0:
        return jnp.zeros(geom_ids.shape, dtype=bool)
    active = contact.dist < contact.includemargin  # (ncon,)
    ids = jnp.asarray(geom_ids)
    involved = (contact.geom[:, 0:1] == ids) | (contact.geom[:, 1:2] == ids)  # (ncon, n)
    return jnp.any(involved & active[:, None], axis=0)


class MjxBackend(PhysicsBackend):
    """MuJoCo MJX (JAX), batched with ``jax.vmap`` and compiled with ``jax.jit``.

    Args:
        batch_chunks: with ``requires_grad=True``, run the differentiable
            step as this many equal row blocks of the batch at once, one
            thread each (see :class:`waddle.bridge.JaxFunction`); it must
            divide ``num_envs``. ``"auto"`` (default): on a CPU, one block
            per usable core, at least 8 envs each (XLA alone keeps about 1.3
            cores busy with a vmapped step), for a model without
            constraints; 1 for a model with constraints (contacts, joint
            friction loss, limits: the MicroDuck), whose Newton solve calls
            LAPACK kernels that deadlock jaxlib 0.10's CPU thread pool when
            several blocks run them at once; 1 on a GPU.
        compiler_options: XLA compiler options for the backend's ``jax.jit``
            programs. On a CPU, ``{"xla_llvm_disable_expensive_passes": True}``
            compiles ~40% faster with the same results. Avoid
            ``{"xla_backend_optimization_level": 0}``: with jax 0.10.2 it
            changes MJX's contact results (trajectories leave MuJoCo's by
            1e-4 within two substeps on MicroDuck).

    See :class:`~waddle.physics.base.PhysicsBackend` for the other arguments.
    """

    name = "mjx"
    differentiable = True

    def __init__(
        self,
        model: mujoco.MjModel | mujoco.MjSpec,
        *,
        batch_chunks: int | str = "auto",
        compiler_options: dict | None = None,
        **kwargs,
    ) -> None:
        super().__init__(model, **kwargs)
        self.batch_chunks = resolve_batch_chunks(batch_chunks, self.num_envs, self.device, "backend='mjx'")
        if self.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"backend='mjx' supports float32 and float64, not {self.dtype}.")
        self._x64 = self.dtype == torch.float64
        self._jax_device = jax_device(self.device, "backend='mjx'")
        self._site_ids = np.asarray(self.site_ids, dtype=np.int32)
        self._geom_ids = np.asarray(self.contact_geom_ids, dtype=np.int32)

        if self.requires_grad and self.model.opt.solver != mujoco.mjtSolver.mjSOL_NEWTON:
            raise ValueError(
                "backend='mjx' with requires_grad=True differentiates the Newton solver's solution; this model "
                f'uses the {mujoco.mjtSolver(self.model.opt.solver).name.removeprefix("mjSOL_")} solver. Set <option solver="Newton"/> in its MJCF.'
            )

        self._compiler_options = dict(compiler_options or {})
        with self._jax_scope():
            self._mx = mjx.put_model(self.model, device=self._jax_device, impl="jax")
            self._d0 = mjx.make_data(self._mx, device=self._jax_device, impl="jax")
            if batch_chunks == "auto" and self._d0._impl.efc_J.size:
                # A model with constraints runs MJX's Newton solve, whose batched LAPACK kernels (jaxlib
                # 0.10) split their batch over XLA's CPU thread pool and wait for the parts: programs of
                # several row blocks fill a 2-core pool with waiting kernels, and the step never returns.
                self.batch_chunks = 1
            self._build_functions()

        self._outputs: dict[str, torch.Tensor] = {}
        self._batched_fields: dict = {}
        self._data = None
        qpos0 = torch.as_tensor(self.model.qpos0, dtype=self.dtype, device=self.device)
        qpos0 = qpos0.expand(self.num_envs, self.nq)
        qvel0 = torch.zeros(self.num_envs, self.nv, dtype=self.dtype, device=self.device)
        if self.requires_grad:
            # Autograd state lives on the torch side; the rest is a plain carry.
            self._carry = [
                torch.zeros(self.num_envs, self.model.na, dtype=self.dtype, device=self.device),
                torch.zeros(self.num_envs, self.nv, dtype=self.dtype, device=self.device),
                torch.zeros(self.num_envs, dtype=self.dtype, device=self.device),
            ]
            self._qpos_t, self._qvel_t = qpos0, qvel0
            self._sites_t = self._contacts_t = None
        else:
            with self._jax_scope():
                self._data = jax.vmap(lambda _: self._d0)(jnp.arange(self.num_envs))
        self.reset(qpos0, qvel0)

    # ------------------------------------------------------------------ jax side

    def _jax_scope(self):
        """Run JAX in this backend's precision, on its device."""
        stack = contextlib.ExitStack()
        stack.enter_context(jax.enable_x64(self._x64))
        stack.enter_context(jax.default_device(self._jax_device))
        return stack

    def _build_functions(self) -> None:
        frame_skip = self.frame_skip
        site_ids = self._site_ids
        geom_ids = self._geom_ids
        d0 = self._d0
        nominal = self._mx

        def axes(m):
            # A field set per env carries one more (leading) axis than the nominal model's.
            return jax.tree_util.tree_map(lambda a, b: 0 if np.ndim(a) > np.ndim(b) else None, m, nominal)

        def fresh(m, qpos, qvel):
            d = d0.replace(qpos=qpos, qvel=qvel)
            return mjx.forward(m, d)

        def substeps(m, d, ctrl):
            d = d.replace(ctrl=ctrl)

            def body(d, _):
                return mjx.step(m, d), None

            d, _ = jax.lax.scan(body, d, None, length=frame_skip)
            return d

        def readout(d):
            return (
                d.qpos,
                d.qvel,
                d.time,
                d.site_xpos[site_ids],
                _contact_flags(d._impl.contact, geom_ids),
            )

        def reset(m, d, qpos, qvel, mask):
            new = jax.vmap(fresh, in_axes=(axes(m), 0, 0))(m, qpos, qvel)

            def pick(a, b):
                return jnp.where(mask.reshape((-1,) + (1,) * (a.ndim - 1)), a, b)

            d = jax.tree_util.tree_map(pick, new, d)
            return d, jax.vmap(readout)(d)

        def step(m, d, ctrl):
            d = jax.vmap(substeps, in_axes=(axes(m), 0, 0))(m, d, ctrl)
            return d, jax.vmap(readout)(d)

        options = self._compiler_options or None
        self._jit_reset = jax.jit(reset, compiler_options=options)
        self._jit_step = jax.jit(step, compiler_options=options)

        if not self.requires_grad:
            return

        mx = self._mx

        def differentiable_substeps(m, d, ctrl):
            d = d.replace(ctrl=ctrl)

            def body(d, _):
                return mjx_implicit.step(m, d), None

            d, _ = jax.lax.scan(body, d, None, length=frame_skip)
            return d

        def pure_step(qpos, qvel, ctrl, act, warm, time):
            def one(qpos, qvel, ctrl, act, warm, time):
                d = d0.replace(
                    qpos=qpos,
                    qvel=qvel,
                    act=act,
                    qacc_warmstart=jax.lax.stop_gradient(warm),
                    time=jax.lax.stop_gradient(time),
                )
                d = differentiable_substeps(mx, d, ctrl)
                return (
                    d.qpos,
                    d.qvel,
                    d.site_xpos[site_ids],
                    _contact_flags(d._impl.contact, geom_ids),
                    d.act,
                    d.qacc_warmstart,
                    d.time,
                )

            return jax.vmap(one)(qpos, qvel, ctrl, act, warm, time)

        def pure_forward(qpos, qvel):
            def one(qpos, qvel):
                d = fresh(mx, qpos, qvel)
                return (
                    d.site_xpos[site_ids],
                    _contact_flags(d._impl.contact, geom_ids),
                )

            return jax.vmap(one)(qpos, qvel)

        self._diff_step = JaxFunction(
            pure_step,
            name="mjx_step",
            input_names=("qpos", "qvel", "ctrl", "act", "qacc_warmstart", "time"),
            batch_chunks=self.batch_chunks,
            compiler_options=options,
        )
        self._diff_forward = JaxFunction(
            pure_forward, name="mjx_forward", batch_chunks=self.batch_chunks, compiler_options=options
        )

    # ------------------------------------------------------------ torch side

    def _input(self, tensor: torch.Tensor, shape: tuple[int, ...], what: str) -> torch.Tensor:
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{what} must have shape {shape}, got {tuple(tensor.shape)}.")
        return tensor.to(device=self.device, dtype=self.dtype)

    def _mask(self, mask: torch.Tensor | None) -> torch.Tensor:
        if mask is None:
            return torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        mask = torch.as_tensor(mask, device=self.device).reshape(-1).to(torch.bool)
        if mask.shape[0] != self.num_envs:
            raise ValueError(f"mask must have {self.num_envs} entries, got {mask.shape[0]}.")
        return mask

    def reset(self, qpos: torch.Tensor, qvel: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        qpos = self._input(qpos, (self.num_envs, self.nq), "qpos")
        qvel = self._input(qvel, (self.num_envs, self.nv), "qvel")
        mask = self._mask(mask)
        if self.requires_grad:
            self._reset_differentiable(qpos, qvel, mask)
            return
        with self._jax_scope():
            self._data, out = self._jit_reset(
                self._model(), self._data, torch_to_jax(qpos), torch_to_jax(qvel), torch_to_jax(mask)
            )
        self._outputs = dict(zip(_OUTPUTS, out))

    def _model(self):
        """The model the step runs: the nominal one, with the per-env fields batched in."""
        return self._mx.replace(**self._batched_fields) if self._batched_fields else self._mx

    @property
    def per_env_models(self) -> bool:
        return not self.requires_grad

    def set_model_fields(self, fields: Mapping[str, torch.Tensor], mask: torch.Tensor | None = None) -> None:
        if self.requires_grad:
            raise NotImplementedError(
                "backend='mjx' with requires_grad=True steps one model for every env; per-env model "
                "parameters need requires_grad=False, or backend='mujoco' on a CPU."
            )
        mask = self._mask(mask)
        batched = {}
        for name, value in fields.items():
            nominal = getattr(self._mx, name, None)
            if not isinstance(nominal, jax.Array):
                raise ValueError(f"set_model_fields: {name!r} is not an array field of mjx.Model.")
            value = self._input(value.detach(), (self.num_envs, *nominal.shape), name)
            batched[name] = (nominal, value)
        with self._jax_scope():
            for name, (nominal, value) in batched.items():
                current = self._batched_fields.get(name)
                if current is None:
                    current = jnp.broadcast_to(nominal, (self.num_envs, *nominal.shape))
                keep = torch_to_jax(mask).reshape((-1,) + (1,) * nominal.ndim)
                new = torch_to_jax(value.contiguous()).astype(nominal.dtype)
                self._batched_fields[name] = jnp.where(keep, new, current)

    def set_qvel(self, qvel: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        qvel = self._input(qvel, (self.num_envs, self.nv), "qvel")
        mask = self._mask(mask)
        if self.requires_grad:
            self._qvel_t = torch.where(mask[:, None], qvel, self._qvel_t)
            return
        with self._jax_scope():
            new = jnp.where(torch_to_jax(mask)[:, None], torch_to_jax(qvel.contiguous()), self._data.qvel)
            self._data = self._data.replace(qvel=new)
        self._outputs["qvel"] = new

    def _reset_differentiable(self, qpos, qvel, mask) -> None:
        full = bool(mask.all()) or self._sites_t is None
        sel = mask[:, None]
        self._qpos_t = qpos if full else torch.where(sel, qpos, self._qpos_t)
        self._qvel_t = qvel if full else torch.where(sel, qvel, self._qvel_t)
        # A fresh carry (zero activations and warm start, clock at 0) for reset envs.
        act, warm, time = self._carry
        self._carry = [
            torch.where(sel, torch.zeros_like(act), act) if act.numel() else act,
            torch.where(sel, torch.zeros_like(warm), warm),
            torch.where(mask, torch.zeros_like(time), time),
        ]
        # Positions right after a reset carry no gradient (that would compile a
        # second VJP program for a value hardly ever differentiated).
        with self._jax_scope():
            sites, contacts = self._diff_forward(self._qpos_t.detach(), self._qvel_t.detach())
        sites = sites.reshape(self.num_envs, -1, 3)
        if full:
            self._sites_t, self._contacts_t = sites, contacts
        else:
            self._sites_t = torch.where(sel[..., None], sites, self._sites_t)
            self._contacts_t = torch.where(sel, contacts, self._contacts_t)

    def step(self, ctrl: torch.Tensor) -> None:
        if self.requires_grad:
            ctrl = self._input(ctrl, (self.num_envs, self.nu), "ctrl")
            act, warm, time = self._carry
            with self._jax_scope():
                qpos, qvel, sites, contacts, act, warm, time = self._diff_step(
                    self._qpos_t, self._qvel_t, ctrl, act, warm, time
                )
            self._qpos_t, self._qvel_t = qpos, qvel
            self._sites_t = sites.reshape(self.num_envs, -1, 3)
            self._contacts_t = contacts
            self._carry = [act.detach(), warm.detach(), time.detach()]
            return
        ctrl = self._input(ctrl.detach(), (self.num_envs, self.nu), "ctrl")
        with self._jax_scope():
            self._data, out = self._jit_step(self._model(), self._data, torch_to_jax(ctrl))
        self._outputs = dict(zip(_OUTPUTS, out))

    def _output(self, key: str) -> torch.Tensor:
        value = self._outputs[key]
        if not isinstance(value, torch.Tensor):
            value = self._outputs[key] = jax_to_torch(value)
        return value

    @property
    def qpos(self) -> torch.Tensor:
        if self.requires_grad:
            return self._qpos_t
        return self._output("qpos")

    @property
    def qvel(self) -> torch.Tensor:
        if self.requires_grad:
            return self._qvel_t
        return self._output("qvel")

    @property
    def time(self) -> torch.Tensor:
        if self.requires_grad:
            return self._carry[2]
        return self._output("time")

    def site_positions(self) -> torch.Tensor:
        if self.requires_grad:
            return self._sites_t
        return self._output("sites")

    def contacts(self) -> torch.Tensor:
        if self.requires_grad:
            return self._contacts_t
        return self._output("contacts")

    @property
    def diverged(self) -> torch.Tensor:
        """``(num_envs,)`` bool: the env's state is non-finite or beyond ``mjMAXVAL``."""
        bound = mujoco.mjMAXVAL
        ok = torch.cat([self.qpos.detach(), self.qvel.detach()], dim=-1)
        return ~(torch.isfinite(ok) & (ok.abs() <= bound)).all(dim=-1)

    def detach(self) -> None:
        if self.requires_grad:
            self._qpos_t = self._qpos_t.detach()
            self._qvel_t = self._qvel_t.detach()
            self._sites_t = self._sites_t.detach()

    def close(self) -> None:
        self._data = None
        self._outputs = {}


__all__ = ["MjxBackend"]
