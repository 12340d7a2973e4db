"""MJX's step with a converged constraint solve that reverse mode can differentiate.

``mjx.step`` iterates the constraint solver in a ``lax.while_loop`` (until
``opt.tolerance`` or ``opt.iterations``), and reverse-mode autodiff cannot go
through a while loop. :func:`step` is ``mjx.step`` with the solve split in two:

* **value**: MJX's own solve, on the model's own settings, with the gradient
  stopped. The step's value is therefore exactly the plain path's: a policy
  trained through gradients runs on the robot that ``requires_grad=False``
  simulates.
* **derivative**: one Newton step taken at the converged acceleration
  ``a*``: ``a* - H(a*)^-1 g(a*)``, with ``g`` the gradient and ``H`` the
  Hessian of the solver's cost on the active constraints. Its derivative with
  respect to the state and controls is ``-H^-1 dg`` (the term in ``dH`` is
  multiplied by ``g(a*) = 0``), which is the implicit-function derivative of
  the converged solution. Its value is discarded (``a* + (step - stop(step))``)
  so the forward pass stays bit-exact.

``H`` is held constant (its derivative multiplies ``g(a*) = 0`` too), formed
by forward mode and inverted in the forward pass. The cost of a
differentiable step is the plain step plus that Hessian and its inverse;
the backward pass through the solve is a product by the saved inverse,
instead of a differentiation through every solver and line-search
iteration. Where the active constraint set changes (contact made or
broken) the derivative is that of the active piece, as for any derivative
of MuJoCo's solver.

This reaches into MJX's private solver helpers (``mujoco.mjx._src``); the
composition follows ``mujoco.mjx._src.forward.step`` of MuJoCo 3.7, and the
tests pin it (``tests/physics/test_microduck_gradients.py`` against central
differences of the plain path, ``tests/physics/test_microduck_parity.py``
against MuJoCo C).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from mujoco.mjx._src import forward as mjx_forward
from mujoco.mjx._src import sensor as mjx_sensor
from mujoco.mjx._src import solver as mjx_solver
from mujoco.mjx._src.types import IntegratorType, SolverType


def _value_of_first_gradient_of_second(value, differentiable):
    """``value`` in the forward pass, the derivative of ``differentiable`` in the backward pass."""
    return jax.lax.stop_gradient(value) + (differentiable - jax.lax.stop_gradient(differentiable))


def spd_inverse(matrix):
    """The inverse of a symmetric positive-definite ``(n, n)`` matrix by Gauss-Jordan elimination.

    Plain XLA operations (no LAPACK call, see :func:`solve`); without pivoting,
    which a positive-definite matrix does not need.
    """
    n = matrix.shape[-1]
    augmented = jnp.concatenate([matrix, jnp.eye(n, dtype=matrix.dtype)], axis=-1)

    def eliminate(k, rows):
        pivot_row = rows[k] / rows[k, k]
        rows = rows - jnp.outer(rows[:, k], pivot_row)
        return rows.at[k].set(pivot_row)

    return jax.lax.fori_loop(0, n, eliminate, augmented)[:, n:]


def _cost_gradient(m, d, qacc):
    """The gradient of the solver's cost at ``qacc``: ``M qacc - qfrc_smooth - qfrc_constraint``, as MJX's
    Newton solver forms it."""
    context = mjx_solver.Context.create(m, d.replace(qacc=qacc), grad=False)
    return context.Ma - d.qfrc_smooth - context.qfrc_constraint


def solve(m, d):
    """MJX's constraint solve (value) with the implicit derivative of its solution (gradient)."""
    if m.opt.solver != SolverType.NEWTON:
        raise ValueError(
            f"the differentiable MJX solve needs the Newton solver (opt.solver={m.opt.solver}); "
            "set <option solver='Newton'/> in the model."
        )
    converged = mjx_solver.solve(m, jax.lax.stop_gradient(d))
    solution = jax.lax.stop_gradient(converged.qacc)
    gradient = _cost_gradient(m, d, solution)
    # The cost's Hessian on the active constraints at the solution, held constant: its own derivative
    # multiplies g(a*) = 0. Formed by forward mode and inverted in plain XLA operations, so the backward
    # pass is a product by a saved matrix and the derivative adds no LAPACK call. jaxlib 0.10's batched
    # LAPACK kernels split their batch over XLA's CPU thread pool and wait for the parts; the several
    # independent solves of a Cholesky's backward pass filled a 2-core pool with waiting kernels, and
    # the step never returned.
    hessian = jax.lax.stop_gradient(jax.jacfwd(lambda qacc: _cost_gradient(m, d, qacc))(solution))
    newton_qacc = solution - spd_inverse(0.5 * (hessian + hessian.T)) @ gradient
    newton = mjx_solver.Context.create(m, d.replace(qacc=newton_qacc), grad=False)
    return d.tree_replace(
        {
            "qacc": _value_of_first_gradient_of_second(converged.qacc, newton.qacc),
            "qfrc_constraint": _value_of_first_gradient_of_second(converged.qfrc_constraint, newton.qfrc_constraint),
            "_impl.efc_force": _value_of_first_gradient_of_second(converged._impl.efc_force, newton.efc_force),
        }
    )


def forward(m, d):
    """``mjx.forward`` with :func:`solve` in place of MJX's solve."""
    d = mjx_forward.fwd_position(m, d)
    d = mjx_sensor.sensor_pos(m, d)
    d = mjx_forward.fwd_velocity(m, d)
    d = mjx_sensor.sensor_vel(m, d)
    d = mjx_forward.fwd_actuation(m, d)
    d = mjx_forward.fwd_acceleration(m, d)
    if d._impl.efc_J.size == 0:
        return d.replace(qacc=d.qacc_smooth)
    d = solve(m, d)
    return mjx_sensor.sensor_acc(m, d)


_INTEGRATORS = {
    IntegratorType.EULER: mjx_forward.euler,
    IntegratorType.IMPLICITFAST: mjx_forward.implicit,
}


def step(m, d):
    """``mjx.step`` with :func:`solve` in place of MJX's solve."""
    integrate = _INTEGRATORS.get(m.opt.integrator)
    if integrate is None:
        raise ValueError(
            f"the differentiable MJX step supports the Euler and implicitfast integrators, not {m.opt.integrator}."
        )
    return integrate(m, forward(m, d))


__all__ = ["forward", "solve", "spd_inverse", "step"]
