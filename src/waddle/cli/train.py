"""``waddle train``: train a MicroDuck policy and write checkpoint, metrics, curve and config.

Every flag comes from a config dataclass field and its docstring: the run
settings from :class:`~waddle.algorithms.runner.TrainConfig`, the algorithm's
hyperparameters from ``PPOConfig``, ``SHACConfig`` or ``APGConfig``.

The command goes through five steps, in this file's order:

1. parse: the flags the user gave (:func:`given_flags`; a flag left out is absent);
2. load: the checkpoints ``--resume`` and ``--init-from`` name, each once (:func:`load_starts`);
3. resolve: :func:`~waddle.algorithms.run_plan.resolve_run` applies every layer of
   the run's configuration in one order (the config defaults, the task's recipe,
   the algorithm's run defaults, the ``--init-from`` source, the learning-rate
   schedule's length, the flags; a resumed run: the checkpoint's plan, then the
   flags) and derives what follows for this machine (update threads, the
   collectors' split);
4. build: env, collectors, trainer, source weights and logger, as the plan says;
5. run: the :class:`~waddle.algorithms.runner.Runner`, which records the plan in
   ``config.json`` and the checkpoint.

``--init-from CHECKPOINT`` starts a new run (its own ``--task`` library and
``--out``) from another run's weights and observation statistics, with a fresh
optimiser (see :mod:`waddle.algorithms.init_from`); the algorithm and the
network-shaping flags left out are the source's.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import math
import os
import shutil
import sys
import textwrap
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from waddle.algorithms.checkpoint import CheckpointError, load_checkpoint
from waddle.algorithms.init_from import InitFromError, load_weights
from waddle.algorithms.loggers import LOGGERS, make_logger, require_package
from waddle.algorithms.presets import (
    ACTOR_OBSERVATIONS,
    ALGORITHMS,
    BACKENDS,
    RANDOMIZATIONS,
    TASK_RECIPES,
    TASKS,
    CollectorEnv,
    make_env,
    make_trainer,
)
from waddle.algorithms.run_plan import (
    RUN_FIELDS,
    Machine,
    RunPlan,
    SourceCheckpoint,
    check_one_start,
    resolve_run,
)
from waddle.algorithms.runner import (
    ACTION_MODES,
    CHECKPOINT_FILE,
    CONFIG_FILE,
    CURVE_FILE,
    METRICS_FILE,
    REMOTE_COLLECTOR_BACKENDS,
    Runner,
    TrainConfig,
)
from waddle.algorithms.trainer import Trainer
from waddle.collectors.rollout import ray_init_options

DEFAULT_OUT = "runs/train"
VIDEO_FILE = "video.mp4"
CHOICES = {
    "task": tuple(TASKS),
    "algo": tuple(ALGORITHMS),
    "backend": BACKENDS,
    "logger": LOGGERS,
    "randomization": RANDOMIZATIONS,
    "actor_observation": ACTOR_OBSERVATIONS,
    "action_mode": ACTION_MODES,
    "collector_backend": REMOTE_COLLECTOR_BACKENDS,
}


# ---------------------------------------------------------------------------
# Flags from dataclass fields
# ---------------------------------------------------------------------------
#
# Why argparse built from the dataclasses rather than tyro (tried: tyro 1.0.17,
# on {"run": TrainConfig, "algorithm": PPOConfig | SHACConfig | APGConfig}):
# - tyro picks a union member by a positional subcommand, so `--algo shac`
#   becomes `waddle train [run flags] algorithm:shac-config [its flags]` (or a
#   renamed `shac` subcommand): a second source of truth beside TrainConfig.algo,
#   and algorithm flags must follow the subcommand.
# - A hyperparameter several algorithms share gets one flag per algorithm's
#   subcommand; the one `--num-epochs` whose help reads "default ppo: 5; shac: 16"
#   has no tyro equivalent, and `--run.`/`--algorithm.` prefixes rename every
#   flag unless each field is annotated otherwise.
# - --task, --algo, --backend and --logger are `str` fields checked against
#   runtime registries (TASKS, ALGORITHMS, physics BACKENDS); tyro only offers
#   choices for Literal/Enum annotations, so a typo would pass the parser.
# - --resume itself would survive: `tyro.cli(..., default=<checkpoint config>)`
#   keeps the checkpoint's value for every flag left out (checked), after a
#   first pass reads --out and --resume.
# So adopting it would change every flag name and the algorithm syntax for no
# gain in what the flags can express; field_docs() below already makes each
# field's docstring its help, as tyro would.


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of dataclass ``cls`` (read from its source), by field name."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body
    docs = {}
    for node, following in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split())
    return docs


def _flag_kwargs(annotation: str) -> dict[str, Any]:
    """argparse keyword arguments for a field annotated ``annotation`` (a string, as
    ``from __future__ import annotations`` leaves it)."""
    annotation = annotation.replace(" ", "")
    if annotation == "bool":
        return {"action": argparse.BooleanOptionalAction}
    if annotation == "int":
        return {"type": int, "metavar": "N"}
    if annotation == "float":
        return {"type": float, "metavar": "X"}
    if annotation == "dict[str,float]":
        return {"nargs": "+", "action": _NameValues, "metavar": "NAME=X"}
    if annotation.startswith("tuple[") and annotation.endswith(",...]"):
        item = int if annotation[6:-5] == "int" else float
        return {"type": item, "nargs": "*", "metavar": "N" if item is int else "X"}
    if annotation.startswith("tuple["):
        items = annotation[6:-1].split(",")
        item = int if items[0] == "int" else float
        return {"type": item, "nargs": len(items), "metavar": "N" if item is int else "X"}
    return {"type": str}


class _NameValues(argparse.Action):
    """``NAME=X [NAME=X ...]`` -> ``{NAME: float(X)}`` (a name given twice keeps its last value)."""

    def __call__(self, parser, namespace, values, option_string=None):  # noqa: ANN001 (argparse's signature)
        pairs = {}
        for item in values:
            name, _, value = item.partition("=")
            try:
                number = float(value)
            except ValueError:
                number = None
            if not name or number is None:
                parser.error(f"{option_string}: {item!r} is not NAME=X with X a number (e.g. target_past_range=-1).")
            pairs[name] = number
        setattr(namespace, self.dest, pairs)


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_config_arguments(
    parser: argparse.ArgumentParser, configs: dict[str, type], *, title: str, skip: Iterable[str] = ()
) -> dict[str, list[str]]:
    """Add one flag per field of the config dataclasses ``configs`` (label -> class).

    A field several configs share gets one flag whose help lists each
    default. Every flag defaults to ``None``, meaning "not given".

    Returns:
        field name -> labels of the configs that have it.
    """
    owners: dict[str, list[str]] = {}
    helps: dict[str, list[str]] = {}
    kinds: dict[str, str] = {}
    for label, cls in configs.items():
        docs = field_docs(cls)
        for field in dataclasses.fields(cls):
            if field.name in skip:
                continue
            owners.setdefault(field.name, []).append(label)
            kinds.setdefault(field.name, str(field.type))
            default = field.default if field.default is not dataclasses.MISSING else field.default_factory()
            shown = " ".join(map(str, default)) if isinstance(default, tuple) else default
            shown = f"{label}: {shown}" if len(configs) > 1 else str(shown)
            helps.setdefault(field.name, [docs.get(field.name, "")]).append(shown)
            for source, value in _recipe_defaults(label, field.name).items():
                helps[field.name].append(f"{label} on {source}: {value}" if len(configs) > 1 else f"{source}: {value}")
    group = parser.add_argument_group(title)
    for name, _labels in owners.items():
        doc, *defaults = helps[name]
        kwargs = _flag_kwargs(kinds[name])
        if name in CHOICES:
            kwargs["choices"] = CHOICES[name]
            kwargs.pop("metavar", None)
        help_text = f"{doc} (default {'; '.join(defaults)})".replace("%", "%%")
        group.add_argument(_flag(name), dest=name, default=None, help=help_text, **kwargs)
    return owners


def _recipe_defaults(label: str, field: str) -> dict[str, Any]:
    """``"--task NAME"`` or ``"--algo NAME"`` -> its own default of config ``label``'s ``field`` (``"run"``
    or an algorithm), for the task recipes and algorithms that set one."""
    defaults = {}
    for task, recipe in TASK_RECIPES.items():
        fields = recipe.run if label == "run" else recipe.algorithms.get(label, {})
        if field in fields:
            defaults[f"--task {task}"] = fields[field]
    if label == "run":
        for algo, entry in ALGORITHMS.items():
            if field in entry.run_defaults:
                defaults[f"--algo {algo}"] = entry.run_defaults[field]
    return defaults


def _algorithm_configs() -> dict[str, type]:
    configs = {}
    for name, algorithm in ALGORITHMS.items():
        try:
            configs[name] = algorithm.classes()[1]
        except ImportError:  # an optional dependency is missing: its flags are left out
            continue
    return configs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=DEFAULT_OUT, metavar="DIR", help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out up to --total-steps")
    parser.add_argument(
        "--init-from",
        metavar="CHECKPOINT",
        help="start a new run from this checkpoint's weights and observation statistics (fresh optimiser); "
        "the task embedding is extended to this run's tasks by name",
    )
    parser.add_argument("--device", default="cpu", help="torch device of the networks and the env")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="hide the progress bar")
    add_config_arguments(parser, {"run": TrainConfig}, title="run")
    algorithm_fields = add_config_arguments(parser, _algorithm_configs(), title="algorithm hyperparameters")
    parser.set_defaults(algorithm_fields=algorithm_fields)


# ---------------------------------------------------------------------------
# The command: parse -> load -> resolve -> build -> run
# ---------------------------------------------------------------------------


def _error(message: str) -> int:
    print(f"waddle train: error: {message}", file=sys.stderr)
    return 1


def given_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The config fields the user set on the command line, field -> value (a flag left out is absent)."""
    names = [*RUN_FIELDS, *getattr(args, "algorithm_fields", {})]
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def _checkpoint_file(path: str | Path) -> Path:
    path = Path(path)
    return path / CHECKPOINT_FILE if path.is_dir() else path


