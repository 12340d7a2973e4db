"""Zero-copy DLPack conversion between torch and JAX."""

from __future__ import annotations

import pytest
import torch

jax = pytest.importorskip("jax")
jnp = jax.numpy

from waddle.bridge import enable_x64, jax_device, jax_to_torch, torch_to_jax, x64_enabled  # noqa: E402

DTYPES_32 = [
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
]
DTYPES_64 = [torch.float64, torch.int64]


def _devices():
    devs = ["cpu"]
    if torch.cuda.is_available():
        try:
            jax.devices("gpu")
            devs.append("cuda")
        except RuntimeError:
            pass
    return devs


def _sample(dtype, device, shape=(5, 3)):
    g = torch.Generator().manual_seed(0)
    if dtype == torch.bool:
        t = torch.rand(shape, generator=g) > 0.5
    elif dtype.is_floating_point:
        t = torch.randn(shape, generator=g).to(dtype)
    else:
        t = torch.randint(-100 if dtype != torch.uint8 else 0, 100, shape, generator=g).to(dtype)
    return t.to(device)


def _ptr(a) -> int:
    return a.unsafe_buffer_pointer()


@pytest.mark.parametrize("device", _devices())
@pytest.mark.parametrize("dtype", DTYPES_32 + DTYPES_64, ids=str)
def test_round_trip_is_zero_copy(dtype, device):
    t = _sample(dtype, device)
    with enable_x64(dtype in DTYPES_64):
        a = torch_to_jax(t)
        assert a.shape == tuple(t.shape)
        assert str(a.dtype) == str(t.dtype).replace("torch.", "")
        assert _ptr(a) == t.data_ptr()  # torch -> jax shares memory
        back = jax_to_torch(a)
    assert back.dtype == t.dtype and back.device == t.device
    assert back.data_ptr() == t.data_ptr()  # and back again
    assert torch.equal(back, t)


def test_jax_to_torch_shares_memory():
    a = jnp.arange(12.0, dtype=jnp.float32).reshape(3, 4) * 2
    t = jax_to_torch(a)
    assert t.data_ptr() == _ptr(a)
    assert t.shape == (3, 4) and t.dtype == torch.float32
    assert torch.equal(t, torch.arange(12.0).reshape(3, 4) * 2)


def test_mutating_torch_side_is_visible_in_jax():
    t = torch.zeros(4)
    a = torch_to_jax(t)
    t[1] = 7.0  # same memory: JAX sees it
    assert float(a[1]) == 7.0


def test_non_contiguous_tensor_is_made_contiguous():
    base = torch.arange(12.0).reshape(3, 4)
    t = base.t()
    assert not t.is_contiguous()
    a = torch_to_jax(t)
    assert a.shape == (4, 3)
    assert (jnp.asarray(a) == jnp.asarray(base.numpy().T)).all()


def test_zero_dim_and_empty():
    t = torch.tensor(3.5)
    a = torch_to_jax(t)
    assert a.shape == () and float(a) == 3.5
    assert _ptr(a) == t.data_ptr()
    back = jax_to_torch(a)
    assert back.shape == () and back.item() == 3.5
    e = torch_to_jax(torch.zeros(0, 3))
    assert e.shape == (0, 3)
    assert jax_to_torch(e).shape == (0, 3)


def test_requires_grad_tensor_is_detached():
    t = torch.randn(3, requires_grad=True)
    a = torch_to_jax(t)
    assert _ptr(a) == t.data_ptr()
    back = jax_to_torch(a)
    assert not back.requires_grad


def test_float64_needs_x64():
    t = torch.ones(2, dtype=torch.float64)
    assert not x64_enabled()
    with pytest.raises(TypeError, match="enable_x64"):
        torch_to_jax(t)
    with enable_x64():
        assert x64_enabled()
        assert torch_to_jax(t).dtype == jnp.float64
    # the context does not leak, and nothing flips the global flag
    assert not x64_enabled()
    assert not jax.config.jax_enable_x64


def test_int64_without_x64_follows_jax_canonicalisation():
    a = torch_to_jax(torch.arange(4))
    assert a.dtype == jnp.int32
    assert list(map(int, a)) == [0, 1, 2, 3]


def test_jax_device_matches_the_torch_device_or_explains():
    assert jax_device("cpu", "test").platform == "cpu"
    assert jax_device(None, "test").platform == "cpu"
    try:
        jax.devices("gpu")
    except RuntimeError:
        with pytest.raises(RuntimeError, match=r"backend='mjx' on cuda.*CUDA build of JAX"):
            jax_device(torch.device("cuda"), "backend='mjx'")
    else:  # pragma: no cover - a GPU JAX is installed
        assert jax_device(torch.device("cuda:0"), "test").platform == "gpu"
    with pytest.raises(ValueError, match=r"BraxWrapper runs on 'cpu' or 'cuda' devices, not meta"):
        jax_device(torch.device("meta"), "BraxWrapper")


def test_cpu_fast_path_agrees_with_jax_from_dlpack():
    """The direct jaxlib call used for CPU tensors is active here (jaxlib as
    pinned) and gives what jax.dlpack.from_dlpack gives, misaligned views included."""
    from waddle.bridge import dlpack

    torch_to_jax(torch.zeros(2))
    assert callable(dlpack._cpu_fast_path)
    base = torch.randn(1001)
    for t in (base, base[1:], base[3:403].view(20, 20), torch.tensor(2.5), torch.zeros(0, 4)):
        fast = torch_to_jax(t)
        public = jax.dlpack.from_dlpack(t)
        assert fast.shape == public.shape and fast.dtype == public.dtype
        assert fast.committed == public.committed and fast.sharding == public.sharding
        assert bool((fast == public).all())
