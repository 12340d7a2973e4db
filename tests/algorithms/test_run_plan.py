"""A run's configuration resolved in one place: the layers' order, what a resumed or a started-from run keeps,
the derived values, and a checkpoint's plan read back."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch

from waddle.algorithms.checkpoint import CheckpointError
from waddle.algorithms.init_from import InitFromError
from waddle.algorithms.presets import ALGORITHMS, COLLECTOR_SEED_STRIDE, TASK_RECIPES, TaskRecipe, make_config
from waddle.algorithms.run_plan import (
    RUN_FIELDS,
    InitFromRecord,
    Machine,
    RunPlan,
    SourceCheckpoint,
    resolve_run,
)
from waddle.algorithms.runner import TrainConfig
from waddle.envs.microduck import MicroDuckEnv

OLD = Path(__file__).resolve().parents[1] / "data" / "old_checkpoints"
TWO_CORES = Machine(cores=2)

RECIPE = TaskRecipe(
    lambda: [MicroDuckEnv.tracking_task(0.2)],
    run={"randomization": "upstream", "action_scale": 0.5, "max_episode_steps": 1000, "total_steps": 4096},
    algorithms={"ppo": {"mirror_loss_coef": 0.2, "actor_observation": "sensors"}},
)
"""A task recipe that sets run-level and algorithm defaults, as the robot's walking recipe does."""
SENSORS = {"actor_observation": "sensors"}
TRAINER = {"policy": {"net.0.weight": torch.zeros(8, 53)}, "task_library": ["standing"]}
"""A source's trainer state as ``inherited_fields`` reads it: no task embedding, one recorded task."""


@pytest.fixture
def recipe_task(monkeypatch):
    monkeypatch.setitem(TASK_RECIPES, "recipe-test", RECIPE)
    return "recipe-test"


def checkpoint_of(plan: RunPlan, *, iteration: int = 3, trainer: dict | None = None) -> dict:
    """What ``load_checkpoint`` returns for a run of ``plan`` saved at ``iteration``."""
    return {
        "algo": plan.algo,
        "config": plan.config(),
        "env_steps": iteration * 256,
        "iteration": iteration,
        "trainer": trainer if trainer is not None else {"policy": {"net.0.weight": torch.zeros(8, 56)}},
    }


# ---------------------------------------------------------------------------
# A new run: the layers in order
# ---------------------------------------------------------------------------


def test_no_flags_give_the_config_defaults():
    plan = resolve_run({}, machine=TWO_CORES)
    assert plan.run == TrainConfig()
    assert plan.algorithm == make_config("ppo")
    assert plan.init_from is None and plan.collectors is None and plan.start_iteration == 0


def test_the_task_recipe_sets_run_and_algorithm_defaults(recipe_task):
    plan = resolve_run({"task": recipe_task}, machine=TWO_CORES)
    assert (plan.run.randomization, plan.run.action_scale) == ("upstream", 0.5)
    assert (plan.run.max_episode_steps, plan.run.total_steps) == (1000, 4096)
    assert (plan.algorithm.mirror_loss_coef, plan.algorithm.actor_observation) == (0.2, "sensors")


def test_a_flag_wins_over_the_recipe(recipe_task):
    flags = {"task": recipe_task, "action_scale": 0.3, "max_episode_steps": 200, "mirror_loss_coef": 0.0}
    plan = resolve_run(flags, machine=TWO_CORES)
    assert (plan.run.action_scale, plan.run.max_episode_steps, plan.algorithm.mirror_loss_coef) == (0.3, 200, 0.0)
    assert plan.run.randomization == "upstream"  # the recipe's, where no flag is given


