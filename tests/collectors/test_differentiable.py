"""The DifferentiableCollector contract on the pure-torch test envs."""

import copy
import dataclasses

import pytest
import torch
from helpers.collector_contract import (
    EnvCase,
    check_action_adjoint_clipping,
    check_collect_matches_unrolled_loop,
    check_windows_and_detach_state,
)
from helpers.diff_point_env import DiffPointEnv, LinearSystemEnv
from helpers.keyed_point_env import KeyedPointEnv
from helpers.policies import linear_policy as make_linear_policy
from helpers.policies import open_loop_policy
from tensordict.nn import NormalParamExtractor, TensorDictModule
from torch import nn
from torchrl.data import Categorical, Composite, Unbounded
from torchrl.modules import IndependentNormal, ProbabilisticActor

from waddle.collectors import (
    ActionAdjointStats,
    DifferentiableCollector,
    DifferentiableRollout,
    clip_per_env_norm,
)
from waddle.modules import RunningNormalizer


def linear_policy(seed: int = 0) -> TensorDictModule:
    return make_linear_policy(2, 1, seed=seed)


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


def test_a_policy_of_another_dtype_reads_its_own_and_the_env_gets_its_own():
    # The case of a float64 MJX env under float32 networks, with the dtypes swapped: the point env is float32.
    env = DiffPointEnv(3, max_steps=100, ctrl_cost=0.1)
    policy = make_linear_policy(2, 1, seed=0, dtype=torch.float64)
    reference_net = copy.deepcopy(policy.module)
    collector = DifferentiableCollector(env, policy, "cpu")
    obs0 = collector.reset(seed=0)
    rollout = collector.collect(5)
    (-rollout.rewards.sum()).backward()

    assert obs0.dtype == rollout.observations.dtype == rollout.next_observations.dtype == torch.float64
    assert env.vel.dtype == torch.float32  # the env stepped on float32 actions
    expected_rewards = reference_rollout(env, reference_net, obs0, 5)  # the same dynamics in float64
    (-expected_rewards.sum()).backward()
    torch.testing.assert_close(rollout.rewards.double().detach(), expected_rewards.detach(), rtol=1e-5, atol=1e-6)
    assert policy.module.weight.grad.abs().min() > 0
    torch.testing.assert_close(policy.module.weight.grad, reference_net.weight.grad, rtol=1e-4, atol=1e-6)


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


def test_adjoint_clipping_caps_each_envs_action_gradient_and_records_statistics():
    # against the hand-stepped env's per-step adjoints, clipped in the test itself
    env = DiffPointEnv(6, ctrl_cost=0.5, init_scale=1.0)
    check_action_adjoint_clipping(
        EnvCase(env, lambda td: td["observation"], seed=3), torch.linspace(-2, 2, 6)[:, None], 4
    )
    collector = DifferentiableCollector(env, linear_policy(), "cpu", action_adjoint_max_norm=1.0)
    stats = collector.collect(2).action_gradient_stats
    assert isinstance(stats, ActionAdjointStats)
    assert set(stats.as_dict()) == {
        "action_adjoint/mean_norm",
        "action_adjoint/max_norm",
        "action_adjoint/clipped_fraction",
        "action_adjoint/num_samples",
    }


def test_single_step_clipped_gradients_have_norm_at_most_the_limit():
    env = DiffPointEnv(6, ctrl_cost=0.5, init_scale=1.0)
    policy = open_loop_policy(torch.linspace(-2.0, 2.0, 6)[:, None])
    rollout = DifferentiableCollector(env, policy, "cpu", action_adjoint_max_norm=1e-3).collect(1)
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


@pytest.mark.parametrize(
    "make_env, error",
    [
        (lambda: KeyedPointEnv(done_entries=()), "full_done_spec"),
        (lambda: _with_specs(KeyedPointEnv(), done=_two_done_groups()), "under a single parent"),
        (lambda: _with_specs(KeyedPointEnv(), done=_flags(("agent", "done"), (3, 2, 1))), "one flag per env"),
        (lambda: _with_specs(KeyedPointEnv(), reward=_entry(("agent", "reward"), (3, 2))), "one value per env"),
    ],
    ids=["no-done-entry", "two-done-groups", "two-flags-per-env", "two-rewards-per-env"],
)
def test_rejects_envs_whose_layout_it_cannot_read(make_env, error):
    with pytest.raises(ValueError, match=error):
        DifferentiableCollector(make_env(), linear_policy(), "cpu", observation_keys=KEYED_OBSERVATION)


