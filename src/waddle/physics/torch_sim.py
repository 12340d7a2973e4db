"""mujoco-torch backend: MJX ported to PyTorch, batched with ``torch.vmap``.

Every env is one slice of a batched ``mujoco_torch.Data``; a substep is
``torch.vmap(mujoco_torch.step)``, and a :meth:`MujocoTorchBackend.step` runs
``frame_skip`` of them, optionally through ``torch.compile``
(``compile_step=True``). Gradients are plain torch autograd: with
``requires_grad=True`` the graph from ``(qpos, qvel, ctrl)`` to the new state
is recorded whenever grad mode is on.

What works on torch 2.13 with mujoco-torch 0.2.0, and what this backend does
about what does not:

* **Constraint solver in a fixed number of iterations.** By default
  ``mujoco_torch.step`` solves constraints in ``while_loop``s that stop at
  MuJoCo's tolerance. Under ``torch.vmap`` these go through
  ``torch._higher_order_ops.while_loop``, and stable torch 2.13 fails there
  (even with mujoco-torch's own batching-rule patch installed)::

      torch._dynamo.exc.InternalTorchDynamoError: NotImplementedError:
      Cannot access storage of BatchedTensorImpl

  This backend therefore always passes ``fixed_iterations=True``: exactly
  ``solver_iterations`` solver iterations of ``ls_iterations`` line-search
  steps each, straight-line code that vmaps, compiles and backpropagates. The
  defaults (4 and 8, or the model's own counts where smaller) reach MuJoCo's
  converged Newton solution on the models tested here; more cost time
  linearly (the model's default of 100 x 50 makes a substep ~100 x slower).
* **float64 simulation.** mujoco-torch 0.2.0's collision functions return
  float64 distances for a float32 model, and the constraint builder then
  fails (``RuntimeError: expected scalar type Double but found Float``). The
  simulation therefore always runs in float64; ``dtype`` is the dtype of the
  tensors this backend returns (cast differentiably).
* **No friction loss.** mujoco-torch 0.2.0 builds the constraint rows of
  joint and tendon ``frictionloss`` but its solver treats them like equality
  constraints: the friction force is never capped at ``frictionloss``, so a
  joint with friction loss behaves like a very stiff damper (on MicroDuck,
  ``qacc`` comes out wrong by ~85% of its size in the first forward pass).
  A model with friction loss therefore raises a :class:`NotImplementedError`
  naming the alternatives (``backend='mjx'`` or ``backend='mujoco'``), unless
  ``frictionloss='ignore'`` asks to simulate it without friction loss, which
  changes the physics.
* **Box contacts sit lower than MuJoCo's.** mujoco-torch 0.2.0 places each
  box-plane contact at the box's corner instead of midway between the
  surfaces (MuJoCo C and MJX), so the contact torque arms differ by half the
  penetration depth. Trajectories with resting boxes (MicroDuck's soles)
  drift from MuJoCo's by ~1e-3 over a second; spheres and capsules match
  MuJoCo C to rounding error.
* **No torch.compile on torch 2.13.** ``torch.compile`` of the batched step
  fails in Dynamo on mujoco-torch's ``UnbatchedTensor`` fields
  (``AttributeError: 'Tensor' object has no attribute '_add_batch_dim'``;
  compiling the unbatched step fails the same way with ``'UnbatchedTensor'
  object has no attribute '_data'``). ``compile_step=True`` turns that into a
  :class:`RuntimeError` naming the alternatives on the first step; the eager
  path (the default) works.
* **One model for every env.** Per-env model parameters
  (:meth:`~waddle.physics.base.PhysicsBackend.set_model_fields`, which domain
  randomization of friction, masses or servo constants needs) are refused
  with the alternatives named; :meth:`MujocoTorchBackend.set_qvel` (pushes)
  works.
* ``differentiable_mode`` (smooth collisions, contacts from distance,
  adaptive integration; ``diff_config=mujoco_torch.DiffConfig(...)``) is
  applied to every substep when given; by default MuJoCo's hard contacts are
  differentiated as they are.

Contact flags: like MJX, mujoco-torch evaluates every candidate geom pair and
pads its contact arrays; a tracked geom's flag is true when a contact
involving it has ``dist < includemargin`` (``margin - gap``).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import mujoco
import torch

try:
    import mujoco_torch
    from tensordict import UnbatchedTensor
except ImportError as err:  # pragma: no cover - exercised without the extra
    raise ImportError(
        f"The 'mujoco-torch' physics backend needs the mujoco-torch package ({err}). "
        "Install it with: pip install 'waddle[torch-sim]'"
    ) from err

from waddle.physics.base import PhysicsBackend

_SIM_DTYPE = torch.float64
_DEFAULT_SOLVER_ITERATIONS = 4
_DEFAULT_LS_ITERATIONS = 8


def _unhealthy(x: torch.Tensor) -> torch.Tensor:
    """Per env: an entry is non-finite or beyond MuJoCo's ``mjMAXVAL``."""
    x = x.detach()
    return ~(torch.isfinite(x) & (x.abs() <= mujoco.mjMAXVAL)).all(dim=-1)


