"""Calling a pure JAX function on torch tensors, with gradients.

:class:`JaxFunction` wraps ``fn(*arrays) -> tuple of arrays`` so that it takes
and returns :class:`torch.Tensor` objects and takes part in torch autograd.

How a call runs
---------------
1. Inputs are grouped by dtype and each group is packed into one flat buffer
   (a ``torch.cat``; a group of one tensor is passed as a flat view, no copy).
   Each buffer crosses to JAX through DLPack without a copy. Packing turns the
   ~40 leaves of a physics state into two or three transfers and keeps the
   jitted call's argument list short, which is where the per-call cost of
   DLPack and of JAX dispatch lies.
2. A jitted function, compiled once per input signature (shapes, dtypes,
   device, 64-bit mode), unpacks the buffers (static slices, free inside XLA),
   calls ``fn``, and packs the outputs by dtype the same way.
3. The output buffers cross back to torch through DLPack and are split into
   views with the output shapes.

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

Why ``"residuals"`` is the default (measured on a 2-core CPU, Brax, see
``benchmarks/differentiable.py --sections modes``): forward+backward per env
step, ``reacher`` with 16 envs: 17 ms (residuals) vs 25 ms (recompute), best
of 12 interleaved rounds; ``ant`` with 16 envs: 0.21 s vs 0.43 s. With 128
``ant`` envs the two are even (0.56 s each: the fused recompute program saves
what the plain forward costs), but the residuals take 54 MB per step against
0.7 MB of saved inputs. So ``"residuals"`` is never slower, and
``"recompute"`` is the choice when the graph's memory is the limit (long
horizons, large batches, GPUs).

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
:func:`waddle.bridge.enable_x64`) is also used for backward.
"""

from __future__ import annotations

import itertools
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from waddle.bridge.dlpack import enable_x64, import_jax, jax_to_torch, torch_to_jax, x64_enabled

__all__ = ["JaxFunction", "NonFiniteGradientWarning"]

_MODES = ("residuals", "recompute")
# Residual arrays smaller than this are packed into one buffer per dtype.
_PACK_BYTES = 16 * 1024


class NonFiniteGradientWarning(RuntimeWarning):
    """A gradient computed by JAX contains NaN or infinite entries."""


def _is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point


@dataclass(frozen=True)
class _Slot:
    """Where one tensor sits in a packed buffer."""

    index: int  # position among the function's inputs (or outputs)
    offset: int
    numel: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class _Group:
    """All tensors of one dtype, packed in order into one flat buffer."""

    dtype: Any  # a torch.dtype (inputs) or a numpy dtype (outputs, residuals)
    slots: tuple[_Slot, ...]

    @property
    def numel(self) -> int:
        return sum(s.numel for s in self.slots)


def _group(items: Sequence[tuple[int, Any, tuple[int, ...]]]) -> tuple[_Group, ...]:
    """Groups ``(index, dtype, shape)`` triples by dtype, keeping first-seen order."""
    by_dtype: dict[Any, list[_Slot]] = {}
    offsets: dict[Any, int] = {}
    for index, dtype, shape in items:
        numel = 1
        for d in shape:
            numel *= int(d)
        off = offsets.get(dtype, 0)
        by_dtype.setdefault(dtype, []).append(_Slot(index, off, numel, tuple(shape)))
        offsets[dtype] = off + numel
    return tuple(_Group(dtype, tuple(slots)) for dtype, slots in by_dtype.items())


def _unpack_jax(jnp, groups: Sequence[_Group], packs: Sequence[Any], n: int) -> list[Any]:
    """Inside a trace: splits packed buffers back into ``n`` arrays."""
    out: list[Any] = [None] * n
    for group, pack in zip(groups, packs):
        if len(group.slots) == 1:
            s = group.slots[0]
            out[s.index] = jnp.reshape(pack, s.shape)
            continue
        for s in group.slots:
            out[s.index] = jnp.reshape(pack[s.offset : s.offset + s.numel], s.shape)
    return out


def _pack_jax(jnp, arrays: Sequence[Any]) -> tuple[tuple[_Group, ...], tuple[Any, ...]]:
    """Inside a trace: packs arrays by dtype into flat buffers."""
    groups = _group([(i, a.dtype, tuple(a.shape)) for i, a in enumerate(arrays)])
    packs = []
    for group in groups:
        flat = [jnp.ravel(arrays[s.index]) for s in group.slots]
        packs.append(flat[0] if len(flat) == 1 else jnp.concatenate(flat))
    return groups, tuple(packs)


def _pack_torch(tensors: Sequence[torch.Tensor], group: _Group) -> torch.Tensor:
    if len(group.slots) == 1:
        return tensors[group.slots[0].index].detach().reshape(-1)
    return torch.cat([tensors[s.index].detach().reshape(-1) for s in group.slots])


