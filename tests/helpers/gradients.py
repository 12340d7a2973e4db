"""Central differences of a loss, to check autograd's directional derivatives."""

from __future__ import annotations

from collections.abc import Callable, Sequence

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