def test_observation_keys_must_be_declared_and_are_required_when_ambiguous():
    env = KeyedPointEnv()
    with pytest.raises(ValueError, match=r"pass observation_keys.*\('agent', 'position'\)"):
        DifferentiableCollector(env, linear_policy(), "cpu")
    with pytest.raises(ValueError, match="observation_keys must name"):
        DifferentiableCollector(env, linear_policy(), "cpu", observation_keys=[("agent", "speed")])
    with pytest.raises(ValueError, match="observation_keys must name"):
        DifferentiableCollector(env, linear_policy(), "cpu", observation_keys=[])


def test_the_only_floating_observation_entry_is_the_default():
    env = KeyedPointEnv()
    env.observation_spec = Composite(agent=Composite(position=Unbounded((3, 1)), shape=(3,)), shape=(3,))
    collector = DifferentiableCollector(env, make_linear_policy(1, 1), "cpu")
    assert collector.layout.observation_keys == (("agent", "position"),)


def test_rejects_an_env_built_without_gradients():
    from waddle.envs.microduck import MicroDuckEnv

    env = MicroDuckEnv(backend="mujoco", num_envs=1)
    with pytest.raises(ValueError, match="requires_grad=True"):
        DifferentiableCollector(env, make_linear_policy(56, 14), "cpu")
    with pytest.raises(TypeError, match="EnvBase"):
        DifferentiableCollector(object(), linear_policy(), "cpu")


class NoGradPointEnv(DiffPointEnv):
    """The point mass stepped outside autograd, as a simulator in numpy or C would be."""

    def _step(self, tensordict):
        with torch.no_grad():
            return super()._step(tensordict)


def test_an_env_that_cuts_the_graph_is_named_at_the_first_step():
    collector = DifferentiableCollector(NoGradPointEnv(3), linear_policy(), "cpu")
    with pytest.raises(RuntimeError, match="NoGradPointEnv is not differentiable"):
        collector.collect(1)
    with torch.no_grad():  # without grad nothing is expected of it (evaluation)
        assert collector.collect(2).rewards.shape == (2, 3)


def test_a_policy_action_of_the_wrong_shape_is_named():
    collector = DifferentiableCollector(DiffPointEnv(3), open_loop_policy(torch.zeros(3, 2)), "cpu")
    with pytest.raises(ValueError, match=r"policy's action must have shape .*\(3, 1\), got \(3, 2\)"):
        collector.collect(1)


# -- any env: helper envs of other layouts -----------------------------------------

KEYED_OBSERVATION = [("agent", "position"), ("agent", "velocity")]


def _keyed_observation(td):
    batch = td.batch_size.numel()
    parts = [td[key].reshape(batch, -1) for key in KEYED_OBSERVATION]
    return torch.cat(parts, -1)


HELPER_CASES = {
    "point": (lambda: EnvCase(DiffPointEnv(3, max_steps=100, ctrl_cost=0.1), lambda td: td["observation"]), 2, 1),
    "linear-system": (lambda: EnvCase(LinearSystemEnv(4, max_steps=100), lambda td: td["observation"]), 1, 1),
    "keyed-2x3": (
        lambda: EnvCase(
            KeyedPointEnv((2, 3), max_steps=100, done_entries=("done", "terminated")),
            _keyed_observation,
            KEYED_OBSERVATION,
        ),
        2,
        1,
    ),
    "keyed-unbatched": (
        lambda: EnvCase(KeyedPointEnv((), max_steps=100, dim=2), _keyed_observation, KEYED_OBSERVATION),
        4,
        2,
    ),
}


@pytest.mark.parametrize("name", HELPER_CASES)
def test_collect_matches_the_hand_stepped_env(name):
    make_case, obs_dim, action_dim = HELPER_CASES[name]
    case = make_case()
    rollout = check_collect_matches_unrolled_loop(case, make_linear_policy(obs_dim, action_dim), 5)
    assert rollout.observations.shape == (5, case.num_envs, obs_dim)
    assert rollout.actions.shape == (5, case.num_envs, action_dim)
    assert not rollout.dones.any()


@pytest.mark.parametrize("name", HELPER_CASES)
def test_windows_and_detach_state_on_any_layout(name):
    make_case, _, action_dim = HELPER_CASES[name]
    case = make_case()
    actions = torch.linspace(-1.0, 1.0, case.num_envs * action_dim).reshape(case.num_envs, action_dim)
    check_windows_and_detach_state(case, actions, (2, 2, 3))


@pytest.mark.parametrize("name", HELPER_CASES)
def test_action_adjoint_clipping_on_any_layout(name):
    make_case, _, action_dim = HELPER_CASES[name]
    case = make_case()
    actions = torch.linspace(-1.0, 1.0, case.num_envs * action_dim).reshape(case.num_envs, action_dim)
    check_action_adjoint_clipping(case, actions, 4)


