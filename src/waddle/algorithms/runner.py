"""The training loop around any trainer: iterate, check, log, plot, checkpoint.

A trainer (PPO, SHAC, APG; see :class:`~waddle.algorithms.trainer.Trainer`)
knows one thing: ``train_iteration() -> dict`` of scalars, plus its state and
``steps_per_iteration``. :class:`Runner` drives it
to a step budget and owns everything around it, in an output directory:

* ``checkpoint.pt``: trainer state, config, step count, written atomically
  every ``checkpoint_every`` iterations and at the end;
* ``metrics.csv``: one row per iteration, appended across resumes (rows newer
  than the checkpoint a run resumes from are dropped first);
* ``curve.png``: episode return and length against env steps, redrawn as it
  goes, and the largest reward terms (``reward/<term>`` columns) when logged;
* ``config.json``: the run's configuration.

An optional TorchRL logger (:mod:`waddle.algorithms.loggers`) receives every
column of every ``metrics.csv`` row as a scalar at step ``env_steps``.

Stopping is always safe. A non-finite loss stops the run before anything of
that iteration is saved, and so does a collector process that dies; Ctrl-C
stops it wherever it is; in every case ``checkpoint.pt`` holds the last
complete, finite state.
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torchrl.record.loggers import Logger

from waddle.algorithms.checkpoint import atomic_write, save_checkpoint
from waddle.algorithms.loggers import LOGGERS
from waddle.algorithms.presets import RANDOMIZATIONS, training_randomization
from waddle.algorithms.trainer import Trainer
from waddle.collectors.rollout import COLLECTOR_BACKENDS, CollectorDiedError, split_envs
from waddle.envs.microduck import MicroDuckEnv, MicroDuckRandomization
from waddle.envs.microduck.rewards import check_weights

ACTION_MODES: tuple[str, ...] = MicroDuckEnv.ACTION_MODES

REMOTE_COLLECTOR_BACKENDS = tuple(backend for backend in COLLECTOR_BACKENDS if backend != "direct")
"""``TrainConfig.collector_backend`` names."""
CHECKPOINT_FILE = "checkpoint.pt"
METRICS_FILE = "metrics.csv"
CURVE_FILE = "curve.png"
CONFIG_FILE = "config.json"

RUN_COLUMNS = ("iteration", "env_steps", "wall_time_s", "steps_per_second")
"""The columns the runner writes before the trainer's own metrics."""
RETURN_KEY = "charts/episode_return"
LENGTH_KEY = "charts/episode_length"
REWARD_KEY = "charts/reward_mean"
REWARD_TERM_PREFIX = "reward/"
"""Columns holding one weighted reward term each (mean per env step)."""
PLOTTED_REWARD_TERMS = 6
"""How many reward terms ``curve.png`` draws: those of largest mean absolute value."""


