"""waddle.envs.brax: TorchRL API of the reference BraxEnv, differentiable steps.

One module-scoped ``reacher`` env is shared by the tests so that each JAX
program (reset, plain step, differentiable step) is compiled once. Compile time
on a 2-core CPU, ``positional`` pipeline (the quicker of ``positional`` and
``generalized`` to compile here), with the reduced XLA optimisation used below:
about 5 s for reset, 10-15 s for the plain step and 30-40 s for the
differentiable step, several times more when the machine is busy. The
persistent JAX compilation cache (``$WADDLE_JAX_CACHE``, default
``~/.cache/waddle/jax``; set it to ``0`` to disable) makes later runs much
faster.
"""

from __future__ import annotations

import sys

import pytest
import torch

pytest.importorskip("jax")
pytest.importorskip("brax")

from tensordict import TensorDict  # noqa: E402
from tensordict.nn import TensorDictModule  # noqa: E402
from torchrl.envs import ParallelEnv  # noqa: E402
from torchrl.envs.utils import check_env_specs, step_mdp  # noqa: E402

from waddle.envs.brax import BraxEnv, BraxWrapper  # noqa: E402

BACKEND = "positional"
BATCH = 3
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
pytestmark = pytest.mark.timeout(900)


def _reacher(**kwargs) -> BraxEnv:
    """The differentiable ``reacher`` of these tests, with the quick compile options."""
    return BraxEnv(
        "reacher",
        backend=BACKEND,
        batch_size=[BATCH],
        requires_grad=True,
        compiler_options=FAST_COMPILE,
        **kwargs,
    )


@pytest.fixture(scope="module")
def env():
    env = _reacher()
    yield env
    env.close()


def test_import_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "brax", None)
    monkeypatch.delitem(sys.modules, "waddle.envs.brax")
    with pytest.raises(ImportError, match=r"pip install 'waddle\[brax\]'"):
        import waddle.envs.brax  # noqa: F401


def test_available_envs():
    envs = BraxEnv.available_envs
    assert {"ant", "reacher", "halfcheetah"} <= set(envs)
    assert BraxWrapper.available_envs == envs


def test_from_pixels_not_implemented():
    with pytest.raises(NotImplementedError):
        BraxEnv("reacher", from_pixels=True)


def test_num_workers_returns_lazy_parallel_env():
    penv = BraxEnv("reacher", backend=BACKEND, batch_size=[2], num_workers=2)
    try:
        assert isinstance(penv, ParallelEnv)
        assert penv.num_workers == 2
        assert penv.is_closed  # workers not started
        assert penv.batch_size == torch.Size([2, 2])
        assert penv.action_spec.shape == torch.Size([2, 2, 2])
    finally:
        penv.close(raise_if_closed=False)


def test_specs_and_state_layout(env):
    check_env_specs(env)
    assert env.action_spec.shape == (BATCH, 2)
    assert env.observation_spec["observation"].shape == (BATCH, 11)
    td = env.reset()
    state = td["state"]
    assert isinstance(state, TensorDict)
    assert state["obs"].shape == (BATCH, 11)
    assert state["reward"].shape == (BATCH, 1) and state["done"].shape == (BATCH, 1)
    assert state["pipeline_state", "q"].shape == (BATCH, 4)
    assert torch.equal(td["observation"], state["obs"])


def test_rollout_shapes(env):
    env.set_seed(1)
    td = env.rollout(5)
    assert td.batch_size == (BATCH, 5)
    assert td["next", "observation"].shape == (BATCH, 5, 11)
    assert td["next", "reward"].shape == (BATCH, 5, 1)
    assert td["next", "done"].dtype == torch.bool
    assert td["action"].shape == (BATCH, 5, 2)
    assert not td["next", "observation"].requires_grad  # random actions: no graph
    assert torch.isfinite(td["next", "observation"]).all()


def test_partial_reset_keeps_other_envs(env):
    env.set_seed(2)
    td = env.reset()
    td["action"] = torch.ones(BATCH, 2) * 0.5
    td = step_mdp(env.step(td))
    q_before = td["state", "pipeline_state", "q"].clone()
    td["_reset"] = torch.tensor([[True], [False], [False]])
    out = env.reset(td)
    q_after = out["state", "pipeline_state", "q"]
    assert torch.equal(q_after[1:], q_before[1:])
    assert not torch.equal(q_after[0], q_before[0])


def test_set_seed_reproducible(env):
    actions = torch.rand(4, BATCH, 2) * 2 - 1

    def run(seed):
        env.set_seed(seed)
        td = env.reset()
        obs = [td["observation"]]
        for a in actions:
            td["action"] = a
            td = step_mdp(env.step(td))
            obs.append(td["observation"])
        return torch.stack(obs)

    a, b, c = run(3), run(3), run(4)
    assert torch.equal(a, b)
    assert not torch.equal(a[0], c[0])
    # as in TorchRL, set_seed returns the next seed and a None seed is refused
    assert isinstance(env.set_seed(3), int)
    with pytest.raises(Exception, match="integer seed"):
        env.set_seed(None)


