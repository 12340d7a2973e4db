"""The torch autograd node of a :class:`~waddle.bridge.JaxFunction` call with grad.

:func:`apply` runs a plan's programs (:mod:`waddle.bridge.plan`) inside one
:class:`torch.autograd.Function` whose inputs are the packed input buffers and
whose outputs are the packed output buffers.

In ``"residuals"`` mode the forward's JAX residuals stay JAX arrays (no copy,
no conversion) in a :class:`_ResidualBox` that torch owns: the box is the
packed object of a saved-tensor hook on an empty sentinel tensor that the node
saves, so the residuals live exactly as long as the graph's saved tensors. In
``"recompute"`` mode the node saves the input buffers.

Backward gives every floating input a gradient (``None`` to the others) and
reports non-finite gradients with a :class:`NonFiniteGradientWarning`.
"""

from __future__ import annotations

import itertools
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

import torch

from waddle.bridge.blocks import from_blocks
from waddle.bridge.dlpack import enable_x64, jax_to_torch
from waddle.bridge.plan import Plan

__all__ = ["NonFiniteGradientWarning", "apply"]


class NonFiniteGradientWarning(RuntimeWarning):
    """A gradient computed by JAX contains NaN or infinite entries."""


# ------------------------------------------------------- residuals kept by torch
class _ResidualBox:
    """Holds a forward's JAX residuals for as long as torch keeps its saved tensors."""

    __slots__ = ("__weakref__", "residuals", "sentinel")

    def __init__(self, residuals, sentinel: torch.Tensor) -> None:
        self.residuals = residuals
        self.sentinel = sentinel


class _ResidualSlot:
    """Passes the residual box from ``forward`` to torch's saved-tensor hook.

    In ``"residuals"`` mode, :func:`apply` runs the autograd function under
    ``saved_tensors_hooks(slot.pack, _unpack_box)``. Torch saves a custom
    function's tensors when ``apply`` returns, through the innermost hooks, so
    the packed object it keeps for the node's only saved tensor (an empty
    sentinel) is the box holding the residual arrays (they stay JAX arrays: no
    copy, no conversion). Torch keeps that packed object exactly as long as
    the graph's saved tensors: freed by ``backward()``, kept with
    ``retain_graph=True``, and a second backward through a freed graph raises
    torch's usual error. ``ctx`` only holds a weak reference.
    """

    __slots__ = ("box", "hooked")

    def __init__(self) -> None:
        self.box: _ResidualBox | None = None
        self.hooked = False

    def pack(self, tensor: torch.Tensor):
        return self.box if self.box is not None else tensor


def _unpack_box(packed):
    return packed.sentinel if isinstance(packed, _ResidualBox) else packed


def _save_residuals(ctx, slot: _ResidualSlot, residuals) -> None:
    sentinel = torch.empty(0)
    box = _ResidualBox(residuals, sentinel)
    ctx.save_for_backward(sentinel)
    if slot.hooked:
        slot.box = box
        ctx.residuals = weakref.ref(box)
    else:  # saved-tensor hooks unavailable here: the node owns the residuals
        ctx.residuals = lambda: box


def _load_residuals(ctx) -> Any:
    box = ctx.residuals()
    if box is None:  # pragma: no cover - torch released the saved tensors
        raise RuntimeError("JaxFunction: the residuals of this graph were already freed.")
    return box.residuals


# --------------------------------------------------------- non-finite gradients
def _warn_nonfinite(plan: Plan, grad_buffers: Sequence[torch.Tensor]) -> None:
    grads: list = [None] * plan.n_in
    for gi, buffer in zip(plan.float_groups, grad_buffers):
        plan.unpack(buffer, plan.in_groups[gi], grads)
    parts = []
    all_rows: set[int] = set()
    for i, g in enumerate(grads):
        if g is None:
            continue
        finite = torch.isfinite(g)
        if bool(finite.all()):
            continue
        if g.ndim == 0:
            parts.append(f"input {plan.spec.label(i)} (0-dim)")
            continue
        rows = (~finite).reshape(g.shape[0], -1).any(1).nonzero().flatten().tolist()
        all_rows.update(rows)
        shown = ", ".join(map(str, itertools.islice(rows, 20))) + (", ..." if len(rows) > 20 else "")
        parts.append(f"input {plan.spec.label(i)} at rows [{shown}]")
    rows_msg = sorted(all_rows)
    warnings.warn(
        f"{plan.spec.owner}: non-finite gradient coming out of JAX (left as is, not zeroed) for "
        + "; ".join(parts)
        + (f". Non-finite batch rows: {rows_msg[:50]}{' ...' if len(rows_msg) > 50 else ''}" if rows_msg else ""),
        NonFiniteGradientWarning,
        stacklevel=3,
    )


