"""Throughput of the physics backends on the MicroDuck model.

For each backend this builds ``--num-envs`` MicroDuck simulators (STAND
keyframe, ``--frame-skip`` substeps per control step), then times

* forward: ``step`` with random actions around STAND, reading qpos, site
  positions and contact flags every step (what an env does);
* forward+backward (differentiable backends only): ``--horizon`` steps with
  ``requires_grad=True``, a loss on qpos and site positions, ``backward()``
  and ``detach()`` (one truncated-BPTT window, as in APG/SHAC).

It prints env-steps per second (control steps x envs) and physics substeps
per second, plus the time of the first call (compilation for MJX). A backend
that fails (missing package, no GPU build of JAX, ...) is reported and skipped.

On a GPU machine::

    python benchmarks/gpu_backends.py --device cuda --num-envs 4096

Smoke check on a CPU::

    python benchmarks/gpu_backends.py --device cpu --num-envs 8 --steps 3

Notes: mujoco-torch 0.2.0 cannot simulate joint friction loss, which the
MicroDuck has, so it runs here with ``frictionloss="ignore"`` (slightly
different physics; fine for timing). It simulates in float64 whatever
``--dtype`` says.
"""

from __future__ import annotations

import argparse
import sys
import traceback

import mujoco
import torch
from harness import Column, Table, load_line, timed

from waddle.envs.microduck.constants import (
    EMBEDDED_SCENE,
    FOOT_GEOMS,
    FOOT_SITES,
    IMU_SITE,
    STAND_KEYFRAME,
)
from waddle.physics import BACKENDS, differentiable_backends, make_backend

RESULTS_TABLE = Table(
    [
        Column("backend", width=13, left=True),
        Column("mode", width=17, left=True),
        Column("env-steps/s", ".1f", 12),
        Column("substeps/s", ".1f", 14),
        Column("build s", ".1f"),
        Column("first call s", ".1f"),
        Column("finite grads", left=True),
    ]
)
"""A backend's rate in a mode, and the seconds it took to build and to make its first call (compilation)."""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-envs", type=int, default=4096)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backends", default="mujoco,mjx,mujoco-torch", help="comma-separated")
    p.add_argument("--steps", type=int, default=20, help="timed control steps (forward)")
    p.add_argument("--warmup", type=int, default=2, help="untimed control steps first")
    p.add_argument("--horizon", type=int, default=4, help="steps per backward window")
    p.add_argument("--windows", type=int, default=3, help="timed backward windows")
    p.add_argument("--frame-skip", type=int, default=10)
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.add_argument("--no-backward", action="store_true", help="skip forward+backward")
    p.add_argument(
        "--batch-chunks",
        nargs="+",
        type=lambda v: v if v == "auto" else int(v),
        default=["auto"],
        help="MJX forward+backward: row blocks run at once, one thread each ('auto': one per CPU "
        "core, 1 on a GPU); several values are timed one after the other in this run",
    )
    return p.parse_args(argv)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(name, args, requires_grad=False, batch_chunks="auto"):
    kwargs = {}
    if name == "mjx":
        kwargs["batch_chunks"] = batch_chunks
    if name == "mujoco-torch":
        kwargs["frictionloss"] = "ignore"
    if name == "mjx" and torch.device(args.device).type == "cpu":
        kwargs["compiler_options"] = {"xla_llvm_disable_expensive_passes": True}
    return make_backend(
        name,
        mujoco.MjSpec.from_file(str(EMBEDDED_SCENE)),
        num_envs=args.num_envs,
        frame_skip=args.frame_skip,
        site_names=(*FOOT_SITES, IMU_SITE),
        contact_geom_names=FOOT_GEOMS,
        device=args.device,
        dtype=getattr(torch, args.dtype),
        requires_grad=requires_grad,
        **kwargs,
    )


def stand_state(sim, gen):
    key = sim.model.key(STAND_KEYFRAME)
    dtype, device = sim.dtype, sim.device
    qpos = torch.as_tensor(key.qpos, dtype=dtype).repeat(sim.num_envs, 1)
    qpos[:, 7:] += 0.02 * torch.randn(sim.num_envs, sim.nq - 7, generator=gen, dtype=dtype)
    qvel = torch.zeros(sim.num_envs, sim.nv, dtype=dtype)
    ctrl = torch.as_tensor(key.ctrl, dtype=dtype, device=device)
    return qpos.to(device), qvel.to(device), ctrl


