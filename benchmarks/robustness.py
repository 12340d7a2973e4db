"""How robust waddle's walking policies are on a randomized MicroDuck, and what randomization costs.

In one run, on the embedded model:

1. trains two walking policies at 0.2 m/s with ``waddle train --task walk`` (its
   walking recipe: PPO, 256 envs, the gait prior), ``--steps`` env steps each
   (6M, the walk task's budget):

   * (a) ``--randomization none --actor-observation full``: today's setting;
   * (b) ``--randomization upstream --actor-observation sensors --action-scale
     0.8 --push-scale 1.5 --max-episode-steps 1000``: what the robot measures,
     under the microduck_rl ranges, delays and noise, with room to step out of
     a push, trained on pushes half again as hard as the evaluation's and on
     episodes as long as it;

2. evaluates both under the ``upstream`` randomization, ``--episodes`` (64)
   episodes of ``--max-steps`` (1000 = 20 s) each at the 0.2 m/s command, and
   prints survival, mean forward speed of the episodes that did not fall
   against the command, the 95th-percentile yaw drift and the training minutes;
3. exports (b) (ONNX and sidecar) and runs it in ``waddle sim2sim`` (MuJoCo
   from the two files alone, the nominal robot) over as many episodes, against
   ``waddle eval``'s survival of (b) under ``upstream`` (its default: the
   checkpoint's randomization) and under ``none`` (the robot sim2sim simulates);
4. measures the native env's throughput at 256 envs with randomization
   ``upstream`` against ``none`` (the two envs take turns, best of
   ``--throughput-repeats``), and prints the load average, since other
   processes on the machine slow every figure here.

The issue's targets: (b) trained for at most 60 minutes on a 2-core machine
survives >= 95 % of 20 s episodes under the upstream randomization with a mean
forward speed within 0.05 m/s of 0.2; sim2sim's survival within 5 points of
``waddle eval``'s; randomization costs at most 20 % of the throughput. The
reference elsewhere (a GPU, ~393M env steps): 0.231 m/s at 0.2, 98-100 %
survival, p95 yaw drift 36-43 degrees.

Usage::

    python benchmarks/robustness.py                        # the walk task's default budget per policy
    python benchmarks/robustness.py --steps 4096 --episodes 4 --max-steps 50 --throughput-steps 5   # smoke
    python benchmarks/robustness.py --run-a runs/a --run-b runs/b   # evaluate runs trained before (minutes
                                                                    # from their checkpoints)
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from harness import Column, Table, cell, cores, load_line, timed
from throughput import randomization_rates

from waddle.algorithms.checkpoint import load_checkpoint
from waddle.algorithms.evaluation import EvaluationResult, evaluate, policy_from_checkpoint
from waddle.algorithms.presets import WALK_SPEED, make_env
from waddle.algorithms.run_plan import Machine, RunPlan, resolve_run
from waddle.cli.main import main as waddle
from waddle.deploy.contract import read_sidecar
from waddle.deploy.sim2sim import OnnxPolicy, Sim2Sim, run_episodes

POLICIES = {
    "a": {
        "randomization": "none",
        "actor_observation": "full",
        "action_scale": 0.35,
        "push_scale": 1.0,
        "max_episode_steps": 500,
    },
    "b": {
        "randomization": "upstream",
        "actor_observation": "sensors",
        "action_scale": 0.8,
        "push_scale": 1.5,
        "max_episode_steps": 1000,
    },
}
"""Policy label -> its ``waddle train`` settings. (b) places its feet up to 0.8 rad of servo target from the
STAND pose and the gait prior, not 0.35: at 0.35 it sat at the action bound 73 % of the time and 28 % of its
episodes fell after a push. It trains on pushes 1.5 times as hard as upstream's: trained on upstream's own, its
falls came from the hardest of them (survival 87.5 % with pushes 1.25 times as hard, 99.2 % at 0.75) and 2 seeds
of 2 stayed near 95 %. It also trains on episodes as long as the evaluation's (1000 steps = 20 s): trained on
10 s episodes, a policy survived every episode to 10 s and fell in 11 % of them between 10 and 20 s, in states
it had never seen. ``docs/deploy.md`` has each measurement."""
WALK_STEPS = resolve_run({"task": "walk"}, machine=Machine(cores=len(os.sched_getaffinity(0)))).run.total_steps
"""``waddle train --task walk``'s step budget."""
SURVIVAL_TARGET = 0.95
SPEED_TOLERANCE = 0.05
SIM2SIM_TOLERANCE = 0.05
THROUGHPUT_COST_TARGET = 0.20
REFERENCE = "reference (GPU, ~393M env steps): 0.231 m/s at 0.2, survival 98-100 %, p95 yaw drift 36-43 deg"


@dataclass
class PolicyOutcome:
    """One policy's training and its evaluation under the upstream randomization."""

    label: str
    randomization: str
    actor_observation: str
    action_scale: float
    push_scale: float
    max_episode_steps: int
    run: str
    env_steps: int
    train_minutes: float
    survival: float
    forward_speed: float
    yaw_drift_p95_deg: float
    yaw_drift_deg: float
    episodes: int


