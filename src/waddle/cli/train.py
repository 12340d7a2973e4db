"""``waddle train``: train a MicroDuck policy and write checkpoint, metrics, curve and config.

Every flag comes from a config dataclass field and its docstring: the run
settings from :class:`~waddle.algorithms.runner.TrainConfig`, the algorithm's
hyperparameters from ``PPOConfig``, ``SHACConfig`` or ``APGConfig``. A flag
left out keeps the config default (or, with ``--resume``, the checkpoint's
value).

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
from collections.abc import Iterable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from waddle.algorithms.checkpoint import CheckpointError, check_compatible, load_checkpoint
from waddle.algorithms.evaluation import POLICY_ENV_FIELDS
from waddle.algorithms.init_from import InitFromError, check_network_config, inherited_fields, load_weights
from waddle.algorithms.loggers import LOGGERS, make_logger, require_package
from waddle.algorithms.ppo import default_update_threads
from waddle.algorithms.presets import (
    ACTOR_OBSERVATIONS,
    ALGORITHMS,
    BACKENDS,
    RANDOMIZATIONS,
    TASK_ALGORITHM_DEFAULTS,
    TASK_TOTAL_STEPS,
    TASKS,
    CollectorEnv,
    algorithm_run_defaults,
    collector_envs,
    make_config,
    make_env,
    make_trainer,
    task_algorithm_defaults,
    task_run_defaults,
    training_randomization,
    upgrade_config_fields,
    upgrade_run_fields,
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
RESUMABLE_FIELDS = (
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
)
"""Config fields ``--resume`` lets a run change; any other difference is refused."""
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
    if annotation.startswith("tuple[") and annotation.endswith(",...]"):
        item = int if annotation[6:-5] == "int" else float
        return {"type": item, "nargs": "*", "metavar": "N" if item is int else "X"}
    if annotation.startswith("tuple["):
        items = annotation[6:-1].split(",")
        item = int if items[0] == "int" else float
        return {"type": item, "nargs": len(items), "metavar": "N" if item is int else "X"}
    return {"type": str}


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
            for task, value in _task_defaults(label, field.name).items():
                helps[field.name].append(
                    f"{label} on --task {task}: {value}" if len(configs) > 1 else f"--task {task}: {value}"
                )
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


def _task_defaults(algo: str, field: str) -> dict[str, Any]:
    """Task -> its own default of ``algo``'s config ``field``, for the tasks that set one."""
    return {
        task: fields[algo][field] for task, fields in TASK_ALGORITHM_DEFAULTS.items() if field in fields.get(algo, {})
    }


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
# The command
# ---------------------------------------------------------------------------


def _error(message: str) -> int:
    print(f"waddle train: error: {message}", file=sys.stderr)
    return 1


def _given(args: argparse.Namespace, names: Iterable[str]) -> dict[str, Any]:
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def init_source(args: argparse.Namespace) -> dict[str, Any] | None:
    """The checkpoint ``--init-from`` names, loaded and checked (``None`` without the flag).

    Raises:
        CheckpointError: it cannot be read or has no run/algorithm config.
    """
    path = getattr(args, "init_from", None)
    if path is None:
        return None
    source = load_checkpoint(_checkpoint_file(path))
    saved = source["config"]
    if not isinstance(saved, dict) or "algorithm" not in saved:
        raise CheckpointError(f"--init-from {path}: the checkpoint has no algorithm config.")
    return source


def _checkpoint_file(path: str | Path) -> Path:
    path = Path(path)
    return path / CHECKPOINT_FILE if path.is_dir() else path


