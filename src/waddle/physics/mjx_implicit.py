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

The cost of a differentiable step is the plain step, plus one Cholesky
factorisation and its backward, instead of differentiating through every
solver and line-search iteration. Where the active constraint set changes
(contact made or broken) the derivative is that of the active piece, as for
any derivative of MuJoCo's solver.

This reaches into MJX's private solver helpers (``mujoco.mjx._src``); the
composition follows ``mujoco.mjx._src.forward.step`` of MuJoCo 3.7, and the
tests pin it (``tests/physics/test_microduck_gradients.py`` against central
differences of the plain path, ``tests/physics/test_microduck_parity.py``
against MuJoCo C).
"""

from __future__ import annotations

import jax
from mujoco.mjx._src import forward as mjx_forward
from mujoco.mjx._src import sensor as mjx_sensor
from mujoco.mjx._src import solver as mjx_solver
from mujoco.mjx._src.types import IntegratorType, SolverType


def _value_of_first_gradient_of_second(value, differentiable):
    """``value`` in the forward pass, the derivative of ``differentiable`` in the backward pass."""
    return jax.lax.stop_gradient(value) + (differentiable - jax.lax.stop_gradient(differentiable))


def solve(m, d):
    """MJX's constraint solve (value) with the implicit derivative of its solution (gradient)."""
    if m.opt.solver != SolverType.NEWTON:
        raise ValueError(
            f"the differentiable MJX solve needs the Newton solver (opt.solver={m.opt.solver}); "
            "set <option solver='Newton'/> in the model."
        )
    converged = mjx_solver.solve(m, jax.lax.stop_gradient(d))
    at_solution = mjx_solver.Context.create(m, d.replace(qacc=jax.lax.stop_gradient(converged.qacc)))
    newton_qacc = at_solution.qacc - at_solution.Mgrad
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


__all__ = ["forward", "solve", "step"]
