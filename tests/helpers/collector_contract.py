"""The DifferentiableCollector contract, checked on any differentiable env.

Every check compares the collector with the same env stepped by hand: a loop
over ``env.step_and_maybe_reset`` written here with the env's own keys and
shapes, which shares no code with the collector. Losses, rewards and
gradients of the two must agree.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import pytest
import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torchrl.envs import EnvBase

from helpers.gradients import clip_rows_to_norm
from helpers.policies import open_loop_policy
from waddle.collectors import DifferentiableCollector


@dataclass
class EnvCase:
    """A differentiable env and how to read its observation by hand.

    ``read_observation`` turns the env's tensordict into the ``[N, F]``
    observation the policy should see; ``observation_keys`` is passed to the
    collector (``None``: its default).
    """

    env: EnvBase
    read_observation: Callable[[TensorDictBase], torch.Tensor]
    observation_keys: object = None
    seed: int = 0

    @property
    def num_envs(self) -> int:
        return self.env.batch_size.numel()

    def collector(self, policy: TensorDictModule, **kwargs) -> DifferentiableCollector:
        return DifferentiableCollector(self.env, policy, "cpu", observation_keys=self.observation_keys, **kwargs)

    def reset(self) -> TensorDictBase:
        """Seed and reset the env, with no graph left from an earlier run."""
        if callable(getattr(self.env, "detach_state", None)):
            self.env.detach_state()
        self.env.set_seed(self.seed)
        return self.env.reset()


def unrolled(case: EnvCase, act: Callable[[torch.Tensor], torch.Tensor], num_steps: int, td: TensorDictBase):
    """Step ``case.env`` by hand ``num_steps`` times from ``td``.

    ``act`` maps the flat observation ``[N, F]`` to a flat action ``[N, ...]``.

    Returns:
        ``(rewards, actions, observations, td)``: per-step lists of the flat
        rewards ``[N]``, actions and observations, and the tensordict to go on from.
    """
    env = case.env
    batch = env.batch_size
    per_env_action = env.full_action_spec[env.action_key].shape[len(batch) :]
    rewards, actions, observations = [], [], []
    for _ in range(num_steps):
        observation = case.read_observation(td)
        action = act(observation)
        td = td.copy()
        td.set(env.action_key, action.reshape(*batch, *per_env_action))
        stepped, td = env.step_and_maybe_reset(td)
        rewards.append(stepped.get(("next", env.reward_key)).reshape(-1))
        actions.append(action)
        observations.append(observation)
    return rewards, actions, observations, td


def cut(case: EnvCase, td: TensorDictBase) -> TensorDictBase:
    """The env's own graph cut, by hand: its ``detach_state()`` if any, and the carried tensordict."""
    if callable(getattr(case.env, "detach_state", None)):
        case.env.detach_state()
    return td.detach()


def check_collect_matches_unrolled_loop(case: EnvCase, policy: TensorDictModule, num_steps: int):
    """``collect`` gives the rewards, observations and parameter gradients of the hand-stepped env.

    Returns:
        The collector's rollout, for env-specific checks of its flags.
    """
    reference = copy.deepcopy(policy.module)
    td = case.reset()
    rewards, _, observations, _ = unrolled(case, reference, num_steps, td)
    (-torch.stack(rewards).sum()).backward()

    collector = case.collector(policy)
    collector.reset(seed=case.seed)
    rollout = collector.collect(num_steps)
    (-rollout.rewards.sum()).backward()

    assert rollout.rewards.shape == (num_steps, case.num_envs)
    torch.testing.assert_close(rollout.rewards.detach(), torch.stack(rewards).detach())
    torch.testing.assert_close(rollout.observations.detach(), torch.stack(observations).detach())
    reference_grads = [p.grad for p in reference.parameters()]
    assert all(g is not None and g.abs().sum() > 0 for g in reference_grads)
    for got, expected in zip([p.grad for p in policy.module.parameters()], reference_grads):
        torch.testing.assert_close(got, expected)
    return rollout


def check_windows_and_detach_state(case: EnvCase, actions: torch.Tensor, windows: tuple[int, int, int]):
    """Gradients cross windows until ``detach_state``, never after it, and flow through the env within one.

    Open-loop actions: a later reward depends on an earlier action only through the env's state.
    """
    first, second, third = windows
    param = actions.clone().requires_grad_(True)
    td = case.reset()
    _, _, _, td = unrolled(case, lambda obs: param.clone(), first + second, td)
    td = cut(case, td)
    rewards, step_actions, _, _ = unrolled(case, lambda obs: param.clone(), third, td)
    (expected_through_env,) = torch.autograd.grad(rewards[-1].sum(), step_actions[0], retain_graph=True)
    (expected_grad,) = torch.autograd.grad(-torch.stack(rewards).sum(), param)
    assert expected_through_env.abs().sum() > 0

    policy = open_loop_policy(actions)
    collector = case.collector(policy)
    collector.reset(seed=case.seed)
    window_1 = collector.collect(first)
    window_2 = collector.collect(second)  # no cut yet
    earlier_actions = [t.action for t in window_1.transitions]
    grads = torch.autograd.grad(window_2.rewards.sum(), earlier_actions, retain_graph=True)
    assert all(g.abs().sum() > 0 for g in grads), "without detach_state the graph must reach the previous window"

    observation = collector.detach_state()
    assert observation.grad_fn is None
    torch.testing.assert_close(observation, window_2.final_observation.detach())
    window_3 = collector.collect(third)
    earlier_actions += [t.action for t in window_2.transitions]
    grads = torch.autograd.grad(window_3.rewards.sum(), earlier_actions, retain_graph=True, allow_unused=True)
    assert all(g is None for g in grads), "after detach_state no gradient may reach an earlier window"

    (through_env,) = torch.autograd.grad(window_3.rewards[-1].sum(), window_3.transitions[0].action, retain_graph=True)
    torch.testing.assert_close(through_env, expected_through_env)
    (-window_3.rewards.sum()).backward()
    torch.testing.assert_close(policy.module.actions.grad, expected_grad)


def check_action_adjoint_clipping(case: EnvCase, actions: torch.Tensor, num_steps: int):
    """Each env's action adjoint is clipped to the limit; the parameter gradient is their sum.

    Open-loop actions, so each step's adjoint reaches the parameters unchanged
    by the clipping of the others. The limit is the median unclipped norm, so
    some rows are clipped and some are not.
    """
    param = actions.clone().requires_grad_(True)
    rewards, step_actions, _, _ = unrolled(case, lambda obs: param.clone(), num_steps, case.reset())
    adjoints = torch.autograd.grad(-torch.stack(rewards).sum(), step_actions)
    norms = torch.stack([a.reshape(a.shape[0], -1).norm(dim=1) for a in adjoints])  # [T, N]
    limit = float(norms.median())
    expected = sum(clip_rows_to_norm(a, limit) for a in adjoints)
    assert not torch.allclose(expected, sum(adjoints))

    policy = open_loop_policy(actions)
    collector = case.collector(policy, action_adjoint_max_norm=limit)
    collector.reset(seed=case.seed)
    rollout = collector.collect(num_steps)
    (-rollout.rewards.sum()).backward()
    torch.testing.assert_close(policy.module.actions.grad, expected)

    stats = rollout.action_gradient_stats
    assert stats.num_samples.item() == num_steps * case.num_envs
    assert stats.mean_norm == pytest.approx(norms.mean().item(), rel=1e-4)
    assert stats.max_norm == pytest.approx(norms.max().item(), rel=1e-4)
    assert stats.clipped_fraction == pytest.approx((norms > limit).float().mean().item())