def actions(ctrl, sim, gen):
    noise = torch.randn(sim.num_envs, sim.nu, generator=gen, dtype=sim.dtype).to(sim.device)
    return ctrl + 0.2 * noise


def bench_forward(name, args):
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    with timed() as building:
        sim = build(name, args)
        qpos, qvel, ctrl = stand_state(sim, gen)
        sim.reset(qpos, qvel)

    with timed() as first_call:
        sim.step(actions(ctrl, sim, gen))
        sim.qpos.sum().item()
    for _ in range(max(args.warmup - 1, 0)):
        sim.step(actions(ctrl, sim, gen))
    sim.qpos.sum().item()

    acts = [actions(ctrl, sim, gen) for _ in range(args.steps)]
    sync(device)
    with timed() as timing:
        for a in acts:
            sim.step(a)
            obs = (sim.qpos, sim.site_positions(), sim.contacts())
        checksum = float(obs[0].sum()) + float(obs[1].sum()) + float(obs[2].sum())
        sync(device)
    sim.close()
    return {
        "build_s": building.wall_s,
        "first_step_s": first_call.wall_s,
        "env_steps_per_s": args.num_envs * args.steps / timing.wall_s,
        "checksum": checksum,
    }


def bench_backward(name, args, batch_chunks="auto"):
    device = torch.device(args.device)
    gen = torch.Generator().manual_seed(0)
    with timed() as building:
        sim = build(name, args, requires_grad=True, batch_chunks=batch_chunks)
        qpos, qvel, ctrl = stand_state(sim, gen)

    def window():
        sim.reset(qpos, qvel)
        acts = torch.stack([actions(ctrl, sim, gen) for _ in range(args.horizon)])
        acts.requires_grad_(True)
        loss = 0.0
        for a in acts:
            sim.step(a)
            loss = loss + sim.qpos[:, 7:].square().sum() + sim.site_positions()[..., 2].sum()
        loss.backward()
        sim.detach()
        return acts.grad

    with timed() as first_call:
        grad = window()
        grad.sum().item()

    sync(device)
    finite = True
    with timed() as timing:
        for _ in range(args.windows):
            grad = window()
            finite = finite and bool(torch.isfinite(grad).all())
        sync(device)
    sim.close()
    return {
        "build_s": building.wall_s,
        "first_step_s": first_call.wall_s,
        "env_steps_per_s": args.num_envs * args.horizon * args.windows / timing.wall_s,
        "finite_grads": finite,
    }


def main(argv=None) -> int:
    args = parse_args(argv)
    names = [n.strip() for n in args.backends.split(",") if n.strip()]
    for n in names:
        if n not in BACKENDS:
            raise SystemExit(f"unknown backend {n!r}; choose from {sorted(BACKENDS)}")
    print(
        f"MicroDuck, {args.num_envs} envs, frame_skip {args.frame_skip}, {args.dtype}, "
        f"device {args.device}, torch {torch.__version__}; {load_line()}",
        flush=True,
    )
    RESULTS_TABLE.print_header()
    rows = []
    for name in names:
        modes = [("forward", None)]
        if name in differentiable_backends() and not args.no_backward:
            chunk_values = args.batch_chunks if name == "mjx" else ["auto"]
            several = len(chunk_values) > 1
            modes += [(f"fwd+bwd chunks={c}" if several else "forward+backward", c) for c in chunk_values]
        for mode, chunks in modes:
            try:
                if chunks is None:
                    res = bench_forward(name, args)
                else:
                    res = bench_backward(name, args, batch_chunks=chunks)
            except Exception as err:  # report and go on with the next backend
                print(f"{name:13s} {mode:17s} FAILED: {type(err).__name__}: {err}", flush=True)
                traceback.print_exc(limit=3, file=sys.stderr)
                rows.append((name, mode, None))
                continue
            rate = res["env_steps_per_s"]
            finite = res.get("finite_grads", "")
            RESULTS_TABLE.print_row(
                name, mode, rate, rate * args.frame_skip, res["build_s"], res["first_step_s"], finite
            )
            rows.append((name, mode, rate))
    print(load_line("at the end"))
    return 0 if all(r[2] is not None for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