def _unpack_torch(buffer: torch.Tensor, group: _Group, out: list) -> None:
    if len(group.slots) == 1:
        s = group.slots[0]
        out[s.index] = buffer.view(s.shape)
        return
    parts = torch.split(buffer, [s.numel for s in group.slots])
    for s, part in zip(group.slots, parts):
        out[s.index] = part.view(s.shape)


@dataclass
class _Plan:
    """Everything compiled for one input signature."""

    in_groups: tuple[_Group, ...]
    float_groups: tuple[int, ...]  # indices into in_groups of floating groups
    other_groups: tuple[int, ...]
    n_in: int
    x64: bool
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
        check_finite: bool = True,
        name: str | None = None,
        input_names: Sequence[str] | None = None,
        compiler_options: dict[str, Any] | None = None,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"mode must be one of {_MODES}, got {mode!r}.")
        import_jax()
        self.fn = fn
        self.mode = mode
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
                devices = {t.device for t in tensors}
                if len(devices) > 1:
                    raise ValueError(
                        f"{self!r}: all inputs must be on one device, got {sorted(map(str, devices))}."
                    )
                groups = _group([(i, t.dtype, tuple(t.shape)) for i, t in enumerate(tensors)])
                plan = _Plan(
                    in_groups=groups,
                    float_groups=tuple(i for i, g in enumerate(groups) if _is_float(g.dtype)),
                    other_groups=tuple(i for i, g in enumerate(groups) if not _is_float(g.dtype)),
                    n_in=len(tensors),
                    x64=x64,
                )
                self._plans[key] = plan
        return plan

    def _record_outputs(self, plan: _Plan, outs: Any) -> tuple:
        """Inside a trace: checks ``fn``'s outputs and packs them."""
        jax = import_jax()
        jnp = jax.numpy
        if not isinstance(outs, (tuple, list)):
            outs = (outs,)
        outs = tuple(jnp.asarray(o) for o in outs)
        groups, packs = _pack_jax(jnp, outs)
        if plan.out_groups is None:
            plan.out_groups = groups
            plan.n_out = len(outs)
            plan.float_out = tuple(
                i for i, g in enumerate(groups) if jnp.issubdtype(g.dtype, jnp.floating)
            )
            plan.other_out = tuple(i for i in range(len(groups)) if i not in plan.float_out)
        elif groups != plan.out_groups:
            raise RuntimeError(f"{self!r}: the outputs of fn changed between traces.")
        return packs

    def _inner(self, plan: _Plan, packs: Sequence[Any]) -> tuple:
        """Inside a trace: unpack inputs, call ``fn``, pack outputs."""
        jnp = import_jax().numpy
        args = _unpack_jax(jnp, plan.in_groups, packs, plan.n_in)
        return self._record_outputs(plan, self.fn(*args))

    def _get_call(self, plan: _Plan):
        if plan.call is None:
            jax = import_jax()

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
                    packs = _merge(plan, fp, other_packs)
                    out = self._inner(plan, packs)
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
                groups, packs = _pack_jax(jnp, [leaves[i] for i in small])
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
                    for i, x in zip(small, _unpack_jax(jnp, groups, packs, len(small))):
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
                        packs = _merge(plan, fp, other_packs)
                        out = self._inner(plan, packs)
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
                raise TypeError(
                    f"{self!r}: argument {i} is a {type(t).__name__}, expected a torch.Tensor."
                )
        plan = self._plan(tensors)
        if torch.is_grad_enabled() and any(
            t.requires_grad for g in plan.float_groups for t in _group_tensors(tensors, plan.in_groups[g])
        ):
            if self.mode != "residuals":
                return _JaxAutogradFunction.apply(self, plan, None, *tensors)
            slot = _ResidualSlot()
            try:
                hooks = torch.autograd.graph.saved_tensors_hooks(slot.pack, _unpack_box)
                hooks.__enter__()
            except RuntimeError:  # hooks disabled by the caller
                return _JaxAutogradFunction.apply(self, plan, slot, *tensors)
            slot.hooked = True
            try:
                return _JaxAutogradFunction.apply(self, plan, slot, *tensors)
            finally:
                hooks.__exit__(None, None, None)
                slot.box = None
        return self._call_nograd(plan, tensors)

    def _call_nograd(self, plan: _Plan, tensors: Sequence[torch.Tensor]):
        packs = [torch_to_jax(_pack_torch(tensors, g)) for g in plan.in_groups]
        out_packs = self._get_call(plan)(*packs)
        outs: list = [None] * plan.n_out
        for group, pack in zip(plan.out_groups, out_packs):
            _unpack_torch(jax_to_torch(pack), group, outs)
        return tuple(outs)

    def _label(self, index: int) -> str:
        if self.input_names is not None and index < len(self.input_names):
            return f"{self.input_names[index]!r}"
        return f"#{index}"