def test_the_joystick_recipe_trains_what_the_robot_runs_unless_a_flag_says_otherwise():
    plan = resolve_run({"task": "joystick"}, machine=TWO_CORES)
    assert (plan.run.randomization, plan.run.action_mode, plan.run.action_scale) == ("upstream", "robot", 0.7)
    assert (plan.run.max_episode_steps, plan.run.total_steps) == (1000, 14_000_000)
    assert plan.run.gait_prior_fade_steps == 6_000_000 and plan.policy_env_options["gait_prior_scale"] == 1.0
    # A checkpoint past the fade evaluates, exports and films with none of the prior left.
    done = dataclasses.replace(plan, env_steps=9_000_000)
    assert done.gait_prior_scale == 0.0 and dataclasses.replace(plan, env_steps=3_000_000).gait_prior_scale == 0.5
    assert (plan.algorithm.actor_observation, plan.algorithm.mirror_loss_coef) == ("robot", 0.3)
    assert plan.algorithm.heading_memory_s == 5.0  # the heading memory on the head's roll
    assert plan.training_env_options()["action_mode"] == "robot"
    plan = resolve_run({"task": "joystick", "randomization": "none", "actor_observation": "full"}, machine=TWO_CORES)
    assert (plan.run.randomization, plan.algorithm.actor_observation) == ("none", "full")
    assert resolve_run({"task": "joystick", "heading_memory_s": 0.0}, machine=TWO_CORES).algorithm.heading_memory_s == 0


@pytest.mark.parametrize(
    "task, steps, fade, episode, log_std, entropy",
    [("getup", 18_000_000, 0, 500, -0.5, 0.01), ("joystick-getup", 20_000_000, 6_000_000, 1000, -1.0, 0.0)],
)
def test_the_getup_recipes_train_on_the_robots_contract_and_lie_down(task, steps, fade, episode, log_std, entropy):
    plan = resolve_run({"task": task}, machine=TWO_CORES)
    assert (plan.run.randomization, plan.run.action_mode, plan.run.action_scale) == ("upstream", "robot", 1.0)
    assert (plan.run.max_episode_steps, plan.run.total_steps, plan.run.gait_prior_fade_steps) == (episode, steps, fade)
    assert (plan.algorithm.actor_observation, plan.algorithm.mirror_loss_coef) == ("robot", 0.3)
    assert (plan.algorithm.init_log_std, plan.algorithm.entropy_coef) == (log_std, entropy)
    assert plan.algorithm.heading_memory_s == 0.0  # measured without one (docs/deploy.md)
    (row,) = TASK_RECIPES[task].library()
    assert float(row.fall_terminates) == 0.0 and float(row.lying_start_fraction) > 0


def test_the_algorithms_run_defaults_win_over_the_recipe_and_its_fields_stay_with_their_algorithm(recipe_task):
    plan = resolve_run({"task": recipe_task, "algo": "shac"}, machine=TWO_CORES)
    assert (plan.run.backend, plan.run.num_envs, plan.run.max_episode_steps) == ("mjx", 8, 128)
    assert plan.run.total_steps == 25_600
    assert plan.run.randomization == "upstream"  # SHAC sets none: the recipe's stays
    assert not hasattr(plan.algorithm, "mirror_loss_coef")  # PPO's recipe fields are not handed to SHAC


def test_every_recipe_and_algorithm_resolves_and_names_only_fields_that_exist():
    for task, recipe in TASK_RECIPES.items():
        assert set(recipe.run) <= set(RUN_FIELDS), task
        for algo, fields in recipe.algorithms.items():
            config_fields = {field.name for field in dataclasses.fields(ALGORITHMS[algo].classes()[1])}
            assert set(fields) <= config_fields, (task, algo)
        for algo in ALGORITHMS:
            plan = resolve_run({"task": task, "algo": algo}, machine=TWO_CORES)
            assert (plan.run.task, plan.algo) == (task, algo)
    for algo, entry in ALGORITHMS.items():
        assert set(entry.run_defaults) <= set(RUN_FIELDS), algo