def resolve_config(args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The run's config ``{"run": ..., "algorithm": ...}`` and, with ``--resume``, the checkpoint.

    With ``--init-from`` the config also holds ``"init_from"``: the source's
    path, algorithm, task library and env steps (a record; a resumed run keeps it).

    Raises:
        CheckpointError: the checkpoint cannot be used, or the flags differ from it
            in a field a resumed run cannot change.
        InitFromError: the ``--init-from`` source's networks differ from this run's.
        ValueError: a flag does not apply to the chosen algorithm, a value is invalid,
            or ``--resume`` and ``--init-from`` are both given.
    """
    out = Path(args.out)
    run_flags = _given(args, [field.name for field in dataclasses.fields(TrainConfig)])
    algorithm_flags = _given(args, getattr(args, "algorithm_fields", {}))
    if args.resume and getattr(args, "init_from", None) is not None:
        raise ValueError(
            "--resume continues the run in --out and --init-from starts a new one from another run's weights; "
            "pass one of them."
        )
    source = init_source(args)
    checkpoint = None
    if args.resume:
        checkpoint = load_checkpoint(out / CHECKPOINT_FILE)
        saved = checkpoint["config"]
        if not isinstance(saved, dict) or not {"run", "algorithm"} <= set(saved):
            raise CheckpointError(f"checkpoint {out / CHECKPOINT_FILE} has no run/algorithm config.")
        saved["run"] = upgrade_run_fields(saved["run"])
        saved["algorithm"] = upgrade_config_fields(saved["run"].get("algo", "ppo"), saved["algorithm"])
        run = TrainConfig(**{**saved["run"], **run_flags})
        base = saved["algorithm"] if run.algo == saved["run"].get("algo") else {}
    else:
        if (out / CHECKPOINT_FILE).exists():
            raise CheckpointError(
                f"{out / CHECKPOINT_FILE} exists; pass --resume to continue it or choose another --out."
            )
        if source is not None:
            run_flags.setdefault("algo", source["algo"])
            # What the source's actor reads and what its actions mean carry over unless given.
            source_run = upgrade_run_fields(source["config"].get("run") or {})
            for name in POLICY_ENV_FIELDS:
                run_flags.setdefault(name, source_run[name])
        for name, value in algorithm_run_defaults(run_flags.get("algo", TrainConfig.algo)).items():
            run_flags.setdefault(name, value)
        task = run_flags.get("task", TrainConfig.task)
        for name, value in task_run_defaults(task).items():
            run_flags.setdefault(name, value)
        if "total_steps" not in run_flags and task in TASK_TOTAL_STEPS:
            run_flags["total_steps"] = TASK_TOTAL_STEPS[task]
        run = TrainConfig(**run_flags)
        base = task_algorithm_defaults(run.task, run.algo)
        if source is not None and source["algo"] == run.algo:
            base.update(inherited_fields(source))
    fields = {field.name for field in dataclasses.fields(ALGORITHMS[run.algo].classes()[1])}
    if checkpoint is None and "lr_decay_steps" in fields:
        base["lr_decay_steps"] = run.total_steps  # a new run's schedule spans it, as CleanRL's anneal_lr
    foreign = sorted(set(algorithm_flags) - fields)
    if foreign:
        raise ValueError(f"{', '.join(map(_flag, foreign))} do(es) not apply to --algo {run.algo}.")
    algorithm = make_config(run.algo, {**base, **algorithm_flags})
    if run.sensor_history > 1 and getattr(algorithm, "actor_observation", "full") != "sensors":
        raise ValueError(
            f"--sensor-history {run.sensor_history} stacks the frames of the sensor observation, which only an "
            "actor reading it sees: add --actor-observation sensors (PPO), or leave --sensor-history at 1."
        )
    config = {"run": asdict(run), "algorithm": _jsonable(asdict(algorithm))}
    if checkpoint is not None:
        if "init_from" in checkpoint["config"]:
            config["init_from"] = checkpoint["config"]["init_from"]
        check_compatible(checkpoint["config"], config, ignore=RESUMABLE_FIELDS)
    if source is not None:
        check_network_config(source, run.algo, config["algorithm"], path=args.init_from)
        config["init_from"] = {
            "checkpoint": str(args.init_from),
            "algo": source["algo"],
            "task_library": source["trainer"].get("task_library"),
            "env_steps": int(source["env_steps"]),
        }
    return config, checkpoint


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _jsonable(item) for key, item in value.items()}
    if isinstance(value, tuple):
        return [_jsonable(item) for item in value]
    return value


def run(args: argparse.Namespace) -> int:
    import torch

    try:
        config, checkpoint = resolve_config(args)
        source = init_source(args) if checkpoint is None else None
    except (CheckpointError, ValueError, TypeError) as err:  # TypeError: a config field this version lacks
        return _error(str(err).splitlines()[0])
    run_config = TrainConfig(**config["run"])
    out = Path(args.out)
    try:
        require_package(run_config.logger)  # before anything is built or written
    except ImportError as err:
        return _error(str(err))
    start_iteration = 0 if checkpoint is None else int(checkpoint["iteration"])
    if checkpoint is not None and checkpoint["env_steps"] >= run_config.total_steps:
        steps = checkpoint["env_steps"]
        print(f"{out / CHECKPOINT_FILE} already holds {steps} env steps >= --total-steps; nothing to train.")
        return 0
    if checkpoint is None:  # a fresh run: leftovers of a run stopped before its first checkpoint go
        for name in (METRICS_FILE, CURVE_FILE):
            (out / name).unlink(missing_ok=True)
        shutil.rmtree(out / "csv" / "scalars", ignore_errors=True)  # the csv logger appends

    if run_config.torch_threads > 0:
        torch.set_num_threads(run_config.torch_threads)
    torch.manual_seed(run_config.seed + start_iteration)
    algorithm = ALGORITHMS[run_config.algo]
    cores = len(os.sched_getaffinity(0))
    env_options = dict(
        backend=run_config.backend,
        device=args.device,
        # PPO logs each weighted reward term (reward/<term>) from the env's diagnostics.
        diagnostics=not algorithm.differentiable,
        randomization=training_randomization(run_config.randomization, run_config.push_scale),
        sensor_history=run_config.sensor_history,
        action_scale=run_config.action_scale,
        action_mode=run_config.action_mode,
        max_episode_steps=run_config.max_episode_steps,
    )
    env_factories, ray_init = None, None
    try:
        if run_config.remote_collectors:
            env_factories, ray_init = _remote_collectors(run_config, config, start_iteration, cores, env_options)
        # With remote collectors this env only describes the batch (specs and size); it never steps.
        env = make_env(
            run_config.task,
            num_envs=run_config.num_envs,
            seed=run_config.seed + start_iteration,
            differentiable=algorithm.differentiable,
            **({"num_threads": 1} if env_factories is not None else {}),
            **env_options,
        )
    except (ValueError, ImportError) as err:
        return _error(str(err).splitlines()[0])
    algo_config = make_config(run_config.algo, config["algorithm"])
    update_threads = run_config.update_threads or (
        default_update_threads(algo_config, cores) if run_config.algo == "ppo" else cores
    )
    try:
        trainer = make_trainer(
            run_config.algo,
            env,
            algo_config,
            args.device,
            update_threads=update_threads,
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
            report = load_weights(trainer, run_config.algo, source, path=args.init_from)
        except InitFromError as err:
            _close(trainer)
            env.close()
            return _error(str(err))
        print(f"initialised from {args.init_from}: {report.summary()}")
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
    )
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
            _film(trainer, run_config, out / VIDEO_FILE, args.device)
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


def _remote_collectors(
    run_config: TrainConfig, config: dict[str, Any], start_iteration: int, cores: int, env_options: dict[str, Any]
) -> tuple[list[CollectorEnv], dict[str, Any] | None]:
    """The collectors' env recipes and ``ray.init`` options; records their seeds in ``config`` and says where they run.

    Raises:
        ValueError: the algorithm needs its env in process, or the Ray address cannot be reached.
        ImportError: Ray is asked for and not installed.
    """
    if ALGORITHMS[run_config.algo].differentiable:
        raise ValueError(
            f"--algo {run_config.algo} backpropagates through its env, which must live in the training "
            "process; --collectors and --ray-address are for ppo."
        )
    local = run_config.collector_backend == "process"
    env_factories = collector_envs(
        run_config.task,
        num_envs=run_config.num_envs,
        collectors=run_config.collectors,
        seed=run_config.seed + start_iteration,
        # Local processes share this machine's cores; a Ray actor reserves one CPU wherever it lands.
        cores=cores if local else run_config.collectors,
        **env_options,
    )
    ray_init = None if local else ray_init_options(run_config.ray_address)
    first = env_factories[0]
    config["collectors"] = {
        "backend": run_config.collector_backend,
        "seeds": [factory.seed for factory in env_factories],
        "envs_each": first.num_envs,
        "physics_threads_each": first.num_threads,
    }
    if local:
        where = "local processes"
    else:
        where = f"the Ray cluster at {run_config.ray_address}" if run_config.ray_address else "local Ray"
    print(
        f"{len(env_factories)} collectors in {where}: {first.num_envs} envs and {first.num_threads} physics "
        f"threads each, seeds {config['collectors']['seeds']}"
    )
    return env_factories, ray_init


def _close(trainer: Trainer) -> None:
    """Stop the trainer's collectors, if it has any to stop."""
    close = getattr(trainer, "close", None)
    if close is not None:
        close()


def _film(trainer: Trainer, run_config: TrainConfig, path: Path, device: str) -> None:
    """Film the deterministic policy in one env for ``video_frames`` control steps."""
    from waddle.algorithms.evaluation import film

    env = make_env(
        run_config.task,
        num_envs=1,
        seed=run_config.seed + 1,
        backend=run_config.backend,
        device=device,
        randomization=run_config.randomization,
        sensor_history=run_config.sensor_history,
        action_scale=run_config.action_scale,
        action_mode=run_config.action_mode,
    )
    try:
        film(env, trainer.deterministic_policy(), path, frames=run_config.video_frames)
    finally:
        env.close()
