"""What a training run is: every layer of its configuration applied in one order, and read back from a checkpoint.

:func:`resolve_run` is the one place that decides a run's values. It is pure:
it takes the flags the user gave (field -> value, only those given), the
checkpoints they name (loaded by the caller, once) and a :class:`Machine`, and
returns a frozen :class:`RunPlan`. ``waddle train`` builds and runs what the
plan says and records :meth:`RunPlan.config` in ``config.json`` and the
checkpoint; :meth:`RunPlan.from_checkpoint` reads that record back (the fields
an older checkpoint lacks filled in with what it trained with) for ``waddle
eval``, ``waddle export``, a resumed run and the benchmarks.

A new run: each field takes its value from the last of these layers that sets it.

1. The config dataclasses' defaults: ``TrainConfig``; ``PPOConfig``,
   ``SHACConfig`` or ``APGConfig``.
2. The task's recipe (:data:`~waddle.algorithms.presets.TASK_RECIPES`): its run
   fields (step budget, randomization, action scale, episode length, ...) and
   its fields of the run's algorithm's config.
3. The algorithm's run defaults (``ALGORITHMS[algo].run_defaults``): a
   differentiable backend; SHAC's envs, episode length and budget.
4. The ``--init-from`` source: what its actor reads and what its actions mean
   (:data:`POLICY_ENV_FIELDS`), and its algorithm config's network fields
   (:func:`~waddle.algorithms.init_from.inherited_fields`).
5. The learning-rate schedule's length, for an algorithm that has one
   (``lr_decay_steps``): the run's step budget.
6. The flags.

The task and the algorithm, which pick the recipe and the algorithm's
defaults, are settled first: the flag, else (the algorithm) the source's, else
the default.

A resumed run: 1. the checkpoint's plan; 2. the flags, which may change only
:data:`RESUMABLE_FIELDS` (anything else is refused).

Then, for either, what follows from those fields and the machine:

* the collector backend: ``"ray"`` whenever a Ray address is given;
* PPO's update threads: ``--update-threads``, else
  :func:`~waddle.algorithms.ppo.default_update_threads` of the machine's cores;
* with remote collectors, their split: envs and physics threads each (local
  processes share the machine's cores; a Ray actor reserves one) and seeds
  (from the run's seed plus the iteration a resumed run continues at).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from waddle.algorithms.checkpoint import CheckpointError, check_compatible
from waddle.algorithms.init_from import check_network_config, inherited_fields
from waddle.algorithms.ppo import default_update_threads
from waddle.algorithms.presets import (
    CollectorSplit,
    algorithm,
    make_config,
    task_recipe,
    training_randomization,
    upgrade_config_fields,
    upgrade_run_fields,
)
from waddle.algorithms.runner import TrainConfig

RESUMABLE_FIELDS: tuple[str, ...] = (
    "run.total_steps",
    "run.checkpoint_every",
    "run.plot_every_s",
    "run.video_frames",
    "run.torch_threads",
    "run.update_threads",
    "run.logger",
    "run.collectors",
    "run.collector_backend",
    "run.ray_address",
    "collectors",
    "machine",
)
"""Config fields (dotted) a resumed run may change; any other difference from the checkpoint is refused."""

POLICY_ENV_FIELDS: tuple[str, ...] = ("sensor_history", "action_scale", "action_mode")
"""Run-config fields that are also MicroDuckEnv options a policy depends on: what it reads (the stack of
sensor frames) and what its action means (radians per unit, and the action law). Every env a policy runs in
takes them as trained, and a run started from its weights inherits them."""

RUN_FIELDS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(TrainConfig))
"""The flags that set run-config (``TrainConfig``) fields; every other flag sets an algorithm config field."""


@dataclass(frozen=True)
class Machine:
    """What the run's derived values depend on in the machine it runs on (the caller reads it)."""

    cores: int
    """CPU cores the process may use (``len(os.sched_getaffinity(0))``)."""


@dataclass(frozen=True)
class SourceCheckpoint:
    """The checkpoint ``--init-from`` names: where it is (for the record and messages) and its loaded contents."""

    path: str
    checkpoint: Mapping[str, Any]


@dataclass(frozen=True)
class InitFromRecord:
    """What a run started from another run's weights records of its source (a resumed run keeps it)."""

    checkpoint: str
    """The source's path, as given."""
    algo: str
    task_library: tuple[str, ...] | None
    """The source's task names in id order (``None``: recorded before libraries were)."""
    env_steps: int
    """Env steps the source had trained."""