def test_actions_are_clamped_per_env_with_several_batch_dimensions():
    env = KeyedPointEnv((2, 2), action_bound=0.5)
    policy = open_loop_policy(torch.tensor([[3.0], [-0.2], [-4.0], [0.1]]))
    collector = DifferentiableCollector(
        env, policy, "cpu", observation_keys=KEYED_OBSERVATION, clip_actions_to_space=True
    )
    rollout = collector.collect(1)
    torch.testing.assert_close(rollout.actions[0, :, 0], torch.tensor([0.5, -0.2, -0.5, 0.1]))
    # the env received them in its own shape
    torch.testing.assert_close(env.vel.reshape(4), env.dt * torch.tensor([0.5, -0.2, -0.5, 0.1]))


# -- episode ends from whichever done entries the env declares -----------------------

# Three point masses pushed by a = 1 (bound 2, time limit 3 steps): env 0 leaves
# the bound at every step (it restarts at 1.999), env 1 reaches the time limit
# at step 2, env 2 leaves the bound at step 2, when its time limit falls too.
T, F = True, False
TERMINAL = [[T, F, F], [T, F, F], [T, F, T], [T, F, F]]
TIME_LIMIT = [[F, F, F], [F, F, F], [F, T, F], [F, F, F]]
NEVER = [[F, F, F]] * 4
EITHER = [[T, F, F], [T, F, F], [T, T, T], [T, F, F]]


@pytest.mark.parametrize(
    "done_entries, terminated, truncated",
    [
        (("done", "terminated", "truncated"), TERMINAL, TIME_LIMIT),
        (("done", "terminated"), TERMINAL, TIME_LIMIT),  # Brax's entries
        (("terminated", "truncated"), TERMINAL, TIME_LIMIT),
        (("done", "truncated"), TERMINAL, TIME_LIMIT),
        (("terminated", "timeout"), TERMINAL, TIME_LIMIT),  # an end under another name
        (("done",), EITHER, NEVER),  # no way to tell a time limit: terminal, as TorchRL reads it
        (("terminated",), TERMINAL, NEVER),
        (("truncated",), NEVER, TIME_LIMIT),
    ],
)
def test_terminated_and_truncated_are_derived_from_the_declared_done_entries(done_entries, terminated, truncated):
    env = KeyedPointEnv(prefix=(), done_entries=done_entries, bound=2.0, max_steps=3, init_pos=[1.999, 0.0, 1.95])
    collector = DifferentiableCollector(
        env, open_loop_policy(torch.ones(3, 1)), "cpu", observation_keys=KEYED_OBSERVATION[0][-1]
    )
    rollout = collector.collect(4)
    assert rollout.terminations.tolist() == terminated
    assert rollout.dones.tolist() == [[a or b for a, b in zip(x, y)] for x, y in zip(terminated, truncated)]
    truncations = torch.stack([t.truncated for t in rollout.transitions])
    assert truncations.tolist() == truncated
    assert rollout.transitions[0].terminated.dtype == torch.bool and rollout.transitions[0].truncated.shape == (3,)
    # none of the done entries leaks into info
    assert not set(rollout.transitions[0].info) & set(done_entries)


def test_done_entries_nested_under_the_only_parent_are_read():
    env = KeyedPointEnv(done_entries=("done", "terminated"), bound=2.0, max_steps=3, init_pos=[1.999, 0.0, 1.95])
    collector = DifferentiableCollector(
        env, open_loop_policy(torch.ones(3, 1)), "cpu", observation_keys=KEYED_OBSERVATION
    )
    rollout = collector.collect(4)
    assert rollout.terminations.tolist() == TERMINAL
    assert torch.stack([t.truncated for t in rollout.transitions]).tolist() == TIME_LIMIT


# -- spec surgery for the validation tests ------------------------------------------


def _entry(key, shape):
    return Composite({key[0]: Composite({key[1]: Unbounded(shape)}, shape=(3,))}, shape=(3,))


def _flags(key, shape):
    flag = Categorical(2, shape, dtype=torch.bool)
    return Composite({key[0]: Composite({key[1]: flag}, shape=(3,))}, shape=(3,))


def _two_done_groups():
    flag = Categorical(2, (3, 1), dtype=torch.bool)
    return Composite(
        left=Composite(done=flag.clone(), shape=(3,)), right=Composite(done=flag.clone(), shape=(3,)), shape=(3,)
    )


def _with_specs(env, *, done=None, reward=None):
    if done is not None:
        env.done_spec = done
    if reward is not None:
        env.reward_spec = reward
    return env
