"""Zero-copy conversion between :class:`torch.Tensor` and :class:`jax.Array`.

Both directions go through DLPack, so on CPU and on CUDA the result shares
memory with its source: no host round trip, no copy. Copies happen only where
DLPack cannot express the source:

* a non-contiguous tensor is made contiguous first (one copy), since JAX
  buffers are always dense row-major;
* a tensor that requires grad is detached first (no copy; the result simply
  has no autograd history);
* a CPU tensor whose storage is not aligned the way XLA wants it (a view
  starting at an odd offset, say) is copied by JAX itself;
* a 64-bit integer tensor while JAX's 64-bit mode is off is narrowed to int32
  by JAX, as JAX does for every input (a copy).

64-bit floats
-------------
JAX runs in 32-bit mode unless ``jax_enable_x64`` is set, and in that mode it
would silently narrow a float64 tensor to float32. :func:`torch_to_jax`
refuses to do that and raises instead. Run float64 code inside
:func:`enable_x64`::

    with waddle.bridge.enable_x64():
        x = torch_to_jax(torch.ones(3, dtype=torch.float64))  # float64 array

:func:`enable_x64` is a thread-local context manager around
:func:`jax.enable_x64`; nothing in waddle flips ``jax_enable_x64`` globally
(do it yourself with ``jax.config.update("jax_enable_x64", True)`` if the
whole program is 64-bit). Functions jitted under 64-bit mode are compiled
separately from the 32-bit ones, so the two modes can be mixed.

Aliasing
--------
JAX arrays are immutable and XLA may assume that nobody writes to a buffer it
is still using. A tensor obtained from :func:`jax_to_torch` shares its memory
with the JAX array; writing into it in place also changes the JAX array.
Treat such tensors as read-only (out-of-place ops are fine).

jax is imported lazily, so importing this module costs nothing when JAX is not
installed; the functions raise an :class:`ImportError` that names the extra to
install.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = [
    "enable_x64",
    "import_jax",
    "jax_device",
    "jax_to_torch",
    "torch_to_jax",
    "x64_enabled",
]

_INSTALL_HINT = "pip install 'waddle[brax]'"

_jax_mod = None
_jax_dlpack = None

_WIDE_FLOATS = (torch.float64, torch.complex128)
_WIDE_INTS = (torch.int64, torch.uint64)


def import_jax():
    """Returns the :mod:`jax` module, or raises an :class:`ImportError` naming the extra."""
    global _jax_mod, _jax_dlpack
    if _jax_mod is None:
        try:
            import jax
            import jax.dlpack
        except ImportError as err:  # pragma: no cover - exercised without jax only
            raise ImportError(
                "waddle.bridge needs JAX, which is not installed. Install it with "
                f"`{_INSTALL_HINT}` (or `pip install 'waddle[mjx]'`)."
            ) from err
        _jax_mod = jax
        _jax_dlpack = jax.dlpack
    return _jax_mod


def x64_enabled() -> bool:
    """Whether JAX's 64-bit mode is on in this thread (globally or via :func:`enable_x64`)."""
    jax = import_jax()
    return bool(jax.config.read("jax_enable_x64"))


@contextlib.contextmanager
def enable_x64(enabled: bool = True) -> Iterator[None]:
    """Turns JAX's 64-bit mode on (or off) for the duration of a ``with`` block.

    The setting is thread-local and restored on exit; the global
    ``jax_enable_x64`` flag is never changed. :class:`~waddle.bridge.JaxFunction`
    records the mode in effect when it runs forward and uses the same mode in
    backward, even when torch runs backward on another thread.
    """
    jax = import_jax()
    with jax.enable_x64(bool(enabled)):
        yield


def jax_device(device: torch.device | str | None, user: str) -> Any:
    """The JAX device that holds the same memory as torch ``device``.

    ``user`` names the caller in errors (e.g. ``"backend='mjx'"``). A CUDA
    device needs a CUDA build of JAX; ``None`` means the CPU.
    """
    jax = import_jax()
    device = torch.device("cpu" if device is None else device)
    if device.type == "cpu":
        return jax.devices("cpu")[0]
    if device.type == "cuda":
        try:
            gpus = jax.devices("gpu")
        except RuntimeError as err:
            raise RuntimeError(
                f"{user} on {device} needs a CUDA build of JAX (pip install 'jax[cuda12]'); this JAX has no GPU device."
            ) from err
        return gpus[device.index or 0]
    raise ValueError(f"{user} runs on 'cpu' or 'cuda' devices, not {device}.")


