"""DifferentiableCollector on waddle's BraxEnv, whose done entries are ``done`` and ``terminated``.

Issue 13: ``collect`` used to fail here reading the ``truncated`` entry Brax
envs do not have. One module-scoped ``reacher`` (3 envs, the ``positional``
pipeline, reduced XLA optimisation: the configuration of
``tests/envs/test_brax.py``, so the persistent compilation cache serves both)
is shared by the tests: its programs compile once.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("jax")
pytest.importorskip("brax")

from helpers.collector_contract import (  # noqa: E402
    EnvCase,
    check_action_adjoint_clipping,
    check_collect_matches_unrolled_loop,
    check_windows_and_detach_state,
)
from helpers.policies import linear_policy  # noqa: E402

from waddle.envs.brax import BraxEnv  # noqa: E402

NUM_ENVS, OBS_DIM, ACTION_DIM = 3, 11, 2
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def case():
    env = BraxEnv(
        "reacher",
        backend="positional",
        batch_size=[NUM_ENVS],
        requires_grad=True,
        compiler_options=FAST_COMPILE,
    )
    yield EnvCase(env, lambda td: td["observation"])
    env.close()


def _open_loop_actions() -> torch.Tensor:
    return 0.5 * torch.linspace(-1.0, 1.0, NUM_ENVS * ACTION_DIM).reshape(NUM_ENVS, ACTION_DIM)


def test_collect_works_without_a_truncated_entry_and_matches_the_hand_stepped_env(case):
    assert set(case.env.full_done_spec.keys()) == {"done", "terminated"}
    rollout = check_collect_matches_unrolled_loop(case, linear_policy(OBS_DIM, ACTION_DIM, scale=0.3), 3)
    # reacher never ends an episode: nothing terminated, and no truncation invented
    assert not rollout.terminations.any()
    assert not torch.stack([t.truncated for t in rollout.transitions]).any()
    # the Brax state rides along in info, with its history
    assert rollout.transitions[-1].info[("state", "pipeline_state", "q")].requires_grad


def test_windows_and_detach_state(case):
    check_windows_and_detach_state(case, _open_loop_actions(), (2, 1, 2))


def test_action_adjoint_clipping(case):
    check_action_adjoint_clipping(case, _open_loop_actions(), 3)
