"""PPO: its maths on hand-worked examples, then the trainer on a tiny point-mass env."""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch
from tensordict import TensorDict
from torchrl.envs.utils import ExplorationType, set_exploration_type

from tests.helpers.diff_point_env import DiffPointEnv
from waddle.algorithms.ppo import (
    PPO,
    NonFiniteLossError,
    PPOConfig,
    adapt_learning_rate,
    default_update_threads,
    finished_episodes,
    gaussian_kl,
    mirror_loss,
    reward_term_means,
)

TINY = dict(actor_hidden_sizes=(16,), critic_hidden_sizes=(16,))


def constant_networks(trainer: PPO, *, value: float) -> None:
    """Make the policy mean 0 and the value ``value`` whatever the observation."""
    with torch.no_grad():
        trainer.policy.net[-1].weight.zero_()
        trainer.policy.net[-1].bias.zero_()
        trainer.value.net[-1].weight.zero_()
        trainer.value.net[-1].bias.fill_(value)


# ---------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------


def test_gaussian_kl_known_values():
    one, zero = torch.ones(3, 2), torch.zeros(3, 2)
    assert gaussian_kl(zero, one, zero, one).item() == pytest.approx(0.0)
    # Means 1 apart, unit stds: 0.5 per action entry, two entries.
    assert gaussian_kl(zero, one, one, one).item() == pytest.approx(1.0)
    # Same mean, std 1 -> 2: log 2 + 1/8 - 1/2 per entry.
    assert gaussian_kl(zero, one, zero, 2 * one).item() == pytest.approx(2 * (math.log(2) + 0.125 - 0.5))


def test_adapt_learning_rate():
    assert adapt_learning_rate(1e-3, kl=0.05, desired_kl=0.01) == pytest.approx(1e-3 / 1.5)
    assert adapt_learning_rate(1e-3, kl=0.001, desired_kl=0.01) == pytest.approx(1.5e-3)
    assert adapt_learning_rate(1e-3, kl=0.01, desired_kl=0.01) == 1e-3
    assert adapt_learning_rate(1e-2, kl=0.0, desired_kl=0.01) == 1e-2  # upper bound
    assert adapt_learning_rate(1e-5, kl=1.0, desired_kl=0.01) == 1e-5  # lower bound


def test_finished_episodes_carries_unfinished_totals():
    # env 0: rewards 1, 2 | 3, 4 (done after step 2), env 1: 1, 1, 1, 1 (done at step 4)
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0]])
    dones = torch.tensor([[False, True, False, False], [False, False, False, True]])
    running_return = torch.tensor([10.0, 0.0])  # env 0 carried 10 from the last rollout
    running_length = torch.tensor([5, 0])
    returns, lengths = finished_episodes(rewards, dones, running_return, running_length)
    assert returns.tolist() == [13.0, 4.0]  # 10 + 1 + 2, then 1 + 1 + 1 + 1
    assert lengths.tolist() == [7, 4]
    assert running_return.tolist() == [7.0, 0.0]  # 3 + 4 carried to the next rollout
    assert running_length.tolist() == [2, 0]


# ---------------------------------------------------------------------------
# GAE and the clipped loss as the trainer configures them
# ---------------------------------------------------------------------------


def three_step_batch(*, terminated_last: bool) -> TensorDict:
    """One env, three steps of reward 1, observation 0; the last step ends the episode."""
    last = torch.tensor([False, False, True]).reshape(1, 3, 1)
    return TensorDict(
        {
            "observation": torch.zeros(1, 3, 2),
            "next": {
                "observation": torch.zeros(1, 3, 2),
                "reward": torch.ones(1, 3, 1),
                "done": last.clone(),
                "terminated": last.clone() if terminated_last else torch.zeros_like(last),
                "truncated": torch.zeros_like(last) if terminated_last else last.clone(),
            },
        },
        batch_size=[1, 3],
    )


