"""JAX <-> torch bridge: zero-copy DLPack conversion and a JAX function with torch autograd.

* :func:`torch_to_jax` / :func:`jax_to_torch`: zero-copy conversion (CPU and GPU).
* :func:`jax_device`: the JAX device sharing a torch device's memory.
* :func:`enable_x64` / :func:`x64_enabled`: thread-local JAX 64-bit mode, needed
  for float64 tensors (waddle never flips ``jax_enable_x64`` globally).
* :class:`JaxFunction`: call a pure JAX function on torch tensors; with grad
  enabled its backward applies a VJP compiled once per input signature.
* :func:`resolve_batch_chunks` / :func:`auto_batch_chunks`: how many row
  blocks a batched step runs as on this device (``JaxFunction(batch_chunks=)``).

The modules, in the order a call uses them: :mod:`~waddle.bridge.dlpack`,
:mod:`~waddle.bridge.packing`, :mod:`~waddle.bridge.blocks`,
:mod:`~waddle.bridge.plan`, :mod:`~waddle.bridge.autograd`,
:mod:`~waddle.bridge.function`.

JAX is imported lazily: importing :mod:`waddle.bridge` works without it, and
the first use raises an :class:`ImportError` naming ``pip install 'waddle[brax]'``.
"""

from waddle.bridge.autograd import NonFiniteGradientWarning
from waddle.bridge.blocks import auto_batch_chunks, resolve_batch_chunks
from waddle.bridge.dlpack import enable_x64, jax_device, jax_to_torch, torch_to_jax, x64_enabled
from waddle.bridge.function import JaxFunction

__all__ = [
    "JaxFunction",
    "NonFiniteGradientWarning",
    "auto_batch_chunks",
    "enable_x64",
    "jax_device",
    "jax_to_torch",
    "resolve_batch_chunks",
    "torch_to_jax",
    "x64_enabled",
]