# ----------------------------------------------------------------- the node
class _JaxAutogradFunction(torch.autograd.Function):
    """Input: the packed buffers. Output: the floating output buffers, then the others."""

    @staticmethod
    def forward(ctx, plan: Plan, slot: _ResidualSlot | None, *buffers):
        float_in = [buffers[i] for i in plan.float_groups]
        other_in = [buffers[i] for i in plan.other_groups]
        blocks = list(zip(plan.to_blocks(float_in), plan.to_blocks(other_in)))
        if plan.spec.mode == "residuals":
            results = plan.run_blocks(plan.forward_program(), blocks)
            _save_residuals(ctx, slot, tuple(r[2] for r in results))
            float_out = [from_blocks([r[0][k] for r in results]) for k in range(len(plan.float_out))]
            other_out = [from_blocks([r[1][k] for r in results]) for k in range(len(plan.other_out))]
        else:
            results = plan.run_blocks(plan.call_program(), [plan.merge(f, o) for f, o in blocks])
            float_out = [from_blocks([r[g] for r in results]) for g in plan.float_out]
            other_out = [from_blocks([r[g] for r in results]) for g in plan.other_out]
            ctx.n_saved_float = len(float_in)
            ctx.save_for_backward(*float_in, *other_in)
        ctx.plan = plan
        ctx.set_materialize_grads(False)
        ctx.float_out_meta = [(t.dtype, t.device) for t in float_out]
        if other_out:
            ctx.mark_non_differentiable(*other_out)
        return (*float_out, *other_out)

    @staticmethod
    def backward(ctx, *grad_outputs):
        saved = ctx.saved_tensors  # raises if the graph was already freed
        plan: Plan = ctx.plan
        cts = []
        for gi, (dtype, device), grad in zip(plan.float_out, ctx.float_out_meta, grad_outputs):
            if grad is None:
                grad = torch.zeros(plan.rows, plan.out_groups[gi].width, dtype=dtype, device=device)
            cts.append(grad)
        with enable_x64(plan.x64):
            ct_blocks = plan.to_blocks(cts)
            if plan.spec.mode == "residuals":
                held = _load_residuals(ctx)
            else:
                n = ctx.n_saved_float
                held = list(zip(plan.to_blocks(saved[:n]), plan.to_blocks(saved[n:])))
            results = plan.run_blocks(plan.backward_program(), list(zip(held, ct_blocks)))
            grads = [from_blocks([r[0][k] for r in results]) for k in range(len(plan.float_groups))]
            bad = plan.spec.check_finite and any(bool(jax_to_torch(r[1]).any()) for r in results)
        if bad:
            _warn_nonfinite(plan, grads)
        needs = ctx.needs_input_grad[2:]
        out: list = [None] * len(plan.in_groups)
        for gi, grad in zip(plan.float_groups, grads):
            out[gi] = grad if needs[gi] else None
        return (None, None, *out)


def apply(plan: Plan, buffers: list[torch.Tensor]) -> list[torch.Tensor]:
    """Runs ``plan`` on the input ``buffers`` as one autograd node; returns
    the output buffers in ``plan.out_groups`` order."""
    if plan.spec.mode == "residuals":
        slot = _ResidualSlot()
        try:
            hooks = torch.autograd.graph.saved_tensors_hooks(slot.pack, _unpack_box)
            hooks.__enter__()
        except RuntimeError:  # hooks disabled by the caller
            outs = _JaxAutogradFunction.apply(plan, slot, *buffers)
        else:
            slot.hooked = True
            try:
                outs = _JaxAutogradFunction.apply(plan, slot, *buffers)
            finally:
                hooks.__exit__(None, None, None)
                slot.box = None
    else:
        outs = _JaxAutogradFunction.apply(plan, None, *buffers)
    ordered: list = [None] * len(plan.out_groups)
    for gi, t in zip((*plan.float_out, *plan.other_out), outs):
        ordered[gi] = t
    return ordered
