"""Calling a pure JAX function on torch tensors, with gradients.

:class:`JaxFunction` wraps ``fn(*arrays) -> tuple of arrays`` so that it takes
and returns :class:`torch.Tensor` objects and takes part in torch autograd.

How a call runs
---------------
1. Inputs are grouped by dtype and each group is packed into one 2-D buffer of
   shape ``(rows, features)``: ``rows`` is the batch size when the function is
   batched (``batch_chunks`` set) and 1 otherwise, and each tensor fills a
   block of columns. A group of one tensor is passed as a view, no copy.
   Each buffer crosses to JAX through DLPack without a copy. Packing turns the
   ~40 leaves of a physics state into two or three transfers and keeps the
   jitted call's argument list short, which is where the per-call cost of
   DLPack and of JAX dispatch lies.
2. A jitted function, compiled once per input signature (shapes, dtypes,
   device, 64-bit mode), unpacks the buffers (static slices, free inside XLA),
   calls ``fn``, and packs the outputs by dtype the same way.
3. The output buffers cross back to torch through DLPack and are split into
   views with the output shapes, outside the autograd node.

Outputs fed back as inputs skip step 1: when the tensors of a dtype group are
exactly the views that step 3 made of one output buffer (a physics state
passed from one step to the next), that buffer itself is passed on. The
autograd graph then links the two calls directly, with no concatenation in
forward and no per-tensor split in backward.

Batches on several CPU cores
----------------------------
``batch_chunks=k`` declares that ``fn`` is batched along the leading
dimension of every input and output (a ``jax.vmap``-ed step, say) and runs it
on ``k`` contiguous row blocks of the buffers at once, one host thread each
(JAX releases the GIL while XLA runs). On a CPU, XLA keeps only about 1.3
cores busy with a vmapped Brax or MJX step whatever the batch size; ``k``
programs from ``k`` threads keep ``k`` cores busy (measured on 2 cores, Brax
``ant`` with 128 envs: forward+backward 204 ms per step with one block,
110 ms with two; see ``benchmarks/differentiable.py``). The blocks' results
are concatenated (one copy per buffer). On a GPU use ``batch_chunks=1``: one
program already fills the device.

Without grad (``torch.is_grad_enabled()`` false, or no floating input requires
grad) step 2 is just ``jax.jit(fn)``.

With grad, the call goes through a :class:`torch.autograd.Function`. Two
strategies are available (``JaxFunction(fn, mode=...)``):

``"residuals"`` (default)
    Forward runs ``jax.vjp`` inside ``jax.jit``. The pullback returned by
    ``jax.vjp`` is a pytree whose leaves are the residual arrays, so the
    jitted forward can return them. They stay JAX arrays (no copy, no
    conversion) in a box that torch owns: the box is the packed object of a
    saved-tensor hook on an empty sentinel tensor that the node saves.
    Backward is a second jitted function that rebuilds the pullback from the
    residuals and applies it to the cotangents. Both are compiled once per
    signature and reused for every step; no Python closure is traced per call
    and no JAX-side cache grows. Because torch owns the box, the residuals
    live exactly as long as the autograd graph's saved tensors: freed by
    ``backward()``, kept with ``retain_graph=True``, and a second
    ``backward()`` through a freed graph raises torch's usual "Trying to
    backward through the graph a second time" error. (Saved-tensor hooks of
    the caller, e.g. CPU offloading, do not apply to the residuals.)

``"recompute"``
    Forward runs the plain jitted ``fn`` and saves only the (packed) inputs.
    Backward runs ``jax.vjp`` again, i.e. recomputes the forward pass, and
    applies the pullback. Less memory per step (inputs instead of residuals),
    one more forward pass of compute per step, and the forward compilation is
    shared with the no-grad path.

Which is faster depends on the function and the batch: measure with
``benchmarks/differentiable.py --sections modes``. For Brax ``ant`` on a
2-core CPU with 16 envs in two blocks, ``"residuals"`` took 0.43 s per
16-step round against 0.44 s; the residuals took 54 MB per step at 128 envs
against 0.7 MB of saved inputs, so
``"recompute"`` is also the choice when the graph's memory is the limit
(long horizons, large batches, GPUs).

Gradients reach every floating input (they are computed for all of them, so
the compiled program does not depend on which inputs require grad); inputs of
other dtypes get ``None``. Outputs that received no gradient get zero
cotangents. Non-floating outputs are marked non-differentiable.

A gradient that comes out of JAX with NaN or inf entries is passed on
unchanged (never zeroed) and reported with a :class:`NonFiniteGradientWarning`
naming the input and the batch rows (indices along dim 0) that are affected.
The check costs one tiny device-to-host transfer per backward call; turn it
off with ``check_finite=False``.

The 64-bit mode in effect when forward runs (see
:func:`waddle.bridge.enable_x64`) is also used for backward, and in the
threads that run the row blocks.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from waddle.bridge.dlpack import (
    enable_x64,
    import_jax,
    jax_to_torch,
    torch_to_jax,
    x64_enabled,
)

__all__ = ["JaxFunction", "NonFiniteGradientWarning", "auto_batch_chunks", "resolve_batch_chunks"]

_MODES = ("residuals", "recompute")
# Residual arrays smaller than this are packed into one buffer per dtype.
_PACK_BYTES = 16 * 1024


class NonFiniteGradientWarning(RuntimeWarning):
    """A gradient computed by JAX contains NaN or infinite entries."""


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class _Slot:
    """Where one tensor sits in a packed ``(rows, features)`` buffer."""

    index: int  # position among the function's inputs (or outputs)
    offset: int  # first column
    width: int  # columns
    rest: tuple[int, ...]  # the shape without the rows (batched) or the whole shape
    rest_strides: tuple[int, ...]


@dataclass(frozen=True)
class _Group:
    """All tensors of one dtype, packed in order into one buffer."""

    dtype: Any  # a torch.dtype (inputs) or a numpy dtype (outputs, residuals)
    slots: tuple[_Slot, ...]

    @property
    def width(self) -> int:
        return sum(s.width for s in self.slots)


def _group(items: Sequence[tuple[int, Any, tuple[int, ...]]], batched: bool) -> tuple[_Group, ...]:
    """Groups ``(index, dtype, shape)`` triples by dtype, keeping first-seen order."""
    by_dtype: dict[Any, list[_Slot]] = {}
    offsets: dict[Any, int] = {}
    for index, dtype, shape in items:
        rest = tuple(int(d) for d in (shape[1:] if batched else shape))
        width = math.prod(rest)
        off = offsets.get(dtype, 0)
        by_dtype.setdefault(dtype, []).append(_Slot(index, off, width, rest, _contiguous_strides(rest)))
        offsets[dtype] = off + width
    return tuple(_Group(dtype, tuple(slots)) for dtype, slots in by_dtype.items())


# ------------------------------------------------------------ JAX-side packing
def _unpack_jax(jnp, groups: Sequence[_Group], packs: Sequence[Any], n: int, batched: bool) -> list[Any]:
    """Inside a trace: splits ``(rows, features)`` buffers back into ``n`` arrays."""
    out: list[Any] = [None] * n
    for group, pack in zip(groups, packs):
        rows = pack.shape[0]
        for s in group.slots:
            cols = pack if len(group.slots) == 1 else pack[:, s.offset : s.offset + s.width]
            out[s.index] = jnp.reshape(cols, (rows, *s.rest) if batched else s.rest)
    return out


def _pack_jax(jnp, arrays: Sequence[Any], rows: int, batched: bool) -> tuple[tuple[_Group, ...], tuple[Any, ...]]:
    """Inside a trace: packs arrays by dtype into ``(rows, features)`` buffers."""
    groups = _group([(i, a.dtype, tuple(a.shape)) for i, a in enumerate(arrays)], batched)
    packs = []
    for group in groups:
        cols = [jnp.reshape(arrays[s.index], (rows, s.width)) for s in group.slots]
        packs.append(cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=1))
    return groups, tuple(packs)


# ---------------------------------------------------------- torch-side packing
def _torch_shape(plan: _Plan, slot: _Slot) -> tuple[int, ...]:
    return (plan.rows, *slot.rest) if plan.batched else slot.rest


def _whole_buffer_run(plan: _Plan, tensors, slots: Sequence[_Slot], start: int):
    """``(buffer, end)`` if ``slots[start:end]`` are exactly the views that
    :func:`_unpack_torch` made of one output buffer, in order; else ``None``."""
    first = tensors[slots[start].index]
    buffer = first._base
    if (
        buffer is None
        or buffer.dim() != 2
        or buffer.shape[0] != plan.rows
        or buffer.dtype != first.dtype
        or buffer.requires_grad != first.requires_grad
        or not buffer.is_contiguous()
    ):
        return None
    total, origin = buffer.shape[1], buffer.storage_offset()
    row_stride = (total,) if plan.batched else ()
    covered, end = 0, start
    while covered < total and end < len(slots):
        slot = slots[end]
        t = tensors[slot.index]
        if (
            t._base is not buffer
            or t.storage_offset() - origin != covered
            or t.stride() != (*row_stride, *slot.rest_strides)
            or t.requires_grad != buffer.requires_grad
        ):
            return None
        covered += slot.width
        end += 1
    return (buffer, end) if covered == total else None


def _pack_torch(plan: _Plan, tensors: Sequence[torch.Tensor], group: _Group) -> torch.Tensor:
    """The group's ``(rows, features)`` buffer, recorded by autograd if inputs require grad."""
    parts, i, slots = [], 0, group.slots
    while i < len(slots):
        run = _whole_buffer_run(plan, tensors, slots, i)
        if run is not None:
            buffer, i = run
            parts.append(buffer)
            continue
        parts.append(tensors[slots[i].index].reshape(plan.rows, -1))
        i += 1
    if len(parts) == 1:
        return parts[0].contiguous()
    return torch.cat(parts, dim=1)


