"""The differentiable MJX path against the plain one: trajectory gap and cost.

``MjxBackend(requires_grad=True)`` takes each substep's value from MJX's own
converged solve and its derivative from one Newton step at the solution
(:mod:`waddle.physics.mjx_implicit`). This script prints, in one run:

* ``gap``: the MicroDuck, float64, same start and same random actions, 20
  control steps (200 substeps): the largest ``|qpos|`` difference after 1, 10
  and 20 control steps to native MuJoCo C and to MJX's plain path
  (``requires_grad=False``), for the plain path and for ``requires_grad=True``,
  with the floor and without it (the robot
  falling freely: only the servos' friction loss and joint limits are
  constraints). With the floor, contacts make the dynamics chaotic, so even
  the plain path drifts from C by round-off growth; the gap to the plain path
  is the one the differentiable path adds;
* ``speed``: ``MicroDuckEnv(backend="mjx", requires_grad=True)``, float64
  (``--dtype float32``: both backends in float32, as SHAC trains):
  forward+backward control steps per second (a ``--horizon``-step rollout of a
  tanh-linear policy, loss = -mean reward, ``backward()``) at each of
  ``--sizes``, against native MuJoCo's forward steps at
  the same sizes; the first window's time (compilation included) and the
  process's peak RSS after it, MiB.

Usage::

    python benchmarks/mjx_solver.py
    python benchmarks/mjx_solver.py --sections speed --sizes 16 64 --horizon 16
    python benchmarks/mjx_solver.py --sections speed --sizes 16 64 --horizon 32 --dtype float32
"""

from __future__ import annotations

import argparse

import mujoco
import numpy as np
import torch
from harness import Column, Table, load_line, peak_rss_mib, timed

from waddle.envs.microduck import MicroDuckEnv
from waddle.envs.microduck.constants import EMBEDDED_SCENE, STAND_KEYFRAME
from waddle.physics import make_backend

FAST_COMPILE = {"xla_llvm_disable_expensive_passes": True}
FRAME_SKIP = 10
GAP_STEPS = (1, 10, 20)
"""Control steps after which ``gap`` reports the largest ``|qpos|`` difference."""
GAP_TABLE = Table(
    [
        Column("floor", width=5, left=True),
        Column("path", width=19, left=True),
        *(Column(f"vs {name} @{t}", ".1e", 9) for name in ("C", "plain") for t in GAP_STEPS),
    ]
)
"""Each path's largest ``|qpos|`` gap to MuJoCo C and to MJX's plain path, with and without the floor."""
SPEED_TABLE = Table(
    [
        Column("envs", width=4),
        Column("fwd+bwd steps/s", ".1f"),
        Column("native fwd steps/s", ".1f"),
        Column("ratio", ".4f", 6),
        Column("first window s", ".1f"),
        Column("peak RSS MiB", ",.0f"),
    ]
)
"""The differentiable MJX env's rate against native MuJoCo's forward rate, its compilation and its memory."""


def _model(floor: bool) -> mujoco.MjSpec:
    spec = mujoco.MjSpec.from_file(str(EMBEDDED_SCENE))
    if not floor:
        spec.delete(spec.geom("floor"))
    return spec


def _start_and_controls(model, num_envs: int, steps: int):
    key = model.key(STAND_KEYFRAME)
    gen = np.random.default_rng(0)
    qpos = np.tile(key.qpos, (num_envs, 1))
    qpos[:, 7:] += 0.05 * gen.standard_normal((num_envs, model.nq - 7))
    controls = key.ctrl + 0.2 * gen.standard_normal((steps, num_envs, model.nu))
    return qpos, controls


def _native_trajectory(model, qpos, controls) -> np.ndarray:
    out = np.empty((*controls.shape[:2], model.nq))
    for env in range(qpos.shape[0]):
        data = mujoco.MjData(model)
        data.qpos[:] = qpos[env]
        for t, ctrl in enumerate(controls[:, env]):
            data.ctrl[:] = ctrl
            mujoco.mj_step(model, data, nstep=FRAME_SKIP)
            out[t, env] = data.qpos
    return out


def _mjx_trajectory(spec, qpos, controls, **kwargs) -> np.ndarray:
    sim = make_backend(
        "mjx",
        spec,
        num_envs=qpos.shape[0],
        frame_skip=FRAME_SKIP,
        dtype=torch.float64,
        compiler_options=FAST_COMPILE,
        **kwargs,
    )
    sim.reset(torch.as_tensor(qpos), torch.zeros(qpos.shape[0], sim.nv, dtype=torch.float64))
    out = []
    with torch.no_grad():
        for ctrl in controls:
            sim.step(torch.as_tensor(ctrl))
            out.append(sim.qpos.detach().clone().numpy())
    sim.close()
    return np.stack(out)