@dataclass(frozen=True)
class RunPlan:
    """A run's whole configuration, layers applied and derived values computed (see the module docstring)."""

    run: TrainConfig
    algorithm: Any
    """The algorithm's config dataclass (``PPOConfig``, ``SHACConfig`` or ``APGConfig``)."""
    init_from: InitFromRecord | None = None
    cores: int | None = None
    """The machine's cores the derived values follow (``None``: a checkpoint from before they were recorded)."""
    update_threads: int | None = None
    """Threads of PPO's update (``None``: an algorithm without them, or not recorded)."""
    collectors: CollectorSplit | None = None
    """How remote collectors share the envs (``None``: the envs step in the training process)."""
    start_iteration: int = 0
    """Iteration the run starts at: 0, or a resumed checkpoint's (its env and torch seeds are offset by it;
    0 in a plan read from a checkpoint)."""
    env_steps: int = 0
    """Env steps trained before this plan applies: 0 for a new run, the checkpoint's otherwise."""
    run_recorded: bool = True
    """Whether the checkpoint the plan was read from records its run config (a hand-made one may hold only
    the algorithm's; its run fields are then the ones checkpoints without them trained with)."""

    @property
    def algo(self) -> str:
        return self.run.algo

    @property
    def actor_observation(self) -> str:
        """What the actor reads (``"full"`` for an algorithm without the choice)."""
        return str(getattr(self.algorithm, "actor_observation", "full"))

    @property
    def gait_prior_scale(self) -> float:
        """The share of the task's gait prior the env adds after ``env_steps``: 1 without a fade, else
        ``max(0, 1 - env_steps / gait_prior_fade_steps)``."""
        fade = self.run.gait_prior_fade_steps
        return 1.0 if fade == 0 else max(0.0, 1.0 - self.env_steps / fade)

    @property
    def push_strength(self) -> float:
        """The share of each drawn push the training env deals after ``env_steps``: 1 without a ramp, else
        ``min(1, env_steps / push_ramp_steps)``."""
        ramp = self.run.push_ramp_steps
        return 1.0 if ramp == 0 else min(1.0, self.env_steps / ramp)

    @property
    def lift_assist(self) -> float:
        """The share of the robot's weight the training env lifts after ``env_steps``:
        ``lift_assist * max(0, 1 - env_steps / lift_assist_fade_steps)`` (0 without one)."""
        if self.run.lift_assist == 0:
            return 0.0
        return self.run.lift_assist * max(0.0, 1.0 - self.env_steps / self.run.lift_assist_fade_steps)

    @property
    def policy_env_options(self) -> dict[str, Any]:
        """The MicroDuckEnv options (:data:`POLICY_ENV_FIELDS`) every env the policy runs in takes; for a
        run whose gait prior fades, the share of it left after ``env_steps``; and the run's reward weights, so
        that an evaluation's returns are the training's."""
        options = {name: getattr(self.run, name) for name in POLICY_ENV_FIELDS}
        if self.run.gait_prior_fade_steps > 0:
            options["gait_prior_scale"] = self.gait_prior_scale
        if self.run.reward_weights:
            options["reward_weights"] = dict(self.run.reward_weights)
        return options

    def training_env_options(self) -> dict[str, Any]:
        """:func:`~waddle.algorithms.presets.make_env` options of the training env: backend, randomization
        (its pushes scaled by ``push_scale``), episode length and the policy's env options."""
        return {
            "backend": self.run.backend,
            "randomization": training_randomization(self.run.randomization, self.run.push_scale),
            "max_episode_steps": self.run.max_episode_steps,
            **self.policy_env_options,
        }

    def config(self) -> dict[str, Any]:
        """The JSON-like record of the plan that ``config.json`` and the checkpoint hold."""
        config: dict[str, Any] = {"run": asdict(self.run), "algorithm": _jsonable(asdict(self.algorithm))}
        if self.init_from is not None:
            config["init_from"] = _jsonable(asdict(self.init_from))
        if self.collectors is not None:
            config["collectors"] = {
                "backend": self.run.collector_backend,
                "seeds": list(self.collectors.seeds),
                "envs_each": self.collectors.envs_each,
                "physics_threads_each": self.collectors.physics_threads_each,
            }
        if self.cores is not None:
            config["machine"] = {"cores": self.cores, "update_threads": self.update_threads}
        return config

    @classmethod
    def from_checkpoint(cls, checkpoint: Mapping[str, Any], *, require_run: bool = True) -> RunPlan:
        """The plan a checkpoint records, the fields it lacks filled in with what it trained with
        (:func:`~waddle.algorithms.presets.upgrade_run_fields`, ``upgrade_config_fields``).

        Args:
            checkpoint: a loaded checkpoint.
            require_run: refuse a checkpoint that records no run config; without it, such a
                checkpoint's run fields are those of checkpoints that predate them.

        Raises:
            CheckpointError: the checkpoint records no algorithm config (or no run config, with
                ``require_run``), or a recorded value does not fit this version's configs.
        """
        algo = checkpoint.get("algo")
        config = checkpoint.get("config")
        if not isinstance(config, Mapping) or not isinstance(config.get("algorithm"), Mapping):
            raise CheckpointError("the checkpoint records no algorithm config.")
        saved_run = config.get("run")
        recorded = isinstance(saved_run, Mapping)
        if require_run and not recorded:
            raise CheckpointError("the checkpoint records no run config (its task, env and budget).")
        try:
            run = _train_config({**upgrade_run_fields(saved_run if recorded else {}), "algo": algo})
            algorithm_config = make_config(algo, upgrade_config_fields(algo, config["algorithm"]))
            record = config.get("init_from")
            init_from = None
            if record is not None:
                library = record.get("task_library")
                init_from = InitFromRecord(**{**record, "task_library": None if library is None else tuple(library)})
            collectors, machine = config.get("collectors"), config.get("machine") or {}
            split = None
            if collectors is not None:
                split = CollectorSplit(
                    int(collectors["envs_each"]), int(collectors["physics_threads_each"]), tuple(collectors["seeds"])
                )
        except (KeyError, TypeError, ValueError) as err:
            reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise CheckpointError(f"the checkpoint's {algo} config does not fit this waddle: {reason[:200]}") from None
        return cls(
            run=run,
            algorithm=algorithm_config,
            init_from=init_from,
            cores=machine.get("cores"),
            update_threads=machine.get("update_threads"),
            collectors=split,
            env_steps=int(checkpoint.get("env_steps", 0)),
            run_recorded=recorded,
        )


