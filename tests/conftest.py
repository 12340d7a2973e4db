import os

import pytest
import torch

import waddle  # noqa: F401  (chooses MuJoCo's GL backend before a test module imports mujoco)
from waddle import gl_backend

# Tests run tiny networks on a 2-core machine shared with the physics threads:
# torch's own thread pool only adds contention there.
torch.set_num_threads(1)

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
