"""What the envs rely on from every backend, beyond stepping: ``diverged``.

One env of three gets a motor command of 1e30 N m, which throws its arm past
MuJoCo's ``mjMAXVAL`` (1e10) within a substep: after that step the env, and
only that one, is reported as diverged; a reset of that env clears the flag.
The MJX case compiles a step (tens of seconds on a CPU) and is marked slow.
"""

from __future__ import annotations

import mujoco
import pytest
import torch
from helpers.ball_arm import BALL_ARM_XML, FRAME_SKIP, GEOMS, NUM_ENVS, SITES, ball_arm_start
from helpers.compile_options import MJX_FAST_COMPILE

from waddle.physics import BACKENDS, backend_available, make_backend

BACKEND_PARAMS = [
    pytest.param(
        name,
        marks=[
            pytest.mark.skipif(not backend_available(name), reason=f"backend {name!r} is not installed"),
            *([pytest.mark.slow] if name == "mjx" else []),
        ],
    )
    for name in BACKENDS
]


@pytest.mark.parametrize("name", BACKEND_PARAMS)
def test_diverged_flags_only_the_broken_env_until_it_is_reset(name):
    spec = mujoco.MjSpec.from_string(BALL_ARM_XML)  # the native backend instruments the spec
    model = spec.compile()
    kwargs = {"compiler_options": MJX_FAST_COMPILE} if name == "mjx" else {}
    sim = make_backend(
        name,
        spec,
        num_envs=NUM_ENVS,
        frame_skip=FRAME_SKIP,
        site_names=SITES,
        contact_geom_names=GEOMS,
        dtype=torch.float64,
        **kwargs,
    )
    qpos, qvel = (torch.from_numpy(a) for a in ball_arm_start(model))
    try:
        assert sim.diverged.dtype == torch.bool and sim.diverged.shape == (NUM_ENVS,)
        sim.reset(qpos, qvel)
        ctrl = torch.zeros(NUM_ENVS, model.nu, dtype=torch.float64)
        ctrl[1] = 1e30  # the arm's unlimited motor: its velocity passes mjMAXVAL in a substep
        sim.step(ctrl)
        assert sim.diverged.tolist() == [False, True, False]
        assert torch.isfinite(sim.qpos[[0, 2]]).all() and torch.isfinite(sim.qvel[[0, 2]]).all()

        sim.reset(qpos, qvel, torch.tensor([False, True, False]))
        assert sim.diverged.tolist() == [False, False, False]
        sim.step(torch.zeros(NUM_ENVS, model.nu, dtype=torch.float64))
        assert sim.diverged.tolist() == [False, False, False]
    finally:
        sim.close()
