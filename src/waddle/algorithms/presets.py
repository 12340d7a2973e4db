"""Names the CLI and the benchmarks accept: tasks, algorithms and backends.

Each name maps to one thing, built by one function, so ``waddle train``,
``waddle eval`` and ``benchmarks/learning.py`` build envs and trainers the
same way:

* :data:`TASK_RECIPES`: ``--task`` name -> the MicroDuck task library it trains
  on and the defaults a new run of it takes (:data:`TASKS`: the libraries alone);
* :data:`ALGORITHMS`: ``--algo`` name -> trainer and config classes, and the
  run defaults the algorithm needs;
* :func:`make_env` and :func:`make_trainer`.

:mod:`waddle.algorithms.run_plan` applies the defaults, in one order, to resolve a run.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch

from waddle.algorithms.trainer import Trainer
from waddle.collectors.rollout import split_envs
from waddle.envs.microduck import MicroDuckEnv, MicroDuckTask
from waddle.envs.microduck.randomization import PRESETS as RANDOMIZATION_PRESETS
from waddle.envs.microduck.randomization import MicroDuckRandomization
from waddle.envs.microduck.rewards import REWARD_TERMS, check_weights
from waddle.envs.microduck.tasks import SPEED_RANGE_PRIOR, WALKING_PRIOR
from waddle.physics import BACKENDS as PHYSICS_BACKENDS
from waddle.physics import backend_class, differentiable_backends

WALK_SPEED = 0.2
"""Forward speed, m/s, of the ``walk`` task (the learning benchmark's walking target)."""

JUMP_MIX_WEIGHT = 3.0
"""Draw weight of the jump row in ``jump-mix`` (the others weigh 1), as in the reference's recipe."""

WALKING_STEPS = 6_000_000
"""Step budget of a new run of the walking tasks (``walk``, ``speed-range``, ``sidestep``): walking takes
longer than standing. The figures behind it, with the command that measures them: docs/microduck.md,
"Step budgets of the recipes"."""

WALKING_MIRROR_LOSS = {"ppo": {"mirror_loss_coef": 0.3}}
"""PPO's mirror loss on the tasks that walk forward: a symmetric robot's straight gait is its own mirror
image, and the loss keeps a policy's heading from drifting (docs/microduck.md, "Walking straight: the
mirror loss")."""


JOYSTICK_STEPS = 14_000_000
"""The joystick recipe's step budget: 40-60 minutes on 2 idle CPU cores (3,600-6,000 steps/s, by the
machine; the slowest so far reached 13.1M in an hour), within the hour of training the robot issue allows
(docs/deploy.md, "The robot's own contract").
At 12M the runs' progress and tracking terms were still rising."""

JOYSTICK_PRIOR_FADE_STEPS = 6_000_000
"""Env steps over which the joystick recipe's gait prior fades out. Without one, nothing pays for a step
until the policy lands one, and a clock-free policy settles on standing; on the prior's swing-leg lift it
steps from the first iterations, and as the lift fades the network, which sees its legs move but no clock,
has to lift them itself (docs/deploy.md has the runs that showed it)."""

JOYSTICK_ACTION_SCALE = 0.7
"""Radians of servo target per unit of action of the joystick recipe: the gamepad runtime's own default, so
a robot whose config overrides the policy's ``action_scale`` with its default still drives what was trained."""


ROBOT_CONTRACT_ALGORITHMS = {"ppo": {"mirror_loss_coef": 0.3, "actor_observation": "robot", "init_log_std": -1.0}}
"""PPO's fields shared by the recipes on the robot's contract: the robot's observation, the mirror loss, a
narrow initial policy."""

JOYSTICK_HEADING_MEMORY_S = 5.0
"""Time constant, s, of the joystick recipe's heading memory (``PPOConfig.heading_memory_s``; ``--heading-memory-s
0`` trains without one)."""

JOYSTICK_ALGORITHMS = {"ppo": {**ROBOT_CONTRACT_ALGORITHMS["ppo"], "heading_memory_s": JOYSTICK_HEADING_MEMORY_S}}
"""PPO's fields of the joystick recipe: the robot's contract with a heading memory on the head's roll. With the
memory and the ``target_past_range`` cost, at 14M env steps, seed 1 met every target of the robot issue and
seed 0 walked at 0.11 m/s and kept 92-100 % of its robots (on another machine seed 0 walked at 0.198 and missed
one row); without the memory no file held its heading within 30 degrees (docs/deploy.md)."""

GETUP_ALGORITHMS = {"ppo": {**ROBOT_CONTRACT_ALGORITHMS["ppo"], "init_log_std": -0.5, "entropy_coef": 0.01}}
"""PPO's fields of the getup recipe: the robot's contract as the joystick's, with a wider initial policy and
an entropy bonus (rsl_rl's 0.01). Without them the first get-up run's action std fell from 0.37 to 0.2 within
1.6M steps, before any robot had found its feet, and it settled propped half up on its belly."""

GETUP_STEPS = 18_000_000
"""The getup recipe's step budget, about 80 minutes on 2 cores (3,700 steps/s with the limb boxes)."""

JOYSTICK_GETUP_STEPS = 20_000_000
"""The joystick-getup recipe's step budget: walking and getting up in one policy, within the 90 minutes of
training on 2 cores the get-up issue allows."""

GETUP_ACTION_SCALE = 1.0
"""Radians of servo target per unit of action of the get-up recipes: upstream's training scale (the file's
metadata carries it to the robot). At the joystick's 0.7 the servos' reach is short for a get-up:
``benchmarks/getup_feasibility.py`` (256 random open-loop patterns per start, seed 0) got a robot at most 7 %
of the way up from its back at 0.7, 10-18 % at 1.0 and 39-49 % at 1.5 from its back or front."""

GETUP_REFERENCE_START_FRACTION = 0.5
"""Share of the get-up recipes' episodes on the floor that start at a state along a scripted get-up
(``reference_start_fraction``) instead of a drop. From drops alone PPO met no state on the way up in 9.7M
steps; the reference starts show it the whole way, from lying to standing, from the first iteration."""

GETUP_RUN = {
    "total_steps": GETUP_STEPS,
    "randomization": "upstream",
    "action_mode": "robot",
    "action_scale": GETUP_ACTION_SCALE,
    "max_episode_steps": 1000,
}
"""Run fields of the get-up recipes: the robot's contract under upstream's randomization, 20 s episodes
(``getup`` shortens them to 10 s: every episode starts on the floor, and a get-up takes seconds)."""


@dataclass(frozen=True)
class TaskRecipe:
    """What a ``--task`` name stands for: the task library its env draws from, and the values a new run of
    it takes where the user gives no flag (a flag always wins; see :mod:`waddle.algorithms.run_plan`)."""

    library: Callable[[], list[MicroDuckTask]]
    """Returns the task library, a list of task rows."""
    run: Mapping[str, Any] = field(default_factory=dict)
    """Run-config (``TrainConfig``) fields: the step budget (``total_steps``), and what the env is
    (``randomization``, ``action_mode``, ``action_scale``, ``max_episode_steps``, ``push_scale``, ...)."""
    algorithms: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """``--algo`` -> fields of that algorithm's config (``PPOConfig``, ...), e.g. PPO's ``mirror_loss_coef``
    or ``actor_observation``; another algorithm is handed none of them."""

    def __post_init__(self) -> None:  # read-only views: the table is shared by every run
        object.__setattr__(self, "run", MappingProxyType(dict(self.run)))
        fields = {algo: MappingProxyType(dict(values)) for algo, values in self.algorithms.items()}
        object.__setattr__(self, "algorithms", MappingProxyType(fields))


TASK_RECIPES: dict[str, TaskRecipe] = {
    "standing": TaskRecipe(lambda: [MicroDuckEnv.standing_task()]),
    "walk": TaskRecipe(
        lambda: [MicroDuckEnv.tracking_task(WALK_SPEED, **WALKING_PRIOR)],
        run={"total_steps": WALKING_STEPS},
        algorithms=WALKING_MIRROR_LOSS,
    ),
    "speed-range": TaskRecipe(
        lambda: [MicroDuckEnv.speed_range_task(0.1, 0.3, **SPEED_RANGE_PRIOR)],
        run={"total_steps": WALKING_STEPS},
        algorithms=WALKING_MIRROR_LOSS,
    ),
    "sidestep": TaskRecipe(
        lambda: [MicroDuckEnv.sidestep_task(0.15, **WALKING_PRIOR)], run={"total_steps": WALKING_STEPS}
    ),
    "jump": TaskRecipe(lambda: [MicroDuckEnv.jump_task()]),
    "mix": TaskRecipe(
        lambda: [
            MicroDuckEnv.standing_task(),
            MicroDuckEnv.tracking_task(WALK_SPEED, **WALKING_PRIOR),
            MicroDuckEnv.sidestep_task(0.15, **WALKING_PRIOR),
            MicroDuckEnv.jump_task(),
        ]
    ),
    # The reference's jump recipe: started from a walking policy, the jump row drawn three times as often.
    "jump-mix": TaskRecipe(
        lambda: [
            MicroDuckEnv.tracking_task(WALK_SPEED, **WALKING_PRIOR),
            MicroDuckEnv.standing_task(),
            MicroDuckEnv.jump_task(weight=JUMP_MIX_WEIGHT),
        ]
    ),
    # The robot's own contract: a twist from a gamepad, no clock, no prior. It trains what the robot runs:
    # under upstream's randomization, with the robot's observation and action law, on 20 s episodes (as long
    # as the evaluation's).
    "joystick": TaskRecipe(
        lambda: [MicroDuckEnv.joystick_task(**WALKING_PRIOR)],
        run={
            "total_steps": JOYSTICK_STEPS,
            "gait_prior_fade_steps": JOYSTICK_PRIOR_FADE_STEPS,
            "randomization": "upstream",
            "action_mode": "robot",
            "action_scale": JOYSTICK_ACTION_SCALE,
            "max_episode_steps": 1000,
        },
        algorithms=JOYSTICK_ALGORITHMS,
    ),
    # Getting up, on the same contract: episodes that start on the floor and go on after a fall.
    "getup": TaskRecipe(
        lambda: [MicroDuckEnv.getup_task(reference_start_fraction=GETUP_REFERENCE_START_FRACTION)],
        run={**GETUP_RUN, "max_episode_steps": 500},
        algorithms=GETUP_ALGORITHMS,
    ),
    "joystick-getup": TaskRecipe(
        lambda: [
            MicroDuckEnv.joystick_getup_task(reference_start_fraction=GETUP_REFERENCE_START_FRACTION, **WALKING_PRIOR)
        ],
        run={**GETUP_RUN, "total_steps": JOYSTICK_GETUP_STEPS, "gait_prior_fade_steps": JOYSTICK_PRIOR_FADE_STEPS},
        algorithms=ROBOT_CONTRACT_ALGORITHMS,
    ),
}
"""``--task`` name -> its :class:`TaskRecipe`: the one table of what each task is and brings to a new run.
The walking recipes add the gait prior (``WALKING_PRIOR``) that TorchRL's factories leave out."""

TASKS: dict[str, Callable[[], list[MicroDuckTask]]] = {name: recipe.library for name, recipe in TASK_RECIPES.items()}
"""``--task`` name -> a function returning the task library of that name (the recipes' libraries)."""


def task_recipe(name: str) -> TaskRecipe:
    """The :class:`TaskRecipe` of ``--task`` ``name``.

    Raises:
        ValueError: ``name`` is not a task, naming the tasks there are.
    """
    _choice("task", name, TASK_RECIPES)
    return TASK_RECIPES[name]


BACKENDS: tuple[str, ...] = tuple(PHYSICS_BACKENDS)
"""``--backend`` names: the physics backends MicroDuckEnv can run on."""


@dataclass(frozen=True)
class Algorithm:
    """Where an ``--algo`` name's trainer lives and what env it needs."""

    module: str
    """Module holding the trainer and its config."""
    trainer: str
    """Trainer class name: ``Trainer(env, config, device)``."""
    config: str
    """Config dataclass name."""
    differentiable: bool
    """Whether the trainer backpropagates through the env (``requires_grad=True``)."""
    run_defaults: Mapping[str, Any] = field(default_factory=dict)
    """Run-config (``TrainConfig``) fields a new run with this algorithm takes when their flags are left
    out; they win over the task recipe's (an algorithm's needs, such as a differentiable backend, come first)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "run_defaults", MappingProxyType(dict(self.run_defaults)))

    def classes(self) -> tuple[type, type]:
        """``(trainer class, config class)``, imported on demand."""
        module = importlib.import_module(self.module)
        return getattr(module, self.trainer), getattr(module, self.config)


ALGORITHMS: dict[str, Algorithm] = {
    "ppo": Algorithm("waddle.algorithms.ppo", "PPO", "PPOConfig", differentiable=False),
    "shac": Algorithm(
        "waddle.algorithms.shac",
        "SHAC",
        "SHACConfig",
        differentiable=True,
        run_defaults={"backend": "mjx", "num_envs": 8, "max_episode_steps": 128, "total_steps": 25_600},
    ),
    "apg": Algorithm("waddle.algorithms.apg", "APG", "APGConfig", differentiable=True, run_defaults={"backend": "mjx"}),
}
"""``--algo`` name -> its trainer and run defaults.

The analytic-gradient trainers need a differentiable backend: MJX, whose differentiable step simulates
the robot ``mujoco`` does. SHAC on ``standing`` (``benchmarks/learning.py --parts shac``;
docs/differentiable.md, "SHAC on the MicroDuck"):

- 8 envs: a 32-step window is one actor update per 256 env steps. Per env step, 8 envs stood sooner
  and fell back less than 16 or 32 (more updates from the same steps);
- 128-step training episodes: the policy keeps meeting the first second after a reset, where a
  standing policy trained on 500-step episodes forgot how to catch itself;
- 25,600 env steps: 100 windows, over which the learning rates fall to zero (``SHACConfig.lr_schedule``)."""


def algorithm(name: str) -> Algorithm:
    """The :class:`Algorithm` of ``--algo`` ``name``.

    Raises:
        ValueError: ``name`` is not an algorithm, naming the algorithms there are.
    """
    _choice("algorithm", name, ALGORITHMS)
    return ALGORITHMS[name]


def _choice(kind: str, name: str, choices: Mapping[str, Any] | tuple[str, ...]) -> None:
    if name not in choices:
        raise ValueError(f"unknown {kind} {name!r}; choose one of {', '.join(choices)}.")


def make_env(
    task: str,
    *,
    num_envs: int,
    seed: int | None = 0,
    backend: str = "mujoco",
    differentiable: bool = False,
    device: torch.device | str = "cpu",
    command: tuple[float, ...] | None = None,
    reference_starts: bool = True,
    reward_weights: Mapping[str, float] | None = None,
    **kwargs: Any,
) -> MicroDuckEnv:
    """The MicroDuck env of ``--task`` ``task`` on ``backend``.

    Args:
        task: a key of :data:`TASKS`.
        num_envs: batch size.
        seed: the env generator's seed.
        backend: a name in :data:`BACKENDS`.
        differentiable: build it with ``requires_grad=True`` (needs a
            backend whose class is differentiable, see
            :func:`waddle.physics.differentiable_backends`).
        device: torch device of the env.
        command: when given, every task of the library gets this fixed
            twist instead of its own box: ``(vx, vy)`` or ``(vx, vy, vyaw)``
            (``waddle eval --command``), held for the whole episode; the rest
            of each task (reward, gait clock and prior) is unchanged.
        reference_starts: ``False`` sets every task's ``reference_start_fraction``
            to 0, so every episode that starts on the floor starts with a drop
            (``waddle eval``: a get-up is judged from the floor, not from half-way up).
        reward_weights: term name -> weight, over every task row's own weights
            (``waddle train --reward-weights``; see :func:`reweighted`).
        **kwargs: forwarded to :class:`MicroDuckEnv` (``randomization``: a name of
            :data:`RANDOMIZATIONS`, or anything that class takes).
    """
    _choice("task", task, TASKS)
    _choice("backend", backend, BACKENDS)
    if isinstance(kwargs.get("randomization"), str):
        _choice("randomization", kwargs["randomization"], RANDOMIZATIONS)
    if differentiable:
        # Only the asked-for backend is imported here: reading every class's flag
        # at import time would load JAX and mujoco-torch for every CLI call.
        if not backend_class(backend).differentiable:
            raise ValueError(
                f"backend {backend!r} is not differentiable; gradient-based training needs one of "
                f"{', '.join(differentiable_backends())}."
            )
        kwargs["requires_grad"] = True
    tasks = TASKS[task]()
    if command is not None:
        tasks = [fixed_command(row, command) for row in tasks]
    if not reference_starts:
        tasks = [without_reference_starts(row) for row in tasks]
    if reward_weights:
        tasks = [reweighted(row, reward_weights) for row in tasks]
    return MicroDuckEnv(tasks=tasks, num_envs=num_envs, seed=seed, backend=backend, device=device, **kwargs)


def without_reference_starts(task: MicroDuckTask) -> MicroDuckTask:
    """A copy of ``task`` whose episodes on the floor all start with a drop (``reference_start_fraction`` 0)."""
    row = task.clone()
    row.reference_start_fraction = torch.tensor(0.0)
    return row


def fixed_command(task: MicroDuckTask, command: tuple[float, ...]) -> MicroDuckTask:
    """A copy of ``task`` that commands the twist ``(vx, vy)`` or ``(vx, vy, vyaw)`` for whole episodes:
    its box and yaw range shrunk to the point, no standing, turning or sidestep shares, no new commands.

    Raises:
        ValueError: ``command`` does not hold 2 or 3 finite numbers.
    """
    values = [float(value) for value in command]
    if len(values) not in (2, 3) or not all(math.isfinite(value) for value in values):
        raise ValueError(f"command must be 2 or 3 finite numbers (vx vy [vyaw]), got {list(command)!r}.")
    vx, vy, vyaw = (values + [0.0])[:3]
    row = task.clone()
    row.command_low = torch.tensor([vx, vy])
    row.command_high = torch.tensor([vx, vy])
    row.yaw_rate_range = torch.tensor([vyaw, vyaw])
    row.turn_in_place_fraction = torch.tensor(0.0)
    row.sidestep_fraction = torch.tensor(0.0)
    row.standing_fraction = torch.tensor(0.0)
    row.command_resample_s = torch.tensor([0.0, 0.0])
    return row


def reweighted(task: MicroDuckTask, weights: Mapping[str, float]) -> MicroDuckTask:
    """A copy of ``task`` whose reward terms named in ``weights`` take those weights; the others keep the task's.

    Raises:
        ValueError: a name is not a registered term (naming those there are), or a weight is not a finite number.
    """
    check_weights(weights)
    row = task.clone()
    names = list(REWARD_TERMS)
    for name, value in weights.items():
        row.reward_weights[names.index(name)] = float(value)
    return row


COLLECTOR_SEED_STRIDE = 1_000_003
"""Collector ``i`` of a run seeded ``s`` seeds its env and its sampling with ``s + i * COLLECTOR_SEED_STRIDE``:
apart from each other and from the ``s + iteration`` seeds a resumed run starts from."""


@dataclass(frozen=True)
class CollectorEnv:
    """What one collector process builds: :func:`make_env` of these arguments, with torch seeded first.

    Picklable (plain fields), so TorchRL can ship it to a process or a Ray
    actor; calling it there builds the env and seeds the worker's sampling.
    """

    task: str
    num_envs: int
    seed: int
    num_threads: int
    options: tuple[tuple[str, Any], ...] = ()
    """Further :func:`make_env` keyword arguments, as ``(name, value)`` pairs."""

    def __call__(self) -> MicroDuckEnv:
        torch.manual_seed(self.seed)  # the worker's action noise
        return make_env(
            self.task, num_envs=self.num_envs, seed=self.seed, num_threads=self.num_threads, **dict(self.options)
        )


@dataclass(frozen=True)
class CollectorSplit:
    """How a run's envs are shared among its collectors: the same number each, their physics threads and seeds."""

    envs_each: int
    """Envs each collector steps: ``num_envs / collectors``."""
    physics_threads_each: int
    """Physics threads of each collector's env: ``cores / collectors``, at least one."""
    seeds: tuple[int, ...]
    """Collector ``i``'s seed: ``seed + i * COLLECTOR_SEED_STRIDE``."""

    @classmethod
    def of(cls, *, num_envs: int, collectors: int, seed: int, cores: int) -> CollectorSplit:
        """The split of ``num_envs`` envs among ``collectors`` sharing ``cores`` cores, from ``seed``.

        Raises:
            ValueError: ``collectors`` does not split ``num_envs`` evenly (see
                :func:`waddle.collectors.rollout.split_envs`).
        """
        each = split_envs(num_envs, collectors)
        seeds = tuple(seed + index * COLLECTOR_SEED_STRIDE for index in range(collectors))
        return cls(each, max(1, cores // collectors), seeds)

    def envs(self, task: str, **kwargs: Any) -> list[CollectorEnv]:
        """One :class:`CollectorEnv` of ``task`` per collector; ``kwargs`` go to each :func:`make_env`."""
        _choice("task", task, TASKS)
        options = tuple(sorted(kwargs.items()))
        return [CollectorEnv(task, self.envs_each, seed, self.physics_threads_each, options) for seed in self.seeds]


def collector_envs(
    task: str, *, num_envs: int, collectors: int, seed: int, cores: int, **kwargs: Any
) -> list[CollectorEnv]:
    """One :class:`CollectorEnv` per collector, as :class:`CollectorSplit` shares ``num_envs`` and ``cores``.

    Raises:
        ValueError: ``collectors`` does not split ``num_envs`` evenly (see
            :func:`waddle.collectors.rollout.split_envs`), or ``task`` is unknown.

    Example:
        >>> [(e.num_envs, e.seed, e.num_threads) for e in collector_envs("walk", num_envs=8, collectors=2, seed=0, cores=2)]
        [(4, 0, 1), (4, 1000003, 1)]
    """
    _choice("task", task, TASKS)
    return CollectorSplit.of(num_envs=num_envs, collectors=collectors, seed=seed, cores=cores).envs(task, **kwargs)


RENAMED_FIELDS: dict[str, dict[str, str]] = {
    "ppo": {"actor_hidden": "actor_hidden_sizes", "critic_hidden": "critic_hidden_sizes"},
    "shac": {
        "lam": "gae_lambda",
        "actor_lr": "learning_rate",
        "critic_lr": "critic_learning_rate",
        "critic_iterations": "num_epochs",
        "critic_minibatches": "num_minibatches",
    },
}
"""Per ``--algo``: config field name of checkpoints written before the three configs
shared one vocabulary -> its name now. PPO's ``init_std`` became ``init_log_std``
(its logarithm)."""

ADDED_FIELDS: dict[str, Any] = {"task_embedding_dim": 0}
"""Config fields added since checkpoints were first written -> the value that reproduces what
a checkpoint without the field was trained with (no field: no task conditioning)."""

ADDED_ALGORITHM_FIELDS: dict[str, dict[str, Any]] = {
    "ppo": {"actor_observation": "full", "overlap_rollout": False, "mirror_loss_coef": 0.0},
    "shac": {"lr_schedule": "constant", "lr_decay_steps": 25_600},
}
"""As :data:`ADDED_FIELDS`, per ``--algo`` for the fields only that algorithm has (no
``actor_observation``: the actor read the full observation; no ``mirror_loss_coef``: no mirror loss)."""

ADDED_RUN_FIELDS: dict[str, Any] = {
    "randomization": "none",
    "push_scale": 1.0,
    "sensor_history": 1,
    "action_scale": 0.35,
    "max_episode_steps": 500,
    "collectors": 1,
    "collector_backend": "process",
    "ray_address": "",
    "action_mode": "residual",
    "gait_prior_fade_steps": 0,
    "push_ramp_steps": 0,
    "lift_assist": 0.0,
    "lift_assist_fade_steps": 0,
    "reward_weights": {},
}
"""Run-config (``TrainConfig``) fields added since checkpoints were first written -> the value
a checkpoint without the field was trained with (no field: no randomization)."""

RANDOMIZATIONS: tuple[str, ...] = tuple(RANDOMIZATION_PRESETS)
"""``--randomization`` names: presets of :class:`~waddle.envs.microduck.MicroDuckRandomization`."""


def training_randomization(name: str, push_scale: float = 1.0) -> str | MicroDuckRandomization:
    """What a training env draws: the preset ``name``, its pushes ``push_scale`` times as hard.

    A scale of 1 gives the name itself: the preset's own pushes.

    Raises:
        ValueError: ``name`` is not a preset, ``push_scale`` is not a finite
            number > 0, or it is not 1 and the preset does not push.

    Example:
        >>> [round(v, 9) for v in training_randomization("upstream", 1.5).push_velocity]
        [-0.45, 0.45]
    """
    _choice("randomization", name, RANDOMIZATIONS)
    if push_scale == 1.0:
        return name
    return MicroDuckRandomization.preset(name).with_pushes_scaled(push_scale)


ACTOR_OBSERVATIONS: tuple[str, ...] = ("full", "sensors", "robot")
"""``--actor-observation`` names: what a PPO actor reads (see ``waddle.algorithms.ppo.ACTOR_OBSERVATIONS``)."""


def upgrade_config_fields(algo: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` (an algorithm config as a dictionary) with old field names renamed (see
    :data:`RENAMED_FIELDS`) and fields added since filled in (:data:`ADDED_FIELDS`), so
    checkpoints written before the change still load and behave as they were trained.

    Raises:
        ValueError: ``fields`` holds both an old name and its new one.

    Example:
        >>> upgrade_config_fields("shac", {"lam": 0.9, "horizon": 16})
        {'gae_lambda': 0.9, 'horizon': 16, 'task_embedding_dim': 0, 'lr_schedule': 'constant', 'lr_decay_steps': 25600}
    """
    _choice("algorithm", algo, ALGORITHMS)
    renamed = dict(RENAMED_FIELDS.get(algo, {}))
    values = dict(fields)
    if algo == "ppo" and "init_std" in values:
        renamed["init_std"] = "init_log_std"
        values["init_std"] = math.log(values["init_std"])
    upgraded = {}
    for name, value in values.items():
        new = renamed.get(name, name)
        if new in upgraded or (new != name and new in values):
            raise ValueError(f"the {algo} config has both {name!r} and its new name {new!r}; keep only {new!r}.")
        upgraded[new] = value
    for name, value in {**ADDED_FIELDS, **ADDED_ALGORITHM_FIELDS.get(algo, {})}.items():
        upgraded.setdefault(name, value)
    return upgraded


def upgrade_run_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """A run config (``TrainConfig`` as a dictionary) with the fields added since filled in
    (:data:`ADDED_RUN_FIELDS`), so that older checkpoints resume and evaluate as trained.

    Example:
        >>> fields = upgrade_run_fields({"task": "walk"})
        >>> fields["randomization"], fields["sensor_history"]
        ('none', 1)
    """
    upgraded = dict(fields)
    for name, value in ADDED_RUN_FIELDS.items():
        upgraded.setdefault(name, dict(value) if isinstance(value, dict) else value)
    return upgraded


def make_config(algo: str, overrides: Mapping[str, Any] | None = None) -> Any:
    """The config dataclass of ``algo`` with ``overrides`` (field name -> value) applied."""
    _choice("algorithm", algo, ALGORITHMS)
    _, config_class = ALGORITHMS[algo].classes()
    overrides = dict(overrides or {})
    fields = {field.name: field for field in dataclasses.fields(config_class)}
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(f"{config_class.__name__} has no field(s) {unknown}; its fields: {sorted(fields)}.")
    for name, value in overrides.items():
        if isinstance(value, list):  # JSON gives lists where the dataclass holds tuples
            overrides[name] = tuple(value)
    return config_class(**overrides)


def make_trainer(
    algo: str,
    env: MicroDuckEnv,
    config: Any,
    device: torch.device | str = "cpu",
    *,
    update_threads: int | None = None,
    env_factories: list[CollectorEnv] | None = None,
    collector_backend: str = "process",
    ray_init: dict[str, Any] | None = None,
) -> Trainer:
    """``Trainer(env, config, device)`` for ``algo``; PPO also takes the threads of its update and,
    to collect in other processes or Ray actors, their envs' recipes (``env`` then only describes the batch).

    Raises:
        ValueError: ``env_factories`` for an algorithm that backpropagates through its env.
    """
    _choice("algorithm", algo, ALGORITHMS)
    trainer_class, _ = ALGORITHMS[algo].classes()
    if algo == "ppo":
        return trainer_class(
            env,
            config,
            device,
            update_threads=update_threads,
            env_factories=env_factories,
            collector_backend=collector_backend,
            ray_init=ray_init,
        )
    if env_factories is not None:
        raise ValueError(
            f"--algo {algo} backpropagates through its env, which must live in the training process; "
            "several collectors (--collectors, --ray-address) are for ppo."
        )
    return trainer_class(env, config, device)
