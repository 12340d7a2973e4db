"""How fast waddle learns MicroDuck: wall-clock minutes and env steps to a behaviour.

Four measurements, each from scratch, on the embedded model:

* ``standing`` - PPO, native backend: until the standing task holds a mean
  episode length of at least 450 of 500 steps (target: within 10 minutes on
  2 CPU cores);
* ``walk`` - ``waddle train --task walk`` with its defaults (PPO, 256 envs,
  the default step budget), for each of ``--seeds``: the minutes and env steps
  until the deterministic policy holds its 0.2 m/s command (forward speed of
  the envs that did not fall within 0.05 m/s, lateral speed within 0.05 of
  zero, at least 98 % survival), then,
  at the end of the budget, ``waddle eval``'s figures over 1000-step (20 s)
  episodes;
* ``speed-range`` - the same for ``--task speed-range``, per command 0.1, 0.2
  and 0.3 m/s (tolerance 0.03 m/s);
* ``shac`` - SHAC as ``waddle train --algo shac`` runs it (MJX, its envs,
  episode length and config): env steps and minutes until the deterministic
  policy's return on the native env reaches the one PPO's policy had when
  ``standing`` was reached, against PPO's (target: at least 10x fewer env
  steps), with SHAC's first-window (compilation) time and peak memory;
* ``jump`` - the reference's jump recipe (not run by default): a walking
  policy (``--walk-checkpoint``, or the ``walk`` part's run of the first
  ``--seeds``), then PPO from its weights (``waddle train --init-from``) on
  ``jump-mix``, a library of tracking, standing and jump with jump drawn three
  times as often, for up to ``--jump-steps`` (6M); the minutes and env steps
  until the jump row hops at least 2 cm, airborne at least 15 % of the time,
  then the per-task figures at the end (hop height, airborne fraction, hop
  frequency).

A criterion is checked on the deterministic policy (the mean action) over one
full episode in each of ``--eval-envs`` fresh envs, whenever the training
statistics suggest it may hold (and every ``--eval-every`` iterations for
walking). "Holds" means: mean episode length >= 450 for standing; for walking,
mean episode length >= 450 as well and the mean over episodes of each
episode's mean forward speed within 0.05 of 0.2. Wall-clock minutes count
training only; evaluation time is reported apart.

Usage::

    python benchmarks/learning.py                   # standing, walk, speed-range, shac
    python benchmarks/learning.py --parts walk --seeds 0 1 2 --json results.json
    python benchmarks/learning.py --parts shac --ppo-standing 56.85 262144  # reuse a standing figure
    python benchmarks/learning.py --parts jump --walk-checkpoint runs/walk/checkpoint.pt
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field

import torch
from harness import Column, Table, cores, load_line, peak_rss_mib, timed

from waddle.algorithms.checkpoint import save_checkpoint
from waddle.algorithms.evaluation import EvaluationResult, evaluate, task_commands
from waddle.algorithms.ppo import PPO
from waddle.algorithms.presets import ALGORITHMS, make_env
from waddle.algorithms.run_plan import Machine, RunPlan, SourceCheckpoint, resolve_run
from waddle.algorithms.runner import TrainConfig

MACHINE = Machine(cores=cores())
"""The machine ``waddle train``'s plan derives PPO's update threads from."""

STANDING_LENGTH = 450
"""Mean episode length (of 500) the standing criterion asks for."""


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


OUTCOME_TABLE = Table(
    [
        Column("part", width=10, left=True),
        Column("reached", width=8, left=True),
        Column("minutes", ".1f", 8),
        Column("env steps", ",", 12),
        Column("eval min", ".1f", 9),
        Column("details", left=True),
    ]
)
"""One row per measurement: whether and when its behaviour was reached."""


def format_outcome(o: Outcome) -> str:
    e = o.evaluation
    details = (
        f"return {e['mean_return']:.2f}, length {e['mean_episode_length']:.0f}, "
        f"forward speed {e['mean_forward_speed']:.3f} m/s, falls {100 * e['fall_rate']:.0f}%"
        if e
        else ""
    )
    return OUTCOME_TABLE.row(o.part, str(o.reached), o.minutes, o.env_steps, o.eval_minutes, f"{details} {o.note}")


def standing_holds(result: EvaluationResult) -> bool:
    return result.mean_episode_length >= STANDING_LENGTH


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
    steps_limit: int | None = None,
) -> tuple[Outcome, object]:
    """Iterate ``trainer`` until ``holds(evaluate(...))``, ``minutes_limit`` of training or ``steps_limit`` env steps."""
    train_s = eval_s = 0.0
    iteration = 0
    last_log = time.monotonic()
    evaluation = None
    while train_s < 60.0 * minutes_limit and (steps_limit is None or iteration * steps_per_iteration < steps_limit):
        with timed() as timing:
            metrics = trainer.train_iteration()
        train_s += timing.wall_s
        iteration += 1
        env_steps = iteration * steps_per_iteration
        if time.monotonic() - last_log >= log_every_s:
            last_log = time.monotonic()
            shown = {k.split("/")[-1]: round(v, 3) for k, v in metrics.items() if k.startswith("charts/episode")}
            print(f"  [{part}] {train_s / 60:5.1f} min  {env_steps:>10,} steps  {shown}", flush=True)
        if may_hold(metrics) or iteration % eval_every == 0:
            with timed() as timing:
                evaluation = evaluate(eval_env, trainer.deterministic_policy())
            eval_s += timing.wall_s
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
    if steps_limit is not None and iteration * steps_per_iteration >= steps_limit:
        note = f"not reached within {steps_limit:,} env steps"
    env_steps = iteration * steps_per_iteration
    outcome = Outcome(part, False, train_s / 60, env_steps, iteration, eval_s / 60, last, note)
    print(f"  [{part}] done: {format_outcome(outcome)}", flush=True)
    return outcome, trainer


def train_plan(task: str, args: argparse.Namespace, *, seed: int, **flags) -> RunPlan:
    """The plan of ``waddle train --task TASK`` for a new PPO run with the benchmark's flags and ``flags``."""
    given = {"task": task, "num_envs": args.num_envs, "seed": seed, "overlap_rollout": args.overlap_rollout}
    return resolve_run({**given, **flags}, machine=MACHINE)


