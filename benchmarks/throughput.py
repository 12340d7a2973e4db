"""Env steps per second of waddle's native backend, side by side with its limits.

In one run, on the same embedded MicroDuck model and machine:

* waddle ``MicroDuckEnv`` (native backend, random actions, stepped as a collector
  steps it: the actor, then ``step_and_maybe_reset``) at several batch sizes;
* the bare backend: ``env.physics.step`` in a Python loop, without the task
  (observation, reward terms, contact bookkeeping, TorchRL plumbing), so the
  ratio env / bare is what the task machinery costs;
* the MuJoCo C limit of each measurement: the transitions it simulated (every
  state and control its backend stepped) simulated again by ``mujoco.rollout``
  on the same threads, one call per control step, nothing else in between
  (``TransitionRecorder``). Fallen robots cost the simulator more than standing
  ones, so a limit measured on other trajectories would not be comparable. The
  env and the bare backend are timed in rounds, each replayed right after it
  (``paired_rate``), so that load from elsewhere meets both alike;
* TorchRL's own ``torchrl.envs.MicroDuckEnv(scene, backend="mujoco")`` on the
  same scene file;
* PPO end to end (``waddle train --task walk``'s trainer and env, rollout and
  update, its default settings), plain and with ``--overlap-rollout``, each
  against the C limit of its own transitions;
* PPO's CPU budget: the CPU seconds (every thread) per env step of its rollout,
  of its update and of the C limit, and the ceiling they put on PPO / C: with
  every core busy all the time, however the rollout and update are
  overlapped, an env step cannot take less than their CPU seconds over the
  cores;
* what task conditioning costs PPO (``task_conditioning_cost``);
* the cost of domain randomization: the native env at 256 envs with
  ``randomization="upstream"`` (per-env models, encoder bias, IMU tilt, pushes,
  delays, noise) against ``"none"``, measured alternately in the same process.

The env and the bare backend are driven by the same kind of controls: uniform
random actions at 0.3 of the action range around the standing pose.

Usage: ``python benchmarks/throughput.py [--sizes 64 256 1024] [--steps 20]
[--ppo-iterations 3]``; ``--randomization-only`` runs the randomization
comparison alone.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

import mujoco
import numpy as np
import torch
from harness import Column, Table, cores, load_line, timed
from mujoco import rollout

from waddle.algorithms.checkpoint import load_checkpoint
from waddle.algorithms.ppo import PPO, PPOConfig, default_update_threads, torch_threads
from waddle.algorithms.presets import make_env
from waddle.envs.microduck import MicroDuckEnv

ROUNDS = 10
"""The env and the bare backend are each timed in this many rounds of ``--steps`` control steps, every
round followed at once by the C limit of the transitions it simulated, so that load which comes and
goes on a shared machine meets both alike (ratios of runs taken a minute apart swung by 10 %)."""
ACTION_FRACTION = 0.3
"""Random actions of every env measurement span this fraction of the action range."""


ENV_TABLE = Table(
    [
        Column("envs", width=6),
        Column("waddle env", ",.0f", 11),
        Column("C limit", ",.0f", 9),
        Column("env / C", width=19),
        Column("bare backend", ",.0f", 13),
        Column("C limit", ",.0f", 9),
        Column("bare / C", width=19),
    ]
)
"""The env and the bare backend at each size, beside the C limits of their transitions."""
PPO_TABLE = Table(
    [
        Column("envs", width=6),
        Column("PPO", ",.0f", 9),
        Column("C limit", ",.0f", 9),
        Column("PPO / C", ".2f", 8),
        Column("update share", ".2f", 13),
        Column("overlap", ",.0f", 9),
        Column("C limit", ",.0f", 9),
        Column("overlap / C", ".2f", 12),
    ]
)
"""PPO end to end, plain and overlapped, beside the C limits of their transitions."""
BUDGET_TABLE = Table(
    [
        Column("envs", width=6),
        Column("rollout", ".3f", 8),
        Column("update", ".3f", 7),
        Column("C limit", ".3f", 8),
        Column("cores", width=6),
        Column("ceiling", ".2f", 8),
        Column("PPO / C", ".2f", 8),
    ]
)
"""PPO's CPU seconds per 1,000 env steps and the ceiling they put on PPO / C."""


def random_policy(num_envs: int, seed: int = 0):
    """A TorchRL policy of uniform actions in ``[-ACTION_FRACTION, ACTION_FRACTION]``."""
    generator = torch.Generator().manual_seed(seed)

    def policy(td):
        noise = 2 * torch.rand(num_envs, MicroDuckEnv.NUM_JOINTS, generator=generator) - 1
        return td.set("action", ACTION_FRACTION * noise)

    return policy


