"""Starting a run from another run's weights: what is kept, how the embedding grows, what is refused."""

from __future__ import annotations

from dataclasses import asdict

import pytest
import torch
from helpers.task_bandit import TaskBanditEnv

from waddle.algorithms.apg import APG, APGConfig
from waddle.algorithms.init_from import InitFromError, check_network_config, inherited_fields, load_weights
from waddle.algorithms.ppo import PPO, PPOConfig
from waddle.algorithms.shac import SHAC, SHACConfig

CONFIG = PPOConfig(
    num_steps=4,
    num_epochs=4,
    num_minibatches=2,
    learning_rate=3e-3,
    lr_schedule="constant",
    actor_hidden_sizes=(16,),
    critic_hidden_sizes=(16,),
)


def checkpoint_of(trainer, algo: str = "ppo") -> dict:
    """What ``load_checkpoint`` returns for a run of ``trainer``."""
    return {
        "algo": algo,
        "config": {"algorithm": asdict(trainer.config)},
        "trainer": trainer.state_dict(),
        "env_steps": 123,
    }


def trained_source(names, targets, iterations: int = 3, **env_kwargs) -> PPO:
    torch.manual_seed(0)
    trainer = PPO(TaskBanditEnv(32, targets, names=names, **env_kwargs), CONFIG)
    for _ in range(iterations):
        trainer.train_iteration()
    return trainer


def test_embedding_rows_are_kept_by_name_and_new_tasks_get_fresh_rows():
    source = trained_source(["walk", "stand"], (0.5, -0.5))
    torch.manual_seed(1)
    target = PPO(TaskBanditEnv(8, (0.0, 0.0, 0.0), names=["stand", "jump", "walk"]), CONFIG)
    fresh = {name: getattr(target, name).task_embedding.weight.detach().clone() for name in ("policy", "value")}

    report = load_weights(target, "ppo", checkpoint_of(source), path="source.pt")

    for name in ("policy", "value"):
        old = getattr(source, name).task_embedding.weight
        new = getattr(target, name).task_embedding.weight
        assert new.shape == (3, 8)
        assert torch.equal(new[0], old[1])  # stand
        assert torch.equal(new[2], old[0])  # walk
        assert torch.equal(new[1], fresh[name][1])  # jump: the new network's own row
        assert not any(torch.equal(new[1], row) for row in old)
        for key, value in getattr(source, name).state_dict().items():
            if not key.endswith("task_embedding.weight"):
                assert torch.equal(getattr(target, name).state_dict()[key], value), key
    assert (report.kept_rows, report.fresh_rows, report.widened) == (["stand", "walk"], ["jump"], False)
    # The normaliser's statistics come along; the optimiser and the counters start fresh.
    assert int(target.normalizer.count) == int(source.normalizer.count) > 0
    assert torch.equal(target.normalizer.mean, source.normalizer.mean)
    assert target.optimizer.state_dict()["state"] == {}
    assert target.env_steps == 0 and target.iteration == 0 and target.learning_rate == CONFIG.learning_rate
    target.train_iteration()  # and the optimiser drives the loaded parameters
    assert not torch.equal(target.policy.net[0].weight, source.policy.net[0].weight)


def test_a_one_task_source_starts_every_task_acting_as_it_did_then_learns_them_apart():
    source = trained_source(["walk"], (0.3,))
    assert not source.policy.reads_task_id
    torch.manual_seed(1)
    target = PPO(TaskBanditEnv(64, (0.5, -0.5), names=["walk", "jump"]), CONFIG)
    report = load_weights(target, "ppo", checkpoint_of(source), path="source.pt")
    assert report.widened and report.fresh_rows == ["walk", "jump"]

    observation = torch.randn(5, 3)
    with torch.no_grad():
        expected = source.deterministic_policy()(observation)
        for task in (0, 1):
            ids = torch.full((5, 1), task)
            assert torch.equal(target.deterministic_policy()(observation, ids), expected)
            assert torch.equal(target.value(observation, ids), source.value(observation))
    # The new inputs start with zero weights; the source's columns are unchanged.
    assert torch.equal(target.policy.net[0].weight[:, 3:], torch.zeros(16, 8))
    assert torch.equal(target.policy.net[0].weight[:, :3], source.policy.net[0].weight)

    for _ in range(30):
        target.train_iteration()
    with torch.no_grad():
        first, second = target.deterministic_policy()(torch.full((2, 3), 0.3), torch.tensor([[0], [1]])).flatten()
    assert float(first) > 0.3 and float(second) < -0.3


