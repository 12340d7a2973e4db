"""The plan of a :class:`~waddle.bridge.JaxFunction` for one input signature, and its jitted programs.

A signature is the inputs' shapes, dtypes and device and the 64-bit mode.
:func:`make_plan` checks the inputs and lays them out by dtype
(:mod:`waddle.bridge.packing`); the :class:`Plan` then compiles, once each and
only when first needed, the three programs a call can run:

* :meth:`Plan.call_program`: unpack the input buffers, call ``fn``, pack the
  outputs (the no-grad path, and ``"recompute"`` mode's forward);
* :meth:`Plan.forward_program`: the same under ``jax.vjp``, also returning
  the pullback's residual arrays (``"residuals"`` mode);
* :meth:`Plan.backward_program`: apply the pullback to the cotangents, from
  the residuals or by running ``jax.vjp`` again (``"recompute"``), and flag
  non-finite gradients.

The output layout is recorded when a program is first traced.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from waddle.bridge.blocks import run_blocks, to_blocks
from waddle.bridge.dlpack import import_jax
from waddle.bridge.packing import Group, group_by_dtype, pack_jax, pack_torch, unpack_jax, unpack_torch

__all__ = ["MODES", "Plan", "Spec", "make_plan"]

MODES = ("residuals", "recompute")
"""How backward gets what it needs; see :class:`~waddle.bridge.JaxFunction`."""

# Residual arrays smaller than this are packed into one buffer per dtype.
_PACK_BYTES = 16 * 1024


@dataclass(frozen=True)
class Spec:
    """What a :class:`~waddle.bridge.JaxFunction` was built with, shared by its plans."""

    fn: Callable[..., Any]
    owner: str  # the JaxFunction's repr, which starts every error and warning
    mode: str  # one of MODES
    batch_chunks: int | None
    check_finite: bool
    input_names: tuple[str, ...] | None
    compiler_options: dict[str, Any] | None
    trace_counts: dict[str, int]  # the JaxFunction's counters, updated in place

    def jit(self, fn):
        jax = import_jax()
        if self.compiler_options:
            return jax.jit(fn, compiler_options=self.compiler_options)
        return jax.jit(fn)

    def label(self, index: int) -> str:
        """How warnings name input ``index``."""
        if self.input_names is not None and index < len(self.input_names):
            return f"{self.input_names[index]!r}"
        return f"#{index}"


def _nonfinite_flags(jnp, grads):
    if not grads:
        return jnp.zeros((0,), dtype=bool)
    return jnp.stack([jnp.logical_not(jnp.all(jnp.isfinite(g))) for g in grads])


@dataclass
class Plan:
    """Everything compiled for one input signature."""

    spec: Spec
    in_groups: tuple[Group, ...]
    float_groups: tuple[int, ...]  # indices into in_groups of floating groups
    other_groups: tuple[int, ...]
    n_in: int
    x64: bool
    batched: bool
    rows: int  # the batch size, or 1 when not batched
    chunks: int  # row blocks run concurrently
    # filled in when the jitted functions are first traced
    out_groups: tuple[Group, ...] | None = None
    n_out: int = 0
    float_out: tuple[int, ...] = ()  # indices into out_groups of floating groups
    other_out: tuple[int, ...] = ()
    res_tree: Any = None
    call: Any = None
    fwd: Any = None
    bwd: Any = None
    res_layout: Any = None

    # --------------------------------------------------------- torch side
    def pack(self, tensors: Sequence[torch.Tensor], group: Group) -> torch.Tensor:
        """``group``'s ``(rows, features)`` buffer of ``tensors``."""
        return pack_torch(tensors, group, self.rows, self.batched)

    def unpack(self, buffer: torch.Tensor, group: Group, out: list) -> None:
        """Views of ``buffer`` in ``group``'s shapes, written into ``out``."""
        unpack_torch(buffer, group, out, self.rows, self.batched)

    def to_blocks(self, buffers: Sequence[torch.Tensor]) -> list[tuple]:
        return to_blocks(buffers, self.rows, self.chunks)

    def run_blocks(self, program, args_per_block: Sequence[tuple]) -> list:
        return run_blocks(program, args_per_block, self.x64)

    def merge(self, float_packs, other_packs) -> list:
        """The input buffers in ``in_groups`` order from the floating ones and the others."""
        packs: list = [None] * len(self.in_groups)
        for i, p in zip(self.float_groups, float_packs):
            packs[i] = p
        for i, p in zip(self.other_groups, other_packs):
            packs[i] = p
        return packs

    # ------------------------------------------------- inside a JAX trace
    def _record_outputs(self, outs: Any, rows: int) -> tuple:
        """Checks ``fn``'s outputs and packs them."""
        jnp = import_jax().numpy
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        outs = tuple(jnp.asarray(o) for o in outs)
        if self.batched:
            bad = [tuple(o.shape) for o in outs if o.ndim == 0 or o.shape[0] != rows]
            if bad:
                raise ValueError(
                    f"{self.spec.owner}: with batch_chunks set, every output needs the batch ({rows} rows "
                    f"per block) as its leading dimension; got output shapes {bad}."
                )
        groups, packs = pack_jax(jnp, outs, rows, self.batched)
        if self.out_groups is None:
            self.out_groups = groups
            self.n_out = len(outs)
            self.float_out = tuple(i for i, g in enumerate(groups) if jnp.issubdtype(g.dtype, jnp.floating))
            self.other_out = tuple(i for i in range(len(groups)) if i not in self.float_out)
        elif groups != self.out_groups:
            raise RuntimeError(f"{self.spec.owner}: the outputs of fn changed between traces.")
        return packs

    def _inner(self, packs: Sequence[Any]) -> tuple:
        """Unpack inputs, call ``fn``, pack outputs."""
        jnp = import_jax().numpy
        rows = packs[0].shape[0]
        args = unpack_jax(jnp, self.in_groups, packs, self.n_in, self.batched)
        return self._record_outputs(self.spec.fn(*args), rows)

    # ------------------------------------------------------ the programs
    def call_program(self):
        """Jitted ``(*input packs) -> output packs``."""
        if self.call is None:

            def call(*packs):
                self.spec.trace_counts["call"] += 1
                return self._inner(packs)

            self.call = self.spec.jit(call)
        return self.call

    def forward_program(self):
        """Jitted ``(float packs, other packs) -> (float out, other out, residual arrays)``."""
        if self.fwd is None:
            jax = import_jax()
            jnp = jax.numpy

            def fwd(float_packs, other_packs):
                self.spec.trace_counts["forward"] += 1

                def primal(*fp):
                    out = self._inner(self.merge(fp, other_packs))
                    return (
                        tuple(out[i] for i in self.float_out),
                        tuple(out[i] for i in self.other_out),
                    )

                float_out, pullback, other_out = jax.vjp(primal, *float_packs, has_aux=True)
                leaves, tree = jax.tree_util.tree_flatten(pullback)
                # Small residuals are packed by dtype (each program output
                # costs ~10 us of dispatch), large ones are returned as they
                # are (a concatenation would copy them).
                small = tuple(i for i, x in enumerate(leaves) if x.size * x.dtype.itemsize < _PACK_BYTES)
                large = tuple(i for i in range(len(leaves)) if i not in set(small))
                groups, packs = pack_jax(jnp, [leaves[i] for i in small], 1, False)
                self.res_tree = tree
                self.res_layout = (small, large, groups)
                return float_out, other_out, (packs, tuple(leaves[i] for i in large))

            self.fwd = self.spec.jit(fwd)
        return self.fwd

    def backward_program(self):
        """Jitted ``(saved, cotangent packs) -> (grad packs, non-finite flags)``."""
        if self.bwd is None:
            jax = import_jax()
            jnp = jax.numpy

            if self.spec.mode == "residuals":

                def bwd(residuals, cts):
                    self.spec.trace_counts["backward"] += 1
                    packs, large_leaves = residuals
                    small, large, groups = self.res_layout
                    leaves: list = [None] * (len(small) + len(large))
                    for i, x in zip(small, unpack_jax(jnp, groups, packs, len(small), False)):
                        leaves[i] = x
                    for i, x in zip(large, large_leaves):
                        leaves[i] = x
                    pullback = jax.tree_util.tree_unflatten(self.res_tree, leaves)
                    grads = pullback(tuple(cts))
                    return grads, _nonfinite_flags(jnp, grads)

            else:

                def bwd(saved, cts):
                    self.spec.trace_counts["backward"] += 1
                    float_packs, other_packs = saved

                    def primal(*fp):
                        out = self._inner(self.merge(fp, other_packs))
                        return tuple(out[i] for i in self.float_out)

                    _, pullback = jax.vjp(primal, *float_packs)
                    grads = pullback(tuple(cts))
                    return grads, _nonfinite_flags(jnp, grads)

            self.bwd = self.spec.jit(bwd)
        return self.bwd


