"""``waddle simulate``: roll out random actions on a batch of MicroDucks and report throughput."""

from __future__ import annotations

import argparse
import time

import torch
from tqdm import tqdm

from waddle.physics import BACKENDS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--num-envs", type=int, default=256, help="simulated robots (default: 256)")
    parser.add_argument("--steps", type=int, default=500, help="control steps at 50 Hz (default: 500)")
    parser.add_argument(
        "--backend", choices=sorted(BACKENDS), default=None, help="physics backend (default: best for the device)"
    )
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--action-noise", type=float, default=0.3, help="scale of the uniform random actions in [-1, 1] (default: 0.3)"
    )


def run(args: argparse.Namespace) -> int:
    from waddle.envs.microduck import MicroDuckEnv

    if args.num_envs < 1 or args.steps < 1:
        raise SystemExit("waddle simulate: --num-envs and --steps must be >= 1")
    env = MicroDuckEnv(num_envs=args.num_envs, backend=args.backend, device=args.device, seed=args.seed)
    print(f"MicroDuck model: {env.scene_path}")
    print(f"backend: {env.backend}, {args.num_envs} envs, {args.steps} control steps of {env.control_dt * 1000:.0f} ms")
    generator = torch.Generator(device=env.device).manual_seed(args.seed)
    td = env.reset()
    episode_return = torch.zeros(args.num_envs, device=env.device)
    returns, falls = [], 0
    start = time.perf_counter()
    with tqdm(total=args.steps, unit="step", desc="simulating") as bar:
        for _ in range(args.steps):
            action = args.action_noise * (
                2 * torch.rand(env.action_spec.shape, generator=generator, device=env.device) - 1
            )
            td["action"] = action
            td, td_next_root = env.step_and_maybe_reset(td)
            step = td["next"]
            episode_return += step["reward"].squeeze(-1)
            done = step["done"].squeeze(-1)
            if done.any():
                returns.extend(episode_return[done].tolist())
                episode_return[done] = 0
                falls += int(step["terminated"].sum())
            td = td_next_root
            bar.update(1)
            bar.set_postfix(env_steps_per_s=f"{args.num_envs * bar.n / (time.perf_counter() - start):,.0f}")
    elapsed = time.perf_counter() - start
    total = args.num_envs * args.steps
    print(
        f"{total:,} env steps in {elapsed:.2f} s: {total / elapsed:,.0f} env steps/s "
        f"({total * env.control_dt / elapsed:,.0f} x real time)"
    )
    print(
        f"episodes ended: {len(returns)} ({falls} falls); "
        f"mean return of ended episodes: {sum(returns) / max(len(returns), 1):.3f}"
    )
    env.close()
    return 0