def load_starts(args: argparse.Namespace) -> tuple[dict[str, Any] | None, SourceCheckpoint | None]:
    """The checkpoints the run starts from, each loaded once: ``--resume``'s (the one in ``--out``) and
    ``--init-from``'s (``None`` for the one not asked for).

    Raises:
        CheckpointError: a checkpoint cannot be read or records no run/algorithm config, or a new
            run's ``--out`` already holds one.
        ValueError: both ``--resume`` and ``--init-from`` are given.
    """
    check_one_start(resume=args.resume, init_from=args.init_from is not None)
    source = None
    if args.init_from is not None:
        checkpoint = load_checkpoint(_checkpoint_file(args.init_from))
        if not isinstance(checkpoint["config"], dict) or "algorithm" not in checkpoint["config"]:
            raise CheckpointError(f"--init-from {args.init_from}: the checkpoint has no algorithm config.")
        source = SourceCheckpoint(args.init_from, checkpoint)
    path = Path(args.out) / CHECKPOINT_FILE
    if not args.resume:
        if path.exists():
            raise CheckpointError(f"{path} exists; pass --resume to continue it or choose another --out.")
        return None, source
    checkpoint = load_checkpoint(path)
    if not isinstance(checkpoint["config"], dict) or not {"run", "algorithm"} <= set(checkpoint["config"]):
        raise CheckpointError(f"checkpoint {path} has no run/algorithm config.")
    return checkpoint, source