def check_one_start(*, resume: bool, init_from: bool) -> None:
    """Refuse a run asked both to continue itself and to start from another run.

    Raises:
        ValueError: both are asked for.
    """
    if resume and init_from:
        raise ValueError(
            "--resume continues the run in --out and --init-from starts a new one from another run's weights; "
            "pass one of them."
        )


def resolve_run(
    flags: Mapping[str, Any],
    *,
    resume: Mapping[str, Any] | None = None,
    init_from: SourceCheckpoint | None = None,
    machine: Machine,
) -> RunPlan:
    """The plan of a run: the layers of the module docstring applied in its order, derived values computed.

    Args:
        flags: the fields the user set (run and algorithm fields alike), field name -> value;
            a field left out is absent, not ``None``.
        resume: the loaded checkpoint the run continues (``waddle train --resume``).
        init_from: the checkpoint whose weights a new run starts from (``--init-from``).
        machine: the machine the run runs on.

    Raises:
        CheckpointError: ``resume``'s config cannot be read, or the flags differ from it in a
            field a resumed run cannot change.
        InitFromError: the source's networks differ from this run's.
        ValueError: an unknown task or algorithm, a flag that does not apply to the run's
            algorithm, an invalid value, or both ``resume`` and ``init_from``.

    Example:
        >>> plan = resolve_run({"task": "walk"}, machine=Machine(cores=2))
        >>> plan.run.total_steps, plan.algorithm.mirror_loss_coef, plan.update_threads
        (6000000, 0.3, 2)
    """
    check_one_start(resume=resume is not None, init_from=init_from is not None)
    run_flags = {name: value for name, value in flags.items() if name in RUN_FIELDS}
    algorithm_flags = {name: value for name, value in flags.items() if name not in RUN_FIELDS}
    saved, record, start_iteration = None, None, 0
    if resume is not None:
        saved = RunPlan.from_checkpoint(resume)
        run = _train_config({**asdict(saved.run), **run_flags})
        base = asdict(saved.algorithm) if run.algo == saved.algo else {}
        record, start_iteration = saved.init_from, int(resume["iteration"])
    else:
        source = None if init_from is None else init_from.checkpoint
        algo = run_flags.get("algo", TrainConfig.algo if source is None else source["algo"])
        recipe = task_recipe(run_flags.get("task", TrainConfig.task))
        fields = {**recipe.run, **algorithm(algo).run_defaults, "algo": algo}  # layers 2 and 3
        if source is not None:  # layer 4: what the source's policy reads and what its actions mean
            source_options = RunPlan.from_checkpoint(source, require_run=False).policy_env_options
            fields.update({name: source_options[name] for name in POLICY_ENV_FIELDS})
        run = _train_config({**fields, **run_flags})
        base = dict(recipe.algorithms.get(run.algo, {}))
        if source is not None and source["algo"] == run.algo:
            base.update(inherited_fields(source))
        if "lr_decay_steps" in _config_fields(run.algo):  # layer 5: the schedule spans the run (CleanRL's anneal_lr)
            base["lr_decay_steps"] = run.total_steps
        if source is not None:
            library = source["trainer"].get("task_library")
            record = InitFromRecord(
                checkpoint=str(init_from.path),
                algo=source["algo"],
                task_library=None if library is None else tuple(library),
                env_steps=int(source["env_steps"]),
            )
    foreign = sorted(set(algorithm_flags) - _config_fields(run.algo))
    if foreign:
        flags_named = ", ".join("--" + name.replace("_", "-") for name in foreign)
        raise ValueError(f"{flags_named} do(es) not apply to --algo {run.algo}.")
    algorithm_config = make_config(run.algo, {**base, **algorithm_flags})
    if run.sensor_history > 1 and getattr(algorithm_config, "actor_observation", "full") != "sensors":
        raise ValueError(
            f"--sensor-history {run.sensor_history} stacks the frames of the sensor observation, which only an "
            "actor reading it sees: add --actor-observation sensors (PPO), or leave --sensor-history at 1."
        )
    plan = RunPlan(
        run=run,
        algorithm=algorithm_config,
        init_from=record,
        cores=machine.cores,
        update_threads=(
            (run.update_threads or default_update_threads(algorithm_config, machine.cores))
            if run.algo == "ppo"
            else None
        ),
        collectors=_collector_split(run, start_iteration, machine),
        start_iteration=start_iteration,
        env_steps=0 if resume is None else int(resume["env_steps"]),
    )
    curricula = [
        name
        for name in ("gait_prior_fade_steps", "push_ramp_steps", "lift_assist_fade_steps")
        if getattr(run, name) > 0
    ]
    if curricula and plan.collectors is not None:
        flags = " and ".join("--" + name.replace("_", "-") for name in curricula)
        raise ValueError(
            f"{flags} {'change' if len(curricula) > 1 else 'changes'} the training env as the run goes, which only "
            "this process's env can do: leave --collectors at 1 and --collector-backend unset."
        )
    if saved is not None:
        check_compatible(saved.config(), plan.config(), ignore=RESUMABLE_FIELDS)
    if init_from is not None:
        check_network_config(init_from.checkpoint, run.algo, plan.config()["algorithm"], path=init_from.path)
    return plan


def _train_config(fields: dict[str, Any]) -> TrainConfig:
    """``TrainConfig(**fields)``, with the collector backend a Ray address implies."""
    if fields.get("ray_address"):
        fields["collector_backend"] = "ray"
    return TrainConfig(**fields)


def _config_fields(algo: str) -> set[str]:
    return {field.name for field in dataclasses.fields(algorithm(algo).classes()[1])}


def _collector_split(run: TrainConfig, start_iteration: int, machine: Machine) -> CollectorSplit | None:
    """How the run's remote collectors share its envs (``None`` without remote collectors).

    Raises:
        ValueError: the algorithm backpropagates through its env, which must then live in the training process.
    """
    if not run.remote_collectors:
        return None
    if algorithm(run.algo).differentiable:
        raise ValueError(
            f"--algo {run.algo} backpropagates through its env, which must live in the training "
            "process; --collectors and --ray-address are for ppo."
        )
    # Local processes share this machine's cores; a Ray actor reserves one CPU wherever it lands.
    cores = machine.cores if run.collector_backend == "process" else run.collectors
    return CollectorSplit.of(
        num_envs=run.num_envs, collectors=run.collectors, seed=run.seed + start_iteration, cores=cores
    )


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_jsonable(item) for item in value]
    return value
