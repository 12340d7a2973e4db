"""Task-conditioned networks: they learn what the task id means, one-task networks are unchanged,
old checkpoints load, and a state saved for another task library is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.diff_point_env import DiffPointEnv
from helpers.task_bandit import TaskBanditEnv

from waddle.algorithms.apg import APG, APGConfig
from waddle.algorithms.checkpoint import CheckpointError, load_checkpoint
from waddle.algorithms.evaluation import policy_from_checkpoint
from waddle.algorithms.ppo import PPO, PPOConfig
from waddle.algorithms.shac import SHAC, SHACConfig
from waddle.algorithms.task_library import TaskLibraryError, check_task_library, task_library

OLD = Path(__file__).resolve().parents[1] / "data" / "old_checkpoints"
OBSERVATION = torch.full((2, 3), 0.3)  # what the bandit shows in every task
TASK_IDS = torch.tensor([[0], [1]])
TARGETS = (0.5, -0.5)


def actions_per_task(trainer) -> list[float]:
    policy = trainer.deterministic_policy()
    with torch.no_grad():
        out = policy(OBSERVATION, TASK_IDS) if policy.reads_task_id else policy(OBSERVATION)
    return out.flatten().tolist()


def ppo_on_bandit(task_embedding_dim: int, iterations: int = 30) -> PPO:
    torch.manual_seed(0)
    config = PPOConfig(
        num_steps=4,
        num_epochs=4,
        num_minibatches=2,
        learning_rate=3e-3,
        lr_schedule="constant",
        actor_hidden_sizes=(16,),
        critic_hidden_sizes=(16,),
        task_embedding_dim=task_embedding_dim,
    )
    trainer = PPO(TaskBanditEnv(64, TARGETS), config)
    for _ in range(iterations):
        trainer.train_iteration()
    return trainer


# ---------------------------------------------------------------------------
# Learning what the id means
# ---------------------------------------------------------------------------


def test_ppo_actor_tells_two_tasks_apart_after_training():
    trainer = ppo_on_bandit(task_embedding_dim=8)
    assert trainer.policy.reads_task_id and trainer.value.reads_task_id
    first, second = actions_per_task(trainer)
    # The same observation, two ids: each action goes to its own task's target.
    assert first == pytest.approx(TARGETS[0], abs=0.15)
    assert second == pytest.approx(TARGETS[1], abs=0.15)


def test_without_the_embedding_the_same_training_cannot_tell_them_apart():
    trainer = ppo_on_bandit(task_embedding_dim=0)
    assert not trainer.policy.reads_task_id
    first, second = actions_per_task(trainer)
    assert first == second
    assert abs(first) < 0.25  # the best it can do is the mean target, 0


@pytest.mark.parametrize(
    ("trainer_class", "config"),
    [
        (APG, APGConfig(horizon=1, learning_rate=1e-2, actor_hidden_sizes=(16,))),
        (
            SHAC,
            SHACConfig(
                horizon=1,
                learning_rate=1e-2,
                actor_hidden_sizes=(16,),
                critic_hidden_sizes=(16,),
                num_epochs=2,
                stochastic_policy=False,
            ),
        ),
    ],
    ids=["apg", "shac"],
)
def test_analytic_actors_tell_two_tasks_apart_after_training(trainer_class, config):
    torch.manual_seed(0)
    trainer = trainer_class(TaskBanditEnv(64, TARGETS), config)
    for _ in range(40):
        trainer.train_iteration()
    first, second = actions_per_task(trainer)
    assert first == pytest.approx(TARGETS[0], abs=0.05)
    assert second == pytest.approx(TARGETS[1], abs=0.05)
    if trainer_class is SHAC:
        assert "task_embedding.weight" in trainer.critic.state_dict()


def test_the_task_id_reaches_the_ppo_critic():
    trainer = PPO(TaskBanditEnv(4, TARGETS), PPOConfig(actor_hidden_sizes=(8,), critic_hidden_sizes=(8,)))
    with torch.no_grad():
        trainer.value.task_embedding.weight[1] += 5.0
        values = trainer.value(OBSERVATION, TASK_IDS).flatten()
    assert values[0] != values[1]
    assert trainer.critic.in_keys == ["observation", "task_id"]


# ---------------------------------------------------------------------------
# One task: nothing changes
# ---------------------------------------------------------------------------


def test_one_task_networks_have_the_layout_of_old_checkpoints():
    old = load_checkpoint(OLD / "ppo_standing.pt")["trainer"]
    # A one-task library with a task id (as MicroDuck's standing), then an env with no task id at all.
    for env in (TaskBanditEnv(4, (0.5,), obs_dim=56, action_dim=14), DiffPointEnv(4, dim=7, action_bound=1.0)):
        trainer = PPO(env, PPOConfig(actor_hidden_sizes=(16,), critic_hidden_sizes=(16,)))
        assert not trainer.policy.reads_task_id and not trainer.value.reads_task_id
        for name in ("policy", "value"):
            state = getattr(trainer, name).state_dict()
            assert list(state) == list(old[name])
            if isinstance(env, TaskBanditEnv):  # the same widths as the old MicroDuck policy
                assert [tuple(v.shape) for v in state.values()] == [tuple(v.shape) for v in old[name].values()]
        assert trainer.actor.in_keys == ["observation"] and trainer.critic.in_keys == ["observation"]


def test_one_task_draws_the_same_initial_weights_with_or_without_a_task_id():
    torch.manual_seed(3)
    with_id = PPO(TaskBanditEnv(4, (0.5,), obs_dim=4, action_dim=2), PPOConfig()).state_dict()
    torch.manual_seed(3)
    without = PPO(DiffPointEnv(4, dim=2, action_bound=1.0), PPOConfig()).state_dict()
    for name in ("policy", "value"):
        for key, value in without[name].items():
            assert torch.equal(with_id[name][key], value), key


@pytest.mark.parametrize("task", ["standing", "mix"])
def test_a_checkpoint_from_before_task_conditioning_loads_and_acts_as_it_did(task):
    from waddle.algorithms.presets import make_env

    recorded = json.loads((OLD / "actions.json").read_text())[task]
    checkpoint = load_checkpoint(OLD / f"ppo_{task}.pt")
    assert "task_library" not in checkpoint["trainer"]  # written before the record existed
    env = make_env(task, num_envs=1, seed=0)
    policy = policy_from_checkpoint(checkpoint, env)
    env.close()
    # A mix checkpoint of then was trained without the id: it still reads the observation only.
    assert not getattr(policy, "reads_task_id", False)
    with torch.no_grad():
        actions = policy(torch.tensor(recorded["observations"]))
    torch.testing.assert_close(actions, torch.tensor(recorded["actions"]), rtol=0, atol=1e-6)


# ---------------------------------------------------------------------------
# The recorded library
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trainer_class", "config"),
    [
        (PPO, PPOConfig(actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))),
        (APG, APGConfig(actor_hidden_sizes=(8,))),
        (SHAC, SHACConfig(actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))),
    ],
    ids=["ppo", "apg", "shac"],
)
def test_a_state_saved_for_another_library_is_refused(trainer_class, config):
    saved = trainer_class(TaskBanditEnv(4, (0.5, -0.5), names=["stand", "jump"]), config).state_dict()
    assert saved["task_library"] == ["stand", "jump"]
    same = trainer_class(TaskBanditEnv(4, (0.1, 0.2), names=["stand", "jump"]), config)
    same.load_state_dict(saved)  # same names in the same order: the ids mean the same tasks
    for names in (["jump", "stand"], ["stand", "jump", "walk"], ["stand", "hop"]):
        other = trainer_class(TaskBanditEnv(4, (0.0,) * len(names), names=names), config)
        with pytest.raises(TaskLibraryError) as info:
            other.load_state_dict(saved)
        message = str(info.value)
        assert "2 tasks [stand, jump]" in message and f"{len(names)} tasks [{', '.join(names)}]" in message


def test_policy_from_checkpoint_names_both_libraries(tmp_path):
    from waddle.algorithms.presets import make_env

    config = PPOConfig(num_steps=2, actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))
    env = make_env("mix", num_envs=2, seed=0)
    trainer = PPO(env, config)
    checkpoint = {"algo": "ppo", "config": {"algorithm": {**config.__dict__}}, "trainer": trainer.state_dict()}
    env.close()
    env = make_env("jump-mix", num_envs=2, seed=0)
    with pytest.raises(CheckpointError) as info:
        policy_from_checkpoint(checkpoint, env)
    env.close()
    message = str(info.value)
    assert "4 tasks [standing, tracking+0.20, sidestep+0.15, jump]" in message
    assert "3 tasks [tracking+0.20, standing, jump]" in message


def test_task_library_of_envs():
    assert task_library(TaskBanditEnv(2, (0.1, 0.2, 0.3), names=["a", "b", "c"])) == ("a", "b", "c")
    assert task_library(DiffPointEnv(2)) == ()
    check_task_library(None, ["a"])  # an old state records nothing: nothing to check