def bench_gap(args) -> list[dict]:
    rows = []
    GAP_TABLE.print_header()
    for floor in (True, False):
        spec = _model(floor)
        model = spec.compile()
        qpos, controls = _start_and_controls(model, args.gap_envs, max(GAP_STEPS))
        native = _native_trajectory(model, qpos, controls)
        plain = _mjx_trajectory(spec, qpos, controls)
        runs = [
            ("requires_grad=False", plain),
            ("requires_grad=True", _mjx_trajectory(spec, qpos, controls, requires_grad=True)),
        ]
        for label, got in runs:
            row = {"floor": floor, "path": label}
            for name, reference in (("C", native), ("plain", plain)):
                gap = np.abs(got - reference).max(axis=(1, 2))
                row.update({f"vs {name} step {t}": float(gap[t - 1]) for t in GAP_STEPS})
            rows.append(row)
            gaps = [row[f"vs {name} step {t}"] for name in ("C", "plain") for t in GAP_STEPS]
            GAP_TABLE.print_row("yes" if floor else "no", label, *gaps)
    return rows


def _policy(obs_dim: int, act_dim: int, dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    layer = torch.nn.Linear(obs_dim, act_dim, dtype=dtype)
    torch.nn.init.normal_(layer.weight, std=0.05)
    torch.nn.init.zeros_(layer.bias)
    return torch.nn.Sequential(layer, torch.nn.Tanh())


def _window(env, policy, horizon: int) -> None:
    td = env.reset()
    rewards = []
    for _ in range(horizon):
        td["action"] = policy(td["observation"])
        td = env.step(td)
        rewards.append(td["next", "reward"])
        td = td["next"]
    loss = -torch.stack(rewards).mean()
    loss.backward()
    env.detach_state()  # the next window starts a new graph


def _native_rate(num_envs: int, steps: int, dtype: torch.dtype) -> float:
    env = MicroDuckEnv(num_envs=num_envs, backend="mujoco", seed=0, dtype=dtype)
    td = env.reset()
    action = torch.zeros(num_envs, 14, dtype=dtype)
    env.step(td.set("action", action))
    with timed() as timing:
        for _ in range(steps):
            td = env.step(td.set("action", action))["next"]
    env.close()
    return num_envs * steps / timing.wall_s


def bench_speed(args) -> list[dict]:
    rows = []
    dtype = getattr(torch, args.dtype)
    SPEED_TABLE.print_header()
    for num_envs in args.sizes:
        native = _native_rate(num_envs, 4 * args.horizon, dtype)
        env = MicroDuckEnv(
            num_envs=num_envs,
            backend="mjx",
            seed=0,
            dtype=dtype,
            requires_grad=True,
            compiler_options=FAST_COMPILE,
        )
        policy = _policy(env.observation_spec["observation"].shape[-1], 14, dtype)
        with timed() as first:
            _window(env, policy, args.horizon)
        rss_mib = peak_rss_mib()
        with timed() as timing:
            for _ in range(args.windows):
                _window(env, policy, args.horizon)
        rate = num_envs * args.horizon * args.windows / timing.wall_s
        env.close()
        row = {
            "envs": num_envs,
            "fwd+bwd steps/s": rate,
            "native fwd steps/s": native,
            "ratio": rate / native,
            "first window s": first.wall_s,
            "peak RSS MiB": rss_mib,
        }
        rows.append(row)
        SPEED_TABLE.print_row(*row.values())
    return rows


SECTIONS = {"gap": bench_gap, "speed": bench_speed}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", nargs="+", default=list(SECTIONS), choices=list(SECTIONS))
    parser.add_argument("--gap-envs", type=int, default=4)
    parser.add_argument("--sizes", nargs="+", type=int, default=[16, 64])
    parser.add_argument("--horizon", type=int, default=16)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument(
        "--dtype", choices=["float64", "float32"], default="float64", help="speed: precision of both backends"
    )
    args = parser.parse_args(argv)
    print(load_line("at the start"), flush=True)
    for name in args.sections:
        SECTIONS[name](args)
    print(load_line("at the end"), flush=True)


if __name__ == "__main__":
    main()