def torch_to_jax(tensor: torch.Tensor) -> Any:
    """Returns a :class:`jax.Array` sharing memory with ``tensor``.

    ``tensor`` is detached (autograd history is dropped, never its data) and
    made contiguous if it is not. 0-dim tensors give 0-dim arrays. The array
    lives on the JAX device matching the tensor's device (CPU, or the CUDA
    device with the same index).

    Raises:
        TypeError: if ``tensor`` is float64/complex128 while JAX's 64-bit mode
            is off (see :func:`enable_x64`); JAX would otherwise narrow it to
            32 bits silently.
    """
    import_jax()
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"torch_to_jax expects a torch.Tensor, got {type(tensor).__name__}.")
    if tensor.dtype in _WIDE_FLOATS and not x64_enabled():
        raise TypeError(
            f"Cannot convert a {tensor.dtype} tensor to JAX while JAX's 64-bit mode is "
            "off: JAX would silently narrow it to 32 bits. Wrap the call in "
            "`with waddle.bridge.enable_x64():` or cast the tensor first."
        )
    if tensor.requires_grad:
        tensor = tensor.detach()
    if not tensor.is_contiguous():
        tensor = tensor.contiguous()
    if tensor.is_conj():
        tensor = tensor.resolve_conj()
    if tensor.is_neg():
        tensor = tensor.resolve_neg()
    if tensor.device.type == "cpu" and (tensor.dtype not in _WIDE_INTS or x64_enabled()):
        fast = _cpu_from_dlpack()
        if fast is not None:
            return fast(tensor)
    return _jax_dlpack.from_dlpack(tensor)


_cpu_fast_path: Any = None  # None: not probed yet; False: unavailable


def _cpu_from_dlpack():
    """A quicker ``jax.dlpack.from_dlpack`` for CPU tensors of JAX-canonical dtypes.

    The public function spends ~150 us per call on a CPU (it asks the device
    for a stream, which raises UNIMPLEMENTED there, and re-wraps the result in
    ``jnp.asarray`` to canonicalise a dtype that is already canonical), more
    than a whole small physics step's dispatch. This calls the same jaxlib
    routine directly. It is probed once against the public function (same
    values, same memory) and not used if jaxlib's private API differs.
    """
    global _cpu_fast_path
    if _cpu_fast_path is None:
        _cpu_fast_path = False
        try:
            from jax._src.lib import _jax as jax_ext
            from jax._src.lib import jaxlib_extension_version

            device = _jax_mod.devices("cpu")[0]
            if jaxlib_extension_version >= 467:

                def convert(tensor):
                    return jax_ext.dlpack_managed_tensor_to_buffer(tensor.__dlpack__(), device, None, None, 1)

            else:  # pragma: no cover - older jaxlib

                def convert(tensor):
                    return jax_ext.dlpack_managed_tensor_to_buffer(tensor.__dlpack__(), device, None, None)

            probe = torch.arange(6, dtype=torch.float32).reshape(2, 3)
            fast, public = convert(probe), _jax_dlpack.from_dlpack(probe)
            same_memory = fast.unsafe_buffer_pointer() == probe.data_ptr()
            if (
                same_memory
                and fast.shape == public.shape
                and fast.dtype == public.dtype
                and bool((fast == public).all())
            ):
                _cpu_fast_path = convert
        except Exception:  # pragma: no cover - any API drift: use the public path
            _cpu_fast_path = False
    return _cpu_fast_path or None


def jax_to_torch(array: Any) -> torch.Tensor:
    """Returns a :class:`torch.Tensor` sharing memory with the JAX ``array``.

    The tensor has the array's shape, dtype and device. It does not require
    grad. Do not modify it in place: that would change the (immutable) JAX
    array too.
    """
    import_jax()
    return torch.from_dlpack(array)
