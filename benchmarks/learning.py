"""How fast waddle learns MicroDuck: wall-clock minutes and env steps to a behaviour.

Three measurements, each from scratch, on the embedded model:

* ``standing`` - PPO, native backend: until the standing task holds a mean
  episode length of at least 450 of 500 steps (target: within 10 minutes on
  2 CPU cores);
* ``walking`` - PPO, native backend: until ``tracking_task(0.2)`` holds a mean
  forward body-frame speed within 0.05 m/s of 0.2 over full episodes
  (target: within 60 minutes);
* ``shac`` - SHAC, MJX backend: env steps until the standing return of the
  PPO policy from ``standing`` is reached (target: at least 10x fewer env
  steps than PPO took).

A criterion is checked on the deterministic policy (the mean action) over one
full episode in each of ``--eval-envs`` fresh envs, whenever the training
statistics suggest it may hold (and every ``--eval-every`` iterations for
walking). "Holds" means: mean episode length >= 450 for standing; for walking,
mean episode length >= 450 as well and the mean over episodes of each
episode's mean forward speed within 0.05 of 0.2. Wall-clock minutes count
training only; evaluation time is reported apart.

Usage::

    python benchmarks/learning.py                   # standing, walking, shac
    python benchmarks/learning.py --parts standing walking --json results.json
    python benchmarks/learning.py --parts shac --ppo-standing 56.85 262144  # reuse a standing figure
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field

import torch

from waddle.algorithms.evaluation import EvaluationResult, evaluate
from waddle.algorithms.ppo import PPO, PPOConfig
from waddle.algorithms.presets import WALK_SPEED, make_env

STANDING_LENGTH = 450
"""Mean episode length (of 500) the standing criterion asks for."""
SPEED_TOLERANCE = 0.05
"""Walking: allowed |mean forward speed - 0.2| in m/s."""


@dataclass
class Outcome:
    """One measurement's figures."""

    part: str
    reached: bool
    minutes: float
    env_steps: int
    iterations: int
    eval_minutes: float
    evaluation: dict = field(default_factory=dict)
    note: str = ""


HEADER = f"{'part':<10} {'reached':<8} {'minutes':>8} {'env steps':>12} {'eval min':>9}  details"


def format_outcome(o: Outcome) -> str:
    e = o.evaluation
    details = (
        f"return {e['mean_return']:.2f}, length {e['mean_episode_length']:.0f}, "
        f"forward speed {e['mean_forward_speed']:.3f} m/s, falls {100 * e['fall_rate']:.0f}%"
        if e else ""
    )
    figures = f"{o.part:<10} {str(o.reached):<8} {o.minutes:>8.1f} {o.env_steps:>12,} {o.eval_minutes:>9.1f}"
    return f"{figures}  {details} {o.note}"


def standing_holds(result: EvaluationResult) -> bool:
    return result.mean_episode_length >= STANDING_LENGTH


def walking_holds(result: EvaluationResult) -> bool:
    on_speed = abs(result.mean_forward_speed - WALK_SPEED) <= SPEED_TOLERANCE
    return result.mean_episode_length >= STANDING_LENGTH and on_speed


def train_until(
    part: str,
    trainer,
    eval_env,
    holds,
    *,
    steps_per_iteration: int,
    minutes_limit: float,
    may_hold,
    eval_every: int,
    log_every_s: float = 30.0,
) -> tuple[Outcome, object]:
    """Iterate ``trainer`` until ``holds(evaluate(...))`` or ``minutes_limit`` of training."""
    train_s = eval_s = 0.0
    iteration = 0
    last_log = time.monotonic()
    evaluation = None
    while train_s < 60.0 * minutes_limit:
        start = time.perf_counter()
        metrics = trainer.train_iteration()
        train_s += time.perf_counter() - start
        iteration += 1
        env_steps = iteration * steps_per_iteration
        if time.monotonic() - last_log >= log_every_s:
            last_log = time.monotonic()
            shown = {k.split("/")[-1]: round(v, 3) for k, v in metrics.items() if k.startswith("charts/episode")}
            print(f"  [{part}] {train_s / 60:5.1f} min  {env_steps:>10,} steps  {shown}", flush=True)
        if may_hold(metrics) or iteration % eval_every == 0:
            start = time.perf_counter()
            evaluation = evaluate(eval_env, trainer.deterministic_policy())
            eval_s += time.perf_counter() - start
            print(
                f"  [{part}] evaluation at {env_steps:,} steps: length {evaluation.mean_episode_length:.0f}, "
                f"forward speed {evaluation.mean_forward_speed:.3f} m/s, return {evaluation.mean_return:.2f}",
                flush=True,
            )
            if holds(evaluation):
                outcome = Outcome(part, True, train_s / 60, env_steps, iteration, eval_s / 60, evaluation.as_dict())
                print(f"  [{part}] done: {format_outcome(outcome)}", flush=True)
                return outcome, trainer
    last = evaluation.as_dict() if evaluation is not None else {}
    note = f"not reached within {minutes_limit} min of training"
    env_steps = iteration * steps_per_iteration
    outcome = Outcome(part, False, train_s / 60, env_steps, iteration, eval_s / 60, last, note)
    print(f"  [{part}] done: {format_outcome(outcome)}", flush=True)
    return outcome, trainer