def ppo_part(part: str, task: str, args: argparse.Namespace, holds) -> tuple[Outcome, PPO]:
    torch.manual_seed(args.seed)
    plan = train_plan(task, args, seed=args.seed)
    env = make_env(task, num_envs=plan.run.num_envs, seed=args.seed, **plan.training_env_options())
    eval_env = make_env(task, num_envs=args.eval_envs, seed=args.seed + 1000, **plan.policy_env_options)
    trainer = PPO(env, plan.algorithm, update_threads=plan.update_threads)

    def may_hold(metrics: dict) -> bool:
        length = metrics["charts/episode_length"]
        return math.isfinite(length) and length >= STANDING_LENGTH

    return train_until(
        part,
        trainer,
        eval_env,
        holds,
        steps_per_iteration=trainer.steps_per_iteration,
        minutes_limit=args.standing_minutes,
        may_hold=may_hold,
        eval_every=10**9,
    )


COMMAND_TOLERANCE = {"walk": 0.05, "speed-range": 0.03}
"""Allowed |forward speed - command|, m/s, per walking part (the issue's targets)."""
MIN_SURVIVAL = 0.98
"""Walking: fraction of evaluation episodes that must not fall."""


def holds_command(result: EvaluationResult, command: float, tolerance: float) -> bool:
    """Survival of at least :data:`MIN_SURVIVAL`, and the standing envs' mean forward speed within
    ``tolerance`` of ``command`` with their mean lateral speed within ``tolerance`` of zero (a
    diagonal gait does not track a forward command)."""
    return (
        result.survival >= MIN_SURVIVAL
        and abs(result.mean_forward_speed - command) <= tolerance
        and abs(result.mean_lateral_speed) <= tolerance
    )