@pytest.mark.parametrize(
    ("terminated_last", "expected"),
    [
        # V == 1, r == 1, gamma 0.9, lambda 0.8 (gamma * lambda = 0.72).
        # Truncated: the last step bootstraps, every delta = 1 + 0.9 * 1 - 1 = 0.9:
        #   A2 = 0.9, A1 = 0.9 + 0.72 * 0.9 = 1.548, A0 = 0.9 + 0.72 * 1.548 = 2.01456
        (False, [2.01456, 1.548, 0.9]),
        # Terminated: the last delta is 1 + 0 - 1 = 0:
        #   A2 = 0, A1 = 0.9, A0 = 0.9 + 0.72 * 0.9 = 1.548
        (True, [1.548, 0.9, 0.0]),
    ],
)
def test_gae_bootstraps_truncation_but_not_termination(terminated_last, expected):
    trainer = PPO(DiffPointEnv(1, action_bound=1.0), PPOConfig(gamma=0.9, gae_lambda=0.8, **TINY))
    constant_networks(trainer, value=1.0)
    batch = three_step_batch(terminated_last=terminated_last)
    trainer.advantage_module(batch)
    assert batch["advantage"].flatten().tolist() == pytest.approx(expected, abs=1e-5)
    # value target = advantage + V
    assert batch["value_target"].flatten().tolist() == pytest.approx([a + 1.0 for a in expected], abs=1e-5)


def test_clipped_loss_on_hand_worked_batch():
    config = PPOConfig(init_log_std=0.0, clip_epsilon=0.2, entropy_coef=0.01, value_coef=0.5, **TINY)
    trainer = PPO(DiffPointEnv(2, action_bound=1.0), config)
    constant_networks(trainer, value=1.0)
    # Two samples, action 0 under N(0, 1): log p = -0.5 log(2 pi). The behaviour
    # policy gave it log p - log 1.5, so the ratio is 1.5 for both.
    log_prob = torch.full((2,), -0.5 * math.log(2 * math.pi))
    batch = TensorDict(
        {
            "observation": torch.zeros(2, 2),
            "action": torch.zeros(2, 1),
            "action_log_prob": log_prob - math.log(1.5),
            "advantage": torch.tensor([[1.0], [-1.0]]),
            "value_target": torch.tensor([[3.0], [1.0]]),
        },
        batch_size=[2],
    )
    losses = trainer.loss_module(batch)
    # Advantages normalised by their (unbiased) std sqrt(2): +-1/sqrt(2).
    # A > 0: min(1.5 A, 1.2 A) = 1.2 / sqrt(2); A < 0: min(-1.5, -1.2) / sqrt(2) = -1.5 / sqrt(2).
    # loss = -mean = -(1.2 - 1.5) / (2 sqrt(2)) = 0.3 / (2 sqrt(2)) = 0.10607
    assert losses["loss_objective"].item() == pytest.approx(0.3 / (2 * math.sqrt(2)), abs=1e-5)
    assert losses["clip_fraction"].item() == pytest.approx(1.0)
    # Value: 0.5 * mean((1 - 3)^2, (1 - 1)^2) = 0.5 * 2 = 1
    assert losses["loss_critic"].item() == pytest.approx(1.0, abs=1e-6)
    # Entropy of N(0, 1): 0.5 log(2 pi e) = 1.41894; the bonus is -0.01 times it.
    assert losses["loss_entropy"].item() == pytest.approx(-0.01 * 0.5 * math.log(2 * math.pi * math.e), abs=1e-6)


# ---------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------


def point_env(num_envs: int = 32, seed: int = 0) -> DiffPointEnv:
    return DiffPointEnv(num_envs, action_bound=1.0, max_steps=25, init_scale=1.0, seed=seed)


def test_rollout_shapes_and_counters():
    trainer = PPO(point_env(8), PPOConfig(num_steps=5, **TINY))
    batch = trainer.collect()
    assert batch.batch_size == torch.Size([8, 5])
    assert batch["action_log_prob"].shape == (8, 5)
    assert trainer.env_steps == 40 == trainer.steps_per_iteration
    # The next step's observation continues where this one ended.
    assert torch.equal(batch["next", "observation"][:, :-1], batch["observation"][:, 1:])


# The overlapped variant learns from data one update old: on this toy it needs twice the iterations.
@pytest.mark.parametrize(("overlap_rollout", "iterations"), [(False, 12), (True, 24)])
def test_ppo_improves_point_mass(overlap_rollout, iterations):
    torch.manual_seed(0)
    config = PPOConfig(
        num_steps=25,
        num_epochs=5,
        num_minibatches=4,
        learning_rate=3e-3,
        actor_hidden_sizes=(32, 32),
        critic_hidden_sizes=(32, 32),
        entropy_coef=0.01,  # the setting these iteration counts were measured with
        overlap_rollout=overlap_rollout,
    )
    trainer = PPO(point_env(32), config)
    returns = [trainer.train_iteration()["charts/episode_return"] for _ in range(iterations)]
    assert math.isfinite(returns[0])
    # A random policy drifts away from the goal at 0.5; the trained one moves to it.
    assert sum(returns[-3:]) / 3 > 0.5 * returns[0], returns