class TransitionRecorder:
    """Records the physics transitions an env's native backend takes, to time them again in C alone.

    A robot lying on the floor costs the simulator more than a standing one, so
    the C limit of a measurement is taken on its own transitions: every
    (state, control) pair the backend stepped, simulated again by
    ``mujoco.rollout`` (``frame_skip`` substeps each) on the same threads, one
    call per control step of the batch it was stepped in, into output arrays
    allocated once. Replayed in one call, the outputs of every step at once
    (hundreds of MB) went through memory rather than cache, and the bare
    backend then ran at up to 1.13 of that "limit".
    """

    def __init__(self, env: MicroDuckEnv) -> None:
        self.physics = env.physics
        self.states: list[np.ndarray] = []
        self.controls: list[np.ndarray] = []
        self.recording = False
        self._step = env.physics.step
        env.physics.step = self._record  # the instance attribute shadows the method

    def _record(self, ctrl: torch.Tensor) -> None:
        if self.recording:
            self.states.append(self.physics._state.copy())
            self.controls.append(ctrl.detach().cpu().numpy().astype(np.float64))
        self._step(ctrl)

    def clear(self) -> None:
        """Forget the transitions recorded so far."""
        self.states.clear()
        self.controls.clear()

    @property
    def env_steps(self) -> int:
        """Env steps recorded since the last ``clear``."""
        return sum(len(state) for state in self.states)

    def replay(self, pool: rollout.Rollout, datas: list[mujoco.MjData]) -> tuple[float, float]:
        """Simulate the recorded transitions in C: wall and CPU seconds (every thread of this process)."""
        model, frame_skip = self.physics.model, self.physics.frame_skip
        num_envs = len(self.states[0])
        models = [model] * num_envs
        control = np.empty((num_envs, frame_skip, model.nu))
        state = np.zeros((num_envs, frame_skip, len(self.states[0][0])))
        sensordata = np.zeros((num_envs, frame_skip, model.nsensordata))
        with timed() as timing:
            for initial, ctrl in zip(self.states, self.controls, strict=True):
                control[:] = ctrl[:, None, :]
                pool.rollout(
                    models,
                    datas,
                    initial,
                    control,
                    skip_checks=True,
                    nstep=frame_skip,
                    state=state,
                    sensordata=sensordata,
                )
        return timing.wall_s, timing.cpu_s


@dataclass(frozen=True)
class PairedRate:
    """A measurement taken in rounds, each beside the C limit of its own transitions (``ROUNDS``)."""

    seconds: float
    """Wall seconds of the rounds together."""
    rate: float
    """Env steps per second over every round."""
    limit: float
    """The C limit over every round's replay, env steps per second."""
    limit_cpu_s: float
    """CPU seconds (every thread of this process) per env step of the replays."""
    ratios: tuple[float, ...]
    """Each round's rate over the C limit of the transitions it simulated."""

    @property
    def ratio(self) -> float:
        """Rate over C limit, every round together."""
        return self.rate / self.limit


def paired_rate(run_round, recorder: TransitionRecorder, threads: int, rounds: int = ROUNDS) -> PairedRate:
    """Time ``run_round()`` ``rounds`` times, each round followed by the C limit of its transitions."""
    pool = rollout.Rollout(nthread=threads)
    datas = [mujoco.MjData(recorder.physics.model) for _ in range(threads)]
    times, limits, cpu, steps = [], [], 0.0, 0
    for _ in range(rounds):
        recorder.clear()
        recorder.recording = True
        with timed() as timing:
            run_round()
        times.append(timing.wall_s)
        recorder.recording = False
        wall, replay_cpu = recorder.replay(pool, datas)
        limits.append(wall)
        cpu += replay_cpu
        steps += recorder.env_steps
    pool.close()
    ratios = tuple(c / t for t, c in zip(times, limits, strict=True))
    return PairedRate(sum(times), steps / sum(times), steps / sum(limits), cpu / steps, ratios)


def waddle_rate(num_envs: int, steps: int, threads: int) -> PairedRate:
    """The env's steps per second under random actions, stepped as a collector steps it (actor, then
    ``step_and_maybe_reset``), beside the C limit of the same transitions."""
    env = MicroDuckEnv(num_envs=num_envs, seed=0, num_threads=threads)
    recorder = TransitionRecorder(env)
    policy = random_policy(num_envs)
    carried = env.reset()

    def run_round(count: int = steps) -> None:
        nonlocal carried
        for _ in range(count):
            _, carried = env.step_and_maybe_reset(policy(carried))

    run_round(5)  # warm-up
    measured = paired_rate(run_round, recorder, threads)
    env.close()
    return measured


