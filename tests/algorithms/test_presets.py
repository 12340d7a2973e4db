"""Config names: one vocabulary over PPO, SHAC and APG, and old checkpoints' names upgraded."""

from __future__ import annotations

import dataclasses
import math

import pytest

from tests.helpers.diff_point_env import DiffPointEnv
from waddle.algorithms.apg import APGConfig
from waddle.algorithms.ppo import PPO, PPOConfig
from waddle.algorithms.presets import make_config, upgrade_config_fields
from waddle.algorithms.shac import SHACConfig


def test_the_configs_name_shared_hyperparameters_alike():
    names = {cls: {field.name for field in dataclasses.fields(cls)} for cls in (PPOConfig, SHACConfig, APGConfig)}
    for shared in (
        "actor_hidden_sizes",
        "init_log_std",
        "learning_rate",
        "gamma",
        "max_grad_norm",
        "normalize_observations",
    ):
        assert all(shared in fields for fields in names.values()), shared
    for shared in ("critic_hidden_sizes", "gae_lambda", "num_epochs", "num_minibatches"):
        assert shared in names[PPOConfig] and shared in names[SHACConfig], shared
    old = {
        "actor_hidden",
        "critic_hidden",
        "init_std",
        "lam",
        "actor_lr",
        "critic_lr",
        "critic_iterations",
        "critic_minibatches",
    }
    assert not old & set().union(*names.values())


def test_an_old_ppo_config_loads_with_its_std_as_a_log_std():
    old = {"num_steps": 3, "actor_hidden": [8], "critic_hidden": [8, 8], "init_std": 0.5}
    config = make_config("ppo", upgrade_config_fields("ppo", old))
    assert config.actor_hidden_sizes == (8,) and config.critic_hidden_sizes == (8, 8)
    assert config.init_log_std == pytest.approx(math.log(0.5))
    trainer = PPO(DiffPointEnv(2, action_bound=1.0), config)
    assert trainer.policy.log_std.exp().tolist() == pytest.approx([0.5])  # std 0.5, as the old config asked
    assert config.mirror_loss_coef == 0.0 and trainer.mirrors is None  # trained before the mirror loss existed


def test_old_shac_names_map_to_the_shared_ones():
    old = {"lam": 0.9, "actor_lr": 1e-2, "critic_lr": 5e-3, "critic_iterations": 3, "critic_minibatches": 2}
    config = make_config("shac", upgrade_config_fields("shac", old))
    assert (config.gae_lambda, config.learning_rate, config.critic_learning_rate) == (0.9, 1e-2, 5e-3)
    assert (config.num_epochs, config.num_minibatches) == (3, 2)
    # A config written before task conditioning existed was trained without it.
    assert upgrade_config_fields("apg", {"horizon": 8}) == {"horizon": 8, "task_embedding_dim": 0}


def test_an_old_name_beside_its_new_one_is_refused():
    with pytest.raises(ValueError, match="both 'lam' and its new name 'gae_lambda'"):
        upgrade_config_fields("shac", {"lam": 0.9, "gae_lambda": 0.95})
    with pytest.raises(ValueError, match="unknown algorithm 'sac'; choose one of ppo, shac, apg"):
        upgrade_config_fields("sac", {})


def test_make_config_names_the_fields_it_lacks():
    with pytest.raises(ValueError, match=r"PPOConfig has no field\(s\) \['actor_hidden'\]"):
        make_config("ppo", {"actor_hidden": (8,)})