def _group_tensors(tensors, group: _Group):
    return [tensors[s.index] for s in group.slots]


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

    __slots__ = ("residuals", "sentinel", "__weakref__")

    def __init__(self, residuals, sentinel: torch.Tensor) -> None:
        self.residuals = residuals
        self.sentinel = sentinel


class _ResidualSlot:
    """Passes the residual box from ``forward`` to torch's saved-tensor hook.

    In ``"residuals"`` mode, :meth:`JaxFunction.__call__` runs the autograd
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
    @staticmethod
    def forward(ctx, jf: JaxFunction, plan: _Plan, slot: _ResidualSlot | None, *tensors):
        packs = [_pack_torch(tensors, g) for g in plan.in_groups]
        float_packs = tuple(torch_to_jax(packs[i]) for i in plan.float_groups)
        other_packs = tuple(torch_to_jax(packs[i]) for i in plan.other_groups)
        if jf.mode == "residuals":
            float_out, other_out, residuals = jf._get_fwd(plan)(float_packs, other_packs)
            _save_residuals(ctx, slot, residuals)
        else:
            out = jf._get_call(plan)(*_merge(plan, float_packs, other_packs))
            float_out = tuple(out[i] for i in plan.float_out)
            other_out = tuple(out[i] for i in plan.other_out)
            saved = [packs[i] for i in plan.float_groups]
            ctx.n_saved_float = len(saved)
            saved += [packs[i] for i in plan.other_groups]
            ctx.save_for_backward(*saved, torch.empty(0))
        ctx.jf = jf
        ctx.plan = plan
        ctx.x64 = plan.x64
        ctx.set_materialize_grads(False)

        outs: list = [None] * plan.n_out
        float_out_t = []
        for gi, pack in zip(plan.float_out, float_out):
            t = jax_to_torch(pack)
            float_out_t.append(t)
            _unpack_torch(t, plan.out_groups[gi], outs)
        ctx.float_out_meta = [(t.dtype, t.device) for t in float_out_t]
        non_diff = []
        for gi, pack in zip(plan.other_out, other_out):
            group = plan.out_groups[gi]
            _unpack_torch(jax_to_torch(pack), group, outs)
            non_diff.extend(outs[s.index] for s in group.slots)
        if non_diff:
            ctx.mark_non_differentiable(*non_diff)
        return tuple(outs)

    @staticmethod
    def backward(ctx, *grad_outputs):
        saved = ctx.saved_tensors  # raises if the graph was already freed
        jf: JaxFunction = ctx.jf
        plan: _Plan = ctx.plan
        cts = []
        for gi, (dtype, device) in zip(plan.float_out, ctx.float_out_meta):
            group = plan.out_groups[gi]
            grads = [grad_outputs[s.index] for s in group.slots]
            if all(g is None for g in grads):
                ct = torch.zeros(group.numel, dtype=dtype, device=device)
            elif len(grads) == 1:
                ct = grads[0].reshape(-1)
            else:
                ct = torch.cat(
                    [
                        g.reshape(-1) if g is not None else torch.zeros(s.numel, dtype=dtype, device=device)
                        for g, s in zip(grads, group.slots)
                    ]
                )
            cts.append(ct)
        with enable_x64(ctx.x64):
            cts_j = tuple(torch_to_jax(c) for c in cts)
            if jf.mode == "residuals":
                held = _load_residuals(ctx)
            else:
                held = (
                    tuple(torch_to_jax(t) for t in saved[: ctx.n_saved_float]),
                    tuple(torch_to_jax(t) for t in saved[ctx.n_saved_float : -1]),
                )
            grad_packs, flags = jf._get_bwd(plan)(held, cts_j)
            grad_packs = [jax_to_torch(g) for g in grad_packs]
            bad = jf.check_finite and bool(jax_to_torch(flags).any())

        grads: list = [None] * plan.n_in
        for gi, pack in zip(plan.float_groups, grad_packs):
            _unpack_torch(pack, plan.in_groups[gi], grads)
        if bad:
            _warn_nonfinite(jf, grads)
        needs = ctx.needs_input_grad[3:]
        out = [g if (g is not None and needs[i]) else None for i, g in enumerate(grads)]
        return (None, None, None, *out)


def _warn_nonfinite(jf: JaxFunction, grads: Sequence[torch.Tensor | None]) -> None:
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
        stacklevel=2,
    )