@dataclass(frozen=True)
class PPOThroughput:
    """One PPO timing: its rate, the C limit of its transitions, and where the seconds went."""

    rate: float
    """Env steps per second, rollout and update."""
    limit: float
    """The C limit of the same transitions, env steps per second."""
    update_share: float
    """The update's share of the wall time."""
    rollout_cpu_s: float
    """CPU seconds (every thread of the process) per 1,000 env steps spent collecting: physics, env, actor."""
    update_cpu_s: float
    """CPU seconds per 1,000 env steps spent updating the networks."""
    limit_cpu_s: float
    """CPU seconds per 1,000 env steps of the C limit."""
    cores: int
    """CPU cores the process may use."""

    @property
    def ceiling(self) -> float:
        """The highest PPO / C limit any schedule could reach on these cores at these CPU costs.

        The best the cores can do is to be busy all the time: then an env step
        takes ``(rollout + update CPU) / cores`` seconds, however the rollout
        and the update are interleaved or overlapped, against ``1 / limit``
        for the C limit.
        """
        return (1e3 / self.limit) / ((self.rollout_cpu_s + self.update_cpu_s) / self.cores)


def ppo_rate(
    num_envs: int, iterations: int, threads: int, overlap: bool = False, start_from: str | None = None
) -> PPOThroughput:
    """PPO's env steps per second over ``iterations`` iterations after one warm-up, the C limit of
    the transitions it simulated (each iteration's replayed right after it), the update's share of the
    time and the CPU seconds of each part.

    With ``overlap`` the rollout runs during the update (``--overlap-rollout``); the share is then the
    update's time over the iteration's, most of it hidden behind the simulator, and the CPU seconds of
    the two parts are not told apart (NaN). ``start_from`` (a ``waddle train --task walk`` checkpoint)
    times PPO from a trained policy: from scratch the robots fall and reset every few steps, later in
    a run episodes last.
    """
    env = make_env("walk", num_envs=num_envs, seed=0, num_threads=threads)
    recorder = TransitionRecorder(env)
    config = PPOConfig(overlap_rollout=overlap)
    trainer = PPO(env, config, update_threads=default_update_threads(config, threads))
    if start_from is not None:
        trainer.load_state_dict(load_checkpoint(start_from)["trainer"])
    trainer.train_iteration()  # warm-up
    totals = dict.fromkeys(("perf/update_s", "perf/rollout_cpu_s", "perf/update_cpu_s"), 0.0)

    def run_round() -> None:
        metrics = trainer.train_iteration()
        for key in totals:
            totals[key] += metrics[key]

    measured = paired_rate(run_round, recorder, threads, rounds=iterations)
    env.close()
    steps = iterations * trainer.steps_per_iteration
    return PPOThroughput(
        rate=steps / measured.seconds,
        limit=measured.limit,
        update_share=totals["perf/update_s"] / measured.seconds,
        rollout_cpu_s=1e3 * totals["perf/rollout_cpu_s"] / steps,
        update_cpu_s=1e3 * totals["perf/update_cpu_s"] / steps,
        limit_cpu_s=1e3 * measured.limit_cpu_s,
        cores=cores(),
    )


def task_conditioning_cost(num_envs: int, threads: int, repeats: int = 3) -> dict[str, float]:
    """What reading the task id costs PPO on the ``mix`` library, measured where it acts.

    The embedding changes the networks, not the env; two trainers on the same
    env, one with ``task_embedding_dim=8`` (the default) and one with 0, take
    turns on one batch: the update, and the actor's forward pass on one step of
    the batch. The cost is their extra time per iteration (one update, 32 actor
    passes) over the seconds of a whole PPO iteration without the embedding:
    training the two side by side would confound it with how often their
    different policies fall.
    """
    env = make_env("mix", num_envs=num_envs, seed=0, num_threads=threads)
    trainers = {
        dim: PPO(env, PPOConfig(task_embedding_dim=dim), update_threads=threads)
        for dim in (0, PPOConfig().task_embedding_dim)
    }
    plain = trainers[0]
    plain.train_iteration()  # warm-up
    with timed() as timing:
        for _ in range(repeats):
            plain.train_iteration()
    iteration_s = timing.wall_s / repeats
    batch = plain.collect()
    update_s, actor_s = dict.fromkeys(trainers, math.inf), dict.fromkeys(trainers, math.inf)
    step = batch[:, 0].exclude("next")
    for _ in range(repeats):
        for dim, trainer in trainers.items():
            data = batch.clone()
            with timed() as timing, torch_threads(threads):
                trainer.update(data)
            update_s[dim] = min(update_s[dim], timing.wall_s)
            with timed() as timing, torch.no_grad():
                for _ in range(plain.config.num_steps):
                    trainer.actor(step.clone())
            actor_s[dim] = min(actor_s[dim], timing.wall_s)
    env.close()
    dim = max(trainers)
    extra = (update_s[dim] - update_s[0]) + (actor_s[dim] - actor_s[0])
    return {
        "iteration_s": iteration_s,
        "update_extra_s": update_s[dim] - update_s[0],
        "actor_extra_s": actor_s[dim] - actor_s[0],
        "cost": extra / iteration_s,
    }