def test_normaliser_updated_after_the_update():
    trainer = PPO(point_env(8), PPOConfig(num_steps=4, **TINY))
    assert int(trainer.normalizer.count) == 0
    trainer.train_iteration()
    assert int(trainer.normalizer.count) == 32
    trainer_off = PPO(point_env(8), PPOConfig(num_steps=4, normalize_observations=False, **TINY))
    trainer_off.train_iteration()
    assert int(trainer_off.normalizer.count) == 0


def test_non_finite_loss_raises_before_any_step():
    env = point_env(8)
    trainer = PPO(env, PPOConfig(num_steps=4, **TINY))
    trainer.train_iteration()
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    env.poison_reward = True
    with pytest.raises(NonFiniteLossError, match="PPO loss is nan"):
        trainer.train_iteration()
    for key, value in trainer.policy.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_state_dict_round_trip():
    config = PPOConfig(num_steps=4, **TINY)
    trainer = PPO(point_env(8), config)
    trainer.train_iteration()
    trainer.train_iteration()
    restored = PPO(point_env(8, seed=1), config)
    restored.load_state_dict(trainer.state_dict())
    observation = torch.randn(5, 2)
    assert torch.equal(restored.deterministic_policy()(observation), trainer.deterministic_policy()(observation))
    assert torch.equal(restored.value(observation), trainer.value(observation))
    assert restored.env_steps == trainer.env_steps and restored.iteration == 2
    assert restored.learning_rate == trainer.learning_rate
    assert restored.optimizer.state_dict()["state"][0]["step"] == trainer.optimizer.state_dict()["state"][0]["step"]
    restored.train_iteration()  # and training goes on


def test_deterministic_policy_is_the_clamped_mean():
    trainer = PPO(point_env(8), PPOConfig(num_steps=4, **TINY))
    trainer.train_iteration()
    observation = 3.0 * torch.randn(64, 2)
    loc, _ = trainer.policy(observation)
    assert torch.equal(trainer.deterministic_policy()(observation), loc.clamp(-1.0, 1.0))


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("num_steps", 0, "num_steps must be an integer >= 1"),
        ("lr_schedule", "cosine", "lr_schedule must be one of"),
        ("gamma", 1.5, "gamma must be in"),
        ("clip_epsilon", 0.0, "clip_epsilon must be > 0"),
        ("init_log_std", 2.0, r"init_log_std must be in \[-5.0, 1.0\]"),
        ("mirror_loss_coef", -1.0, "mirror_loss_coef must be a finite number >= 0"),
        ("mirror_loss_coef", math.inf, "mirror_loss_coef must be a finite number >= 0"),
        ("symmetric_policy", "yes", "symmetric_policy must be None, True or False"),
    ],
)
def test_config_validation(field, value, message):
    with pytest.raises(ValueError, match=message):
        PPOConfig(**{field: value})


# ---------------------------------------------------------------------------
# Mirror loss
# ---------------------------------------------------------------------------


def test_mirror_loss_on_a_hand_worked_linear_policy():
    from waddle.envs.microduck.symmetry import SignedPermutation
    from waddle.modules.networks import GaussianPolicy
    from waddle.modules.normalizer import RunningNormalizer

    policy = GaussianPolicy(RunningNormalizer(2), 2, ())  # mean = W o + b (the normaliser starts as identity)
    with torch.no_grad():
        policy.net[-1].weight.copy_(torch.tensor([[1.0, 2.0], [3.0, 4.0]]))
        policy.net[-1].bias.copy_(torch.tensor([0.5, -0.5]))
    swap = SignedPermutation.from_lists([1, 0], [1.0, 1.0])  # the observation's entries trade places
    flip = SignedPermutation.from_lists([0, 1], [1.0, -1.0])  # the second action entry changes sign
    observation = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    # o1 = (1, 0): mu(o1) = (1.5, 2.5), mu(swap o1) = (2.5, 3.5), flip mu(o1) = (1.5, -2.5): |(1, 6)|^2 = 37.
    # o2 = (0, 0): mu = (0.5, -0.5) both ways, flipped (0.5, 0.5): |(0, -1)|^2 = 1. Mean 19.
    loss = mirror_loss(policy, observation, None, swap, flip)
    assert float(loss.detach()) == pytest.approx(19.0)
    loss.backward()
    # Only the reflected answer moves: d/db = mean of 2 (mu(swap o) - target) = ((2 + 0) / 2, (12 - 2) / 2).
    torch.testing.assert_close(policy.net[-1].bias.grad, torch.tensor([1.0, 5.0]))


