import os


def _use_jax_compilation_cache() -> None:
    """Turn on JAX's persistent compilation cache for the whole session, subprocesses included.

    Compiling an MJX or Brax step takes from tens of seconds to minutes on a
    2-core CPU; with the cache a program that several tests build compiles once
    per session, and once per machine across runs. Its folder is
    ``$WADDLE_JAX_CACHE`` (default ``~/.cache/waddle/jax``; ``0`` or empty
    turns it off). JAX reads these variables when it is imported, so this runs
    before anything imports it.
    """
    path = os.environ.get("WADDLE_JAX_CACHE", os.path.expanduser("~/.cache/waddle/jax"))
    if path in ("", "0"):
        return
    os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", path)
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "2")


_use_jax_compilation_cache()

import pytest  # noqa: E402
import torch  # noqa: E402

import waddle  # noqa: E402, F401  (chooses MuJoCo's GL backend before a test module imports mujoco)
from waddle import gl_backend  # noqa: E402

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


REQUIRE_RENDERING_VAR = "WADDLE_REQUIRE_RENDERING"
"""Set to 1 (CI does) to fail, rather than skip, rendering tests on a machine with no GL backend."""


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("rendering") is None:
        return
    selection = gl_backend.configure()
    if selection.backend is not None:
        return
    reason = f"needs rendering: {selection.describe()}"
    if os.environ.get(REQUIRE_RENDERING_VAR) == "1":
        pytest.fail(f"{reason} ({REQUIRE_RENDERING_VAR}=1 forbids skipping it)", pytrace=False)
    pytest.skip(reason)