def make_plan(spec: Spec, tensors: Sequence[torch.Tensor], x64: bool) -> Plan:
    """The plan of ``spec``'s function for ``tensors``, checked; nothing is compiled yet."""
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"{spec.owner}: all inputs must be on one device, got {sorted(map(str, devices))}.")
    batched = spec.batch_chunks is not None
    rows, chunks = 1, 1
    if batched:
        leading = {t.shape[0] if t.dim() else None for t in tensors}
        if len(leading) != 1 or None in leading:
            raise ValueError(
                f"{spec.owner}: with batch_chunks set, every input needs the same leading (batch) "
                f"dimension; got shapes {[tuple(t.shape) for t in tensors]}."
            )
        rows, chunks = leading.pop(), spec.batch_chunks
        if rows % chunks:
            raise ValueError(
                f"{spec.owner}: batch_chunks={chunks} does not divide the batch size {rows}; "
                "pass a divisor of the batch size."
            )
    groups = group_by_dtype([(i, t.dtype, tuple(t.shape)) for i, t in enumerate(tensors)], batched)
    return Plan(
        spec=spec,
        in_groups=groups,
        float_groups=tuple(i for i, g in enumerate(groups) if g.dtype.is_floating_point),
        other_groups=tuple(i for i, g in enumerate(groups) if not g.dtype.is_floating_point),
        n_in=len(tensors),
        x64=x64,
        batched=batched,
        rows=rows,
        chunks=chunks,
    )