def test_mirror_loss_pulls_a_microduck_actor_toward_equivariance():
    from waddle.envs.microduck import MicroDuckEnv

    def trained(coef):
        torch.manual_seed(0)
        env = MicroDuckEnv(tasks=[MicroDuckEnv.speed_range_task(0.1, 0.3)], num_envs=8, seed=0)
        trainer = PPO(env, PPOConfig(num_steps=16, num_epochs=4, num_minibatches=2, mirror_loss_coef=coef))
        metrics = [trainer.train_iteration() for _ in range(3)]
        observation = env.reset()["observation"]
        env.close()
        mirrors = MicroDuckEnv.MIRRORS["observation"], MicroDuckEnv.MIRRORS["action"]
        with torch.no_grad():
            return float(mirror_loss(trainer.policy, observation, None, *mirrors)), metrics

    free, free_metrics = trained(0.0)
    pulled, pulled_metrics = trained(10.0)
    assert "losses/mirror_loss" not in free_metrics[-1]
    assert pulled_metrics[-1]["losses/mirror_loss"] > 0.0
    assert pulled < 0.5 * free  # measured: 0.27 of it


def test_mirror_loss_needs_an_env_that_declares_its_mirror():
    env = DiffPointEnv(4, action_bound=1.0)
    with pytest.raises(
        ValueError, match=r"mirror_loss_coef > 0 needs the env's left-right reflection of \['observation', 'action'\]"
    ):
        PPO(env, PPOConfig(mirror_loss_coef=1.0, **TINY))


@pytest.mark.parametrize(
    ("fields", "symmetric"),
    [
        ({"actor_observation": "robot", "mirror_loss_coef": 0.3}, True),  # the robot's file: on by default
        ({"actor_observation": "robot", "mirror_loss_coef": 0.3, "symmetric_policy": False}, False),
        ({"actor_observation": "robot"}, False),  # no mirror loss: not trained toward symmetry
        ({"mirror_loss_coef": 0.3}, False),  # the full observation's walking recipes keep their plain mean
        ({"symmetric_policy": True}, True),
    ],
)
def test_the_deterministic_policy_is_the_mirror_average_where_asked(fields, symmetric):
    from waddle.envs.microduck import MicroDuckEnv

    torch.manual_seed(0)
    env = MicroDuckEnv(tasks=[MicroDuckEnv.joystick_task()], num_envs=6, seed=0, action_mode="robot")
    trainer = PPO(env, PPOConfig(**TINY, **fields))
    key = trainer.actor_key
    observe, act = MicroDuckEnv.MIRRORS[key], MicroDuckEnv.MIRRORS["action"]
    td = env.reset()
    for _ in range(3):
        td = env.step(td.set("action", torch.rand(6, 14) * 0.6 - 0.3))["next"]
    observation = td[key]
    env.close()
    policy = trainer.deterministic_policy()
    with torch.no_grad():
        direct, reflected = policy(observation), policy(observe(observation))
        loc, _ = trainer.policy(observation)
        loc_reflected, _ = trainer.policy(observe(observation))
    assert policy.symmetric is symmetric
    if symmetric:
        # Equivariant to rounding, and by hand the mean of the actor and its mirror image.
        torch.testing.assert_close(reflected, act(direct), atol=1e-6, rtol=0)
        torch.testing.assert_close(direct, (0.5 * (loc + act(loc_reflected))).clamp(-1, 1), atol=1e-6, rtol=0)
    else:
        torch.testing.assert_close(direct, loc.clamp(-1, 1))
        assert (reflected - act(direct)).abs().max() > 1e-3  # a random actor is not equivariant


def test_a_symmetric_policy_needs_an_env_that_declares_its_mirror():
    env = DiffPointEnv(4, action_bound=1.0)
    with pytest.raises(ValueError, match=r"PPOConfig.symmetric_policy=True needs the env's left-right reflection"):
        PPO(env, PPOConfig(symmetric_policy=True, **TINY))