@dataclass(frozen=True)
class TrainConfig:
    """What to train and for how long; the algorithm's own hyperparameters live in its config."""

    task: str = "standing"
    """Task library to train on, and the defaults it brings (see waddle.algorithms.presets.TASK_RECIPES)."""
    algo: str = "ppo"
    """Training algorithm."""
    backend: str = "mujoco"
    """Physics backend of the env ('mujoco': MuJoCo C; --algo shac and apg train through 'mjx' unless given)."""
    randomization: str = "none"
    """Domain randomization, latency and sensor noise of the training env: 'none' (the idealized robot) or
    'upstream' (the microduck_rl training's ranges; see docs/microduck.md)."""
    push_scale: float = 1.0
    """Training pushes are this many times as hard as the randomization's (its push kick range scaled; 'waddle
    eval' and 'waddle export' keep the preset's): a margin on the pushes the policy will meet."""
    sensor_history: int = 1
    """Frames of the robot's readings, newest first, in the sensor observation a '--actor-observation sensors'
    actor reads (1: the latest only); a robot runtime keeps the same number (the export's sidecar says it)."""
    action_scale: float = 0.35
    """Radians of servo target per unit of action, on top of the STAND pose and the gait prior (the policy's
    actions live in [-1, 1]), or of the HOME pose with '--action-mode robot'; the export records it."""
    action_mode: str = "residual"
    """What an action means: 'residual' (an offset in [-1, 1] around the STAND pose plus the task's gait
    prior) or 'robot' (the MicroDuck daemon's HOME + action_scale * action, unclipped)."""
    gait_prior_fade_steps: int = 0
    """Env steps over which the training env's gait prior fades to nothing (0: it stays as the task sets it).
    A policy that reads no gait clock learns to step on the prior and takes the stepping over as it fades;
    after that many steps the env adds nothing, as the robot adds nothing."""
    push_ramp_steps: int = 0
    """Env steps over which the training pushes grow linearly from nothing to their full strength (0: full from
    the first step). A policy first learns to step on calm ground, then to keep its feet under growing kicks;
    over the joystick recipe's first 6M or 3M it walked 4M steps sooner, and traded rows of the benchmark
    rather than closing them (docs/deploy.md, stops 55 and 56)."""
    lift_assist: float = 0.0
    """Share of the robot's weight held up at the trunk of every training robot at the first step, fading
    linearly to nothing over ``lift_assist_fade_steps`` (0: no force): a helping hand
    while a policy learns to get up (waddle.envs.microduck.lift_assist). 'waddle eval' and 'waddle export'
    never lift. The get-up recipes train without it: from 0.7 or 0.9 it stood up no more robots (docs/microduck.md,
    "The lift assist")."""
    lift_assist_fade_steps: int = 0
    """Env steps over which ``lift_assist`` fades to nothing; > 0 whenever ``lift_assist`` is."""
    reward_weights: dict[str, float] = field(default_factory=dict)
    """Reward term -> weight, over the task's own weights in every env the run builds ('--reward-weights
    target_past_range=-1 pose=1'; the terms are waddle.envs.microduck.rewards.REWARD_TERMS)."""
    max_episode_steps: int = 500
    """Control steps after which a training episode is cut (truncated, its value bootstrapped): 500 = 10 s at
    50 Hz (--algo shac: 128 unless given). A policy never sees a state later than this in training; 'waddle eval'
    runs 20 s episodes."""
    num_envs: int = 256
    """Envs simulated in parallel (--algo shac: 8 unless given; it learns from many short windows)."""
    total_steps: int = 1_500_000
    """Env steps to train for, counted over all envs and across resumes.

    What the default takes, and when the standing policy holds its episodes,
    is in docs/throughput.md ("The default budget"). ``waddle train`` gives
    the walking tasks 6M when the flag is left out (their
    ``presets.TASK_RECIPES``), and ``--algo shac`` 25,600 on any task
    (``presets.ALGORITHMS["shac"].run_defaults``).
    """
    seed: int = 0
    """Seed of torch and of the env's generator."""
    checkpoint_every: int = 10
    """Write checkpoint.pt every this many iterations (and at the end)."""
    plot_every_s: float = 20.0
    """Redraw curve.png at most this often, in seconds (and at the end)."""
    video_frames: int = 250
    """Frames of the trained policy filmed to video.mp4 at the end (0: no video)."""
    torch_threads: int = 1
    """Threads of torch's own ops (0: torch's default); the physics has its own pool, so 1 is fastest on a small CPU."""
    update_threads: int = 0
    """Threads of torch's ops during PPO's update (0: every core the process may use, which the physics pool
    leaves idle then; one with --overlap-rollout, whose rollout holds the cores during the update)."""
    logger: str = "none"
    """Also write the metrics through a TorchRL logger: 'csv', 'tensorboard' or 'wandb' (under the output directory)."""
    collectors: int = 1
    """Collector processes (PPO): each steps num_envs / collectors envs on cores / collectors threads, with its own
    seed (1: the envs step in the training process)."""
    collector_backend: str = "process"
    """Where collectors run when there are several: 'process' (local processes) or 'ray' (Ray actors on the
    cluster at ray_address, or on a local Ray instance started for the run)."""
    ray_address: str = ""
    """HOST:PORT of a running Ray cluster's head (implies collector_backend 'ray'); empty: start a local one."""

    def __post_init__(self) -> None:
        for name in ("num_envs", "total_steps", "checkpoint_every", "sensor_history", "max_episode_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
        for name in (
            "video_frames",
            "torch_threads",
            "update_threads",
            "gait_prior_fade_steps",
            "push_ramp_steps",
            "lift_assist_fade_steps",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}.")
        scale = self.action_scale
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale > 0):
            raise ValueError(
                f"action_scale must be a finite number > 0 (rad per unit of action), got {self.action_scale!r}."
            )
        if not isinstance(self.reward_weights, Mapping):
            raise ValueError(f"reward_weights must map term names to weights, got {self.reward_weights!r}.")
        check_weights(self.reward_weights)
        not_plain = {name: value for name, value in self.reward_weights.items() if not isinstance(value, (int, float))}
        if not_plain:
            raise ValueError(f"reward_weights must be plain numbers, which config.json records; got {not_plain!r}.")
        if self.randomization not in RANDOMIZATIONS:
            raise ValueError(f"randomization must be one of {', '.join(RANDOMIZATIONS)}; got {self.randomization!r}.")
        if self.action_mode not in ACTION_MODES:
            raise ValueError(f"action_mode must be one of {', '.join(ACTION_MODES)}; got {self.action_mode!r}.")
        if self.push_scale != 1.0:
            try:
                training_randomization(self.randomization, self.push_scale)
            except ValueError as err:
                raise ValueError(f"push_scale: {err}") from None
        if self.push_ramp_steps > 0 and not MicroDuckRandomization.preset(self.randomization).pushes:
            raise ValueError(
                f"push_ramp_steps ramps up the training pushes, and randomization {self.randomization!r} does not "
                "push: use randomization 'upstream', or leave push_ramp_steps at 0."
            )
        lift = self.lift_assist
        if isinstance(lift, bool) or not isinstance(lift, (int, float)) or not (math.isfinite(lift) and 0 <= lift <= 1):
            raise ValueError(f"lift_assist must be a share of the robot's weight in [0, 1], got {lift!r}.")
        if lift > 0 and self.lift_assist_fade_steps == 0:
            raise ValueError(
                f"lift_assist {lift!r} must fade, or the policy would learn to lean on it: give "
                "lift_assist_fade_steps > 0 (env steps), or leave lift_assist at 0."
            )
        if lift > 0 and self.backend != "mujoco":
            raise ValueError(
                f"lift_assist pushes on the trunk, which only the 'mujoco' backend can; got backend {self.backend!r}."
            )
        if self.logger not in LOGGERS:
            raise ValueError(f"logger must be one of {', '.join(LOGGERS)}; got {self.logger!r}.")
        if self.collector_backend not in REMOTE_COLLECTOR_BACKENDS:
            raise ValueError(
                f"collector_backend must be one of {', '.join(REMOTE_COLLECTOR_BACKENDS)}; got {self.collector_backend!r}."
            )
        if self.ray_address and self.collector_backend != "ray":
            raise ValueError(
                f"ray_address {self.ray_address!r} names a Ray cluster, which collector_backend "
                f"{self.collector_backend!r} does not use; set collector_backend to 'ray' (waddle train does when "
                "--ray-address is given)."
            )
        split_envs(self.num_envs, self.collectors)

    @property
    def remote_collectors(self) -> bool:
        """Whether the envs step outside the training process (several collectors, or Ray)."""
        return self.collectors > 1 or self.collector_backend == "ray"


