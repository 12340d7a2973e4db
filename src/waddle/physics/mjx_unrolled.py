"""MJX's step with its constraint solver unrolled: reverse mode through a converged solve.

``mjx.step`` iterates the constraint solver in a ``lax.while_loop`` (stopping
at ``opt.tolerance`` or ``opt.iterations``), and reverse-mode autodiff cannot
go through a while loop. :func:`step` is the same computation with that loop
replaced by a ``lax.scan`` of fixed length ``iterations`` whose body becomes a
no-op once MJX's own stopping test holds (the construction MJX already uses
for its line search). So:

* whenever the solve converges within ``iterations``, the result is
  bit-for-bit the result of ``mjx.step`` on the same model: a policy trained
  through gradients runs on the robot that the plain path simulates;
* the gradient is the derivative of the iterations actually taken, which
  approaches the derivative of the converged solution as Newton converges
  (quadratically, so a few iterations suffice from the warm start);
* under ``vmap`` the no-op branch is a ``select``, so every one of the
  ``iterations`` is computed: the cost grows linearly with ``iterations``.

This reaches into MJX's private solver helpers (``mujoco.mjx._src``); the
composition follows ``mujoco.mjx._src.forward.step`` of MuJoCo 3.7, and
``tests/physics/test_mjx_unrolled.py`` pins it against ``mjx.step``.
"""

from __future__ import annotations

import jax.numpy as jnp
import mujoco
from mujoco.mjx._src import forward as mjx_forward
from mujoco.mjx._src import math as mjx_math
from mujoco.mjx._src import sensor as mjx_sensor
from mujoco.mjx._src import solver as mjx_solver
from mujoco.mjx._src.types import DisableBit, IntegratorType, SolverType


def solve(m, d, iterations: int):
    """MJX's constraint solve (Newton or CG) in at most ``iterations`` scanned iterations."""
    if m.opt.solver not in (SolverType.NEWTON, SolverType.CG):
        raise ValueError(f"the unrolled MJX solver supports the Newton and CG solvers, not {m.opt.solver}.")

    def unconverged(ctx):
        improvement = mjx_solver._rescale(m, ctx.prev_cost - ctx.cost)
        gradient = mjx_solver._rescale(m, mjx_math.norm(ctx.grad))
        return (improvement >= m.opt.tolerance) & (gradient >= m.opt.tolerance)

    def iterate(ctx):
        ctx = mjx_solver._linesearch(m, d, ctx)
        previous_grad, previous_mgrad = ctx.grad, ctx.Mgrad
        ctx = mjx_solver._update_constraint(m, d, ctx)
        ctx = mjx_solver._update_gradient(m, d, ctx)
        if m.opt.solver == SolverType.NEWTON:
            search = -ctx.Mgrad
        else:  # Polak-Ribiere conjugate gradient, as MJX's CG
            beta = jnp.dot(ctx.grad, ctx.Mgrad - previous_mgrad)
            beta = jnp.maximum(0, beta / jnp.maximum(mujoco.mjMINVAL, jnp.dot(previous_grad, previous_mgrad)))
            search = -ctx.Mgrad + beta * ctx.search
        return ctx.replace(search=search, solver_niter=ctx.solver_niter + 1)

    # The warm start MJX picks: the previous acceleration when it costs less than the smooth one.
    qacc = d.qacc_smooth
    if not m.opt.disableflags & DisableBit.WARMSTART:
        warm = mjx_solver.Context.create(m, d.replace(qacc=d.qacc_warmstart), grad=False)
        smooth = mjx_solver.Context.create(m, d.replace(qacc=d.qacc_smooth), grad=False)
        qacc = jnp.where(warm.cost < smooth.cost, d.qacc_warmstart, d.qacc_smooth)
    d = d.replace(qacc=qacc)

    ctx = mjx_solver.Context.create(m, d)
    ctx = mjx_solver._while_loop_scan(unconverged, iterate, ctx, iterations)
    return d.tree_replace({"qfrc_constraint": ctx.qfrc_constraint, "qacc": ctx.qacc, "_impl.efc_force": ctx.efc_force})


def forward(m, d, iterations: int):
    """``mjx.forward`` with :func:`solve` in place of MJX's while-loop solve."""
    d = mjx_forward.fwd_position(m, d)
    d = mjx_sensor.sensor_pos(m, d)
    d = mjx_forward.fwd_velocity(m, d)
    d = mjx_sensor.sensor_vel(m, d)
    d = mjx_forward.fwd_actuation(m, d)
    d = mjx_forward.fwd_acceleration(m, d)
    if d._impl.efc_J.size == 0:
        return d.replace(qacc=d.qacc_smooth)
    d = solve(m, d, iterations)
    return mjx_sensor.sensor_acc(m, d)


_INTEGRATORS = {
    IntegratorType.EULER: mjx_forward.euler,
    IntegratorType.IMPLICITFAST: mjx_forward.implicit,
}


def step(m, d, iterations: int):
    """``mjx.step`` with :func:`solve` in place of MJX's while-loop solve."""
    integrate = _INTEGRATORS.get(m.opt.integrator)
    if integrate is None:
        raise ValueError(
            f"the unrolled MJX step supports the Euler and implicitfast integrators, not {m.opt.integrator}."
        )
    return integrate(m, forward(m, d, iterations))


__all__ = ["forward", "solve", "step"]