def test_the_tables_are_read_only():
    with pytest.raises(TypeError):
        TASK_RECIPES["walk"].run["total_steps"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        ALGORITHMS["shac"].run_defaults["num_envs"] = 1  # type: ignore[index]
    plan = resolve_run({}, machine=TWO_CORES)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.update_threads = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"task": "fly"}, "unknown task 'fly'; choose one of standing, walk"),
        ({"algo": "sac"}, "unknown algorithm 'sac'; choose one of ppo, shac, apg"),
        ({"horizon": 8}, r"--horizon do\(es\) not apply to --algo ppo"),
        ({"num_envs": 0}, "num_envs must be an integer >= 1, got 0"),
        (
            {"reward_weights": {"sway": -1.0}},
            r"reward_weights names unregistered terms \['sway'\]; the terms: tracking",
        ),
        ({"reward_weights": {"pose": float("nan")}}, r"reward_weights\['pose'\] must be a finite number, got nan"),
        ({"reward_weights": ["pose"]}, "reward_weights must map term names to weights"),
        ({"reward_weights": {"pose": torch.tensor(1.0)}}, r"reward_weights must be plain numbers, which config.json"),
    ],
)
def test_a_bad_flag_is_refused_naming_it(flags, message):
    with pytest.raises(ValueError, match=message):
        resolve_run(flags, machine=TWO_CORES)


# ---------------------------------------------------------------------------
# Derived values
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "decay_steps"),
    [
        ({}, 25_600),
        ({"total_steps": 4096}, 4096),  # the schedule spans the run's budget
        ({"total_steps": 4096, "lr_decay_steps": 1000}, 1000),  # a flag wins
    ],
)
def test_the_learning_rate_schedule_spans_the_budget(flags, decay_steps):
    plan = resolve_run({"algo": "shac", **flags}, machine=TWO_CORES)
    assert plan.algorithm.lr_decay_steps == decay_steps


@pytest.mark.parametrize(
    ("flags", "cores", "threads"),
    [
        ({}, 4, 4),
        ({"overlap_rollout": True}, 4, 1),
        ({"update_threads": 3}, 4, 3),
        ({"algo": "shac"}, 4, None),  # no PPO update
    ],
)
def test_the_update_threads_follow_the_machine(flags, cores, threads):
    plan = resolve_run(flags, machine=Machine(cores=cores))
    assert plan.update_threads == threads
    assert plan.config()["machine"] == {"cores": cores, "update_threads": threads}


def test_local_collectors_share_the_machines_cores_and_ray_actors_take_one_each():
    flags = {"num_envs": 8, "collectors": 2, "seed": 5}
    local = resolve_run(flags, machine=Machine(cores=4)).collectors
    assert (local.envs_each, local.physics_threads_each, local.seeds) == (4, 2, (5, 5 + COLLECTOR_SEED_STRIDE))
    ray = resolve_run({**flags, "collector_backend": "ray"}, machine=Machine(cores=4)).collectors
    assert (ray.envs_each, ray.physics_threads_each) == (4, 1)
    assert resolve_run({"num_envs": 8}, machine=Machine(cores=4)).collectors is None


def test_a_ray_address_implies_the_ray_backend():
    plan = resolve_run({"ray_address": "127.0.0.1:6379", "collector_backend": "process"}, machine=TWO_CORES)
    assert plan.run.collector_backend == "ray" and plan.collectors is not None
    assert plan.config()["collectors"]["backend"] == "ray"
    with pytest.raises(ValueError, match="ray_address '127.0.0.1:6379' names a Ray cluster"):
        TrainConfig(ray_address="127.0.0.1:6379")


