"""The DifferentiableCollector contract on a pure-torch point-mass env."""

import copy
import dataclasses

import pytest
import torch
from helpers.diff_point_env import DiffPointEnv
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.modules import IndependentNormal, ProbabilisticActor

from waddle.collectors import (
    ActionAdjointStats,
    DifferentiableCollector,
    DifferentiableRollout,
    clip_per_env_norm,
)
from waddle.modules import RunningNormalizer


def linear_policy(seed: int = 0) -> TensorDictModule:
    torch.manual_seed(seed)
    return TensorDictModule(nn.Linear(2, 1), in_keys=["observation"], out_keys=["action"])


class OpenLoop(nn.Module):
    """One learnable action per env, whatever the observation."""

    def __init__(self, actions: torch.Tensor) -> None:
        super().__init__()
        self.actions = nn.Parameter(actions.clone())

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.actions.clone()


def open_loop_policy(actions: torch.Tensor) -> TensorDictModule:
    return TensorDictModule(OpenLoop(actions), in_keys=["observation"], out_keys=["action"])


def reference_rollout(
    env: DiffPointEnv, net: nn.Module, obs0: torch.Tensor, num_steps: int, normalizer: nn.Module | None = None
) -> torch.Tensor:
    """The point-mass dynamics written out by hand; returns rewards ``[T, N]``."""
    pos, vel = obs0[:, :1], obs0[:, 1:]
    rewards = []
    for _ in range(num_steps):
        obs = torch.cat([pos, vel], -1)
        action = net(obs if normalizer is None else normalizer(obs))
        vel = vel + env.dt * action
        pos = pos + env.dt * vel
        rewards.append(-((pos - env.goal) ** 2).sum(-1) - env.ctrl_cost * (action**2).sum(-1))
    return torch.stack(rewards)


# -- rollout contract ----------------------------------------------------------


def test_rollout_shapes_fields_and_immutability():
    env = DiffPointEnv(3, max_steps=100)
    collector = DifferentiableCollector(env, linear_policy(), "cpu")
    obs0 = collector.reset(seed=0)
    seen = []
    rollout = collector.collect(4, on_step_callback=seen.append)

    assert isinstance(rollout, DifferentiableRollout) and rollout.num_steps == 4
    assert seen == list(rollout.transitions)
    torch.testing.assert_close(rollout.initial_observation, obs0)
    assert rollout.rewards.shape == (4, 3)
    assert rollout.observations.shape == rollout.next_observations.shape == (4, 3, 2)
    assert rollout.actions.shape == (4, 3, 1)
    assert rollout.alive_mask.shape == rollout.dones.shape == (4, 3)
    assert rollout.alive_mask.dtype == torch.bool and rollout.alive_mask.all()
    torch.testing.assert_close(rollout.observations[1:], rollout.next_observations[:-1])
    assert rollout.final_observation is rollout.transitions[-1].next_observation
    assert rollout.action_gradient_stats is None

    step = rollout.transitions[0]
    assert step.action is step.policy_output["action"]
    assert step.reward.shape == step.terminated.shape == step.truncated.shape == (3,)
    torch.testing.assert_close(step.done, step.terminated | step.truncated)
    assert isinstance(step.info, dict)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rollout.transitions = ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.reward = step.reward


@pytest.mark.parametrize("normalize", [False, True])
def test_graph_reaches_the_policy_and_matches_hand_written_dynamics(normalize):
    env = DiffPointEnv(3, max_steps=100, ctrl_cost=0.1)
    policy = linear_policy()
    reference_net = copy.deepcopy(policy.module)
    normalizer = None
    if normalize:
        normalizer = RunningNormalizer(2)
        normalizer.update(torch.tensor([[0.0, -1.0], [1.0, 1.0]]))
    collector = DifferentiableCollector(env, policy, "cpu", observation_normalizer=normalizer)
    obs0 = collector.reset(seed=0)
    rollout = collector.collect(6)
    (-rollout.rewards.sum()).backward()

    expected_rewards = reference_rollout(env, reference_net, obs0, 6, normalizer)
    (-expected_rewards.sum()).backward()
    torch.testing.assert_close(rollout.rewards.detach(), expected_rewards.detach())
    assert policy.module.weight.grad.abs().min() > 0
    torch.testing.assert_close(policy.module.weight.grad, reference_net.weight.grad)
    torch.testing.assert_close(policy.module.bias.grad, reference_net.bias.grad)
    if normalize:  # the policy read the normalised observation
        policy_obs = rollout.transitions[0].policy_output["observation"]
        torch.testing.assert_close(policy_obs, normalizer(obs0))