def _unpack_torch(plan: _Plan, buffer: torch.Tensor, group: _Group, out: list) -> None:
    """Views of ``buffer`` with the group's shapes (the only kind that
    :func:`_whole_buffer_run` recognises)."""
    if len(group.slots) == 1:
        s = group.slots[0]
        out[s.index] = buffer.view(_torch_shape(plan, s))
        return
    parts = torch.split(buffer, [s.width for s in group.slots], dim=1)
    for s, part in zip(group.slots, parts):
        out[s.index] = part.view(_torch_shape(plan, s))


# ---------------------------------------------------------------- row blocks
def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _is_block_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def auto_batch_chunks(
    batch: int, device: torch.device | str | None, *, cores: int | None = None, min_rows: int = 8
) -> int:
    """A ``batch_chunks`` for a batched physics step: 1 on a GPU (one program
    fills it); on a CPU the most row blocks, at most one per usable core and
    of at least ``min_rows`` rows each, that divide ``batch`` evenly."""
    if torch.device("cpu" if device is None else device).type != "cpu":
        return 1
    cores = _usable_cores() if cores is None else int(cores)
    for chunks in range(max(1, min(cores, batch // min_rows)), 0, -1):
        if batch % chunks == 0:
            return chunks
    return 1


def resolve_batch_chunks(batch_chunks: int | str, batch: int | None, device, user: str) -> int | str:
    """``batch_chunks`` as given by a user (``"auto"`` or a positive divisor of
    ``batch``), checked and resolved; ``user`` names the caller in errors.
    With ``batch=None`` only the value is checked, and returned as is."""
    if batch_chunks != "auto" and not _is_block_count(batch_chunks):
        raise ValueError(f"{user}: batch_chunks must be 'auto' or a positive integer, got {batch_chunks!r}.")
    if batch is None:
        return batch_chunks
    if batch_chunks == "auto":
        return auto_batch_chunks(batch, device)
    if batch % batch_chunks:
        raise ValueError(f"{user}: batch_chunks={batch_chunks} must divide the number of envs ({batch}).")
    return batch_chunks


_executors: dict[int, ThreadPoolExecutor] = {}
_executors_lock = threading.Lock()


def _executor(workers: int) -> ThreadPoolExecutor:
    with _executors_lock:
        pool = _executors.get(workers)
        if pool is None:
            pool = _executors[workers] = ThreadPoolExecutor(workers, thread_name_prefix="waddle-jax")
        return pool


def _to_blocks(plan: _Plan, buffers: Sequence[torch.Tensor]) -> list[tuple]:
    """Per row block, the JAX arrays of ``buffers`` (zero-copy row slices)."""
    if plan.chunks == 1:
        return [tuple(torch_to_jax(b) for b in buffers)]
    size = plan.rows // plan.chunks
    return [tuple(torch_to_jax(b[c * size : (c + 1) * size]) for b in buffers) for c in range(plan.chunks)]


def _run_blocks(plan: _Plan, program, args_per_block: Sequence[tuple]) -> list:
    """Runs ``program`` on every row block, concurrently when there are several."""
    if len(args_per_block) == 1:
        return [program(*args_per_block[0])]
    jax = import_jax()
    x64 = plan.x64

    def run(args):
        with enable_x64(x64):  # the mode is thread-local: use the caller's
            return jax.block_until_ready(program(*args))

    # The calling thread runs the first block itself: one hand-off fewer.
    others = [_executor(len(args_per_block) - 1).submit(run, args) for args in args_per_block[1:]]
    first = jax.block_until_ready(program(*args_per_block[0]))
    return [first, *(f.result() for f in others)]


def _from_blocks(arrays: Sequence[Any]) -> torch.Tensor:
    """One torch buffer from the row blocks' JAX arrays."""
    if len(arrays) == 1:
        return jax_to_torch(arrays[0])
    return torch.cat([jax_to_torch(a) for a in arrays], dim=0)


@dataclass
class _Plan:
    """Everything compiled for one input signature."""

    in_groups: tuple[_Group, ...]
    float_groups: tuple[int, ...]  # indices into in_groups of floating groups
    other_groups: tuple[int, ...]
    n_in: int
    x64: bool
    batched: bool
    rows: int  # the batch size, or 1 when not batched
    chunks: int  # row blocks run concurrently
    # filled in when the jitted functions are first traced
    out_groups: tuple[_Group, ...] | None = None
    n_out: int = 0
    float_out: tuple[int, ...] = ()  # indices into out_groups of floating groups
    other_out: tuple[int, ...] = ()
    res_tree: Any = None
    call: Any = None
    fwd: Any = None
    bwd: Any = None
    res_layout: Any = None


class JaxFunction:
    """A pure JAX function made callable on torch tensors, with autograd.

    Args:
        fn: a pure JAX function ``fn(*arrays) -> tuple of arrays`` (flat tuples
            in and out; a single returned array is treated as a 1-tuple).
            It is jitted, so it must be traceable.

    Keyword Args:
        mode: ``"residuals"`` (default) or ``"recompute"``; how backward gets
            what it needs (see the module documentation).
        batch_chunks: ``None`` (default) for any function. An integer ``k``
            declares that every input and output of ``fn`` has the batch as
            its leading dimension, rows independent of each other (a
            ``jax.vmap``-ed function), and runs ``fn`` on ``k`` equal row
            blocks concurrently, one thread each; the batch size must be a
            multiple of ``k``. See the module documentation for when this pays.
        check_finite: warn with :class:`NonFiniteGradientWarning`, naming the
            batch rows, when a gradient coming out of JAX is not finite.
            Defaults to ``True``.
        name: used in warnings and ``repr``. Defaults to ``fn.__name__``.
        input_names: optional labels for the inputs, used in warnings.
        compiler_options: passed to :func:`jax.jit` for every program, e.g.
            ``{"xla_backend_optimization_level": 0}`` to trade run time for a
            shorter compilation on CPU.

    Calling it with tensors returns a tuple of tensors (always a tuple). All
    tensor inputs must live on one device; outputs come back on it.

    Examples:
        >>> import jax.numpy as jnp
        >>> f = JaxFunction(lambda x, y: (jnp.sin(x) * y, (x**2).sum(-1)))
        >>> x = torch.randn(4, 3, requires_grad=True)
        >>> y = torch.randn(4, 3, requires_grad=True)
        >>> a, b = f(x, y)
        >>> (a.sum() + b.sum()).backward()
        >>> torch.allclose(x.grad, torch.cos(x) * y + 2 * x)
        True
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        mode: str = "residuals",
        batch_chunks: int | None = None,
        check_finite: bool = True,
        name: str | None = None,
        input_names: Sequence[str] | None = None,
        compiler_options: dict[str, Any] | None = None,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}.")
        if batch_chunks is not None and not _is_block_count(batch_chunks):
            raise ValueError(f"batch_chunks must be None or a positive integer, got {batch_chunks!r}.")
        import_jax()
        self.fn = fn
        self.mode = mode
        self.batch_chunks = batch_chunks
        self.check_finite = bool(check_finite)
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.input_names = tuple(input_names) if input_names is not None else None
        self.compiler_options = dict(compiler_options) if compiler_options else None
        self._plans: dict[tuple, _Plan] = {}
        self._lock = threading.Lock()
        #: how many times each jitted program was traced (== compiled); one per
        #: input signature when everything is reused as intended.
        self.trace_counts = {"call": 0, "forward": 0, "backward": 0}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, mode={self.mode!r})"

    # ------------------------------------------------------------------ plans
    def _jit(self, fn):
        jax = import_jax()
        if self.compiler_options:
            return jax.jit(fn, compiler_options=self.compiler_options)
        return jax.jit(fn)

    def _plan(self, tensors: Sequence[torch.Tensor]) -> _Plan:
        x64 = x64_enabled()
        key = (x64, *((t.dtype, t.shape, t.device) for t in tensors))
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                plan = self._new_plan(tensors, x64)
                self._plans[key] = plan
        return plan

    def _new_plan(self, tensors: Sequence[torch.Tensor], x64: bool) -> _Plan:
        devices = {t.device for t in tensors}
        if len(devices) > 1:
            raise ValueError(f"{self!r}: all inputs must be on one device, got {sorted(map(str, devices))}.")
        batched = self.batch_chunks is not None
        rows, chunks = 1, 1
        if batched:
            leading = {t.shape[0] if t.dim() else None for t in tensors}
            if len(leading) != 1 or None in leading:
                raise ValueError(
                    f"{self!r}: with batch_chunks set, every input needs the same leading (batch) "
                    f"dimension; got shapes {[tuple(t.shape) for t in tensors]}."
                )
            rows, chunks = leading.pop(), self.batch_chunks
            if rows % chunks:
                raise ValueError(
                    f"{self!r}: batch_chunks={chunks} does not divide the batch size {rows}; "
                    "pass a divisor of the batch size."
                )
        groups = _group([(i, t.dtype, tuple(t.shape)) for i, t in enumerate(tensors)], batched)
        return _Plan(
            in_groups=groups,
            float_groups=tuple(i for i, g in enumerate(groups) if g.dtype.is_floating_point),
            other_groups=tuple(i for i, g in enumerate(groups) if not g.dtype.is_floating_point),
            n_in=len(tensors),
            x64=x64,
            batched=batched,
            rows=rows,
            chunks=chunks,
        )

    def _record_outputs(self, plan: _Plan, outs: Any, rows: int) -> tuple:
        """Inside a trace: checks ``fn``'s outputs and packs them."""
        jnp = import_jax().numpy
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        outs = tuple(jnp.asarray(o) for o in outs)
        if plan.batched:
            bad = [tuple(o.shape) for o in outs if o.ndim == 0 or o.shape[0] != rows]
            if bad:
                raise ValueError(
                    f"{self!r}: with batch_chunks set, every output needs the batch ({rows} rows "
                    f"per block) as its leading dimension; got output shapes {bad}."
                )
        groups, packs = _pack_jax(jnp, outs, rows, plan.batched)
        if plan.out_groups is None:
            plan.out_groups = groups
            plan.n_out = len(outs)
            plan.float_out = tuple(i for i, g in enumerate(groups) if jnp.issubdtype(g.dtype, jnp.floating))
            plan.other_out = tuple(i for i in range(len(groups)) if i not in plan.float_out)
        elif groups != plan.out_groups:
            raise RuntimeError(f"{self!r}: the outputs of fn changed between traces.")
        return packs

    def _inner(self, plan: _Plan, packs: Sequence[Any]) -> tuple:
        """Inside a trace: unpack inputs, call ``fn``, pack outputs."""
        jnp = import_jax().numpy
        rows = packs[0].shape[0]
        args = _unpack_jax(jnp, plan.in_groups, packs, plan.n_in, plan.batched)
        return self._record_outputs(plan, self.fn(*args), rows)

    def _get_call(self, plan: _Plan):
        if plan.call is None:

            def call(*packs):
                self.trace_counts["call"] += 1
                return self._inner(plan, packs)

            plan.call = self._jit(call)
        return plan.call

    def _get_fwd(self, plan: _Plan):
        """Jitted ``(float packs, other packs) -> (float out, other out, residual arrays)``."""
        if plan.fwd is None:
            jax = import_jax()
            jnp = jax.numpy

            def fwd(float_packs, other_packs):
                self.trace_counts["forward"] += 1

                def primal(*fp):
                    out = self._inner(plan, _merge(plan, fp, other_packs))
                    return (
                        tuple(out[i] for i in plan.float_out),
                        tuple(out[i] for i in plan.other_out),
                    )

                float_out, pullback, other_out = jax.vjp(primal, *float_packs, has_aux=True)
                leaves, tree = jax.tree_util.tree_flatten(pullback)
                # Small residuals are packed by dtype (each program output
                # costs ~10 us of dispatch), large ones are returned as they
                # are (a concatenation would copy them).
                small = tuple(i for i, x in enumerate(leaves) if x.size * x.dtype.itemsize < _PACK_BYTES)
                large = tuple(i for i in range(len(leaves)) if i not in set(small))
                groups, packs = _pack_jax(jnp, [leaves[i] for i in small], 1, False)
                plan.res_tree = tree
                plan.res_layout = (small, large, groups)
                return float_out, other_out, (packs, tuple(leaves[i] for i in large))

            plan.fwd = self._jit(fwd)
        return plan.fwd

    def _get_bwd(self, plan: _Plan):
        """Jitted ``(saved, cotangent packs) -> (grad packs, non-finite flags)``."""
        if plan.bwd is None:
            jax = import_jax()
            jnp = jax.numpy

            if self.mode == "residuals":

                def bwd(residuals, cts):
                    self.trace_counts["backward"] += 1
                    packs, large_leaves = residuals
                    small, large, groups = plan.res_layout
                    leaves: list = [None] * (len(small) + len(large))
                    for i, x in zip(small, _unpack_jax(jnp, groups, packs, len(small), False)):
                        leaves[i] = x
                    for i, x in zip(large, large_leaves):
                        leaves[i] = x
                    pullback = jax.tree_util.tree_unflatten(plan.res_tree, leaves)
                    grads = pullback(tuple(cts))
                    return grads, _nonfinite_flags(jnp, grads)

            else:

                def bwd(saved, cts):
                    self.trace_counts["backward"] += 1
                    float_packs, other_packs = saved

                    def primal(*fp):
                        out = self._inner(plan, _merge(plan, fp, other_packs))
                        return tuple(out[i] for i in plan.float_out)

                    _, pullback = jax.vjp(primal, *float_packs)
                    grads = pullback(tuple(cts))
                    return grads, _nonfinite_flags(jnp, grads)

            plan.bwd = self._jit(bwd)
        return plan.bwd

    # ------------------------------------------------------------------- call
    def __call__(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{self!r}: argument {i} is a {type(t).__name__}, expected a torch.Tensor.")
        plan = self._plan(tensors)
        buffers = [_pack_torch(plan, tensors, g) for g in plan.in_groups]
        if torch.is_grad_enabled() and any(buffers[i].requires_grad for i in plan.float_groups):
            out_buffers = self._apply(plan, buffers)
        else:
            out_buffers = self._call_nograd(plan, buffers)
        outs: list = [None] * plan.n_out
        for group, buffer in zip(plan.out_groups, out_buffers):
            _unpack_torch(plan, buffer, group, outs)
        return tuple(outs)

    def _apply(self, plan: _Plan, buffers: list[torch.Tensor]) -> list[torch.Tensor]:
        """The autograd node; returns the output buffers in ``plan.out_groups`` order."""
        if self.mode == "residuals":
            slot = _ResidualSlot()
            try:
                hooks = torch.autograd.graph.saved_tensors_hooks(slot.pack, _unpack_box)
                hooks.__enter__()
            except RuntimeError:  # hooks disabled by the caller
                outs = _JaxAutogradFunction.apply(self, plan, slot, *buffers)
            else:
                slot.hooked = True
                try:
                    outs = _JaxAutogradFunction.apply(self, plan, slot, *buffers)
                finally:
                    hooks.__exit__(None, None, None)
                    slot.box = None
        else:
            outs = _JaxAutogradFunction.apply(self, plan, None, *buffers)
        ordered: list = [None] * len(plan.out_groups)
        for gi, t in zip((*plan.float_out, *plan.other_out), outs):
            ordered[gi] = t
        return ordered

    def _call_nograd(self, plan: _Plan, buffers: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        results = _run_blocks(plan, self._get_call(plan), _to_blocks(plan, buffers))
        return [_from_blocks([r[g] for r in results]) for g in range(len(plan.out_groups))]

    def _label(self, index: int) -> str:
        if self.input_names is not None and index < len(self.input_names):
            return f"{self.input_names[index]!r}"
        return f"#{index}"


def _merge(plan: _Plan, float_packs, other_packs) -> list:
    packs: list = [None] * len(plan.in_groups)
    for i, p in zip(plan.float_groups, float_packs):
        packs[i] = p
    for i, p in zip(plan.other_groups, other_packs):
        packs[i] = p
    return packs


def _nonfinite_flags(jnp, grads):
    if not grads:
        return jnp.zeros((0,), dtype=bool)
    return jnp.stack([jnp.logical_not(jnp.all(jnp.isfinite(g))) for g in grads])


class _ResidualBox:
    """Holds a forward's JAX residuals for as long as torch keeps its saved tensors."""

    __slots__ = ("__weakref__", "residuals", "sentinel")

    def __init__(self, residuals, sentinel: torch.Tensor) -> None:
        self.residuals = residuals
        self.sentinel = sentinel


class _ResidualSlot:
    """Passes the residual box from ``forward`` to torch's saved-tensor hook.

    In ``"residuals"`` mode, :meth:`JaxFunction._apply` runs the autograd
    function under ``saved_tensors_hooks(slot.pack, _unpack_box)``. Torch
    saves a custom function's tensors when ``apply`` returns, through the
    innermost hooks, so the packed object it keeps for the node's only saved
    tensor (an empty sentinel) is the box holding the residual arrays (they
    stay JAX arrays: no copy, no conversion). Torch keeps that packed object
    exactly as long as the graph's saved tensors: freed by ``backward()``,
    kept with ``retain_graph=True``, and a second backward through a freed
    graph raises torch's usual error. ``ctx`` only holds a weak reference.
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


class _JaxAutogradFunction(torch.autograd.Function):
    """Input: the packed buffers. Output: the floating output buffers, then the others."""

    @staticmethod
    def forward(ctx, jf: JaxFunction, plan: _Plan, slot: _ResidualSlot | None, *buffers):
        float_in = [buffers[i] for i in plan.float_groups]
        other_in = [buffers[i] for i in plan.other_groups]
        blocks = list(zip(_to_blocks(plan, float_in), _to_blocks(plan, other_in)))
        if jf.mode == "residuals":
            results = _run_blocks(plan, jf._get_fwd(plan), blocks)
            _save_residuals(ctx, slot, tuple(r[2] for r in results))
            float_out = [_from_blocks([r[0][k] for r in results]) for k in range(len(plan.float_out))]
            other_out = [_from_blocks([r[1][k] for r in results]) for k in range(len(plan.other_out))]
        else:
            results = _run_blocks(plan, jf._get_call(plan), [_merge(plan, f, o) for f, o in blocks])
            float_out = [_from_blocks([r[g] for r in results]) for g in plan.float_out]
            other_out = [_from_blocks([r[g] for r in results]) for g in plan.other_out]
            ctx.n_saved_float = len(float_in)
            ctx.save_for_backward(*float_in, *other_in)
        ctx.jf = jf
        ctx.plan = plan
        ctx.set_materialize_grads(False)
        ctx.float_out_meta = [(t.dtype, t.device) for t in float_out]
        if other_out:
            ctx.mark_non_differentiable(*other_out)
        return (*float_out, *other_out)

    @staticmethod
    def backward(ctx, *grad_outputs):
        saved = ctx.saved_tensors  # raises if the graph was already freed
        jf: JaxFunction = ctx.jf
        plan: _Plan = ctx.plan
        cts = []
        for gi, (dtype, device), grad in zip(plan.float_out, ctx.float_out_meta, grad_outputs):
            if grad is None:
                grad = torch.zeros(plan.rows, plan.out_groups[gi].width, dtype=dtype, device=device)
            cts.append(grad)
        with enable_x64(plan.x64):
            ct_blocks = _to_blocks(plan, cts)
            if jf.mode == "residuals":
                held = _load_residuals(ctx)
            else:
                n = ctx.n_saved_float
                held = list(zip(_to_blocks(plan, saved[:n]), _to_blocks(plan, saved[n:])))
            results = _run_blocks(plan, jf._get_bwd(plan), list(zip(held, ct_blocks)))
            grads = [_from_blocks([r[0][k] for r in results]) for k in range(len(plan.float_groups))]
            bad = jf.check_finite and any(bool(jax_to_torch(r[1]).any()) for r in results)
        if bad:
            _warn_nonfinite(jf, plan, grads)
        needs = ctx.needs_input_grad[3:]
        out: list = [None] * len(plan.in_groups)
        for gi, grad in zip(plan.float_groups, grads):
            out[gi] = grad if needs[gi] else None
        return (None, None, None, *out)


def _warn_nonfinite(jf: JaxFunction, plan: _Plan, grad_buffers: Sequence[torch.Tensor]) -> None:
    grads: list = [None] * plan.n_in
    for gi, buffer in zip(plan.float_groups, grad_buffers):
        _unpack_torch(plan, buffer, plan.in_groups[gi], grads)
    parts = []
    all_rows: set[int] = set()
    for i, g in enumerate(grads):
        if g is None:
            continue
        finite = torch.isfinite(g)
        if bool(finite.all()):
            continue
        if g.ndim == 0:
            parts.append(f"input {jf._label(i)} (0-dim)")
            continue
        rows = (~finite).reshape(g.shape[0], -1).any(1).nonzero().flatten().tolist()
        all_rows.update(rows)
        shown = ", ".join(map(str, itertools.islice(rows, 20))) + (", ..." if len(rows) > 20 else "")
        parts.append(f"input {jf._label(i)} at rows [{shown}]")
    rows_msg = sorted(all_rows)
    warnings.warn(
        f"{jf!r}: non-finite gradient coming out of JAX (left as is, not zeroed) for "
        + "; ".join(parts)
        + (f". Non-finite batch rows: {rows_msg[:50]}{' ...' if len(rows_msg) > 50 else ''}" if rows_msg else ""),
        NonFiniteGradientWarning,
        stacklevel=3,
    )