def _merge_rows(old, new, idx: torch.Tensor):
    """``old`` with rows ``idx`` replaced by ``new`` (out of place, differentiable)."""

    def merge(a, b):
        if isinstance(a, UnbatchedTensor) or a.ndim == 0:
            return a
        return a.index_copy(0, idx, b)

    return old.apply(merge, new)


class MujocoTorchBackend(PhysicsBackend):
    """mujoco-torch (MJX in PyTorch), batched with ``torch.vmap``.

    Args:
        solver_iterations: constraint-solver iterations per substep, run
            unconditionally (see the module docstring). Defaults to
            ``min(model.opt.iterations, 4)``.
        ls_iterations: line-search steps per solver iteration. Defaults to
            ``min(model.opt.ls_iterations, 8)``.
        compile_step: compile the batched ``frame_skip`` substeps with
            ``torch.compile`` (fails on torch 2.13, see the module docstring).
        compile_kwargs: keyword arguments for ``torch.compile``.
        diff_config: a ``mujoco_torch.DiffConfig`` whose differentiability
            features apply to every substep.
        frictionloss: ``"error"`` (default) refuses a model with joint or
            tendon friction loss, which mujoco-torch 0.2.0 simulates wrongly;
            ``"ignore"`` simulates it with friction loss set to zero.

    See :class:`~waddle.physics.base.PhysicsBackend` for the other arguments.
    """

    name = "mujoco-torch"
    differentiable = True

    def __init__(
        self,
        model: mujoco.MjModel | mujoco.MjSpec,
        *,
        solver_iterations: int | None = None,
        ls_iterations: int | None = None,
        compile_step: bool = False,
        compile_kwargs: dict | None = None,
        diff_config: mujoco_torch.DiffConfig | None = None,
        frictionloss: str = "error",
        **kwargs,
    ) -> None:
        super().__init__(model, **kwargs)
        if not self.dtype.is_floating_point:
            raise ValueError(f"dtype must be a floating dtype, got {self.dtype}.")
        if frictionloss not in ("error", "ignore"):
            raise ValueError(f"frictionloss must be 'error' or 'ignore', got {frictionloss!r}.")
        sim_model = copy.deepcopy(self.model)
        n_friction = int((sim_model.dof_frictionloss > 0).sum()) + int((sim_model.tendon_frictionloss > 0).sum())
        if n_friction and frictionloss == "error":
            raise NotImplementedError(
                f"This model has friction loss on {n_friction} joint(s)/tendon(s), which "
                "mujoco-torch 0.2.0 does not simulate correctly: its constraint solver "
                "never caps the friction-loss force, so the joints act as stiff dampers. "
                "Use backend='mjx' (differentiable) or backend='mujoco' (CPU) for this "
                "model, or pass frictionloss='ignore' to simulate it without friction loss."
            )
        sim_model.dof_frictionloss[:] = 0.0
        sim_model.tendon_frictionloss[:] = 0.0
        sim_model.opt.iterations = int(solver_iterations or min(self.model.opt.iterations, _DEFAULT_SOLVER_ITERATIONS))
        sim_model.opt.ls_iterations = int(ls_iterations or min(self.model.opt.ls_iterations, _DEFAULT_LS_ITERATIONS))
        self.sim_model = sim_model
        self.diff_config = diff_config
        self._site_idx = torch.as_tensor(self.site_ids, dtype=torch.long, device=self.device)
        self._geom_idx = torch.as_tensor(self.contact_geom_ids, dtype=torch.long, device=self.device)

        mx = mujoco_torch.device_put(sim_model)
        d0 = mujoco_torch.device_put(mujoco.MjData(sim_model))
        if self.device.type != "cpu":
            mx = mx.to(self.device)
            d0 = d0.to(self.device)
        self._mx = mx
        self._d0 = d0

        self._vstep = torch.vmap(lambda d: mujoco_torch.step(mx, d, fixed_iterations=True))
        self._vforward = torch.vmap(lambda d: mujoco_torch.forward(mx, d, fixed_iterations=True))
        frame_skip = self.frame_skip
        vstep = self._vstep

        def substeps(d, ctrl):
            # mujoco-torch, like MuJoCo C, quietly resets the bad entries of a
            # non-finite or huge state at the start of the next substep; flag
            # such envs after every substep instead of letting that go unseen.
            d = d.replace(ctrl=ctrl)
            bad = torch.zeros(d.qpos.shape[0], dtype=torch.bool, device=d.qpos.device)
            for _ in range(frame_skip):
                d = vstep(d)
                bad = bad | _unhealthy(d.qpos) | _unhealthy(d.qvel) | _unhealthy(d.qacc)
            return d, bad

        self.compile_step = bool(compile_step)
        self._compiled_ok = False
        if self.compile_step:
            substeps = torch.compile(substeps, **(compile_kwargs or {}))
        self._substeps = substeps

        self._data = d0.expand(self.num_envs).clone()
        # The env's state became non-finite or huge during a step since its
        # last reset; its qpos/qvel are then NaN.
        self._diverged = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        qpos0 = torch.as_tensor(self.model.qpos0, dtype=_SIM_DTYPE, device=self.device)
        self.reset(
            qpos0.expand(self.num_envs, self.nq),
            torch.zeros(self.num_envs, self.nv, dtype=_SIM_DTYPE, device=self.device),
        )

    def _mode(self):
        """Grad mode and mujoco-torch's differentiable features for a physics call."""
        stack = contextlib.ExitStack()
        if not self.requires_grad:
            stack.enter_context(torch.no_grad())
        if self.diff_config is not None:
            stack.enter_context(mujoco_torch.differentiable_mode(**dataclasses.asdict(self.diff_config)))
        return stack

    def _input(self, tensor: torch.Tensor, shape: tuple[int, ...], what: str) -> torch.Tensor:
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{what} must have shape {shape}, got {tuple(tensor.shape)}.")
        if not self.requires_grad:
            tensor = tensor.detach()
        return tensor.to(device=self.device, dtype=_SIM_DTYPE)

    def reset(self, qpos: torch.Tensor, qvel: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        qpos = self._input(qpos, (self.num_envs, self.nq), "qpos")
        qvel = self._input(qvel, (self.num_envs, self.nv), "qvel")
        if mask is None:
            idx = torch.arange(self.num_envs, device=self.device)
        else:
            mask = torch.as_tensor(mask, device=self.device).reshape(-1).to(torch.bool)
            if mask.shape[0] != self.num_envs:
                raise ValueError(f"mask must have {self.num_envs} entries, got {mask.shape[0]}.")
            idx = mask.nonzero().squeeze(-1)
        if idx.numel() == 0:
            return
        self._diverged[idx] = False
        fresh = self._d0.expand(idx.numel()).clone()
        fresh = fresh.replace(qpos=qpos[idx], qvel=qvel[idx])
        with self._mode():
            fresh = self._vforward(fresh)
            if idx.numel() == self.num_envs:
                self._data = fresh
            else:
                self._data = _merge_rows(self._data, fresh, idx)

    def set_qvel(self, qvel: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        qvel = self._input(qvel, (self.num_envs, self.nv), "qvel")
        if mask is None:
            mask = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)
        mask = torch.as_tensor(mask, device=self.device).reshape(-1, 1).to(torch.bool)
        with self._mode():
            self._data = self._data.replace(qvel=torch.where(mask, qvel, self._data.qvel))

    def step(self, ctrl: torch.Tensor) -> None:
        ctrl = self._input(ctrl, (self.num_envs, self.nu), "ctrl")
        with self._mode():
            if self.compile_step and not self._compiled_ok:
                data, bad = self._first_compiled_step(ctrl)
            else:
                data, bad = self._substeps(self._data, ctrl)
            # No host sync on the step path: mark diverged envs with NaN unconditionally.
            nan = torch.full((), float("nan"), dtype=_SIM_DTYPE, device=self.device)
            data = data.replace(
                qpos=torch.where(bad[:, None], nan, data.qpos),
                qvel=torch.where(bad[:, None], nan, data.qvel),
            )
            self._diverged = self._diverged | bad
            self._data = data

    def _first_compiled_step(self, ctrl):
        try:
            out = self._substeps(self._data, ctrl)
        except Exception as err:  # torch.compile raises many exception types
            raise RuntimeError(
                f"torch.compile of mujoco-torch's batched step failed on torch "
                f"{torch.__version__} ({type(err).__name__}: {str(err).splitlines()[0]}). "
                "Use compile_step=False (eager mujoco-torch works), or backend='mjx' "
                "for a compiled differentiable simulator, or backend='mujoco' on CPU."
            ) from err
        self._compiled_ok = True
        return out

    def _out(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor if tensor.dtype == self.dtype else tensor.to(self.dtype)

    @property
    def qpos(self) -> torch.Tensor:
        return self._out(self._data.qpos)

    @property
    def qvel(self) -> torch.Tensor:
        return self._out(self._data.qvel)

    @property
    def time(self) -> torch.Tensor:
        return self._out(self._data.time.detach())

    @property
    def diverged(self) -> torch.Tensor:
        return self._diverged

    def site_positions(self) -> torch.Tensor:
        return self._out(self._data.site_xpos[:, self._site_idx])

    def contacts(self) -> torch.Tensor:
        contact = self._data.contact
        if self._geom_idx.numel() == 0 or contact.dist.shape[-1] == 0:
            return torch.zeros(self.num_envs, self._geom_idx.numel(), dtype=torch.bool, device=self.device)
        active = (contact.dist < contact.includemargin).detach()  # (B, ncon)
        geom = contact.geom  # (B, ncon, 2)
        ids = self._geom_idx
        involved = (geom[..., 0:1] == ids) | (geom[..., 1:2] == ids)  # (B, ncon, n)
        return (involved & active[..., None]).any(dim=1)

    def detach(self) -> None:
        self._data = self._data.detach()


__all__ = ["MujocoTorchBackend"]
