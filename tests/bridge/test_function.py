"""JaxFunction: JAX functions in torch autograd, with a VJP compiled once."""

from __future__ import annotations

import gc
import os
import warnings

import pytest
import torch

jax = pytest.importorskip("jax")
jnp = jax.numpy

from waddle.bridge import JaxFunction, NonFiniteGradientWarning, enable_x64  # noqa: E402

MODES = ["residuals", "recompute"]


def smooth(x, y, idx):
    """Two floating inputs, one integer input; float and integer outputs."""
    a = jnp.sin(x) * y + jnp.tanh(x * y).sum(-1, keepdims=True)
    b = (x**2).sum(-1) + jnp.exp(-y[:, 0])
    return a, b, idx * 2


@pytest.mark.parametrize("mode", MODES)
def test_gradcheck_float64(mode):
    f = JaxFunction(smooth, mode=mode)
    idx = torch.arange(4)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, dtype=torch.float64, generator=g, requires_grad=True)
    y = torch.randn(4, 3, dtype=torch.float64, generator=g, requires_grad=True)
    with enable_x64():
        # both float outputs at once, and each alone (zero cotangent for the other)
        assert torch.autograd.gradcheck(lambda x, y: f(x, y, idx)[:2], (x, y))
        assert torch.autograd.gradcheck(lambda x, y: f(x, y, idx)[1], (x, y))
        out = f(x, y, idx)
    assert out[0].dtype == torch.float64
    assert out[2].dtype == torch.int64 and not out[2].requires_grad
    assert torch.equal(out[2], idx * 2)


@pytest.mark.parametrize("mode", MODES)
def test_non_float_inputs_get_none_and_unused_outputs_zero(mode):
    f = JaxFunction(smooth, mode=mode)
    x = torch.randn(4, 3, requires_grad=True)
    y = torch.randn(4, 3)  # does not require grad
    idx = torch.arange(4, dtype=torch.int32)
    a, b, i2 = f(x, y, idx)
    assert a.requires_grad and b.requires_grad and not i2.requires_grad
    (b.sum()).backward()  # `a` unused: zero cotangent
    expected = 2 * x.detach()
    torch.testing.assert_close(x.grad, expected)
    assert y.grad is None

    x.grad = None
    (gx,) = torch.autograd.grad(f(x, y, idx)[0].sum(), [x])
    xd = x.detach()
    torch.testing.assert_close(gx, torch.cos(xd) * y + 3 * (1 - torch.tanh(xd * y) ** 2) * y)


def _dynamics(state, action):
    """A small smooth 'physics' step: returns (next state, reward)."""
    pos, vel = state[:, :2], state[:, 2:]
    acc = action - 0.3 * jnp.sin(pos) - 0.1 * vel
    vel = vel + 0.1 * acc
    pos = pos + 0.1 * vel
    nxt = jnp.concatenate([pos, vel], -1)
    reward = -(pos**2).sum(-1) - 0.01 * (action**2).sum(-1)
    return nxt, reward


