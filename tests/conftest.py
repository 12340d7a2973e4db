import pytest
import torch

# Tests run tiny networks on a 2-core machine shared with the physics threads:
# torch's own thread pool only adds contention there.
torch.set_num_threads(1)


@pytest.fixture
def restore_reward_registry():
    """Snapshot the MicroDuck reward registry and restore it in place afterwards,
    so the terms a test registers do not leak into other tests."""
    from waddle.envs.microduck import rewards

    terms, params = dict(rewards.REWARD_TERMS), dict(rewards.REWARD_PARAMS)
    yield
    rewards.REWARD_TERMS.clear()
    rewards.REWARD_TERMS.update(terms)
    rewards.REWARD_PARAMS.clear()
    rewards.REWARD_PARAMS.update(params)
