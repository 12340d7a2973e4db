"""Central differences of a loss, to check autograd's directional derivatives,
and the double-pendulum gradient check every differentiable backend passes."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch


def central_difference(
    loss: Callable[..., torch.Tensor],
    args: Sequence[torch.Tensor],
    index: int,
    direction: torch.Tensor,
    *,
    eps: float = 1e-5,
    record_grad: bool = False,
) -> float:
    """``(loss(.., x + eps d, ..) - loss(.., x - eps d, ..)) / (2 eps)`` for ``x = args[index]``.

    With ``record_grad=True`` the perturbed argument requires grad while the
    loss runs, so a backend reuses its compiled differentiable programs
    instead of compiling its no-grad ones; otherwise the loss runs under
    :func:`torch.no_grad`. Float64 with eps 1e-5 leaves a truncation error of
    ~eps^2 times the third derivative and a rounding error of ~1e-16 / eps.
    """

    def at(sign: float) -> torch.Tensor:
        shifted = list(args)
        shifted[index] = (args[index].detach() + sign * eps * direction).requires_grad_(record_grad)
        if record_grad:
            return loss(*shifted).detach()
        with torch.no_grad():
            return loss(*shifted)

    return ((at(1.0) - at(-1.0)) / (2 * eps)).item()


def assert_pendulum_gradients(sim, model, *, record_grad: bool = False) -> None:
    """``sim`` (2 envs, ``frame_skip=5``, site ``tip``, float64, ``requires_grad``)
    over the contact-free double pendulum ``model`` (:data:`helpers.ball_arm.PENDULUM_XML`):
    3 random control steps reproduce MuJoCo C, and autograd's directional
    derivatives of a loss on qpos and the tip site, along random directions
    of the controls and the initial velocities, match central differences.

    ``record_grad`` is passed to :func:`central_difference`.
    """
    from helpers.mujoco_c import c_rollout

    gen = torch.Generator().manual_seed(0)
    qpos0 = torch.randn(2, 2, generator=gen, dtype=torch.float64)
    qvel0 = torch.randn(2, 2, generator=gen, dtype=torch.float64)
    controls = torch.randn(3, 2, 2, generator=gen, dtype=torch.float64)
    weights = torch.randn(2, 2, generator=gen, dtype=torch.float64)

    def loss(controls, qvel0):
        sim.reset(qpos0, qvel0)
        for ctrl in controls:
            sim.step(ctrl)
        return (sim.qpos * weights).sum() + sim.site_positions()[..., 2].sum()

    controls_var = controls.clone().requires_grad_(True)
    qvel_var = qvel0.clone().requires_grad_(True)
    loss(controls_var, qvel_var).backward()

    # The forward pass is MuJoCo's (no contacts: no solver involved).
    ref = c_rollout(model, qpos0.numpy(), qvel0.numpy(), controls.numpy(), 5, ["tip"], [])
    torch.testing.assert_close(sim.qpos.detach(), torch.from_numpy(ref["qpos"][-1]), atol=1e-12, rtol=0)
    torch.testing.assert_close(sim.time, torch.from_numpy(ref["time"][-1]), atol=1e-12, rtol=0)

    for index, grad, point in ((0, controls_var.grad, "ctrl"), (1, qvel_var.grad, "qvel")):
        direction = torch.randn(grad.shape, generator=gen, dtype=torch.float64)
        fd = central_difference(loss, (controls, qvel0), index, direction, record_grad=record_grad)
        ad = (grad * direction).sum().item()
        assert abs(ad) > 1e-3
        # Observed agreement ~1e-10; central differences are good to ~eps^2.
        assert ad == pytest.approx(fd, rel=1e-6, abs=1e-8), point


def clip_rows_to_norm(gradient: torch.Tensor, max_norm: float) -> torch.Tensor:
    """Each env's row of ``gradient`` ``[N, ...]`` scaled to an L2 norm of at most ``max_norm``
    (written out here, apart from the collector's own clipping, to check it)."""
    rows = [row * min(1.0, max_norm / row.norm().item()) if row.norm() > 0 else row for row in gradient]
    return torch.stack(rows)