@pytest.mark.parametrize(
    ("trainer_class", "config", "networks"),
    [
        (APG, APGConfig(actor_hidden_sizes=(8,), stochastic_policy=True), ("actor",)),
        (SHAC, SHACConfig(actor_hidden_sizes=(8,), critic_hidden_sizes=(8,)), ("actor", "critic", "target_critic")),
    ],
    ids=["apg", "shac"],
)
def test_analytic_trainers_start_from_a_one_task_source(trainer_class, config, networks):
    torch.manual_seed(0)
    source = trainer_class(TaskBanditEnv(4, (0.3,), names=["walk"]), config)
    source.normalizer.update(torch.randn(50, 3))
    target = trainer_class(TaskBanditEnv(4, (0.5, -0.5), names=["walk", "jump"]), config)
    load_weights(
        target, trainer_class.__name__.lower(), checkpoint_of(source, trainer_class.__name__.lower()), path="s"
    )
    observation = torch.randn(6, 3)
    with torch.no_grad():
        expected = source.deterministic_policy()(observation)
        for task in (0, 1):
            actual = target.deterministic_policy()(observation, torch.full((6, 1), task))
            torch.testing.assert_close(actual, expected, rtol=0, atol=1e-6)
    assert torch.equal(target.normalizer.mean, source.normalizer.mean)
    for name in networks:
        assert "task_embedding.weight" in "".join(getattr(target, name).state_dict())


# ---------------------------------------------------------------------------
# Refusals
# ---------------------------------------------------------------------------


def test_a_different_algorithm_or_network_config_is_refused():
    source = checkpoint_of(trained_source(["walk"], (0.3,), iterations=0))
    with pytest.raises(InitFromError, match="holds ppo networks but this run trains with --algo shac"):
        check_network_config(source, "shac", asdict(SHACConfig()), path="source.pt")
    wider = asdict(PPOConfig(actor_hidden_sizes=(32,), critic_hidden_sizes=(16,)))
    with pytest.raises(InitFromError, match=r"differs in actor_hidden_sizes: the source has \[16\], .* \[32\]"):
        check_network_config(source, "ppo", wider, path="source.pt")
    deeper = asdict(PPOConfig(actor_hidden_sizes=(16,), critic_hidden_sizes=(16, 16)))
    with pytest.raises(InitFromError, match="critic_hidden_sizes"):
        check_network_config(source, "ppo", deeper, path="source.pt")
    # Everything else may differ: it is a new run.
    check_network_config(
        source, "ppo", asdict(PPOConfig(actor_hidden_sizes=(16,), critic_hidden_sizes=(16,))), path="s"
    )


def test_the_embedding_width_of_a_conditioned_source_must_match():
    source = checkpoint_of(trained_source(["walk", "stand"], (0.5, -0.5), iterations=0))
    assert inherited_fields(source)["task_embedding_dim"] == 8
    narrower = asdict(PPOConfig(actor_hidden_sizes=(16,), critic_hidden_sizes=(16,), task_embedding_dim=4))
    with pytest.raises(InitFromError, match="task_embedding_dim: the source has 8, this run asks for 4"):
        check_network_config(source, "ppo", narrower, path="source.pt")
    # A one-task source has no embedding, so the new run keeps its own width.
    assert "task_embedding_dim" not in inherited_fields(checkpoint_of(trained_source(["walk"], (0.3,), iterations=0)))


@pytest.mark.parametrize(
    ("env_kwargs", "message"),
    [
        ({"obs_dim": 4}, "the source's policy reads 3 observation values, this env gives 4"),
        ({"action_dim": 2}, "the source's policy writes 1 actions, this env takes 2"),
    ],
)
def test_other_observation_or_action_widths_are_refused(env_kwargs, message):
    source = checkpoint_of(trained_source(["walk"], (0.3,), iterations=0))
    target = PPO(TaskBanditEnv(4, (0.5, -0.5), **env_kwargs), CONFIG)
    with pytest.raises(InitFromError, match=message):
        load_weights(target, "ppo", source, path="source.pt")


def test_a_conditioned_source_cannot_start_an_unconditioned_run():
    source = checkpoint_of(trained_source(["walk", "stand"], (0.5, -0.5), iterations=0))
    for env, config in (
        (TaskBanditEnv(4, (0.5,), names=["walk"]), CONFIG),  # one task
        (
            TaskBanditEnv(4, (0.5, -0.5)),
            PPOConfig(actor_hidden_sizes=(16,), critic_hidden_sizes=(16,), task_embedding_dim=0),
        ),
    ):
        with pytest.raises(InitFromError, match=r"reads a task embedding \(a library of 2 tasks \[walk, stand\]\)"):
            load_weights(PPO(env, config), "ppo", source, path="source.pt")