def test_a_push_ramp_grows_the_training_pushes_to_full_strength():
    plan = resolve_run({"task": "joystick", "push_ramp_steps": 4_000_000}, machine=TWO_CORES)
    strengths = [
        dataclasses.replace(plan, env_steps=steps).push_strength for steps in (0, 1_000_000, 4_000_000, 9_000_000)
    ]
    assert strengths == [0.0, 0.25, 1.0, 1.0]
    assert resolve_run({"task": "joystick"}, machine=TWO_CORES).push_strength == 1.0  # no ramp: full from the start
    # The ramp is the training env's alone: what the policy is evaluated and exported in pushes as the preset does.
    assert "push_ramp_steps" not in plan.policy_env_options and "push_strength" not in plan.policy_env_options


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"push_ramp_steps": -1}, r"push_ramp_steps must be >= 0, got -1"),
        ({"push_ramp_steps": 1000}, r"push_ramp_steps ramps up the training pushes, and randomization 'none' does not"),
        (
            {"task": "joystick", "push_ramp_steps": 1000, "collectors": 2},
            r"--gait-prior-fade-steps and --push-ramp-steps change the training env as the run goes",
        ),
        (
            {"randomization": "upstream", "push_ramp_steps": 1000, "collectors": 2},
            r"^--push-ramp-steps changes the training env .* leave --collectors at 1",
        ),
    ],
)
def test_a_push_ramp_that_cannot_apply_is_refused_naming_it(flags, message):
    with pytest.raises(ValueError, match=message):
        resolve_run(flags, machine=TWO_CORES)


def test_a_lift_assist_fades_to_nothing_and_stays_out_of_the_policys_envs():
    plan = resolve_run({"task": "getup", "lift_assist": 0.8, "lift_assist_fade_steps": 4_000_000}, machine=TWO_CORES)
    shares = [dataclasses.replace(plan, env_steps=steps).lift_assist for steps in (0, 1_000_000, 4_000_000, 9_000_000)]
    assert shares == pytest.approx([0.8, 0.6, 0.0, 0.0])
    assert resolve_run({"task": "joystick"}, machine=TWO_CORES).lift_assist == 0.0
    assert not any(name.startswith("lift") for name in plan.policy_env_options)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"lift_assist": 1.5, "lift_assist_fade_steps": 10}, r"lift_assist must be a share .* in \[0, 1\], got 1.5"),
        ({"lift_assist": 0.5}, r"lift_assist 0.5 must fade, .* give lift_assist_fade_steps > 0"),
        ({"lift_assist_fade_steps": -1}, r"lift_assist_fade_steps must be >= 0, got -1"),
        (
            {"lift_assist": 0.5, "lift_assist_fade_steps": 10, "backend": "mjx"},
            r"only the 'mujoco' backend can; got backend 'mjx'",
        ),
        (
            {"task": "getup", "lift_assist": 0.5, "lift_assist_fade_steps": 10, "collectors": 2},
            r"^--lift-assist-fade-steps changes the training env .* leave --collectors at 1",
        ),
    ],
)
def test_a_lift_assist_that_cannot_apply_is_refused_naming_it(flags, message):
    with pytest.raises(ValueError, match=message):
        resolve_run(flags, machine=TWO_CORES)


def test_an_analytic_gradient_run_refuses_remote_collectors():
    with pytest.raises(ValueError, match="--algo shac backpropagates through its env"):
        resolve_run({"algo": "shac", "collectors": 2}, machine=TWO_CORES)


# ---------------------------------------------------------------------------
# A resumed run
# ---------------------------------------------------------------------------


def test_resume_keeps_the_checkpoints_values_and_takes_the_resumable_flags():
    saved = resolve_run({"task": "walk", "num_envs": 16, "mirror_loss_coef": 0.0}, machine=TWO_CORES)
    checkpoint = checkpoint_of(saved)
    before = copy.deepcopy(checkpoint["config"])
    plan = resolve_run({"total_steps": 8192, "video_frames": 0}, resume=checkpoint, machine=Machine(cores=4))
    assert checkpoint["config"] == before  # the resolver reads its inputs only
    assert (plan.run.task, plan.run.num_envs) == ("walk", 16)
    assert plan.algorithm.mirror_loss_coef == 0.0  # the walk recipe's 0.3 is not applied again
    assert (plan.run.total_steps, plan.run.video_frames) == (8192, 0)
    assert plan.start_iteration == 3
    assert plan.update_threads == 4  # re-derived for the machine it continues on