# ---------------------------------------------------------------------------
# Reward terms
# ---------------------------------------------------------------------------


def test_reward_term_means_are_per_step_means_of_the_diagnostic_entries():
    # 2 envs x 3 steps; upright: mean of 1..6 = 3.5; pose: (-1 + 0 + 0 + 0 + 0 - 2) / 6 = -0.5
    out = TensorDict(
        {
            "diagnostic_reward_upright": torch.arange(1.0, 7.0).reshape(2, 3, 1),
            "diagnostic_reward_pose": torch.tensor([[[-1.0], [0.0], [0.0]], [[0.0], [0.0], [-2.0]]]),
            "diagnostic_height": torch.ones(2, 3, 1),  # not a reward term
            "reward": torch.zeros(2, 3, 1),
        },
        batch_size=[2, 3],
    )
    assert reward_term_means(out) == {"reward/upright": 3.5, "reward/pose": -0.5}
    assert reward_term_means(out.exclude("diagnostic_reward_upright", "diagnostic_reward_pose")) == {}


def test_ppo_on_microduck_logs_every_reward_term_summing_to_the_mean_reward():
    from waddle.envs.microduck import MicroDuckEnv

    env = MicroDuckEnv(tasks=[MicroDuckEnv.tracking_task(0.2)], num_envs=4, seed=0, diagnostics=True)
    trainer = PPO(env, PPOConfig(num_steps=8, num_epochs=1, num_minibatches=2, **TINY))
    metrics = trainer.train_iteration()
    env.close()
    terms = {key: value for key, value in metrics.items() if key.startswith("reward/")}
    assert set(terms) == {f"reward/{name}" for name in MicroDuckEnv.REWARD_TERMS}
    assert any(value != 0.0 for value in terms.values())
    # The env's reward is the sum of its weighted terms, so the means add up too.
    assert sum(terms.values()) == pytest.approx(metrics["charts/reward_mean"], rel=1e-5, abs=1e-6)


def test_update_runs_on_update_threads_and_restores_the_rollout_setting(monkeypatch):
    trainer = PPO(point_env(8), PPOConfig(num_steps=4, **TINY), update_threads=3)
    seen = []
    update = trainer.update
    monkeypatch.setattr(trainer, "update", lambda batch: seen.append(torch.get_num_threads()) or update(batch))
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        trainer.train_iteration()
        assert seen == [3]
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(previous)


def test_the_update_takes_every_core_unless_it_overlaps_the_rollout():
    assert default_update_threads(PPOConfig(), 4) == 4
    assert default_update_threads(PPOConfig(overlap_rollout=True), 4) == 1