def train(label: str, out: Path, steps: int, seed: int) -> float:
    """Train policy ``label`` into ``out`` with ``waddle train``; returns the minutes it took."""
    settings = POLICIES[label]
    argv = ["train", "--task", "walk", "--total-steps", str(steps), "--out", str(out), "--seed", str(seed)]
    argv += ["--randomization", settings["randomization"], "--actor-observation", settings["actor_observation"]]
    argv += ["--action-scale", str(settings["action_scale"]), "--push-scale", str(settings["push_scale"])]
    argv += ["--max-episode-steps", str(settings["max_episode_steps"])]
    argv += ["--video-frames", "0", "--no-progress"]
    print(f"training ({label}): waddle {' '.join(argv)}", flush=True)
    with timed() as timing:
        code = waddle(argv)
    if code != 0:
        raise SystemExit(f"waddle train for policy ({label}) exited with {code}")
    return timing.wall_s / 60.0


def trained_settings(checkpoint: dict) -> dict:
    """The :data:`POLICIES` settings a checkpoint was trained with (a run given by ``--run-a``/``--run-b`` may
    differ from its label's)."""
    plan = RunPlan.from_checkpoint(checkpoint)
    return {
        "randomization": plan.run.randomization,
        "actor_observation": plan.actor_observation,
        "action_scale": float(plan.run.action_scale),
        "push_scale": float(plan.run.push_scale),
        "max_episode_steps": int(plan.run.max_episode_steps),
    }


def recorded_minutes(run: Path) -> float:
    """Training minutes of a run trained before, as its checkpoint records them."""
    return float(load_checkpoint(run / "checkpoint.pt").get("wall_time_s", float("nan"))) / 60.0


def evaluate_run(run: Path, randomization: str, episodes: int, max_steps: int, seed: int) -> EvaluationResult:
    """``waddle eval``'s figures for the run's policy at the walking command, under ``randomization``."""
    checkpoint = load_checkpoint(run / "checkpoint.pt")
    env = make_env(
        "walk",
        num_envs=episodes,
        seed=seed,
        randomization=randomization,
        max_episode_steps=max_steps,
        **RunPlan.from_checkpoint(checkpoint).policy_env_options,
    )
    try:
        policy = policy_from_checkpoint(checkpoint, env)
        return evaluate(env, policy, command=(WALK_SPEED, 0.0), task_id=0, max_steps=max_steps)
    finally:
        env.close()


def sim2sim_survival(run: Path, folder: Path, episodes: int, max_steps: int, seed: int) -> tuple[float, float]:
    """Export the run's policy and run it in sim2sim: ``(survival, mean forward speed)``."""
    onnx_path = folder / "policy.onnx"
    if waddle(["export", str(run), "--onnx", str(onnx_path), "--samples", "64"]) != 0:
        raise SystemExit(f"waddle export of {run} failed")
    sidecar = read_sidecar(onnx_path.with_suffix(".json"))
    runner = Sim2Sim(sidecar)
    report = run_episodes(
        runner,
        OnnxPolicy(onnx_path, sidecar),
        episodes=episodes,
        max_steps=max_steps,
        command=(WALK_SPEED, 0.0),
        seed=seed,
    )
    return report.survival, report.mean_forward_speed


OUTCOME_TABLE = Table(
    [
        Column("policy", width=6, left=True),
        Column("random.", width=9, left=True),
        Column("actor", width=8, left=True),
        Column("scale", ".2f"),
        Column("push", ".2f", 5),
        Column("horizon"),
        Column("env steps", ",", 11),
        Column("train min", ".1f"),
        Column("survival %", ".1f"),
        Column("forward", ".3f", 8),
        Column("error", "+.3f", 7),
        Column("yaw deg", ".1f", 8),
        Column("p95 deg", ".1f"),
    ]
)
"""One row per policy: its training settings and minutes, and its figures under the upstream randomization
(``-`` where every episode fell)."""


