"""Packing tensors by dtype into ``(rows, features)`` buffers, on both sides of the bridge.

A :class:`~waddle.bridge.JaxFunction` call groups its inputs by dtype and
packs each group into one 2-D buffer of shape ``(rows, features)``: ``rows`` is
the batch size when the function is batched and 1 otherwise, and each tensor
fills a block of columns. A group of one tensor is passed as a view, no copy.
Packing turns the ~40 leaves of a physics state into two or three DLPack
transfers and keeps the jitted call's argument list short, which is where the
per-call cost of DLPack and of JAX dispatch lies.

* :func:`group_by_dtype` lays the tensors out (:class:`Group` of :class:`Slot`).
* :func:`pack_jax` / :func:`unpack_jax` run inside a JAX trace (static
  slices, free inside XLA).
* :func:`pack_torch` / :func:`unpack_torch` run on the torch side. The views
  that :func:`unpack_torch` makes of an output buffer are recognised when they
  come back as inputs (a physics state passed from one step to the next), and
  the buffer itself is passed on: no concatenation in forward and no
  per-tensor split in backward.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Group", "Slot", "group_by_dtype", "pack_jax", "pack_torch", "unpack_jax", "unpack_torch"]


def _contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class Slot:
    """Where one tensor sits in a packed ``(rows, features)`` buffer."""

    index: int  # position among the function's inputs (or outputs)
    offset: int  # first column
    width: int  # columns
    rest: tuple[int, ...]  # the shape without the rows (batched) or the whole shape
    rest_strides: tuple[int, ...]


@dataclass(frozen=True)
class Group:
    """All tensors of one dtype, packed in order into one buffer."""

    dtype: Any  # a torch.dtype (inputs) or a numpy dtype (outputs, residuals)
    slots: tuple[Slot, ...]

    @property
    def width(self) -> int:
        return sum(s.width for s in self.slots)


def group_by_dtype(items: Sequence[tuple[int, Any, tuple[int, ...]]], batched: bool) -> tuple[Group, ...]:
    """Groups ``(index, dtype, shape)`` triples by dtype, keeping first-seen order."""
    by_dtype: dict[Any, list[Slot]] = {}
    offsets: dict[Any, int] = {}
    for index, dtype, shape in items:
        rest = tuple(int(d) for d in (shape[1:] if batched else shape))
        width = math.prod(rest)
        off = offsets.get(dtype, 0)
        by_dtype.setdefault(dtype, []).append(Slot(index, off, width, rest, _contiguous_strides(rest)))
        offsets[dtype] = off + width
    return tuple(Group(dtype, tuple(slots)) for dtype, slots in by_dtype.items())


# ------------------------------------------------------------ JAX-side packing
def unpack_jax(jnp, groups: Sequence[Group], packs: Sequence[Any], n: int, batched: bool) -> list[Any]:
    """Inside a trace: splits ``(rows, features)`` buffers back into ``n`` arrays."""
    out: list[Any] = [None] * n
    for group, pack in zip(groups, packs):
        rows = pack.shape[0]
        for s in group.slots:
            cols = pack if len(group.slots) == 1 else pack[:, s.offset : s.offset + s.width]
            out[s.index] = jnp.reshape(cols, (rows, *s.rest) if batched else s.rest)
    return out


def pack_jax(jnp, arrays: Sequence[Any], rows: int, batched: bool) -> tuple[tuple[Group, ...], tuple[Any, ...]]:
    """Inside a trace: packs arrays by dtype into ``(rows, features)`` buffers."""
    groups = group_by_dtype([(i, a.dtype, tuple(a.shape)) for i, a in enumerate(arrays)], batched)
    packs = []
    for group in groups:
        cols = [jnp.reshape(arrays[s.index], (rows, s.width)) for s in group.slots]
        packs.append(cols[0] if len(cols) == 1 else jnp.concatenate(cols, axis=1))
    return groups, tuple(packs)


# ---------------------------------------------------------- torch-side packing
def _torch_shape(slot: Slot, rows: int, batched: bool) -> tuple[int, ...]:
    return (rows, *slot.rest) if batched else slot.rest


def _whole_buffer_run(tensors, slots: Sequence[Slot], start: int, rows: int, batched: bool):
    """``(buffer, end)`` if ``slots[start:end]`` are exactly the views that
    :func:`unpack_torch` made of one output buffer, in order; else ``None``."""
    first = tensors[slots[start].index]
    buffer = first._base
    if (
        buffer is None
        or buffer.dim() != 2
        or buffer.shape[0] != rows
        or buffer.dtype != first.dtype
        or buffer.requires_grad != first.requires_grad
        or not buffer.is_contiguous()
    ):
        return None
    total, origin = buffer.shape[1], buffer.storage_offset()
    row_stride = (total,) if batched else ()
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


def pack_torch(tensors: Sequence[torch.Tensor], group: Group, rows: int, batched: bool) -> torch.Tensor:
    """The group's ``(rows, features)`` buffer, recorded by autograd if inputs require grad."""
    parts, i, slots = [], 0, group.slots
    while i < len(slots):
        run = _whole_buffer_run(tensors, slots, i, rows, batched)
        if run is not None:
            buffer, i = run
            parts.append(buffer)
            continue
        parts.append(tensors[slots[i].index].reshape(rows, -1))
        i += 1
    if len(parts) == 1:
        return parts[0].contiguous()
    return torch.cat(parts, dim=1)


def unpack_torch(buffer: torch.Tensor, group: Group, out: list, rows: int, batched: bool) -> None:
    """Fills ``out`` with views of ``buffer`` in the group's shapes (the only
    kind of view that :func:`pack_torch` passes on as the buffer itself)."""
    if len(group.slots) == 1:
        s = group.slots[0]
        out[s.index] = buffer.view(_torch_shape(s, rows, batched))
        return
    parts = torch.split(buffer, [s.width for s in group.slots], dim=1)
    for s, part in zip(group.slots, parts):
        out[s.index] = part.view(_torch_shape(s, rows, batched))
