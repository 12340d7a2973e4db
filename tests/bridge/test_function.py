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


def _jax_node(tensor):
    """The JaxFunction autograd node behind an output (outputs are views of its buffers)."""
    stack = [tensor.grad_fn]
    while stack:
        node = stack.pop()
        if node is None:
            continue
        if type(node).__name__ == "_JaxAutogradFunctionBackward":
            return node
        stack.extend(fn for fn, _ in node.next_functions)
    raise AssertionError("no JaxFunction node in the graph")


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
    node = _jax_node(r)
    assert node.residuals() is not None
    r.sum().backward(retain_graph=True)
    assert node.residuals() is not None  # retained
    r.sum().backward()
    gc.collect()
    assert node.residuals() is None  # freed with the saved tensors
    assert _jax_node(nxt) is node  # while the outputs (and the node) are still alive


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


def _split_dynamics(pos, vel, action):
    """``_dynamics`` with the state as two arrays, and the reward last."""
    nxt, reward = _dynamics(jnp.concatenate([pos, vel], -1), action)
    return nxt[:, :2], nxt[:, 2:], reward


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("chunks", [None, 1, 2, 3])
def test_batch_chunks_and_fed_back_state_match_jax_grad(mode, chunks):
    """The state fed back through T steps, the batch run in row blocks:
    values and gradients equal jax.grad of the unrolled loss."""
    T, B = 6, 6
    f = JaxFunction(_split_dynamics, mode=mode, batch_chunks=chunks)
    g = torch.Generator().manual_seed(2)
    p0 = torch.randn(B, 2, dtype=torch.float64, generator=g, requires_grad=True)
    v0 = torch.randn(B, 2, dtype=torch.float64, generator=g, requires_grad=True)
    actions = torch.randn(T, B, 2, dtype=torch.float64, generator=g, requires_grad=True)
    with enable_x64():
        p, v, loss = p0, v0, 0.0
        for t in range(T):
            p, v, r = f(p, v, actions[t])
            loss = loss + (r * (t + 1)).sum()
        loss = loss + (p**3).sum() + (v**2).sum()
        loss.backward()

        def jax_loss(p, v, actions):
            total = 0.0
            for t in range(T):
                p, v, r = _split_dynamics(p, v, actions[t])
                total = total + (r * (t + 1)).sum()
            return total + (p**3).sum() + (v**2).sum()

        args = [jnp.asarray(x.detach().numpy()) for x in (p0, v0, actions)]
        ref = float(jax.jit(jax_loss)(*args))
        grads = jax.jit(jax.grad(jax_loss, argnums=(0, 1, 2)))(*args)
    assert loss.item() == pytest.approx(ref, rel=1e-12)
    for tensor, expected in zip((p0, v0, actions), grads):
        torch.testing.assert_close(
            tensor.grad, torch.from_numpy(jax.device_get(expected).copy()), rtol=1e-10, atol=1e-12
        )


def test_fed_back_outputs_link_the_nodes_directly():
    """Outputs passed back in as inputs, in order, are not re-concatenated:
    the second node's floating input is the first node's output buffer
    (joined only to the action), so backward does no per-tensor split."""
    f = JaxFunction(lambda pos, vel, action: _split_dynamics(pos, vel, action)[:2])
    pos = torch.randn(4, 2, requires_grad=True)
    vel = torch.randn(4, 2, requires_grad=True)
    p1, v1 = f(pos, vel, torch.zeros(4, 2))
    p2, v2 = f(p1, v1, torch.zeros(4, 2))
    first, second = _jax_node(p1), _jax_node(p2)
    ((cat, _),) = second.next_functions  # one floating buffer
    assert type(cat).__name__ == "CatBackward0"
    assert [fn for fn, _ in cat.next_functions][0] is first
    # swapped order: not the buffer's layout, so it is concatenated tensor by tensor
    v3, p3 = f(v1, p1, torch.zeros(4, 2))
    ((cat, _),) = _jax_node(v3).next_functions
    assert first not in [fn for fn, _ in cat.next_functions]
    (gp,) = torch.autograd.grad(v3.sum(), [pos])
    with torch.no_grad():
        ref = lambda x: f(*f(x, vel, torch.zeros(4, 2))[::-1], torch.zeros(4, 2))[0].sum()  # noqa: E731
        eps = 1e-2
        e = torch.zeros(4, 2)
        e[1, 0] = eps
        fd = (ref(pos + e) - ref(pos - e)) / (2 * eps)
    assert float(gp[1, 0]) == pytest.approx(float(fd), rel=1e-3)


def test_batch_chunks_bad_input():
    with pytest.raises(ValueError, match="batch_chunks must be None or a positive integer"):
        JaxFunction(_dynamics, batch_chunks=0)
    f = JaxFunction(_dynamics, batch_chunks=4)
    with pytest.raises(ValueError, match="batch_chunks=4 does not divide the batch size 6"):
        f(torch.randn(6, 4), torch.randn(6, 2))
    g = JaxFunction(_dynamics, batch_chunks=1)
    with pytest.raises(ValueError, match="same leading"):
        g(torch.randn(6, 4), torch.randn(5, 2))
    h = JaxFunction(lambda x: (x.sum(),), batch_chunks=1)
    with pytest.raises(ValueError, match="every output needs the batch"):
        h(torch.randn(6, 4))