def _loss(env, td0, actions):
    """A short-horizon loss: rewards plus the squared final observation."""
    td = td0.clone(False)
    total = 0.0
    for t, a in enumerate(actions):
        td["action"] = a
        td = env.step(td)
        total = total + td["next", "reward"].sum() * (1 + 0.1 * t)
        td = step_mdp(td)
    return total + 0.5 * td["observation"].pow(2).sum()


def test_rollout_gradient_matches_finite_differences(env):
    """Directional derivative of an H-step loss w.r.t. the action sequence:
    autograd through the differentiable steps (gradient through actions and
    state) vs central finite differences of the same loss computed without
    gradients, in float32.

    Tolerance: |autograd - fd| <= 2e-4 + 5e-3 |fd|. With step eps = 1e-2 the
    central difference has a truncation error ~eps^2 |L'''| / 6 ~ 1e-5 and a
    float32 rounding error ~u |L| / eps ~ 6e-8 * 2 / 1e-2 ~ 1e-5 per loss
    evaluation (|L| ~ 2), amplified somewhat over H steps: the absolute term
    leaves ~10x margin over the ~2e-5 differences observed (relative error
    7e-5 and 3e-4 for the two directions). The relative term covers float32
    differences between the plain step program (used for the finite
    differences) and the differentiated one.
    """
    H, eps = 5, 1e-2
    env.set_seed(0)
    td0 = env.reset()
    g = torch.Generator().manual_seed(0)
    actions = 0.3 * torch.randn(H, BATCH, 2, generator=g)
    directions = [torch.randn(H, BATCH, 2, generator=g) for _ in range(2)]

    a = actions.clone().requires_grad_()
    loss = _loss(env, td0, a)
    loss.backward()
    assert a.grad is not None and torch.isfinite(a.grad).all()
    assert a.grad[0].abs().sum() > 0  # the first action influences later steps through the state

    for v in directions:
        v = v / v.norm()
        with torch.no_grad():
            fd = (_loss(env, td0, actions + eps * v) - _loss(env, td0, actions - eps * v)) / (2 * eps)
        ad = (a.grad * v).sum()
        assert abs(ad - fd) <= 2e-4 + 5e-3 * abs(fd), (ad.item(), fd.item())


def test_policy_gradient_through_rollout(env):
    torch.manual_seed(0)
    policy = TensorDictModule(torch.nn.Linear(11, 2), in_keys=["observation"], out_keys=["action"])
    env.set_seed(0)
    td = env.rollout(4, policy)
    assert td["next", "observation"].requires_grad
    td["next", "reward"].mean().backward()
    grad = policy.module.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    # a second backward through the freed graph raises torch's usual error
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        td["next", "reward"].mean().backward()


def test_batch_chunks_give_the_same_rollout_and_gradients(env):
    """The batch run as one row block per env, each in its own thread: the
    loss and its gradient w.r.t. the actions equal the one-block env's."""
    chunked = _reacher(batch_chunks=BATCH)
    assert env._step_fn.batch_chunks == 1 and chunked._step_fn.batch_chunks == BATCH
    g = torch.Generator().manual_seed(1)
    actions = 0.3 * torch.randn(4, BATCH, 2, generator=g)
    results = []
    for e in (env, chunked):
        e.set_seed(0)
        td0 = e.reset()
        a = actions.clone().requires_grad_()
        loss = _loss(e, td0, a)
        loss.backward()
        results.append((loss.detach(), a.grad))
    torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-4, atol=1e-5)
    assert results[0][1].abs().sum() > 0
    chunked.close()


def test_batch_chunks_choice_and_bad_input():
    from waddle.bridge import auto_batch_chunks as _auto

    # one block per core, at least 8 envs per block, dividing the batch
    assert _auto(128, "cpu", cores=2) == 2
    assert _auto(16, "cpu", cores=2) == 2
    assert _auto(12, "cpu", cores=2) == 1  # 6 envs per block would be too few
    assert _auto(24, "cpu", cores=16) == 3
    assert _auto(40, "cpu", cores=4) == 4
    assert _auto(42, "cpu", cores=4) == 3  # 4 does not divide 42
    assert _auto(1, "cpu", cores=8) == 1
    assert _auto(128, "cuda", cores=2) == 1  # one program fills a GPU
    with pytest.raises(ValueError, match="BraxWrapper: batch_chunks must be 'auto' or a positive integer"):
        BraxEnv("reacher", backend=BACKEND, batch_size=[BATCH], batch_chunks=0)
    with pytest.raises(ValueError, match=r"batch_chunks=2 must divide the number of envs \(3\)"):
        _reacher(batch_chunks=2)