def test_resume_keeps_the_schedule_length_and_offsets_the_collector_seeds():
    saved = resolve_run({"algo": "shac", "total_steps": 4096}, machine=TWO_CORES)
    plan = resolve_run({"total_steps": 8192}, resume=checkpoint_of(saved), machine=TWO_CORES)
    assert plan.algorithm.lr_decay_steps == 4096  # the run's schedule as it started
    saved = resolve_run({"num_envs": 8, "collectors": 2}, machine=TWO_CORES)
    plan = resolve_run({}, resume=checkpoint_of(saved, iteration=7), machine=TWO_CORES)
    assert plan.collectors.seeds == (7, 7 + COLLECTOR_SEED_STRIDE)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"task": "standing"}, "run.task differs, checkpoint has 'walk', this run asks for 'standing'"),
        ({"actor_hidden_sizes": (64,)}, "algorithm.actor_hidden_sizes differs"),
    ],
)
def test_resume_refuses_a_flag_it_cannot_change(flags, message):
    checkpoint = checkpoint_of(resolve_run({"task": "walk"}, machine=TWO_CORES))
    with pytest.raises(CheckpointError, match=message):
        resolve_run(flags, resume=checkpoint, machine=TWO_CORES)


def test_resume_and_init_from_together_are_refused():
    checkpoint = checkpoint_of(resolve_run({}, machine=TWO_CORES))
    source = SourceCheckpoint("source.pt", checkpoint)
    with pytest.raises(ValueError, match="--resume continues the run in --out and --init-from starts a new one"):
        resolve_run({}, resume=checkpoint, init_from=source, machine=TWO_CORES)


# ---------------------------------------------------------------------------
# A run started from another run's weights
# ---------------------------------------------------------------------------


def test_init_from_inherits_the_algorithm_the_network_and_the_policys_env_fields():
    trained = resolve_run(
        {"algo": "ppo", "actor_hidden_sizes": (32, 32), "action_scale": 0.5, "sensor_history": 3, **SENSORS},
        machine=TWO_CORES,
    )
    source = SourceCheckpoint("runs/walk", checkpoint_of(trained, trainer=TRAINER))
    plan = resolve_run({"task": "jump-mix"}, init_from=source, machine=TWO_CORES)
    assert plan.algorithm.actor_hidden_sizes == (32, 32)
    assert plan.algorithm.actor_observation == "sensors"
    assert (plan.run.action_scale, plan.run.sensor_history) == (0.5, 3)
    assert plan.run.task == "jump-mix" and plan.run.total_steps == TrainConfig.total_steps  # its own budget
    assert plan.init_from == InitFromRecord("runs/walk", "ppo", ("standing",), 768)
    assert plan.config()["init_from"]["task_library"] == ["standing"]
    plan = resolve_run({"task": "jump-mix", "action_scale": 0.4}, init_from=source, machine=TWO_CORES)
    assert plan.run.action_scale == 0.4  # a flag wins


def test_init_from_wins_over_the_recipe_for_what_the_policy_reads_and_does(recipe_task):
    source = SourceCheckpoint("runs/walk", checkpoint_of(resolve_run({}, machine=TWO_CORES), trainer=TRAINER))
    plan = resolve_run({"task": recipe_task}, init_from=source, machine=TWO_CORES)
    assert plan.run.action_scale == 0.35  # the source's actions, not the recipe's 0.5
    assert plan.algorithm.actor_observation == "full"  # the source's actor, not the recipe's sensors
    assert plan.run.randomization == "upstream" and plan.algorithm.mirror_loss_coef == 0.2  # the recipe's