@dataclass
class CommandOutcome:
    """One seed's figures for one command of a walking part."""

    part: str
    seed: int
    command: float
    reached: bool
    minutes: float
    env_steps: int
    final: dict = field(default_factory=dict)


WALK_TABLE = Table(
    [
        Column("part", width=12, left=True),
        Column("seed", width=4),
        Column("cmd", ".2f", 5),
        Column("reached"),
        Column("minutes", ".1f"),
        Column("env steps", ",", 10),
        Column("|"),
        Column("survival", ".1f"),
        Column("forward", ".3f"),
        Column("|err|", ".3f", 6),
        Column("lateral", ".3f"),
        Column("yaw", ".1f", 5),
        Column("p95", ".1f", 5),
        Column("clear cm", ".2f"),
        Column("steps/s", ".2f"),
        Column("bound %", ".1f"),
        Column("act chg", ".3f"),
    ]
)
"""One row per walking run and command: when it first held the command, then its final figures."""


def format_command_outcome(o: CommandOutcome) -> str:
    f = o.final
    reached = ("yes", o.minutes, o.env_steps) if o.reached else ("no", "", "")
    figures = (
        (
            100 * (1 - f["fall_rate"]),
            f["mean_forward_speed"],
            abs(f["mean_forward_speed"] - o.command),
            f["mean_lateral_speed"],
            f["yaw_drift_deg"],
            f["yaw_drift_p95_deg"],
            100 * f["foot_clearance"],
            f["step_frequency_hz"],
            100 * f["action_saturation"],
            f["action_change"],
        )
        if f
        else (None,) * 10  # no final evaluation
    )
    return WALK_TABLE.row(o.part, o.seed, o.command, *reached, "|", *figures)


def save_run(directory: str, plan: RunPlan, trainer: PPO, env_steps: int, iteration: int, train_s: float) -> str:
    """Write the trainer as ``directory/<task>-seed<N>.pt``, a checkpoint ``waddle eval`` reads."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{plan.run.task}-seed{plan.run.seed}.pt")
    save_checkpoint(
        path,
        algo=plan.algo,
        config=plan.config(),
        trainer_state=trainer.state_dict(),
        env_steps=env_steps,
        iteration=iteration,
        wall_time_s=train_s,
    )
    print(f"  wrote {path} (waddle eval {path} --video ...)", flush=True)
    return path


def walk_part(part: str, seed: int, args: argparse.Namespace) -> list[CommandOutcome]:
    """Train ``--task part`` with ``waddle train``'s defaults; time each command's first hold, then evaluate."""
    torch.manual_seed(seed)
    budget = {} if args.walk_steps is None else {"total_steps": args.walk_steps}
    plan = train_plan(part, args, seed=seed, action_scale=args.action_scale, **budget)
    env = make_env(part, num_envs=plan.run.num_envs, seed=seed, **plan.training_env_options())
    trainer = PPO(env, plan.algorithm, update_threads=plan.update_threads)
    commands = [command for command, _ in task_commands(env.tasks)]
    tolerance = COMMAND_TOLERANCE[part]
    check_env = make_env(part, num_envs=args.eval_envs, seed=seed + 1000, **plan.policy_env_options)

    def evaluate_all(eval_env, max_steps):
        policy = trainer.deterministic_policy()
        return {c: evaluate(eval_env, policy, command=(c, 0.0), max_steps=max_steps) for c in commands}

    first: dict[float, tuple[float, int]] = {}
    train_s, iteration, env_steps = 0.0, 0, 0
    while env_steps < plan.run.total_steps and train_s < 60.0 * args.walking_minutes:
        with timed() as timing:
            trainer.train_iteration()
        train_s += timing.wall_s
        iteration += 1
        env_steps = iteration * trainer.steps_per_iteration
        if iteration % args.eval_every == 0:
            results = evaluate_all(check_env, 500)
            shown = ", ".join(
                f"{c:.2f}: {r.mean_forward_speed:.3f} m/s {100 * r.survival:.0f}%" for c, r in results.items()
            )
            print(f"  [{part} seed {seed}] {train_s / 60:5.1f} min {env_steps:>10,} steps  {shown}", flush=True)
            for c, r in results.items():
                if c not in first and holds_command(r, c, tolerance):
                    first[c] = (train_s / 60.0, env_steps)
    if args.save:
        save_run(args.save, plan, trainer, env_steps, iteration, train_s)
    final_env = make_env(
        part, num_envs=args.eval_envs, seed=seed + 2000, max_episode_steps=1000, **plan.policy_env_options
    )
    finals = evaluate_all(final_env, 1000)
    outcomes = []
    for c in commands:
        minutes, steps = first.get(c, (train_s / 60.0, env_steps))
        outcomes.append(CommandOutcome(part, seed, c, c in first, minutes, steps, finals[c].as_dict()))
        print(f"  done: {format_command_outcome(outcomes[-1])}", flush=True)
    return outcomes


@dataclass
class ShacCost:
    """What SHAC's run cost besides env steps."""

    first_window_s: float
    """Wall-clock seconds of the first window: JAX compiles the differentiable step then."""
    window_s: float
    """Median wall-clock seconds of the later windows."""
    peak_rss_mib: float
    """Peak resident memory of this process, MiB (the PPO part before it included)."""