def test_stochastic_policy_is_reparameterised_and_deterministic_uses_the_mean():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 2), NormalParamExtractor())
    policy = ProbabilisticActor(
        TensorDictModule(net, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"],
        distribution_class=IndependentNormal,
    )
    collector = DifferentiableCollector(DiffPointEnv(4), policy, "cpu")
    collector.reset(seed=0)
    sampled = collector.collect(3)
    out = sampled.transitions[0].policy_output
    assert not torch.allclose(out["action"], out["loc"])
    (-sampled.rewards.sum()).backward()
    weight_grad = net[0].weight.grad
    # both the loc row and the scale row receive gradient through rsample
    assert weight_grad[0].abs().sum() > 0 and weight_grad[1].abs().sum() > 0

    mean = collector.collect(2, deterministic=True).transitions[0].policy_output
    torch.testing.assert_close(mean["action"], mean["loc"])


def test_alive_mask_is_true_until_the_first_done_then_false():
    # env 0 crosses the bound at step 0 (terminated) and again right after its
    # reset at step 1; envs 1 and 2 are truncated at step 2 (max_steps=3).
    env = DiffPointEnv(3, max_steps=3, bound=2.0, init_pos=[1.999, 0.0, -1.0])
    policy = open_loop_policy(torch.ones(3, 1))
    collector = DifferentiableCollector(env, policy, "cpu")
    collector.reset()
    rollout = collector.collect(5)
    T, F = True, False
    assert rollout.terminations[:, 0].tolist() == [T, T, T, T, T]
    assert rollout.dones[:, 1].tolist() == [F, F, T, F, F]
    assert rollout.alive_mask.T.tolist() == [[T, F, F, F, F], [T, T, T, F, F], [T, T, T, F, F]]
    # the done step keeps its true next observation (before the auto-reset)
    assert rollout.transitions[0].next_observation[0, 0] > 2.0
    assert rollout.transitions[1].observation[0, 0].item() == pytest.approx(1.999)


def test_actions_are_clamped_to_the_action_bounds():
    env = DiffPointEnv(2, action_bound=0.5)
    policy = open_loop_policy(torch.tensor([[3.0], [-0.2]]))
    collector = DifferentiableCollector(env, policy, "cpu", clip_actions_to_space=True)
    rollout = collector.collect(2)
    torch.testing.assert_close(rollout.actions[:, :, 0], torch.tensor([[0.5, -0.2], [0.5, -0.2]]))
    (-rollout.rewards.sum()).backward()
    assert policy.module.actions.grad[0] == 0  # saturated: no gradient through the clamp
    assert policy.module.actions.grad[1] != 0


# -- action-adjoint clipping -----------------------------------------------------


def test_clip_per_env_norm_rescales_rows_above_the_limit():
    gradient = torch.tensor([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    clipped, norms = clip_per_env_norm(gradient, 1.0)
    torch.testing.assert_close(norms, torch.tensor([5.0, 0.5, 0.0]))
    torch.testing.assert_close(clipped, torch.tensor([[0.6, 0.8], [0.3, 0.4], [0.0, 0.0]]))


def _open_loop_rollout(max_norm: float, num_steps: int):
    env = DiffPointEnv(6, ctrl_cost=0.5, init_scale=1.0)
    policy = open_loop_policy(torch.linspace(-2.0, 2.0, 6)[:, None])
    collector = DifferentiableCollector(env, policy, "cpu", action_adjoint_max_norm=max_norm)
    collector.reset(seed=3)
    return policy, collector.collect(num_steps)


def test_adjoint_clipping_caps_each_envs_action_gradient_and_records_statistics():
    num_steps = 4
    # unclipped per-step adjoints dL/da_t, one row per env
    _, free = _open_loop_rollout(0.0, num_steps)
    adjoints = torch.autograd.grad(-free.rewards.sum(), [t.action for t in free.transitions])
    norms = torch.stack([a.norm(dim=-1) for a in adjoints])  # [T, N]
    limit = float(norms.median())

    policy, clipped = _open_loop_rollout(limit, num_steps)
    (-clipped.rewards.sum()).backward()
    # open loop, so the parameter gradient is the sum of the clipped adjoints
    expected = sum(clip_per_env_norm(a, limit)[0] for a in adjoints)
    torch.testing.assert_close(policy.module.actions.grad, expected)
    assert not torch.allclose(expected, sum(adjoints))

    stats = clipped.action_gradient_stats
    assert isinstance(stats, ActionAdjointStats)
    assert stats.num_samples.item() == num_steps * 6
    assert stats.mean_norm == pytest.approx(norms.mean().item(), rel=1e-5)
    assert stats.max_norm == pytest.approx(norms.max().item(), rel=1e-5)
    assert stats.clipped_fraction == pytest.approx((norms > limit).float().mean().item())
    assert set(stats.as_dict()) == {
        "action_adjoint/mean_norm",
        "action_adjoint/max_norm",
        "action_adjoint/clipped_fraction",
        "action_adjoint/num_samples",
    }


def test_single_step_clipped_gradients_have_norm_at_most_the_limit():
    policy, rollout = _open_loop_rollout(1e-3, 1)
    (-rollout.rewards.sum()).backward()
    assert (policy.module.actions.grad.norm(dim=-1) <= 1e-3 * (1 + 1e-5)).all()
    assert rollout.action_gradient_stats.clipped_fraction == 1.0


# -- truncated-BPTT segments -----------------------------------------------------


def test_detach_state_starts_a_segment_no_gradient_crosses_it():
    env = DiffPointEnv(3, max_steps=100)
    collector = DifferentiableCollector(env, linear_policy(), "cpu")
    collector.reset(seed=0)
    first = collector.collect(3)
    first_actions = [t.action for t in first.transitions]

    joined = collector.collect(2)  # no cut yet: gradient reaches the first segment
    grads = torch.autograd.grad(joined.rewards.sum(), first_actions, retain_graph=True)
    assert all(g.abs().sum() > 0 for g in grads)

    obs = collector.detach_state()
    assert obs.grad_fn is None and env.pos.grad_fn is None and env.vel.grad_fn is None
    torch.testing.assert_close(obs, joined.final_observation.detach())
    cut = collector.collect(3)
    grads = torch.autograd.grad(cut.rewards.sum(), first_actions, allow_unused=True)
    assert all(g is None for g in grads)
    assert cut.rewards.requires_grad  # the new segment still reaches the policy


# -- validation ------------------------------------------------------------------


@pytest.mark.parametrize("num_steps", [0, -3, 2.5, True])
def test_collect_rejects_non_positive_num_steps(num_steps):
    collector = DifferentiableCollector(DiffPointEnv(2), linear_policy(), "cpu")
    with pytest.raises(ValueError, match="num_steps"):
        collector.collect(num_steps)


@pytest.mark.parametrize("max_norm", [-1.0, float("nan")])
def test_rejects_negative_action_adjoint_max_norm(max_norm):
    with pytest.raises(ValueError, match="action_adjoint_max_norm"):
        DifferentiableCollector(DiffPointEnv(2), linear_policy(), "cpu", action_adjoint_max_norm=max_norm)


def test_clipping_actions_needs_a_bounded_action_spec():
    with pytest.raises(TypeError, match="clip_actions_to_space"):
        DifferentiableCollector(DiffPointEnv(2, action_bound=None), linear_policy(), "cpu", clip_actions_to_space=True)