def plan_run(args: argparse.Namespace) -> tuple[RunPlan, dict[str, Any] | None, SourceCheckpoint | None]:
    """Parse, load, resolve: the run's plan (:func:`~waddle.algorithms.run_plan.resolve_run` of the flags
    given, the checkpoints they name and this machine), the checkpoint it resumes and the one it starts from.

    Raises:
        CheckpointError, InitFromError, ValueError: see :func:`load_starts` and ``resolve_run``.
    """
    flags = given_flags(args)
    resume, source = load_starts(args)
    machine = Machine(cores=len(os.sched_getaffinity(0)))
    plan = resolve_run(flags, resume=resume, init_from=source, machine=machine)
    return plan, resume, source


def resolve_config(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The config ``waddle train`` with these arguments would record (:meth:`RunPlan.config`) and, with
    ``--resume``, the checkpoint it continues.

    Raises:
        as :func:`plan_run`.
    """
    plan, resume, _ = plan_run(args)
    return plan.config(), resume


def run(args: argparse.Namespace) -> int:
    import torch

    try:
        plan, checkpoint, source = plan_run(args)
    except (CheckpointError, ValueError, TypeError) as err:  # TypeError: a value of the wrong type
        return _error(str(err).splitlines()[0])
    run_config = plan.run
    out = Path(args.out)
    try:
        require_package(run_config.logger)  # before anything is built or written
    except ImportError as err:
        return _error(str(err))
    if checkpoint is not None and checkpoint["env_steps"] >= run_config.total_steps:
        steps = checkpoint["env_steps"]
        print(f"{out / CHECKPOINT_FILE} already holds {steps} env steps >= --total-steps; nothing to train.")
        return 0
    if checkpoint is None:  # a fresh run: leftovers of a run stopped before its first checkpoint go
        for name in (METRICS_FILE, CURVE_FILE):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / "csv" / "scalars", ignore_errors=True)  # the csv logger appends

    # Build what the plan says.
    if run_config.torch_threads > 0:
        torch.set_num_threads(run_config.torch_threads)
    seed = run_config.seed + plan.start_iteration
    torch.manual_seed(seed)
    algorithm = ALGORITHMS[run_config.algo]
    # PPO logs each weighted reward term (reward/<term>) from the env's diagnostics.
    env_options = dict(device=args.device, diagnostics=not algorithm.differentiable, **plan.training_env_options())
    env_factories, ray_init = None, None
    try:
        if plan.collectors is not None:
            env_factories, ray_init = _remote_collectors(plan, env_options)
        # With remote collectors this env only describes the batch (specs and size); it never steps.
        env = make_env(
            run_config.task,
            num_envs=run_config.num_envs,
            seed=seed,
            differentiable=algorithm.differentiable,
            **({"num_threads": 1} if env_factories is not None else {}),
            **env_options,
        )
    except (ValueError, ImportError) as err:
        return _error(str(err).splitlines()[0])
    try:
        trainer = make_trainer(
            run_config.algo,
            env,
            plan.algorithm,
            args.device,
            update_threads=plan.update_threads,
            env_factories=env_factories,
            collector_backend=run_config.collector_backend,
            ray_init=ray_init,
        )
    except ValueError as err:
        env.close()
        return _error(str(err).splitlines()[0])
    if env_factories is not None:
        try:
            trainer.start_collectors()
        except Exception as err:  # whatever the processes or Ray raise: report it before anything trains
            _close(trainer)
            env.close()
            return _error(f"could not start the collectors: {str(err).strip().splitlines()[0]}")
    if source is not None:
        try:
            report = load_weights(trainer, run_config.algo, source.checkpoint, path=source.path)
        except InitFromError as err:
            _close(trainer)
            env.close()
            return _error(str(err))
        print(f"initialised from {source.path}: {report.summary()}")
    config = plan.config()
    logger = make_logger(run_config.logger, out, config=config)
    runner = Runner(
        trainer,
        out,
        algo=run_config.algo,
        config=config,
        total_steps=run_config.total_steps,
        checkpoint_every=run_config.checkpoint_every,
        plot_every_s=run_config.plot_every_s,
        progress=args.progress,
        logger=logger,
        before_iteration=_curriculum(env, plan),
    )

    # Run.
    started = time.perf_counter()
    try:
        if checkpoint is not None:
            try:
                runner.restore(checkpoint)
            except (RuntimeError, KeyError, ValueError) as err:
                reason = str(err).splitlines()[0]
                return _error(f"checkpoint {out / CHECKPOINT_FILE} does not fit its config: {reason}")
        result = runner.run()
    finally:
        _close(trainer)
        env.close()
        if logger is not None:
            logger.close()
    if result.status == "interrupted":
        print(f"waddle train: {result.message}", file=sys.stderr)
        return 130
    if result.status == "collector-died":
        return _error(f"{result.message} Resume with: waddle train --out {out} --resume")
    if result.status != "finished":
        return _error(result.message)

    written = [CHECKPOINT_FILE, METRICS_FILE, CURVE_FILE, CONFIG_FILE]
    if logger is not None:
        written.append(f"{run_config.logger}/")
    if run_config.video_frames > 0:
        try:
            _film(trainer, dataclasses.replace(plan, env_steps=result.env_steps), out / VIDEO_FILE, args.device)
            written.append(VIDEO_FILE)
        except (RuntimeError, OSError, ImportError) as err:
            print(f"waddle train: warning: no {VIDEO_FILE}: {str(err).splitlines()[0]}", file=sys.stderr)
    row = result.last_metrics
    minutes = (time.perf_counter() - started) / 60.0
    summary = f"trained {result.env_steps} env steps in {minutes:.1f} min"
    if math.isfinite(row.get("charts/episode_return", math.nan)):
        summary += f"; episode return {row['charts/episode_return']:.2f}, length {row['charts/episode_length']:.0f}"
    print(f"{summary}; wrote {', '.join(written)} to {out}")
    return 0


def _remote_collectors(plan: RunPlan, env_options: dict[str, Any]) -> tuple[list[CollectorEnv], dict[str, Any] | None]:
    """The collectors' env recipes, as the plan splits the envs, and ``ray.init`` options; says where they run.

    Raises:
        ValueError: the Ray address cannot be reached.
        ImportError: Ray is asked for and not installed.
    """
    run_config, split = plan.run, plan.collectors
    env_factories = split.envs(run_config.task, **env_options)
    local = run_config.collector_backend == "process"
    ray_init = None if local else ray_init_options(run_config.ray_address)
    if local:
        where = "local processes"
    else:
        where = f"the Ray cluster at {run_config.ray_address}" if run_config.ray_address else "local Ray"
    print(
        f"{len(env_factories)} collectors in {where}: {split.envs_each} envs and {split.physics_threads_each} "
        f"physics threads each, seeds {list(split.seeds)}"
    )
    return env_factories, ray_init


def _curriculum(env: Any, plan: RunPlan) -> Callable[[int], dict[str, float]] | None:
    """The runner's hook that sets ``env``'s curricula for the env steps trained so far (``None`` without any):
    the gait prior fading over ``gait_prior_fade_steps`` (``RunPlan.gait_prior_scale``) and the pushes growing
    over ``push_ramp_steps`` (``RunPlan.push_strength``) and the lift assist fading over
    ``lift_assist_fade_steps`` (``RunPlan.lift_assist``), logged under ``curriculum/``."""
    run = plan.run
    if run.gait_prior_fade_steps == 0 and run.push_ramp_steps == 0 and run.lift_assist == 0:
        return None

    def set_curricula(env_steps: int) -> dict[str, float]:
        now = dataclasses.replace(plan, env_steps=env_steps)
        metrics = {}
        if run.gait_prior_fade_steps > 0:
            env.gait_prior_scale = now.gait_prior_scale
            metrics["curriculum/gait_prior_scale"] = env.gait_prior_scale
        if run.push_ramp_steps > 0:
            env.pushes.strength = now.push_strength
            metrics["curriculum/push_strength"] = env.pushes.strength
        if run.lift_assist > 0:
            env.lift_assist = now.lift_assist
            metrics["curriculum/lift_assist"] = env.lift_assist
        return metrics

    return set_curricula


def _close(trainer: Trainer) -> None:
    """Stop the trainer's collectors, if it has any to stop."""
    close = getattr(trainer, "close", None)
    if close is not None:
        close()


def _film(trainer: Trainer, plan: RunPlan, path: Path, device: str) -> None:
    """Film the deterministic policy in one env for ``video_frames`` control steps (the preset's pushes)."""
    from waddle.algorithms.evaluation import film

    env = make_env(
        plan.run.task,
        num_envs=1,
        seed=plan.run.seed + 1,
        backend=plan.run.backend,
        device=device,
        randomization=plan.run.randomization,
        **plan.policy_env_options,
    )
    try:
        film(env, trainer.deterministic_policy(), path, frames=plan.run.video_frames)
    finally:
        env.close()