def shac_part(args: argparse.Namespace, target_return: float) -> tuple[Outcome, ShacCost | None]:
    """SHAC as ``waddle train --algo shac`` runs it (its run defaults and config), until its deterministic
    policy's return on the native env reaches ``target_return``."""
    from waddle.algorithms.shac import SHAC

    torch.manual_seed(args.seed)
    flags = {"algo": "shac", "task": "standing", "num_envs": args.shac_envs, "seed": args.seed}
    plan = resolve_run(flags, machine=MACHINE)
    try:
        env = make_env(
            "standing", num_envs=plan.run.num_envs, seed=args.seed, differentiable=True, **plan.training_env_options()
        )
    except (ImportError, ValueError) as err:
        note = f"MJX backend unavailable: {str(err).splitlines()[0]}"
        return Outcome("shac", False, 0.0, 0, 0, 0.0, note=note), None
    eval_env = make_env("standing", num_envs=args.eval_envs, seed=args.seed + 1000, **plan.policy_env_options)
    trainer = SHAC(env, plan.algorithm)
    window_times: list[float] = []
    train_iteration = trainer.train_iteration

    def timed_iteration() -> dict[str, float]:
        with timed() as timing:
            metrics = train_iteration()
        window_times.append(timing.wall_s)
        return metrics

    trainer.train_iteration = timed_iteration
    outcome, _ = train_until(
        "shac",
        trainer,
        eval_env,
        lambda result: result.mean_return >= target_return,
        steps_per_iteration=trainer.steps_per_iteration,
        minutes_limit=args.shac_minutes,
        may_hold=lambda metrics: False,
        eval_every=args.shac_eval_every,
        steps_limit=trainer.config.lr_decay_steps,  # past it the learning rates are zero
    )
    later = sorted(window_times[1:]) or [math.nan]
    cost = ShacCost(
        first_window_s=window_times[0] if window_times else math.nan,
        window_s=later[len(later) // 2],
        peak_rss_mib=peak_rss_mib(),
    )
    return outcome, cost


def print_shac_comparison(shac: Outcome, cost: ShacCost | None, ppo_steps: int, ppo_minutes: float | None) -> None:
    """SHAC against PPO to the same standing return: env steps, minutes, their ratios, and SHAC's cost."""
    print(
        f"SHAC ({shac.env_steps // max(shac.iterations, 1)} env steps a window) against PPO, to PPO's standing return:"
    )
    ppo_min = f"{ppo_minutes:.1f}" if ppo_minutes is not None else "-"
    shac_steps = f"{shac.env_steps:,}" if shac.reached else f"not reached in {shac.env_steps:,}"
    print(f"  env steps: PPO {ppo_steps:,}, SHAC {shac_steps}")
    print(f"  minutes:   PPO {ppo_min}, SHAC {shac.minutes:.1f}")
    if shac.reached:
        ratio = f"{ppo_steps / max(shac.env_steps, 1):.1f}x fewer env steps (target >= 10x)"
        if ppo_minutes is not None:
            ratio += f", {ppo_minutes / max(shac.minutes, 1e-9):.2f}x the wall-clock speed"
        print(f"  SHAC: {ratio}")
    if cost is not None:
        print(
            f"  SHAC's first window (compilation) {cost.first_window_s:.0f} s (target < 120), later windows "
            f"{cost.window_s:.1f} s; peak RSS {cost.peak_rss_mib:,.0f} MiB (target < 4 GB: 3,815 MiB)"
        )


HOP_HEIGHT_TARGET = 0.02
"""Jump: hop height, m, the reference reports (2 cm)."""
AIRBORNE_TARGET = 0.15
"""Jump: fraction of the time with both feet off the ground the reference reports."""
JUMP_STEPS = 6_000_000
"""Jump: the reference's budget, in env steps (transitions)."""
JUMP_MAX_EPISODE_STEPS = 1000
"""Jump: training horizon. The final evaluation runs 1000 steps, and at 500 the standing row of the
mix collapsed (0 % survival, mean length just past 500) while the jump row learned."""


@dataclass
class JumpOutcome:
    """The jump recipe's figures."""

    walk_checkpoint: str
    reached: bool
    minutes: float
    env_steps: int
    train_minutes: float
    train_env_steps: int
    load_average: float
    action_scale: float
    final: list = field(default_factory=list)
    note: str = ""


def add_jump_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--walk-checkpoint", metavar="PATH", help="jump: start from this walking policy")
    parser.add_argument("--jump-steps", type=int, default=JUMP_STEPS, help="jump: env steps after the walk")
    parser.add_argument("--jump-minutes", type=float, default=240.0, help="jump: stop after this much training")
    parser.add_argument(
        "--jump-max-episode-steps",
        type=int,
        default=JUMP_MAX_EPISODE_STEPS,
        help="jump: the training episodes' horizon (waddle train --max-episode-steps); the final evaluation "
        "runs 1000 steps",
    )


def jump_part(args: argparse.Namespace) -> JumpOutcome:
    """The reference's recipe: a walking policy, then PPO from its weights on ``jump-mix``."""
    import tempfile

    from waddle.algorithms.checkpoint import load_checkpoint
    from waddle.algorithms.evaluation import evaluate_tasks
    from waddle.algorithms.init_from import load_weights

    seed = args.seeds[0]
    path = args.walk_checkpoint
    if path is None:  # the walk part's run, trained now unless it was (with --save) in this invocation
        args.save = args.save or tempfile.mkdtemp(prefix="waddle-walk-")
        path = os.path.join(args.save, f"walk-seed{seed}.pt")
        if not os.path.exists(path):
            walk_part("walk", seed, args)
    source = load_checkpoint(path)
    torch.manual_seed(seed)
    flags = {
        "task": "jump-mix",
        "num_envs": args.num_envs,
        "seed": seed,
        "max_episode_steps": args.jump_max_episode_steps,
        "total_steps": args.jump_steps,
    }
    # The walking policy's networks, action scale and sensor history carry over, as with waddle train --init-from.
    plan = resolve_run(flags, init_from=SourceCheckpoint(path, source), machine=MACHINE)
    options = plan.policy_env_options
    env = make_env("jump-mix", num_envs=plan.run.num_envs, seed=seed, **plan.training_env_options())
    trainer = PPO(env, plan.algorithm, update_threads=plan.update_threads)
    print(f"  [jump] from {path}: {load_weights(trainer, 'ppo', source, path=path).summary()}", flush=True)
    check_env = make_env("jump-mix", num_envs=args.eval_envs, seed=seed + 1000, **options)
    jump_id = list(check_env.tasks.name).index("jump")

    reached, train_s, iteration, env_steps = None, 0.0, 0, 0
    while env_steps < plan.run.total_steps and train_s < 60.0 * args.jump_minutes:
        with timed() as timing:
            trainer.train_iteration()
        train_s += timing.wall_s
        iteration += 1
        env_steps = iteration * trainer.steps_per_iteration
        if iteration % args.eval_every == 0:
            r = evaluate(check_env, trainer.deterministic_policy(), task_id=jump_id, command=(0.0, 0.0), max_steps=500)
            print(
                f"  [jump] {train_s / 60:5.1f} min {env_steps:>10,} steps  hop {100 * r.hop_height:.2f} cm, "
                f"airborne {100 * r.airborne_fraction:.1f}%, {r.hop_frequency_hz:.2f} Hz, survival {100 * r.survival:.0f}%",
                flush=True,
            )
            if reached is None and r.hop_height >= HOP_HEIGHT_TARGET and r.airborne_fraction >= AIRBORNE_TARGET:
                reached = (train_s / 60.0, env_steps)
    if args.save:
        save_run(args.save, plan, trainer, env_steps, iteration, train_s)
    final_env = make_env("jump-mix", num_envs=args.eval_envs, seed=seed + 2000, max_episode_steps=1000, **options)
    final = [r.as_dict() for r in evaluate_tasks(final_env, trainer.deterministic_policy(), max_steps=1000)]
    for closing in (env, check_env, final_env):
        closing.close()
    minutes, steps = reached if reached is not None else (train_s / 60.0, env_steps)
    return JumpOutcome(
        path,
        reached is not None,
        minutes,
        steps,
        train_s / 60.0,
        env_steps,
        os.getloadavg()[0],
        plan.run.action_scale,
        final,
    )


def print_jump(o: JumpOutcome) -> None:
    target = f"hops of >= {100 * HOP_HEIGHT_TARGET:.0f} cm airborne >= {100 * AIRBORNE_TARGET:.0f}% of the time"
    when = f"after {o.minutes:.1f} min, {o.env_steps:,} env steps" if o.reached else "not reached"
    print(f"jump from {o.walk_checkpoint} (action scale {o.action_scale:g} rad per unit): {target}: {when}")
    print(
        f"trained {o.train_minutes:.1f} min, {o.train_env_steps:,} env steps (load average {o.load_average:.1f}); "
        "1000-step episodes at the end:"
    )
    table = Table(
        [
            Column("task", width=16, left=True),
            Column("survival", ".1f"),
            Column("return", ".2f", 8),
            Column("forward", ".3f", 8),
            Column("hop cm", ".2f"),
            Column("airborne", ".1f"),
            Column("hops/s", ".2f", 7),
        ]
    )
    table.print_header()
    for f in o.final:
        hops = (
            (100 * f["hop_height"], 100 * f["airborne_fraction"], f["hop_frequency_hz"])
            if f["hop_task"]
            else (None, None, None)
        )
        table.print_row(f["task"], 100 * (1 - f["fall_rate"]), f["mean_return"], f["mean_forward_speed"], *hops)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parts = ["standing", "walk", "speed-range", "shac"]
    parser.add_argument("--parts", nargs="+", choices=[*parts, "jump"], default=parts)
    parser.add_argument("--num-envs", type=int, default=256, help="PPO envs")
    parser.add_argument(
        "--shac-envs",
        type=int,
        default=ALGORITHMS["shac"].run_defaults["num_envs"],
        help="SHAC envs (MJX; default: waddle train --algo shac's)",
    )
    parser.add_argument("--shac-eval-every", type=int, default=5, help="SHAC: evaluate every N windows")
    parser.add_argument("--eval-envs", type=int, default=32, help="envs (one episode each) per evaluation")
    parser.add_argument("--eval-every", type=int, default=20, help="walking/SHAC: evaluate every N iterations")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="walk, speed-range: one run per seed")
    parser.add_argument(
        "--walk-steps", type=int, default=None, help="walk, speed-range: env steps per run (default: waddle train's)"
    )
    parser.add_argument("--standing-minutes", type=float, default=20.0, help="give up standing after this long")
    parser.add_argument(
        "--walking-minutes", type=float, default=60.0, help="stop a walking run after this much training"
    )
    parser.add_argument("--shac-minutes", type=float, default=60.0, help="give up SHAC after this much training")
    parser.add_argument(
        "--ppo-standing",
        nargs=2,
        type=float,
        metavar=("RETURN", "STEPS"),
        help="SHAC's target from an earlier standing measurement, instead of measuring it again",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="PATH", help="also write the figures here")
    parser.add_argument(
        "--save", metavar="DIR", help="walk, speed-range, jump: write each run's final policy to DIR/<task>-seed<N>.pt"
    )
    parser.add_argument(
        "--overlap-rollout",
        action="store_true",
        help="standing, walk, speed-range: PPO collects the next rollout during the update (one iteration of lag)",
    )
    parser.add_argument(
        "--action-scale",
        type=float,
        default=TrainConfig().action_scale,
        help="walk, speed-range: rad per unit of action (waddle train --action-scale); the jump part follows "
        "its walking policy's",
    )
    add_jump_arguments(parser)
    args = parser.parse_args()
    if not (math.isfinite(args.action_scale) and args.action_scale > 0):
        parser.error(f"--action-scale must be a finite number > 0 (rad per unit of action), got {args.action_scale}")
    if args.jump_max_episode_steps <= 0:
        parser.error(f"--jump-max-episode-steps must be a number of steps > 0, got {args.jump_max_episode_steps}")
    torch.set_num_threads(1)  # the physics has its own threads; one torch thread is fastest on 2 busy cores

    print(f"waddle learning benchmark: torch {torch.__version__}; {load_line()}", flush=True)
    outcomes: list[Outcome] = []
    target = None  # (PPO's standing return, its env steps, its minutes or None): what SHAC has to reach
    if args.ppo_standing is not None:
        target = (args.ppo_standing[0], int(args.ppo_standing[1]), None)
    if "standing" in args.parts or ("shac" in args.parts and target is None):
        standing, _ = ppo_part("standing", "standing", args, standing_holds)
        outcomes.append(standing)
        if standing.reached:
            target = (standing.evaluation["mean_return"], standing.env_steps, standing.minutes)
    walking: list[CommandOutcome] = []
    for part in ("walk", "speed-range"):
        if part in args.parts:
            for seed in args.seeds:
                walking.extend(walk_part(part, seed, args))
    jump = jump_part(args) if "jump" in args.parts else None
    shac = None
    if "shac" in args.parts:
        if target is not None:
            shac = shac_part(args, target[0])
            outcomes.append(shac[0])
        else:
            note = "PPO standing was not reached: no target return"
            outcomes.append(Outcome("shac", False, 0.0, 0, 0, 0.0, note=note))

    print(f"\n{load_line('at the end')} (figures scale with how busy the cores were)")
    if outcomes:
        print(OUTCOME_TABLE.header())
        for o in outcomes:
            print(format_outcome(o))
    if shac is not None:
        print_shac_comparison(*shac, ppo_steps=target[1], ppo_minutes=target[2])
    if walking:
        print(
            "walking: time to hold each command (forward speed of standing envs within tolerance of it, lateral "
            "within tolerance of 0, >= 98% survival),"
        )
        print("then the figures of 1000-step episodes at the end of the run (speeds, drift: envs that did not fall)")
        print(WALK_TABLE.header())
        for o in walking:
            print(format_command_outcome(o))
    if jump is not None:
        print_jump(jump)
    if args.json:
        with open(args.json, "w") as file:
            figures = {"outcomes": [asdict(o) for o in outcomes], "walking": [asdict(o) for o in walking]}
            if jump is not None:
                figures["jump"] = asdict(jump)
            json.dump(figures, file, indent=2)


if __name__ == "__main__":
    main()