@dataclass
class RunResult:
    """How :meth:`Runner.run` ended."""

    status: str
    """``"finished"``, ``"interrupted"`` (Ctrl-C), ``"non-finite"`` (a NaN/inf loss) or ``"collector-died"``
    (a collector process or actor stopped)."""
    message: str
    """One line for the user."""
    env_steps: int
    """Env steps trained when the loop stopped."""
    checkpoint_env_steps: int | None
    """Env steps of the checkpoint on disk (``None`` when none was written)."""
    last_metrics: dict[str, float] = field(default_factory=dict)
    """The last iteration's row."""


def non_finite_losses(metrics: Mapping[str, float]) -> list[str]:
    """Names of the ``losses/*`` entries of ``metrics`` that are NaN or infinite.

    Example:
        >>> non_finite_losses({"losses/value_loss": float("nan"), "charts/episode_return": float("nan")})
        ['losses/value_loss']
    """
    return [key for key, value in metrics.items() if key.startswith("losses/") and not math.isfinite(value)]


def state_is_finite(state: Any) -> bool:
    """Whether every floating tensor in a (nested) state dict is finite."""
    if isinstance(state, torch.Tensor):
        return not state.is_floating_point() or bool(torch.isfinite(state).all())
    if isinstance(state, Mapping):
        return all(state_is_finite(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return all(state_is_finite(value) for value in state)
    return True


def read_metrics(path: str | Path) -> tuple[list[str], list[dict[str, float]]]:
    """The header and rows of a ``metrics.csv`` (values as floats; empty cells as NaN)."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return [], []
    with open(path, newline="") as file:
        reader = csv.DictReader(file)
        header = list(reader.fieldnames or [])
        rows = [{key: _to_float(value) for key, value in row.items() if key is not None} for row in reader]
    return header, rows


def _to_float(value: str | None) -> float:
    try:
        return float(value) if value not in (None, "") else math.nan
    except ValueError:
        return math.nan


def largest_reward_terms(rows: list[Mapping[str, float]], count: int = PLOTTED_REWARD_TERMS) -> list[str]:
    """The ``reward/<term>`` columns of ``rows`` with the largest mean absolute value (NaNs
    skipped), largest first; at most ``count``, none that are zero throughout.

    Example:
        >>> rows = [{"reward/upright": 1.0, "reward/pose": -3.0, "reward/jump": 0.0},
        ...         {"reward/upright": 2.0, "reward/pose": -1.0, "reward/jump": 0.0}]
        >>> largest_reward_terms(rows, count=2)
        ['reward/pose', 'reward/upright']
    """
    sizes: dict[str, list[float]] = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith(REWARD_TERM_PREFIX) and math.isfinite(value):
                sizes.setdefault(key, []).append(abs(value))
    means = {key: sum(values) / len(values) for key, values in sizes.items()}
    ranked = sorted((key for key in means if means[key] > 0), key=lambda key: -means[key])
    return ranked[:count]


def plot_curve(rows: list[Mapping[str, float]], path: str | Path, *, title: str = "") -> None:
    """Draw episode return and length against env steps to ``path`` (PNG, written atomically).

    Falls back to the mean reward per step when the rows carry no episode return.
    When the rows hold ``reward/<term>`` columns, a third panel draws the
    :func:`largest_reward_terms`.
    """
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    steps = [row["env_steps"] for row in rows]
    has_return = any(math.isfinite(row.get(RETURN_KEY, math.nan)) for row in rows)
    panels = [
        ([RETURN_KEY] if has_return else [REWARD_KEY], "episode return" if has_return else "reward per step"),
        ([LENGTH_KEY], "episode length (steps)"),
    ]
    terms = largest_reward_terms(rows)
    if terms:
        panels.append((terms, "reward terms per step"))
    figure = Figure(figsize=(7, 3 * len(panels)), tight_layout=True)
    for index, (keys, label) in enumerate(panels):
        axes = figure.add_subplot(len(panels), 1, index + 1)
        for key in keys:
            values = [row.get(key, math.nan) for row in rows]
            color = None if len(keys) > 1 else ("tab:blue" if index == 0 else "tab:orange")
            axes.plot(steps, values, color=color, label=key[len(REWARD_TERM_PREFIX) :] if len(keys) > 1 else None)
        if len(keys) > 1:
            axes.legend(fontsize="small", loc="best")
        axes.set_ylabel(label)
        axes.grid(alpha=0.3)
        if index == len(panels) - 1:
            axes.set_xlabel("env steps")
        elif title:
            axes.set_title(title)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    atomic_write(path, lambda file: file.write(buffer.getvalue()))


class Runner:
    """Drive ``trainer`` to ``total_steps`` env steps, writing its outputs under ``out_dir``.

    Args:
        trainer: a :class:`~waddle.algorithms.trainer.Trainer`; each
            ``train_iteration`` counts ``trainer.steps_per_iteration`` env steps.
        out_dir: output directory (created).
        algo: the algorithm's name, stored in the checkpoint.
        config: the full run configuration (JSON-like), stored in the
            checkpoint and ``config.json``.
        total_steps: env-step budget, counted across resumes.
        checkpoint_every: iterations between checkpoints.
        plot_every_s: minimum seconds between curve redraws.
        progress: show a tqdm progress bar (on stderr).
        logger: a TorchRL logger that also gets each row's scalars, at step
            ``env_steps`` (the caller closes it).
        before_iteration: called with the env steps done before each
            iteration (a curriculum's hook); the scalars it returns join
            that iteration's row.

    Example:
        >>> from waddle.algorithms.ppo import PPO, PPOConfig
        >>> from waddle.algorithms.presets import make_env
        >>> trainer = PPO(make_env("standing", num_envs=4, seed=0, num_threads=1), PPOConfig(num_steps=8))
        >>> runner = Runner(trainer, "runs/x", algo="ppo", config={"task": "standing"}, total_steps=64, progress=False)
        >>> result = runner.run()  # two iterations of 4 envs x 8 steps
        >>> result.status, result.env_steps, sorted(path.name for path in runner.out_dir.iterdir())
        ('finished', 64, ['checkpoint.pt', 'config.json', 'curve.png', 'metrics.csv'])
    """

    def __init__(
        self,
        trainer: Trainer,
        out_dir: str | Path,
        *,
        algo: str,
        config: Mapping[str, Any],
        total_steps: int,
        checkpoint_every: int = 10,
        plot_every_s: float = 20.0,
        progress: bool = True,
        logger: Logger | None = None,
        before_iteration: Callable[[int], Mapping[str, float]] | None = None,
    ) -> None:
        self.trainer = trainer
        self.before_iteration = before_iteration
        self.out_dir = Path(out_dir)
        self.algo = algo
        self.config = dict(config)
        self.total_steps = int(total_steps)
        self.steps_per_iteration = int(trainer.steps_per_iteration)
        self.checkpoint_every = int(checkpoint_every)
        self.plot_every_s = float(plot_every_s)
        self.progress = progress
        self.logger = logger
        self.iteration = 0
        self.env_steps = 0
        self.wall_time_s = 0.0
        self.checkpoint_env_steps: int | None = None
        self.history: list[dict[str, float]] = []
        self._header: list[str] | None = None

    @property
    def checkpoint_path(self) -> Path:
        return self.out_dir / CHECKPOINT_FILE

    @property
    def metrics_path(self) -> Path:
        return self.out_dir / METRICS_FILE

    # ------------------------------------------------------------------
    # Resume
    # ------------------------------------------------------------------

    def restore(self, checkpoint: Mapping[str, Any]) -> None:
        """Continue from a loaded checkpoint: trainer state, counters and the metrics so far.

        Rows of ``metrics.csv`` past the checkpoint's iteration (logged after
        the last save by a run that was then stopped) are dropped, so the file
        stays one row per trained iteration.
        """
        self.trainer.load_state_dict(checkpoint["trainer"])
        self.iteration = int(checkpoint["iteration"])
        self.env_steps = int(checkpoint["env_steps"])
        self.wall_time_s = float(checkpoint.get("wall_time_s", 0.0))
        self.checkpoint_env_steps = self.env_steps
        header, rows = read_metrics(self.metrics_path)
        kept = [row for row in rows if row.get("iteration", math.inf) <= self.iteration]
        if len(kept) != len(rows):
            self._rewrite_metrics(header, kept)
        self.history = kept
        self._header = header or None

    def _rewrite_metrics(self, header: list[str], rows: list[dict[str, float]]) -> None:
        def write(file) -> None:
            writer = csv.DictWriter(file, fieldnames=header, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)

        atomic_write(self.metrics_path, write, mode="w")

    # ------------------------------------------------------------------
    # Outputs
    # ------------------------------------------------------------------

    def write_config(self) -> None:
        """Write ``config.json`` (atomically)."""
        text = json.dumps({"algo": self.algo, **self.config}, indent=2, sort_keys=False) + "\n"
        atomic_write(self.out_dir / CONFIG_FILE, lambda file: file.write(text), mode="w")

    def save(self) -> None:
        """Write ``checkpoint.pt`` unless the trainer state holds a NaN or infinity."""
        state = self.trainer.state_dict()
        if not state_is_finite(state):
            raise FloatingPointError("the trainer state is not finite; the previous checkpoint was kept.")
        save_checkpoint(
            self.checkpoint_path,
            algo=self.algo,
            config=self.config,
            trainer_state=state,
            env_steps=self.env_steps,
            iteration=self.iteration,
            wall_time_s=self.wall_time_s,
        )
        self.checkpoint_env_steps = self.env_steps

    def plot(self) -> None:
        """Redraw ``curve.png`` from the rows so far."""
        if self.history:
            title = f"{self.algo} on {self.config.get('run', {}).get('task', '')}".strip()
            plot_curve(self.history, self.out_dir / CURVE_FILE, title=title)

    def _log(self, row: dict[str, float]) -> None:
        if self._header is None:
            self._header = list(row)
        new_file = not self.metrics_path.exists() or self.metrics_path.stat().st_size == 0
        with open(self.metrics_path, "a", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=self._header, extrasaction="ignore")
            if new_file:
                writer.writeheader()
            writer.writerow(row)
        self.history.append(row)
        if self.logger is not None:
            step = int(row["env_steps"])
            for key, value in row.items():
                if key not in ("iteration", "env_steps"):
                    self.logger.log_scalar(key, value, step=step)

    # ------------------------------------------------------------------
    # The loop
    # ------------------------------------------------------------------

    def run(self) -> RunResult:
        """Train until ``total_steps``, Ctrl-C or a non-finite loss; see :class:`RunResult`."""
        from tqdm.auto import tqdm

        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.write_config()
        bar = tqdm(
            total=self.total_steps,
            initial=min(self.env_steps, self.total_steps),
            unit="step",
            unit_scale=True,
            dynamic_ncols=True,
            disable=not self.progress,
            desc=f"{self.algo}",
        )
        last_plot = time.monotonic()
        row: dict[str, float] = self.history[-1] if self.history else {}
        try:
            while self.env_steps < self.total_steps:
                start = time.perf_counter()
                schedule = dict(self.before_iteration(self.env_steps)) if self.before_iteration else {}
                try:
                    metrics = self.trainer.train_iteration()
                except FloatingPointError as err:  # e.g. PPO's NonFiniteLossError, raised before its step
                    return self._stopped("non-finite", str(err), bar)
                except CollectorDiedError as err:  # the iteration's batch is lost; the checkpoint is whole
                    return self._stopped("collector-died", str(err), bar)
                bad = non_finite_losses(metrics)
                if bad:
                    values = ", ".join(f"{key}={metrics[key]}" for key in bad)
                    reason = f"non-finite loss at iteration {self.iteration + 1}: {values}."
                    return self._stopped("non-finite", reason, bar)
                elapsed = time.perf_counter() - start
                self.iteration += 1
                self.env_steps += self.steps_per_iteration
                self.wall_time_s += elapsed
                row = {
                    "iteration": self.iteration,
                    "env_steps": self.env_steps,
                    "wall_time_s": round(self.wall_time_s, 3),
                    "steps_per_second": round(self.steps_per_iteration / max(elapsed, 1e-9), 1),
                    **{key: float(value) for key, value in metrics.items()},
                    **{key: float(value) for key, value in schedule.items()},
                }
                self._log(row)
                bar.update(min(self.env_steps, self.total_steps) - bar.n)
                bar.set_postfix(_postfix(row), refresh=False)
                if self.iteration % self.checkpoint_every == 0:
                    try:
                        self.save()
                    except FloatingPointError as err:
                        return self._stopped("non-finite", str(err), bar)
                if time.monotonic() - last_plot >= self.plot_every_s:
                    self.plot()
                    last_plot = time.monotonic()
            try:
                self.save()
            except FloatingPointError as err:
                return self._stopped("non-finite", str(err), bar)
            self.plot()
        except KeyboardInterrupt:
            return self._stopped("interrupted", "interrupted", bar)
        finally:
            bar.close()
        message = f"trained {self.env_steps} env steps"
        return RunResult("finished", message, self.env_steps, self.checkpoint_env_steps, row)

    def _stopped(self, status: str, reason: str, bar: Any) -> RunResult:
        bar.close()
        if self.checkpoint_env_steps is None:
            kept = "no checkpoint was written yet"
        else:
            kept = f"{self.checkpoint_path} (step {self.checkpoint_env_steps}) is kept"
        try:
            self.plot()
        except KeyboardInterrupt:
            pass
        message = f"{reason.rstrip('.')}; stopped at step {self.env_steps}, {kept}."
        last = self.history[-1] if self.history else {}
        return RunResult(status, message, self.env_steps, self.checkpoint_env_steps, last)


def _postfix(row: Mapping[str, float]) -> dict[str, str]:
    def fmt(value: float, spec: str) -> str:
        return format(value, spec) if math.isfinite(value) else "-"

    postfix = {}
    if RETURN_KEY in row:
        postfix["return"] = fmt(row[RETURN_KEY], ".2f")
    elif REWARD_KEY in row:
        postfix["reward"] = fmt(row[REWARD_KEY], ".3f")
    if LENGTH_KEY in row:
        postfix["ep_len"] = fmt(row[LENGTH_KEY], ".0f")
    postfix["sps"] = fmt(row["steps_per_second"], ".0f")
    return postfix
