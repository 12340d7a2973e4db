"""PPO's env steps per second with its rollouts in this process, in collector processes and in Ray actors.

In one run, on ``waddle train --task walk``'s env and trainer (PPO defaults, 256
envs unless ``--num-envs`` says otherwise):

* **own loop**: PPO's rollout as a plain loop (``actor`` then
  ``env.step_and_maybe_reset``, stacked), the reference the Collector has to
  match (within 10 %);
* **collector**: ``torchrl.collectors.Collector`` on the env in this process (the default);
* **2 processes**: ``waddle train --collectors 2``: two collector processes of
  ``num_envs / 2`` envs and one physics thread each;
* **ray, 2 actors**: the same through ``Collector(backend="ray")`` on a local
  Ray instance (skipped when Ray is not installed).

Each variant runs ``--iterations`` PPO iterations after one warm-up; it reports
env steps per second over whole iterations, and per iteration the seconds
waiting for data (``perf/rollout_s``) against updating (``perf/update_s``).
The load average is printed before and after.

The transfer sizes per iteration (the weights every collector receives, the
batch the learner receives) are computed from the tensors, with the bandwidth
they need at the measured iteration rate and what they imply for bigger
machines.

Usage: ``python benchmarks/scaling.py [--num-envs 256] [--iterations 5] [--no-ray]``.
"""

from __future__ import annotations

import argparse
import math

import torch
from harness import Column, Table, cores, load_line, timed

from waddle.algorithms.ppo import PPO, PPOConfig
from waddle.algorithms.presets import collector_envs, make_env
from waddle.collectors.rollout import ray_init_options

TASK = "walk"


class OwnLoopPPO(PPO):
    """PPO whose rollout is a plain loop over the actor and ``env.step_and_maybe_reset``, without a Collector."""

    _next_td = None

    @torch.no_grad()
    def _rollout(self):
        if self._next_td is None:
            self._next_td = self.env.reset()
        td = self._next_td
        steps = []
        for _ in range(self.config.num_steps):
            td = self.actor(td)
            td, next_td = self.env.step_and_maybe_reset(td)
            steps.append(td)
            td = next_td
        self._next_td = td
        return torch.stack(steps, dim=1)


VARIANTS_TABLE = Table(
    [
        Column("variant", width=15, left=True),
        Column("steps/s", ",.0f", 9),
        Column("vs own loop", width=12),
        Column("data s/it", ".2f", 10),
        Column("update s/it", ".2f", 12),
    ]
)
"""Every variant's rate against the own loop's, and its seconds per iteration waiting and updating."""