def busy(seconds: float) -> None:
    """Spend ``seconds`` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_cpu_seconds_are_counted_per_phase_and_not_as_wall_time(monkeypatch):
    trainer = PPO(point_env(8), PPOConfig(num_steps=4, **TINY))
    trainer.train_iteration()  # warm-up: first calls build the collector
    collect, update = trainer.collect, trainer.update
    monkeypatch.setattr(trainer, "collect", lambda: busy(0.3) or collect())
    monkeypatch.setattr(trainer, "update", lambda batch: time.sleep(0.3) or update(batch))
    metrics = trainer.train_iteration()
    # The rollout burned 0.3 s of CPU; the update slept 0.3 s, which is wall time and no CPU.
    assert metrics["perf/rollout_cpu_s"] >= 0.3
    assert metrics["perf/update_s"] >= 0.3
    assert metrics["perf/update_cpu_s"] < metrics["perf/update_s"] - 0.2
    assert metrics["perf/rollout_cpu_s"] + metrics["perf/update_cpu_s"] == pytest.approx(
        metrics["perf/iteration_cpu_s"]
    )


def test_overlapped_iterations_report_only_the_total_cpu_seconds():
    trainer = PPO(point_env(8), PPOConfig(num_steps=4, overlap_rollout=True, **TINY))
    metrics = trainer.train_iteration()
    assert math.isnan(metrics["perf/rollout_cpu_s"]) and math.isnan(metrics["perf/update_cpu_s"])
    assert metrics["perf/iteration_cpu_s"] > 0


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_update_threads_must_be_a_positive_integer(value):
    with pytest.raises(ValueError, match="update_threads must be an integer >= 1 or None"):
        PPO(point_env(8), PPOConfig(num_steps=4, **TINY), update_threads=value)


# ---------------------------------------------------------------------------
# Overlapped rollouts
# ---------------------------------------------------------------------------


def test_overlapped_rollout_acts_with_the_policy_from_before_the_update():
    torch.manual_seed(0)
    trainer = PPO(point_env(8), PPOConfig(num_steps=4, overlap_rollout=True, **TINY))
    before = {k: v.clone() for k, v in trainer.policy.state_dict().items()}
    trainer.train_iteration()
    collected = trainer._next_batch  # collected while the first update ran, learned from next
    assert collected is not None and collected.shape == (8, 4)
    assert trainer.env_steps == 2 * 32  # the first iteration collects its own batch, then the next
    stale = PPO(point_env(8), PPOConfig(num_steps=4, **TINY))
    stale.policy.load_state_dict(before)
    loc_before, _ = stale.policy(collected["observation"])
    loc_after, _ = trainer.policy(collected["observation"])
    torch.testing.assert_close(collected["loc"], loc_before)
    assert not torch.allclose(collected["loc"], loc_after)


def test_overlapped_training_is_reproducible_and_leaves_no_thread_behind():
    def train() -> dict[str, torch.Tensor]:
        torch.manual_seed(3)
        trainer = PPO(point_env(8, seed=1), PPOConfig(num_steps=4, overlap_rollout=True, **TINY), update_threads=2)
        for _ in range(3):
            trainer.train_iteration()
            assert threading.active_count() == threads
        return trainer.policy.state_dict()

    threads = threading.active_count()
    first, second = train(), train()
    for key, value in first.items():
        assert torch.equal(value, second[key]), key


def test_overlapped_actions_are_sampled_inside_a_deterministic_exploration_context():
    # TorchRL losses set the process-wide exploration type to deterministic while they run;
    # the collecting thread must keep sampling meanwhile.
    torch.manual_seed(0)
    trainer = PPO(point_env(8), PPOConfig(num_steps=4, overlap_rollout=True, **TINY))
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        batch = trainer._rollout()
    assert not torch.allclose(batch["action"], batch["loc"])
    expected = torch.distributions.Normal(batch["loc"], batch["scale"]).log_prob(batch["action"]).sum(-1)
    torch.testing.assert_close(batch["action_log_prob"], expected)


def test_overlapped_update_that_fails_waits_for_the_rollout():
    env = point_env(8)
    trainer = PPO(env, PPOConfig(num_steps=4, overlap_rollout=True, **TINY))
    trainer.train_iteration()
    threads = threading.active_count()
    trainer._next_batch["next", "reward"] = trainer._next_batch["next", "reward"] * float("nan")
    with pytest.raises(NonFiniteLossError, match="PPO loss is nan"):
        trainer.train_iteration()
    assert threading.active_count() == threads  # the rollout that ran during the failed update was joined
    assert trainer.env_steps == 2 * 32  # and its batch dropped with the iteration


def test_overlapped_update_clips_around_the_current_policy_and_weights_the_advantage(monkeypatch):
    torch.manual_seed(0)
    config = PPOConfig(num_steps=4, num_epochs=1, num_minibatches=1, overlap_rollout=True, **TINY)
    trainer = PPO(point_env(8), config)
    batch = trainer.collect()
    with torch.no_grad():  # the policy moved since it acted
        trainer.policy.log_std.add_(0.3)
        trainer.policy.net[-1].bias.add_(0.2)
    expected = batch.clone()
    trainer.advantage_module(expected)
    flat = expected.exclude("next").reshape(-1)
    with torch.no_grad():
        loc, scale = trainer.policy(flat["observation"])
    current = torch.distributions.Normal(loc, scale).log_prob(flat["action"]).sum(-1)
    weight = torch.exp(current - flat["action_log_prob"]).clamp(max=1.0)
    assert (weight < 1).any() and (weight == 1).any()  # both sides of the truncation are exercised

    seen = []
    loss = trainer.loss_module.forward
    monkeypatch.setattr(trainer.loss_module, "forward", lambda data: seen.append(data.clone()) or loss(data))
    monkeypatch.setattr(torch, "randperm", lambda n, **kwargs: torch.arange(n))
    trainer.update(batch)
    torch.testing.assert_close(seen[0]["action_log_prob"], current)
    torch.testing.assert_close(seen[0]["advantage"], flat["advantage"] * weight.unsqueeze(-1))