def bare_backend_rate(num_envs: int, steps: int, threads: int) -> PairedRate:
    """``env.physics.step`` in a Python loop, beside the C limit of the same transitions."""
    env = MicroDuckEnv(num_envs=num_envs, seed=0, num_threads=threads)
    recorder = TransitionRecorder(env)
    env.reset()
    generator = torch.Generator().manual_seed(0)
    noise = 2 * torch.rand(steps, num_envs, 14, generator=generator) - 1
    controls = env._home_ctrl + env.action_scale * ACTION_FRACTION * noise
    env.physics.step(controls[0])  # warm-up

    def run_round() -> None:
        for ctrl in controls:
            env.physics.step(ctrl)

    measured = paired_rate(run_round, recorder, threads)
    env.close()
    return measured


def torchrl_rate(num_envs: int, steps: int, parallel: bool) -> float:
    from torchrl.envs import MicroDuckEnv as TorchRLMicroDuckEnv

    scene = MicroDuckEnv.resolve_scene()
    env = TorchRLMicroDuckEnv(scene, backend="mujoco", num_envs=num_envs, parallel=parallel)
    env.rollout(2, break_when_any_done=False)
    with timed() as timing:
        env.rollout(steps, break_when_any_done=False)
    env.close()
    return num_envs * steps / timing.wall_s


def randomization_rates(num_envs: int, steps: int, threads: int, repeats: int) -> dict[str, float]:
    """Env steps per second with ``randomization="none"`` and ``"upstream"``, best of ``repeats`` each.

    The two envs take turns, so a burst of load from other processes hits
    both; on a busy machine the best run is the least disturbed one.
    """
    envs = {
        name: MicroDuckEnv(num_envs=num_envs, seed=0, num_threads=threads, randomization=name)
        for name in ("none", "upstream")
    }
    best = dict.fromkeys(envs, 0.0)
    for env in envs.values():
        env.rollout(5, break_when_any_done=False)  # warm-up
    for _ in range(repeats):
        for name, env in envs.items():
            with timed() as timing:
                env.rollout(steps, break_when_any_done=False)
            best[name] = max(best[name], num_envs * steps / timing.wall_s)
    for env in envs.values():
        env.close()
    return best