@pytest.mark.parametrize("mode", MODES)
def test_multistep_chain_matches_jax_grad(mode):
    """State fed back through T steps: gradients w.r.t. every action and the
    initial state equal jax.grad of the same unrolled loss."""
    T, B = 12, 5
    f = JaxFunction(_dynamics, mode=mode)
    g = torch.Generator().manual_seed(1)
    s0 = torch.randn(B, 4, dtype=torch.float64, generator=g, requires_grad=True)
    actions = torch.randn(T, B, 2, dtype=torch.float64, generator=g, requires_grad=True)
    with enable_x64():
        s, loss = s0, 0.0
        for t in range(T):
            s, r = f(s, actions[t])
            loss = loss + (r * (t + 1)).sum()
        loss = loss + (s**3).sum()
        loss.backward()

        def jax_loss(s0, actions):
            s, total = s0, 0.0
            for t in range(T):
                s, r = _dynamics(s, actions[t])
                total = total + (r * (t + 1)).sum()
            return total + (s**3).sum()

        gs0, gact = jax.jit(jax.grad(jax_loss, argnums=(0, 1)))(
            jnp.asarray(s0.detach().numpy()), jnp.asarray(actions.detach().numpy())
        )
        ref = float(jax.jit(jax_loss)(jnp.asarray(s0.detach().numpy()), jnp.asarray(actions.detach().numpy())))
    assert loss.item() == pytest.approx(ref, rel=1e-12)
    torch.testing.assert_close(s0.grad, torch.from_numpy(jax.device_get(gs0).copy()), rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(actions.grad, torch.from_numpy(jax.device_get(gact).copy()), rtol=1e-10, atol=1e-12)
    # one compilation for the whole chain, reused for every step
    if mode == "residuals":
        assert f.trace_counts == {"call": 0, "forward": 1, "backward": 1}
    else:
        assert f.trace_counts == {"call": 1, "forward": 0, "backward": 1}


@pytest.mark.parametrize("mode", MODES)
def test_second_backward_raises_and_retain_graph_works(mode):
    f = JaxFunction(_dynamics, mode=mode)
    s = torch.randn(3, 4, requires_grad=True)
    a = torch.randn(3, 2, requires_grad=True)
    loss = f(s, a)[1].sum()
    loss.backward(retain_graph=True)
    first = a.grad.clone()
    loss.backward()  # graph retained: works, gradients accumulate
    torch.testing.assert_close(a.grad, 2 * first)
    with pytest.raises(RuntimeError, match="Trying to backward through the graph a second time"):
        loss.backward()


def test_no_grad_path_uses_plain_jit():
    f = JaxFunction(_dynamics)
    s = torch.randn(3, 4, requires_grad=True)
    a = torch.randn(3, 2, requires_grad=True)
    with torch.no_grad():
        nxt, r = f(s, a)
    assert not nxt.requires_grad
    nxt2, r2 = f(s.detach(), a.detach())  # grad mode on, nothing requires grad
    assert not r2.requires_grad
    torch.testing.assert_close(r, r2)
    assert f.trace_counts == {"call": 1, "forward": 0, "backward": 0}
    nxt3, r3 = f(s, a)
    torch.testing.assert_close(r3.detach(), r)


def test_nonfinite_gradient_is_reported_not_zeroed():
    f = JaxFunction(lambda x: (jnp.sqrt(x).sum(-1),), name="sqrt")
    x = torch.rand(6, 3) + 0.5
    x[2, 1] = 0.0  # d sqrt / dx = inf at 0
    x[4, 0] = 0.0
    x.requires_grad_()
    with pytest.warns(NonFiniteGradientWarning, match=r"rows \[2, 4\]"):
        f(x)[0].sum().backward()
    assert torch.isinf(x.grad[2, 1]) and torch.isinf(x.grad[4, 0])
    assert torch.isfinite(x.grad[[0, 1, 3, 5]]).all()
    # finite gradients stay silent
    y = (torch.rand(6, 3) + 0.5).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonFiniteGradientWarning)
        f(y)[0].sum().backward()


def test_single_array_output_and_zero_dim():
    f = JaxFunction(lambda x, s: x * s)
    x = torch.randn(3, requires_grad=True)
    s = torch.tensor(2.0, requires_grad=True)
    (out,) = f(x, s)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.full((3,), 2.0))
    torch.testing.assert_close(s.grad, x.detach().sum())


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        pages = int(fh.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_memory_flat_over_many_differentiable_calls():
    """2000 forward+backward calls, no cache clearing: RSS must stay flat."""
    f = JaxFunction(_dynamics)
    s = torch.randn(256, 4)
    a = torch.randn(256, 2, requires_grad=True)

    def run(n):
        for _ in range(n):
            nxt, r = f(s, a)
            (r.sum() + nxt.sum()).backward()

    run(200)  # warm-up: compilation, allocator pools
    gc.collect()
    before = _rss_mb()
    run(2000)
    gc.collect()
    growth = _rss_mb() - before
    assert growth < 50, f"RSS grew by {growth:.1f} MB over 2000 differentiable calls"
    assert f.trace_counts["forward"] == 1 and f.trace_counts["backward"] == 1


def test_residuals_are_freed_with_the_graph():
    """The residuals live exactly as long as torch's saved tensors."""
    f = JaxFunction(_dynamics)
    s = torch.randn(3, 4, requires_grad=True)
    a = torch.randn(3, 2, requires_grad=True)
    nxt, r = f(s, a)
    node = r.grad_fn
    assert node.residuals() is not None
    r.sum().backward(retain_graph=True)
    assert node.residuals() is not None  # retained
    r.sum().backward()
    gc.collect()
    assert node.residuals() is None  # freed with the saved tensors
    assert nxt.grad_fn is node  # while the outputs (and the node) are still alive


def test_large_and_small_residuals():
    """Residuals above the packing threshold are passed through unpacked."""
    f = JaxFunction(lambda x, y: (jnp.sin(x) * jnp.cos(x) + jnp.exp(y).sum(),))
    x = torch.randn(64, 128, requires_grad=True)  # 32 KB residuals: not packed
    y = torch.randn(3, requires_grad=True)  # tiny residuals: packed
    (out,) = f(x, y)
    out.sum().backward()
    torch.testing.assert_close(x.grad, torch.cos(2 * x.detach()), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y.grad, torch.exp(y.detach()) * x.numel(), rtol=1e-5, atol=1e-3)
    small, large, _ = next(iter(f._plans.values())).res_layout
    assert small and large