def ppo_part(part: str, task: str, args: argparse.Namespace, holds) -> tuple[Outcome, PPO]:
    torch.manual_seed(args.seed)
    env = make_env(task, num_envs=args.num_envs, seed=args.seed)
    eval_env = make_env(task, num_envs=args.eval_envs, seed=args.seed + 1000)
    trainer = PPO(env, PPOConfig())

    def may_hold(metrics: dict) -> bool:
        length = metrics["charts/episode_length"]
        return math.isfinite(length) and length >= STANDING_LENGTH

    def never(metrics: dict) -> bool:
        return False

    # Walking: the training statistics say nothing about speed, and once the
    # robot stops falling "may hold" would evaluate after every iteration
    # (an evaluation costs about three iterations); check every eval_every.
    if part == "standing":
        limit, eval_every, trigger = args.standing_minutes, 10**9, may_hold
    else:
        limit, eval_every, trigger = args.walking_minutes, args.eval_every, never
    return train_until(
        part, trainer, eval_env, holds, steps_per_iteration=trainer.steps_per_iteration,
        minutes_limit=limit, may_hold=trigger, eval_every=eval_every,
    )


def shac_part(args: argparse.Namespace, target_return: float, ppo_steps: int) -> Outcome:
    from waddle.algorithms.shac import SHAC, SHACConfig

    torch.manual_seed(args.seed)
    try:
        env = make_env("standing", num_envs=args.shac_envs, seed=args.seed, backend="mjx", differentiable=True)
    except (ImportError, ValueError) as err:
        return Outcome("shac", False, 0.0, 0, 0, 0.0, note=f"MJX backend unavailable: {str(err).splitlines()[0]}")
    eval_env = make_env("standing", num_envs=args.eval_envs, seed=args.seed + 1000)
    config = SHACConfig()
    trainer = SHAC(env, config)
    outcome, _ = train_until(
        "shac", trainer, eval_env, lambda result: result.mean_return >= target_return,
        steps_per_iteration=trainer.steps_per_iteration, minutes_limit=args.shac_minutes,
        may_hold=lambda metrics: False, eval_every=args.eval_every,
    )
    if outcome.reached:
        outcome.note = f"{ppo_steps / max(outcome.env_steps, 1):.1f}x fewer env steps than PPO (target >= 10x)"
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parts = ["standing", "walking", "shac"]
    parser.add_argument("--parts", nargs="+", choices=parts, default=parts)
    parser.add_argument("--num-envs", type=int, default=256, help="PPO envs")
    parser.add_argument("--shac-envs", type=int, default=64, help="SHAC envs (MJX)")
    parser.add_argument("--eval-envs", type=int, default=32, help="envs (one episode each) per evaluation")
    parser.add_argument("--eval-every", type=int, default=10, help="walking/SHAC: also evaluate every N iterations")
    parser.add_argument("--standing-minutes", type=float, default=20.0, help="give up standing after this long")
    parser.add_argument("--walking-minutes", type=float, default=90.0, help="give up walking after this much training")
    parser.add_argument("--shac-minutes", type=float, default=60.0, help="give up SHAC after this much training")
    parser.add_argument(
        "--ppo-standing", nargs=2, type=float, metavar=("RETURN", "STEPS"),
        help="SHAC's target from an earlier standing measurement, instead of measuring it again",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="also write the figures here")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the physics has its own threads; one torch thread is fastest on 2 busy cores

    cores, load = len(os.sched_getaffinity(0)), os.getloadavg()[0]
    print(f"waddle learning benchmark: {cores} CPU cores (load average {load:.1f}), torch {torch.__version__}", flush=True)
    outcomes: list[Outcome] = []
    target = None  # (PPO's standing return, its env steps): what SHAC has to reach
    if args.ppo_standing is not None:
        target = (args.ppo_standing[0], int(args.ppo_standing[1]))
    if "standing" in args.parts or ("shac" in args.parts and target is None):
        standing, _ = ppo_part("standing", "standing", args, standing_holds)
        outcomes.append(standing)
        if standing.reached:
            target = (standing.evaluation["mean_return"], standing.env_steps)
    if "walking" in args.parts:
        outcomes.append(ppo_part("walking", "walk", args, walking_holds)[0])
    if "shac" in args.parts:
        if target is not None:
            outcomes.append(shac_part(args, *target))
        else:
            note = "PPO standing was not reached: no target return"
            outcomes.append(Outcome("shac", False, 0.0, 0, 0, 0.0, note=note))

    print(f"\nload average at the end: {os.getloadavg()[0]:.1f} (figures scale with how busy the cores were)")
    print(HEADER)
    for o in outcomes:
        print(format_outcome(o))
    if args.json:
        with open(args.json, "w") as file:
            json.dump([asdict(o) for o in outcomes], file, indent=2)


if __name__ == "__main__":
    main()