def test_init_from_refuses_another_network():
    source = SourceCheckpoint("src.pt", checkpoint_of(resolve_run({}, machine=TWO_CORES), trainer=TRAINER))
    with pytest.raises(InitFromError, match="differs in actor_hidden_sizes"):
        resolve_run({"actor_hidden_sizes": (64,)}, init_from=source, machine=TWO_CORES)
    with pytest.raises(InitFromError, match="holds ppo networks but this run trains with --algo apg"):
        resolve_run({"algo": "apg"}, init_from=source, machine=TWO_CORES)


# ---------------------------------------------------------------------------
# A checkpoint's plan read back
# ---------------------------------------------------------------------------


def test_a_plan_reads_back_from_its_checkpoint():
    plan = resolve_run({"task": "walk", "num_envs": 8, "collectors": 2, "actor_hidden_sizes": [16]}, machine=TWO_CORES)
    back = RunPlan.from_checkpoint(checkpoint_of(plan))
    assert (back.run, back.algorithm, back.collectors) == (plan.run, plan.algorithm, plan.collectors)
    assert (back.cores, back.update_threads) == (2, 2)
    assert back.config() == plan.config()


def test_reward_weights_reach_every_env_the_policy_runs_in_and_read_back():
    """The flag's weights are a run field: the training env, an evaluation and a resumed run get them, and over
    the task's own weights they change only the terms named."""
    from waddle.algorithms.presets import make_env
    from waddle.envs.microduck.rewards import REWARD_TERMS
    from waddle.envs.microduck.tasks import JOYSTICK_REWARD_WEIGHTS

    plan = resolve_run({"task": "joystick", "reward_weights": {"pose": 0.0, "upright": 3.0}}, machine=TWO_CORES)
    assert plan.policy_env_options["reward_weights"] == {"pose": 0.0, "upright": 3.0}
    assert plan.training_env_options()["reward_weights"] == {"pose": 0.0, "upright": 3.0}
    assert RunPlan.from_checkpoint(checkpoint_of(plan)).run.reward_weights == {"pose": 0.0, "upright": 3.0}
    env = make_env("joystick", num_envs=2, seed=0, reward_weights=plan.run.reward_weights)
    names = list(REWARD_TERMS)
    weights = dict(zip(names, env.tasks[0].reward_weights.tolist(), strict=True))
    assert (weights["pose"], weights["upright"]) == (0.0, 3.0)
    assert JOYSTICK_REWARD_WEIGHTS["pose"] == 0.5  # so the pose weight above was changed, not kept
    assert weights["heading_hold"] == JOYSTICK_REWARD_WEIGHTS["heading_hold"]  # a term not named keeps the task's
    env.close()


def test_an_old_checkpoint_reads_back_with_what_it_trained_with():
    back = RunPlan.from_checkpoint(torch.load(OLD / "ppo_standing.pt", weights_only=True))
    assert (back.run.randomization, back.run.action_scale, back.run.max_episode_steps) == ("none", 0.35, 500)
    assert (back.actor_observation, back.algorithm.mirror_loss_coef, back.algorithm.task_embedding_dim) == (
        "full",
        0.0,
        0,
    )
    assert back.policy_env_options == {"sensor_history": 1, "action_scale": 0.35, "action_mode": "residual"}
    assert back.cores is None and back.collectors is None and back.init_from is None


def test_a_checkpoint_without_a_run_config_is_refused_unless_asked_not_to():
    checkpoint = {"algo": "ppo", "config": {"algorithm": {"num_steps": 4}}}
    with pytest.raises(CheckpointError, match="records no run config"):
        RunPlan.from_checkpoint(checkpoint)
    back = RunPlan.from_checkpoint(checkpoint, require_run=False)
    assert not back.run_recorded and back.algorithm.num_steps == 4
    with pytest.raises(CheckpointError, match="records no algorithm config"):
        RunPlan.from_checkpoint({"algo": "ppo", "config": {"run": {}}})
    with pytest.raises(CheckpointError, match="ppo config does not fit this waddle: .*no_such_field"):
        RunPlan.from_checkpoint({"algo": "ppo", "config": {"run": {}, "algorithm": {"no_such_field": 1}}})
