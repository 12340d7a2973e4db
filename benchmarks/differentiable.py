"""Differentiable-simulation benchmark: forward+backward through Brax rollouts.

In one run, on the same machine, Brax task and torch policy:

* ``torchrl``: forward+backward env-steps per second of waddle's
  ``BraxEnv("ant", requires_grad=True)`` against TorchRL's
  ``torchrl.envs.libs.brax.BraxEnv("ant", requires_grad=True)`` at 16 and 128
  envs. Each iteration resets (seed 0), rolls out ``--horizon`` steps with the
  same MLP policy, takes ``loss = -sum_t mean(reward_t)`` and calls
  ``backward()``. TorchRL's automatic JAX cache clearing is turned off
  (``cache_clear_frequency=False``): with its default it would clear JAX's
  caches, and so recompile, every 20 steps.
* ``overhead``: waddle against a pure-JAX program computing the same loss and
  its gradient w.r.t. the same policy weights (``jax.lax.scan`` over the
  rollout inside one ``jax.jit(jax.value_and_grad(...))``): what the bridge
  (per-step dispatch, DLPack, torch autograd, TensorDict plumbing) costs.
* ``memory``: RSS growth over ~1000 differentiable env steps (rollouts with
  backward), cache clearing off.
* ``modes``: waddle's two VJP strategies, ``residuals`` (forward runs
  ``jax.vjp`` and keeps its residuals) and ``recompute`` (backward re-runs the
  forward), with the memory the autograd graph holds at the end of a rollout.

Compile time is excluded from the rates (the first iteration is reported
separately). Torch runs with one intra-op thread by default (``--threads``):
the policy is tiny, and on a small CPU torch's OpenMP pool competing with
XLA's threads made each ``nn.Linear`` call ~50x slower. JAX's persistent compilation cache is on by default
(``--jax-cache``) so that re-runs skip the minutes ``ant`` takes to compile on
CPU; it does not change run time.

Usage::

    python benchmarks/differentiable.py --quick
    python benchmarks/differentiable.py --sizes 16 128 --horizon 16 --iters 5

Adding a section: write ``def bench_<name>(args) -> list[dict]`` that prints
its own table (``harness.print_table``) and returns rows, and register it in
``SECTIONS``; ``main()`` runs the sections named by ``--sections`` in order.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import os
from collections.abc import Callable, Sequence

import torch
from harness import load_line, median, print_table, rss_mib, time_interleaved, timed
from torch import nn

# --------------------------------------------------------------------- helpers


def make_policy(obs_dim: int, act_dim: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Linear(obs_dim, 64),
        nn.Tanh(),
        nn.Linear(64, 64),
        nn.Tanh(),
        nn.Linear(64, act_dim),
        nn.Tanh(),
    )


def _td_policy(module: nn.Module):
    from tensordict.nn import TensorDictModule

    return TensorDictModule(module, in_keys=["observation"], out_keys=["action"])


def rollout_loss(env, policy, horizon: int, seed: int = 0) -> torch.Tensor:
    """``-sum_t mean(reward_t)`` over a rollout from a seeded reset (done flags ignored)."""
    from torchrl.envs.utils import step_mdp

    env.set_seed(seed)
    td = env.reset()
    loss = 0.0
    for _ in range(horizon):
        td = policy(td)
        td = env.step(td)
        loss = loss - td["next", "reward"].mean()
        td = step_mdp(td)
    return loss


def _fb_step(env, policy, horizon: int):
    """One forward+backward iteration on a torch env; returns the loss value."""

    def run():
        loss = rollout_loss(env, policy, horizon)
        loss.backward()
        policy.zero_grad(set_to_none=True)
        return float(loss.detach())

    return run


def make_waddle_env(args, n: int, **kwargs):
    from waddle.envs.brax import BraxEnv

    return BraxEnv(args.task, batch_size=[n], requires_grad=True, backend=args.backend, **kwargs)


def make_torchrl_env(args, n: int):
    import brax.envs
    from torchrl.envs.libs.brax import BraxEnv as TorchRLBraxEnv
    from torchrl.envs.libs.brax import BraxWrapper as TorchRLBraxWrapper

    if args.backend == "generalized":  # TorchRL's BraxEnv(name) takes no env kwargs
        return TorchRLBraxEnv(args.task, batch_size=[n], requires_grad=True, device="cpu", cache_clear_frequency=False)
    return TorchRLBraxWrapper(
        brax.envs.get_environment(args.task, backend=args.backend),
        batch_size=[n],
        requires_grad=True,
        device="cpu",
        cache_clear_frequency=False,
    )


# ---------------------------------------------------------------- sections

_RESULTS: dict[str, dict] = {}


def bench_torchrl(args) -> list[dict]:
    """waddle vs TorchRL forward+backward throughput (timed round by round)."""
    rows = []
    for n in args.sizes:
        env = make_waddle_env(args, n)
        obs_dim, act_dim = env.observation_spec["observation"].shape[-1], env.action_spec.shape[-1]
        base = make_policy(obs_dim, act_dim)
        pol_w = _td_policy(copy.deepcopy(base))
        contenders = [("waddle", env, pol_w)]
        error = None
        try:
            tenv = make_torchrl_env(args, n)
            contenders.append(("torchrl", tenv, _td_policy(copy.deepcopy(base))))
        except Exception as err:  # report why and keep going
            error = f"{type(err).__name__}: {err}"
        try:
            first, times = time_interleaved([_fb_step(e, p, args.horizon) for _, e, p in contenders], args.iters)
        except Exception as err:
            if len(contenders) == 1:
                raise
            # TorchRL failed while stepping: report it and time waddle alone
            error = f"{type(err).__name__}: {err}"
            contenders = contenders[:1]
            first, times = time_interleaved([_fb_step(env, pol_w, args.horizon)], args.iters)
        meds = [median(t) for t in times]
        w_rate = n * args.horizon / meds[0]
        _RESULTS[f"waddle_{n}"] = {"median_s": meds[0], "rate": w_rate, "times": times[0]}
        for (name, e, p), f, med, ts in zip(contenders, first, meds, times):
            rate = n * args.horizon / med
            row = {
                "impl": name,
                "envs": n,
                "first_iter_s": f,
                "iter_s": med,
                "min_iter_s": min(ts),
                "env_steps/s": rate,
                "loss": float(rollout_loss(e, p, args.horizon).detach()),
            }
            if name == "torchrl":
                row["waddle/torchrl"] = w_rate / rate
                _RESULTS[f"torchrl_{n}"] = {"median_s": med, "rate": rate, "ratio": w_rate / rate, "times": ts}
            rows.append(row)
        if error is not None:
            rows.append({"impl": "torchrl", "envs": n, "error": error[:300]})
            _RESULTS[f"torchrl_{n}"] = {"error": error[:1000]}
        del contenders, env
        gc.collect()
    print_table(
        f"forward+backward, {args.task} ({args.backend}), horizon {args.horizon}: waddle vs TorchRL",
        rows,
        ["impl", "envs", "first_iter_s", "iter_s", "min_iter_s", "env_steps/s", "waddle/torchrl", "loss", "error"],
    )
    return rows


def _step_programs_only(env, horizon: int) -> Callable[[], None]:
    """``horizon`` x (differentiable forward + backward) of waddle's compiled step
    programs, called directly on JAX arrays (row blocks run as waddle runs
    them): no torch autograd, no TensorDict, no DLPack per step.

    The gap between this and a waddle iteration is the bridge's own cost; the
    gap between this and the fused pure-JAX program is the cost of running the
    differentiated rollout as one program per step. Uses waddle internals
    (the JaxFunction's compiled plan), which is fine for a benchmark.
    """
    import jax
    import jax.numpy as jnp

    jf = env._step_fn
    plan = next(p for p in jf._plans.values() if p.bwd is not None)
    env.set_seed(0)
    td = env.reset()
    tensors = [*env._read_leaves(td["state"]), env.action_spec.zero().reshape(env._num, -1)]
    packs = [plan.pack(tensors, g) for g in plan.in_groups]
    blocks = list(
        zip(
            plan.to_blocks([packs[i] for i in plan.float_groups]),
            plan.to_blocks([packs[i] for i in plan.other_groups]),
        )
    )
    residual_mode = jf.mode == "residuals"
    fwd = plan.forward_program() if residual_mode else plan.call_program()
    fwd_args = blocks if residual_mode else [plan.merge(f, o) for f, o in blocks]
    first = plan.run_blocks(fwd, fwd_args)
    outs = [r[0] for r in first] if residual_mode else [[r[g] for g in plan.float_out] for r in first]
    cts = [tuple(jnp.ones_like(o) for o in out) for out in outs]

    def run():
        saved = []
        for _ in range(horizon):
            results = plan.run_blocks(fwd, fwd_args)
            saved.append([r[2] for r in results] if residual_mode else blocks)
        for held in reversed(saved):
            grads = plan.run_blocks(plan.backward_program(), list(zip(held, cts)))
        jax.block_until_ready(grads)

    return run


def bench_overhead(args) -> list[dict]:
    """waddle vs a pure-JAX jitted rollout-and-gradient of the same loss."""
    import brax.envs
    import jax
    import jax.numpy as jnp

    rows = []
    for n in args.sizes:
        benv = brax.envs.get_environment(args.task, backend=args.backend)
        vreset, vstep = jax.vmap(benv.reset), jax.vmap(benv.step)
        base = make_policy(benv.observation_size, benv.action_size)
        params = [
            (jnp.asarray(m.weight.detach().numpy().T), jnp.asarray(m.bias.detach().numpy()))
            for m in base
            if isinstance(m, nn.Linear)
        ]
        horizon = args.horizon

        def mlp(params, x):
            for w, b in params:
                x = jnp.tanh(x @ w + b)
            return x

        def loss_fn(params, key):
            state = vreset(jax.random.split(key, 1 + n)[1:])

            def body(state, _):
                state = vstep(state, mlp(params, state.obs))
                return state, -state.reward.mean()

            _, losses = jax.lax.scan(body, state, None, length=horizon)
            return losses.sum()

        value_and_grad = jax.jit(jax.value_and_grad(loss_fn))
        key = jax.random.PRNGKey(0)

        def run_jax():
            value, grads = value_and_grad(params, key)
            jax.block_until_ready(grads)
            return float(value)

        env = make_waddle_env(args, n)
        pol = _td_policy(copy.deepcopy(base))
        run_w = _fb_step(env, pol, horizon)
        run_w()  # compiles the step programs, so that they can be timed alone
        run_programs = _step_programs_only(env, horizon)
        first, (t_jax, t_w, t_p) = time_interleaved([run_jax, run_w, run_programs], args.iters)
        loss_j = run_jax()
        loss_w = float(rollout_loss(env, pol, horizon).detach())
        med, w_med, p_med = median(t_jax), median(t_w), median(t_p)
        ratio = w_med / med
        # per-round ratios: robust to load changes between rounds
        round_ratio = median([w / j for w, j in zip(t_w, t_jax)])
        bridge = median([w / p for w, p in zip(t_w, t_p)])
        _RESULTS[f"jax_{n}"] = {
            "median_s": med,
            "overhead": ratio - 1,
            "round_overhead": round_ratio - 1,
            "bridge_only_overhead": bridge - 1,
        }
        rows.append(
            {
                "envs": n,
                "pure_jax_first_s": first[0],
                "pure_jax_iter_s": med,
                "waddle_iter_s": w_med,
                "step_programs_s": p_med,
                "waddle/pure_jax": ratio,
                "overhead_%": 100 * (ratio - 1),
                "per_round_overhead_%": 100 * (round_ratio - 1),
                "waddle/step_programs": bridge,
                "pure_jax_loss": loss_j,
                "waddle_loss": loss_w,
            }
        )
        del env
        gc.collect()
    print_table(
        "bridge overhead: waddle vs pure-JAX jit(value_and_grad(scan rollout))",
        rows,
        [
            "envs",
            "pure_jax_first_s",
            "pure_jax_iter_s",
            "waddle_iter_s",
            "waddle/pure_jax",
            "overhead_%",
            "per_round_overhead_%",
            "step_programs_s",
            "waddle/step_programs",
            "pure_jax_loss",
            "waddle_loss",
        ],
    )
    return rows


def _memory_run(env, policy, horizon: int, steps: int) -> dict:
    run = _fb_step(env, policy, horizon)
    for _ in range(2):  # warm-up: compilation, allocator pools
        run()
    gc.collect()
    before = rss_mib()
    iters = math.ceil(steps / horizon)
    peak = before
    with timed() as timing:
        for _ in range(iters):
            run()
            peak = max(peak, rss_mib())
    gc.collect()
    after = rss_mib()
    return {
        "steps": iters * horizon,
        "rss_before_mib": before,
        "rss_after_mib": after,
        "growth_mib": after - before,
        "peak_minus_before_mib": peak - before,
        "seconds": timing.wall_s,
    }


def bench_memory(args) -> list[dict]:
    """RSS growth over ~1000 differentiable steps, cache clearing off."""
    n = args.memory_envs
    rows = []
    env = make_waddle_env(args, n)
    obs_dim, act_dim = env.observation_spec["observation"].shape[-1], env.action_spec.shape[-1]
    base = make_policy(obs_dim, act_dim)
    row = {
        "impl": "waddle",
        "envs": n,
        **_memory_run(env, _td_policy(copy.deepcopy(base)), args.horizon, args.memory_steps),
    }
    rows.append(row)
    _RESULTS["memory_waddle"] = row
    del env
    gc.collect()
    if args.memory_torchrl:
        try:
            tenv = make_torchrl_env(args, n)
            row = {
                "impl": "torchrl",
                "envs": n,
                **_memory_run(tenv, _td_policy(copy.deepcopy(base)), args.horizon, args.memory_steps),
            }
            _RESULTS["memory_torchrl"] = row
        except Exception as err:
            row = {"impl": "torchrl", "envs": n, "error": f"{type(err).__name__}: {err}"[:200]}
        rows.append(row)
    print_table(
        f"RSS over differentiable steps ({args.task}, horizon {args.horizon}, no cache clearing)",
        rows,
        [
            "impl",
            "envs",
            "steps",
            "rss_before_mib",
            "rss_after_mib",
            "growth_mib",
            "peak_minus_before_mib",
            "seconds",
            "error",
        ],
    )
    return rows


def _graph_mib(env, policy, horizon: int) -> float:
    """MiB saved for backward by the autograd graph of one rollout (all nodes,
    policy included), counted exactly with torch's saved-tensor hooks."""
    seen: dict[int, int] = {}

    def pack(t):
        try:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        except (RuntimeError, NotImplementedError):  # pragma: no cover
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = rollout_loss(env, policy, horizon)
    loss.backward()
    policy.zero_grad(set_to_none=True)
    return sum(seen.values()) / 2**20


def bench_modes(args) -> list[dict]:
    """waddle's VJP strategies: keep residuals vs recompute the forward in backward."""
    rows = []
    modes = ("residuals", "recompute")
    for n in args.mode_sizes:
        envs = [make_waddle_env(args, n, vjp_mode=mode) for mode in modes]
        obs_dim, act_dim = envs[0].observation_spec["observation"].shape[-1], envs[0].action_spec.shape[-1]
        base = make_policy(obs_dim, act_dim)
        pols = [_td_policy(copy.deepcopy(base)) for _ in modes]
        first, times = time_interleaved([_fb_step(e, p, args.horizon) for e, p in zip(envs, pols)], args.iters)
        for mode, env, pol, f, ts in zip(modes, envs, pols, first, times):
            med = median(ts)
            rows.append(
                {
                    "mode": mode,
                    "envs": n,
                    "first_iter_s": f,
                    "iter_s": med,
                    "min_iter_s": min(ts),
                    "env_steps/s": n * args.horizon / med,
                    "graph_mib_per_step": _graph_mib(env, pol, args.horizon) / args.horizon,
                }
            )
            _RESULTS[f"mode_{mode}_{n}"] = rows[-1]
        del envs, pols
        gc.collect()
    print_table(
        f"VJP strategy ({args.task}, horizon {args.horizon})",
        rows,
        ["mode", "envs", "first_iter_s", "iter_s", "min_iter_s", "env_steps/s", "graph_mib_per_step"],
    )
    return rows


SECTIONS: dict[str, Callable] = {
    "torchrl": bench_torchrl,
    "overhead": bench_overhead,
    "memory": bench_memory,
    "modes": bench_modes,
}


def summary(args) -> None:
    rows = []
    for n in args.sizes:
        t = _RESULTS.get(f"torchrl_{n}", {})
        if "ratio" in t:
            rows.append(
                {
                    "target": f"waddle/TorchRL fwd+bwd >= 2x ({n} envs)",
                    "value": f"{t['ratio']:.2f}x",
                    "ok": t["ratio"] >= 2,
                }
            )
        elif "error" in t:
            rows.append({"target": f"waddle/TorchRL fwd+bwd >= 2x ({n} envs)", "value": "TorchRL failed", "ok": "n/a"})
        j = _RESULTS.get(f"jax_{n}")
        if j:
            rows.append(
                {
                    "target": f"overhead vs pure-JAX <= 15% ({n} envs)",
                    "value": f"{100 * j['overhead']:.1f}%",
                    "ok": j["overhead"] <= 0.15,
                }
            )
            rows.append(
                {
                    "target": f"  of which bridge (vs its own step programs) ({n} envs)",
                    "value": f"{100 * j['bridge_only_overhead']:.1f}%",
                    "ok": "",
                }
            )
    m = _RESULTS.get("memory_waddle")
    if m:
        rows.append(
            {
                "target": f"RSS growth < 50 MiB over {m['steps']} steps",
                "value": f"{m['growth_mib']:.1f} MiB",
                "ok": m["growth_mib"] < 50,
            }
        )
    if rows:
        print_table("targets", rows, ["target", "value", "ok"])


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer iterations (compile time still dominates on CPU)")
    parser.add_argument("--task", default="ant")
    parser.add_argument(
        "--backend", default="generalized", help="Brax pipeline (TorchRL's BraxEnv(name) uses the default, generalized)"
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 128])
    parser.add_argument("--horizon", type=int, default=16)
    parser.add_argument("--iters", type=int, default=None, help="timed iterations after the first (default 5, quick 2)")
    parser.add_argument("--memory-steps", type=int, default=1000)
    parser.add_argument("--memory-envs", type=int, default=16)
    parser.add_argument(
        "--memory-torchrl",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="also measure TorchRL's RSS growth (default: off in --quick)",
    )
    parser.add_argument(
        "--mode-sizes", type=int, nargs="+", default=None, help="batch sizes for the modes section (default: 16)"
    )
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: the policy's ops are tiny, and torch's OpenMP "
        "pool spinning next to XLA's threads slows both down several times on a small CPU; "
        "0 keeps torch's default)",
    )
    parser.add_argument(
        "--jax-cache",
        default=os.path.expanduser("~/.cache/waddle/jax"),
        help="JAX persistent compilation cache dir ('' to disable)",
    )
    parser.add_argument("--json", default=None, help="also write all results to this JSON file")
    args = parser.parse_args(argv)
    if args.iters is None:
        args.iters = 2 if args.quick else 5
    if args.memory_torchrl is None:
        args.memory_torchrl = not args.quick
    if args.mode_sizes is None:
        args.mode_sizes = [16]
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    import jax

    if args.jax_cache:
        jax.config.update("jax_compilation_cache_dir", args.jax_cache)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.0)

    import brax
    import torchrl

    print(
        f"torch {torch.__version__}, torchrl {torchrl.__version__}, jax {jax.__version__}, brax {brax.__version__}; "
        f"torch threads {torch.get_num_threads()}, JAX devices {jax.devices()}; {load_line('at the start')}"
    )
    print(f"args: {vars(args)}")
    results = {}
    with timed() as total:
        for name in args.sections:
            with timed() as section:
                results[name] = SECTIONS[name](args)
            print(f"[{name}: {section.wall_s:.0f} s]", flush=True)
        summary(args)
    print(f"\ntotal {total.wall_s:.0f} s; {load_line('at the end')}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"args": vars(args), "sections": results, "results": _RESULTS}, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