def print_randomization_cost(num_envs: int, steps: int, threads: int, repeats: int) -> None:
    rates = randomization_rates(num_envs, steps, threads, repeats)
    print(
        f"randomization at {num_envs} envs (best of {repeats} x {steps} steps): "
        f"none {rates['none']:,.0f} steps/s, upstream {rates['upstream']:,.0f} steps/s, "
        f"upstream / none = {rates['upstream'] / rates['none']:.2f}; {load_line()}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--steps", type=int, default=20, help="control steps per round of a measurement")
    parser.add_argument("--torchrl-envs", type=int, default=256, help="batch size for TorchRL's env")
    parser.add_argument("--torchrl-steps", type=int, default=10)
    parser.add_argument(
        "--torchrl-parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="TorchRL's native backend in a ParallelEnv, one worker process per env (default: only "
        "when there are no more envs than cores; 256 worker processes on 2 cores drove the load "
        "average to 238 and never finished) or in one process (SerialEnv)",
    )
    parser.add_argument("--threads", type=int, default=cores())
    parser.add_argument(
        "--randomization-envs", type=int, default=256, help="batch size of the randomization comparison (0: skip)"
    )
    parser.add_argument("--randomization-repeats", type=int, default=3)
    parser.add_argument(
        "--task-conditioning-envs", type=int, default=256, help="batch size of the task-embedding cost (0: skip)"
    )
    parser.add_argument(
        "--ppo-iterations", type=int, default=3, help="timed PPO iterations per size, after one warm-up (0: skip)"
    )
    parser.add_argument(
        "--ppo-from", metavar="CHECKPOINT", help="time PPO from this walk checkpoint's policy instead of from scratch"
    )
    parser.add_argument("--randomization-only", action="store_true", help="run the randomization comparison alone")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the physics threads, not torch's, do the work
    if args.randomization_only:
        print_randomization_cost(args.randomization_envs, args.steps, args.threads, args.randomization_repeats)
        return

    print(f"MicroDuck scene: {MicroDuckEnv.resolve_scene()}; {args.threads} threads")
    print(
        f"C limit: mujoco.rollout simulating the same transitions again; {ROUNDS} rounds of {args.steps} steps, each\n"
        "replayed right after it; rates over every round, the rounds' range of ratios in brackets\n"
        f"{ENV_TABLE.header()}   (env steps/s)"
    )
    results = {}

    def ratio(measured: PairedRate) -> str:
        return f"{measured.ratio:.2f} [{min(measured.ratios):.2f}-{max(measured.ratios):.2f}]"

    for size in args.sizes:
        ours = waddle_rate(size, args.steps, args.threads)
        bare = bare_backend_rate(size, args.steps, args.threads)
        results[size] = ours.rate
        ENV_TABLE.print_row(size, ours.rate, ours.limit, ratio(ours), bare.rate, bare.limit, ratio(bare))

    if args.ppo_iterations:
        print(
            f"PPO end to end (walk task, default settings, {args.ppo_iterations} iterations after a warm-up), "
            "and with --overlap-rollout; C limit of each one's transitions, each iteration replayed right after it:\n"
            f"{PPO_TABLE.header()}   (env steps/s)"
        )
        if args.ppo_from:
            print(f"(from the trained policy {args.ppo_from})")
        budgets = {}
        for size in args.sizes:
            plain = budgets[size] = ppo_rate(size, args.ppo_iterations, args.threads, start_from=args.ppo_from)
            overlapped = ppo_rate(size, args.ppo_iterations, args.threads, overlap=True, start_from=args.ppo_from)
            PPO_TABLE.print_row(
                size,
                plain.rate,
                plain.limit,
                plain.rate / plain.limit,
                plain.update_share,
                overlapped.rate,
                overlapped.limit,
                overlapped.rate / overlapped.limit,
            )
        print(
            "PPO's CPU budget (plain loop; CPU seconds of every thread per 1,000 env steps). The ceiling is the\n"
            "best PPO / C any overlap of rollout and update could reach on these cores at these costs:"
        )
        BUDGET_TABLE.print_header()
        for size, plain in budgets.items():
            BUDGET_TABLE.print_row(
                size,
                plain.rollout_cpu_s,
                plain.update_cpu_s,
                plain.limit_cpu_s,
                plain.cores,
                plain.ceiling,
                plain.rate / plain.limit,
            )

    if args.task_conditioning_envs:
        cost = task_conditioning_cost(args.task_conditioning_envs, args.threads)
        print(
            f"task conditioning (mix library, {args.task_conditioning_envs} envs): a PPO iteration without it "
            f"{cost['iteration_s']:.2f} s; the embedding adds {1e3 * cost['update_extra_s']:+.0f} ms to the update "
            f"and {1e3 * cost['actor_extra_s']:+.0f} ms to the rollout's actor passes: cost {100 * cost['cost']:.1f} % "
            "(target <= 5 %)",
            flush=True,
        )

    if args.randomization_envs:
        print_randomization_cost(args.randomization_envs, args.steps, args.threads, args.randomization_repeats)

    parallel = args.torchrl_parallel
    if parallel is None:
        parallel = args.torchrl_envs <= cores()
    try:
        theirs = torchrl_rate(args.torchrl_envs, args.torchrl_steps, parallel)
    except Exception as err:  # report, do not hide, why the comparison is missing
        print(f"TorchRL MicroDuckEnv could not run: {type(err).__name__}: {err}")
        return
    ours = results.get(args.torchrl_envs) or waddle_rate(args.torchrl_envs, args.steps, args.threads).rate
    print(
        f"TorchRL MicroDuckEnv(backend='mujoco', parallel={parallel}) at {args.torchrl_envs} envs: "
        f"{theirs:,.0f} steps/s; "
        f"waddle / TorchRL = {ours / theirs:.1f}x"
    )
    print(load_line("at the end"))


if __name__ == "__main__":
    main()