def measure(name: str, build, iterations: int) -> dict[str, float]:
    """Warm up one iteration, then time ``iterations``; returns the figures of one table row."""
    with timed() as setup:
        trainer = build()
    try:
        with timed() as warm_up:
            trainer.train_iteration()
        rollout_s, update_s = [], []
        with timed() as timing:
            for _ in range(iterations):
                metrics = trainer.train_iteration()
                rollout_s.append(metrics["perf/rollout_s"])
                update_s.append(metrics["perf/update_s"])
        return {
            "name": name,
            "steps_per_s": iterations * trainer.steps_per_iteration / timing.wall_s,
            "rollout_s": sum(rollout_s) / iterations,
            "update_s": sum(update_s) / iterations,
            "setup_s": setup.wall_s + warm_up.wall_s,
            "steps_per_iteration": trainer.steps_per_iteration,
        }
    finally:
        trainer.close()


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=5, help="timed PPO iterations per variant")
    parser.add_argument("--no-ray", action="store_true", help="leave out the Ray variant")
    args = parser.parse_args()
    torch.set_num_threads(1)  # as waddle train: the physics has its own threads
    print(
        f"waddle scaling benchmark: PPO on {TASK!r} with {args.num_envs} envs, {args.iterations} timed iterations "
        f"each; {load_line()}",
        flush=True,
    )
    config = PPOConfig()

    def spec_env(threads: int | None = None):
        return make_env(TASK, num_envs=args.num_envs, seed=0, diagnostics=True, num_threads=threads)

    def in_process(trainer_class):
        def build():
            torch.manual_seed(0)
            return trainer_class(spec_env(), config, update_threads=cores())

        return build

    def remote(backend: str):
        def build():
            torch.manual_seed(0)
            recipes = collector_envs(
                TASK, num_envs=args.num_envs, collectors=2, seed=0, cores=cores(), diagnostics=True
            )
            init = ray_init_options("") if backend == "ray" else None
            return PPO(
                spec_env(1),
                config,
                update_threads=cores(),
                env_factories=recipes,
                collector_backend=backend,
                ray_init=init,
            )

        return build

    variants = [
        ("own loop", in_process(OwnLoopPPO)),
        ("collector", in_process(PPO)),
        ("2 processes", remote("process")),
    ]
    if not args.no_ray:
        try:
            import ray  # noqa: F401

            variants.append(("ray, 2 actors", remote("ray")))
        except ImportError:
            print("ray is not installed (pip install 'waddle[ray]'): the Ray variant is left out")
    rows = []
    for name, build in variants:
        row = measure(name, build, args.iterations)
        rows.append(row)
        print(
            f"  {name:<14} {row['steps_per_s']:>8,.0f} env steps/s   waiting for data {row['rollout_s']:5.2f} s, "
            f"updating {row['update_s']:5.2f} s per iteration (setup and warm-up {row['setup_s']:.1f} s)",
            flush=True,
        )
    if "ray" in [name.split(",")[0] for name, _ in variants]:
        import ray

        ray.shutdown()

    reference = rows[0]["steps_per_s"]
    print(f"\n{load_line('at the end')}")
    VARIANTS_TABLE.print_header()
    for row in rows:
        VARIANTS_TABLE.print_row(
            row["name"], row["steps_per_s"], f"{row['steps_per_s'] / reference:.2f}x", row["rollout_s"], row["update_s"]
        )

    # What crosses the wire per iteration, from the tensors themselves.
    trainer = in_process(PPO)()
    weights = tensor_bytes([*trainer.actor.parameters(), *trainer.actor.buffers()])
    batch = trainer.collect()
    batch_bytes = tensor_bytes(batch.values(include_nested=True, leaves_only=True))
    per_step = batch_bytes / batch.numel()
    iteration_s = rows[1]["steps_per_iteration"] / rows[1]["steps_per_s"]
    print(
        f"\nper iteration: weights {weights / 1e6:.2f} MB to every collector; batch {batch_bytes / 1e6:.1f} MB "
        f"({per_step / 1e3:.2f} kB per env step, every entry the env and the actor write) back to the learner"
    )
    print(
        f"at this machine's iteration time ({iteration_s:.2f} s) the learner receives "
        f"{batch_bytes / iteration_s * 8 / 1e6:,.0f} Mbit/s and sends {weights / iteration_s * 8 / 1e6:,.1f} Mbit/s "
        "per collector"
    )
    update = rows[1]["update_s"]
    ceiling = trainer.steps_per_iteration / update
    print(
        f"the update alone takes {update:.2f} s per iteration here, so however fast the collectors are, "
        f"one learner on this CPU tops out near {ceiling:,.0f} env steps/s at this batch size"
    )
    rollout_per_step = rows[1]["rollout_s"] / trainer.steps_per_iteration * cores()  # core-seconds per env step
    for name, collector_cores in (("a 64-core machine (63 collector cores)", 63), ("4 such hosts", 4 * 63)):
        rollout = rollout_per_step * trainer.steps_per_iteration / collector_cores
        steps = trainer.steps_per_iteration / (rollout + update)
        wire = batch_bytes / (rollout + update) * 8 / 1e9
        print(
            f"estimate for {name}, same batch, rollout spread over the cores: "
            f"{rollout:.3f} s of data + {update:.2f} s of update -> ~{steps:,.0f} env steps/s; "
            f"the learner then receives {wire:.2f} Gbit/s (not run: an estimate from the per-step costs above)"
        )
    trainer.close()
    if not math.isfinite(reference):
        raise SystemExit("no reference figure")


if __name__ == "__main__":
    main()
