"""DifferentiableCollector on MicroDuckEnv with MJX gradients (``requires_grad=True``).

One module-scoped env of 2 robots is shared by the tests: the MJX step and its
backward compile once (about 3 minutes on a busy 2-core CPU the first time;
the persistent compilation cache makes later runs quick). The time limit is
set per test: short to see a truncation and auto-reset inside a window, long
where a window must not end an episode.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("mujoco.mjx", reason="needs the mjx extra: pip install 'waddle[mjx]'")

from helpers.collector_contract import (  # noqa: E402
    EnvCase,
    check_action_adjoint_clipping,
    check_collect_matches_unrolled_loop,
    check_windows_and_detach_state,
)
from helpers.compile_options import MJX_FAST_COMPILE  # noqa: E402
from helpers.policies import linear_policy  # noqa: E402

from waddle.envs.microduck import MicroDuckEnv  # noqa: E402

NUM_ENVS = 2
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


@pytest.fixture(scope="module")
def case():
    env = MicroDuckEnv(
        backend="mjx",
        requires_grad=True,
        num_envs=NUM_ENVS,
        seed=0,
        compiler_options=MJX_FAST_COMPILE,
    )
    yield EnvCase(env, lambda td: td["observation"])
    env.close()


@pytest.fixture
def time_limit(case):
    """Set the env's episode length for one test."""
    default = case.env.max_episode_steps

    def set_limit(steps: int) -> None:
        case.env.max_episode_steps = steps

    yield set_limit
    case.env.max_episode_steps = default


def _open_loop_actions() -> torch.Tensor:
    return 0.3 * torch.linspace(-1.0, 1.0, NUM_ENVS * MicroDuckEnv.NUM_JOINTS).reshape(NUM_ENVS, -1)


def test_collect_across_a_time_limit_matches_the_hand_stepped_env(case, time_limit):
    time_limit(3)
    policy = linear_policy(MicroDuckEnv.OBSERVATION_DIM, MicroDuckEnv.NUM_JOINTS, scale=0.05)
    rollout = check_collect_matches_unrolled_loop(case, policy, 4)
    T, F = True, False
    assert not rollout.terminations.any()  # standing still: nobody falls
    assert torch.stack([t.truncated for t in rollout.transitions]).tolist() == [[F, F], [F, F], [T, T], [F, F]]
    assert rollout.alive_mask.tolist() == [[T, T], [T, T], [T, T], [F, F]]
    # the truncated step keeps the observation it produced; the next step starts from the reset
    assert rollout.transitions[2].next_observation.requires_grad
    assert not torch.allclose(rollout.transitions[2].next_observation, rollout.transitions[3].observation)


def test_windows_and_detach_state(case, time_limit):
    time_limit(100)
    check_windows_and_detach_state(case, _open_loop_actions(), (2, 1, 2))


def test_action_adjoint_clipping(case, time_limit):
    time_limit(100)
    check_action_adjoint_clipping(case, _open_loop_actions(), 3)
