"""Running a batched JAX program on row blocks, one host thread each.

``JaxFunction(batch_chunks=k)`` declares that a function is batched along the
leading dimension of every input and output (a ``jax.vmap``-ed step, say) and
runs it on ``k`` contiguous row blocks of the packed buffers at once, one
host thread each (JAX releases the GIL while XLA runs). On a CPU, XLA leaves
cores idle while it runs a vmapped Brax or MJX step, whatever the batch size;
``k`` programs from ``k`` threads keep ``k`` cores busy (docs/differentiable.md,
"Row blocks", has the figures and the command that measures them). The blocks'
results are concatenated (one copy per buffer). On a GPU use
``batch_chunks=1``: one program already fills the device.

* :func:`auto_batch_chunks` / :func:`resolve_batch_chunks`: how many blocks a
  batched step runs as on a device.
* :func:`to_blocks`, :func:`run_blocks`, :func:`from_blocks`: split the
  buffers (zero-copy), run the program on every block, join the results.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from waddle.bridge.dlpack import enable_x64, import_jax, jax_to_torch, torch_to_jax

__all__ = [
    "auto_batch_chunks",
    "from_blocks",
    "is_block_count",
    "resolve_batch_chunks",
    "run_blocks",
    "to_blocks",
]


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def is_block_count(value) -> bool:
    """Whether ``value`` is a valid number of row blocks: an ``int`` >= 1 (not a bool)."""
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
    if batch_chunks != "auto" and not is_block_count(batch_chunks):
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


def to_blocks(buffers: Sequence[torch.Tensor], rows: int, chunks: int) -> list[tuple]:
    """Per row block, the JAX arrays of ``buffers`` (zero-copy row slices)."""
    if chunks == 1:
        return [tuple(torch_to_jax(b) for b in buffers)]
    size = rows // chunks
    return [tuple(torch_to_jax(b[c * size : (c + 1) * size]) for b in buffers) for c in range(chunks)]


def run_blocks(program, args_per_block: Sequence[tuple], x64: bool) -> list:
    """Runs ``program`` on every row block, concurrently when there are several,
    in the 64-bit mode ``x64`` (which is thread-local in JAX)."""
    if len(args_per_block) == 1:
        return [program(*args_per_block[0])]
    jax = import_jax()

    def run(args):
        with enable_x64(x64):  # the mode is thread-local: use the caller's
            return jax.block_until_ready(program(*args))

    # The calling thread runs the first block itself: one hand-off fewer.
    others = [_executor(len(args_per_block) - 1).submit(run, args) for args in args_per_block[1:]]
    first = jax.block_until_ready(program(*args_per_block[0]))
    return [first, *(f.result() for f in others)]


def from_blocks(arrays: Sequence[Any]) -> torch.Tensor:
    """One torch buffer from the row blocks' JAX arrays."""
    if len(arrays) == 1:
        return jax_to_torch(arrays[0])
    return torch.cat([jax_to_torch(a) for a in arrays], dim=0)
