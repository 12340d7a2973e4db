"""``waddle bench``: env steps per second of MicroDuckEnv across batch sizes."""

from __future__ import annotations

import argparse
import time

from waddle.physics import BACKENDS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 16, 256, 1024], help="batch sizes")
    parser.add_argument("--steps", type=int, default=50, help="control steps per measurement (default: 50)")
    parser.add_argument("--backend", choices=sorted(BACKENDS), default=None, help="physics backend")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")


def run(args: argparse.Namespace) -> int:
    from waddle.envs.microduck import MicroDuckEnv

    if min(args.sizes) < 1 or args.steps < 1:
        raise SystemExit("waddle bench: --sizes and --steps must be >= 1")
    print(f"{'envs':>6} {'env steps/s':>12}")
    for size in args.sizes:
        env = MicroDuckEnv(num_envs=size, backend=args.backend, device=args.device, seed=0)
        env.rollout(3, break_when_any_done=False)
        start = time.perf_counter()
        env.rollout(args.steps, break_when_any_done=False)
        print(f"{size:>6} {size * args.steps / (time.perf_counter() - start):>12,.0f}", flush=True)
        env.close()
    return 0
