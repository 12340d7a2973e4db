"""Calling a pure JAX function on torch tensors, with gradients.

:class:`JaxFunction` wraps ``fn(*arrays) -> tuple of arrays`` so that it takes
and returns :class:`torch.Tensor` objects and takes part in torch autograd.

How a call runs
---------------
1. Inputs are grouped by dtype and each group is packed into one 2-D buffer
   of shape ``(rows, features)`` (:mod:`waddle.bridge.packing`), which
   crosses to JAX through DLPack without a copy.
2. A jitted program, compiled once per input signature (shapes, dtypes,
   device, 64-bit mode; :mod:`waddle.bridge.plan`), unpacks the buffers,
   calls ``fn``, and packs the outputs by dtype the same way.
3. The output buffers cross back to torch through DLPack and are split into
   views with the output shapes, outside the autograd node.

Outputs fed back as inputs skip step 1: when the tensors of a dtype group are
exactly the views that step 3 made of one output buffer (a physics state
passed from one step to the next), that buffer itself is passed on. The
autograd graph then links the two calls directly.

``batch_chunks=k`` declares that ``fn`` is batched along the leading
dimension of every input and output and runs it on ``k`` row blocks at once,
one host thread each (:mod:`waddle.bridge.blocks`, which says when this pays:
on a multi-core CPU, not on a GPU).

Without grad (``torch.is_grad_enabled()`` false, or no floating input requires
grad) step 2 is just ``jax.jit(fn)``.

With grad, the call goes through a :class:`torch.autograd.Function`
(:mod:`waddle.bridge.autograd`). Two
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
``benchmarks/differentiable.py --sections modes`` (docs/differentiable.md
has figures for Brax ``ant``). Residuals take more memory per step than the
inputs, so ``"recompute"`` is the choice when the graph's memory is the
limit (long horizons, large batches, GPUs).

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

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from waddle.bridge.autograd import NonFiniteGradientWarning, apply
from waddle.bridge.blocks import auto_batch_chunks, from_blocks, is_block_count, resolve_batch_chunks
from waddle.bridge.dlpack import import_jax, x64_enabled
from waddle.bridge.plan import MODES, Plan, Spec, make_plan

__all__ = ["JaxFunction", "NonFiniteGradientWarning", "auto_batch_chunks", "resolve_batch_chunks"]


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
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}.")
        if batch_chunks is not None and not is_block_count(batch_chunks):
            raise ValueError(f"batch_chunks must be None or a positive integer, got {batch_chunks!r}.")
        import_jax()
        self.fn = fn
        self.mode = mode
        self.batch_chunks = batch_chunks
        self.check_finite = bool(check_finite)
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        self.input_names = tuple(input_names) if input_names is not None else None
        self.compiler_options = dict(compiler_options) if compiler_options else None
        self._plans: dict[tuple, Plan] = {}
        self._lock = threading.Lock()
        #: how many times each jitted program was traced (== compiled); one per
        #: input signature when everything is reused as intended.
        self.trace_counts = {"call": 0, "forward": 0, "backward": 0}
        self._spec = Spec(
            fn=fn,
            owner=repr(self),
            mode=mode,
            batch_chunks=batch_chunks,
            check_finite=self.check_finite,
            input_names=self.input_names,
            compiler_options=self.compiler_options,
            trace_counts=self.trace_counts,
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name}, mode={self.mode!r})"

    def _plan(self, tensors: Sequence[torch.Tensor]) -> Plan:
        x64 = x64_enabled()
        key = (x64, *((t.dtype, t.shape, t.device) for t in tensors))
        plan = self._plans.get(key)
        if plan is not None:
            return plan
        with self._lock:
            plan = self._plans.get(key)
            if plan is None:
                plan = make_plan(self._spec, tensors, x64)
                self._plans[key] = plan
        return plan

    def __call__(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{self!r}: argument {i} is a {type(t).__name__}, expected a torch.Tensor.")
        plan = self._plan(tensors)
        buffers = [plan.pack(tensors, g) for g in plan.in_groups]
        if torch.is_grad_enabled() and any(buffers[i].requires_grad for i in plan.float_groups):
            out_buffers = apply(plan, buffers)
        else:
            results = plan.run_blocks(plan.call_program(), plan.to_blocks(buffers))
            out_buffers = [from_blocks([r[g] for r in results]) for g in range(len(plan.out_groups))]
        outs: list = [None] * plan.n_out
        for group, buffer in zip(plan.out_groups, out_buffers):
            plan.unpack(buffer, group, outs)
        return tuple(outs)