def format_outcome(o: PolicyOutcome) -> str:
    return OUTCOME_TABLE.row(
        f"({o.label})",
        o.randomization,
        o.actor_observation,
        o.action_scale,
        o.push_scale,
        o.max_episode_steps,
        o.env_steps,
        o.train_minutes,
        100 * o.survival,
        o.forward_speed,
        o.forward_speed - WALK_SPEED,
        o.yaw_drift_deg,
        o.yaw_drift_p95_deg,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--steps",
        type=int,
        default=WALK_STEPS,
        help=f"env steps to train each policy (default {WALK_STEPS:,}, waddle train's walk budget)",
    )
    parser.add_argument("--episodes", type=int, default=64, help="evaluation episodes per policy (default 64)")
    parser.add_argument("--max-steps", type=int, default=1000, help="steps per evaluation episode (1000 = 20 s)")
    parser.add_argument("--seed", type=int, default=0, help="training seed of both policies")
    parser.add_argument("--eval-seed", type=int, default=12345, help="seed of the evaluation envs")
    parser.add_argument("--out", help="where the two runs go (default: a temporary directory)")
    parser.add_argument("--run-a", help="skip training (a): evaluate this run directory")
    parser.add_argument("--run-b", help="skip training (b): evaluate this run directory")
    parser.add_argument("--throughput-envs", type=int, default=256)
    parser.add_argument("--throughput-steps", type=int, default=100, help="control steps per throughput measurement")
    parser.add_argument("--throughput-repeats", type=int, default=3)
    parser.add_argument("--json", help="also write every figure to this file")
    args = parser.parse_args()
    for flag in ("steps", "episodes", "max_steps", "throughput_envs", "throughput_steps", "throughput_repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1, got {getattr(args, flag)}")
    if args.episodes < 64:
        print(f"note: {args.episodes} evaluation episodes; the issue's figures need at least 64")
    out = Path(args.out or tempfile.mkdtemp(prefix="waddle-robustness-"))
    print(f"{load_line('at the start')}; runs under {out}", flush=True)

    outcomes: list[PolicyOutcome] = []
    runs: dict[str, Path] = {}
    for label in POLICIES:
        given = getattr(args, f"run_{label}")
        run = Path(given) if given else out / f"walk-{label}"
        minutes = recorded_minutes(run) if given else train(label, run, args.steps, args.seed)
        runs[label] = run
        checkpoint = load_checkpoint(run / "checkpoint.pt")
        result = evaluate_run(run, "upstream", args.episodes, args.max_steps, args.eval_seed)
        outcomes.append(
            PolicyOutcome(
                label=label,
                run=str(run),
                env_steps=int(checkpoint["env_steps"]),
                train_minutes=minutes,
                survival=result.survival,
                forward_speed=result.mean_forward_speed,
                yaw_drift_p95_deg=result.yaw_drift_p95_deg,
                yaw_drift_deg=result.yaw_drift_deg,
                episodes=result.episodes,
                **trained_settings(checkpoint),
            )
        )
        print(f"evaluated ({label}); {load_line()}", flush=True)

    nominal = evaluate_run(runs["b"], "none", args.episodes, args.max_steps, args.eval_seed)
    sim_survival, sim_speed = sim2sim_survival(runs["b"], out / "export-b", args.episodes, args.max_steps, args.seed)
    torch.set_num_threads(1)  # the physics threads, not torch's, do the stepping
    rates = randomization_rates(args.throughput_envs, args.throughput_steps, cores(), args.throughput_repeats)
    cost = 1.0 - rates["upstream"] / rates["none"]

    episode_s = args.max_steps * 0.02
    print()
    print(
        f"walking at {WALK_SPEED} m/s, evaluated under randomization 'upstream': {args.episodes} episodes of "
        f"{episode_s:.0f} s; speeds and drift over the episodes that did not fall"
    )
    print(OUTCOME_TABLE.header())
    for outcome in outcomes:
        print(format_outcome(outcome))
    print(REFERENCE)
    b = outcomes[1]
    held = b.survival >= SURVIVAL_TARGET and abs(b.forward_speed - WALK_SPEED) <= SPEED_TOLERANCE
    within = b.train_minutes <= 60.0 if b.train_minutes == b.train_minutes else None
    print(
        f"target for (b): survival >= {100 * SURVIVAL_TARGET:.0f} % and |forward - {WALK_SPEED}| <= "
        f"{SPEED_TOLERANCE} m/s: {'met' if held else 'not met'}"
        + ("" if within is None else f"; trained in {'at most' if within else 'more than'} 60 minutes")
    )
    gap = sim_survival - b.survival
    print(
        f"sim2sim of (b)'s ONNX and sidecar (nominal robot, {args.episodes} episodes): survival "
        f"{100 * sim_survival:.1f} %, forward {cell(sim_speed, '.3f')} m/s; waddle eval: {100 * b.survival:.1f} % under "
        f"'upstream' ({100 * gap:+.1f} points, target within {100 * SIM2SIM_TOLERANCE:.0f}), "
        f"{100 * nominal.survival:.1f} % under 'none' ({100 * (sim_survival - nominal.survival):+.1f} points)"
    )
    print(
        f"native env throughput at {args.throughput_envs} envs (best of {args.throughput_repeats} x "
        f"{args.throughput_steps} steps): none {rates['none']:,.0f} steps/s, upstream {rates['upstream']:,.0f} "
        f"steps/s, cost {100 * cost:.1f} % (target <= {100 * THROUGHPUT_COST_TARGET:.0f} %)"
    )
    print(load_line("at the end"))
    if args.json:
        figures = {
            "policies": [asdict(o) for o in outcomes],
            "sim2sim": {"survival": sim_survival, "forward_speed": sim_speed},
            "eval_b_none": {"survival": nominal.survival, "forward_speed": nominal.mean_forward_speed},
            "throughput": {**rates, "cost": cost, "num_envs": args.throughput_envs},
            "load_average": os.getloadavg(),
        }
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
        print(f"figures: {args.json}")


if __name__ == "__main__":
    main()
