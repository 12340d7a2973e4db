"""Which backend a device gets by default, and how missing packages are reported."""

from __future__ import annotations

import mujoco
import pytest

import waddle.physics as physics
from waddle.envs.microduck.constants import EMBEDDED_SCENE

PENDULUM = """
<mujoco>
  <worldbody>
    <body><joint name="hinge" type="hinge" {friction}/><geom size="0.1" mass="1"/></body>
  </worldbody>
</mujoco>
"""


def _spec(frictionloss: float) -> mujoco.MjSpec:
    friction = f'frictionloss="{frictionloss}"' if frictionloss else ""
    return mujoco.MjSpec.from_string(PENDULUM.format(friction=friction))


def test_friction_loss_is_detected():
    assert physics.has_friction_loss(_spec(0.01))
    assert not physics.has_friction_loss(_spec(0.0))
    # the upstream MicroDuck's servos have friction loss (0.0048 N m on every joint)
    assert physics.has_friction_loss(mujoco.MjSpec.from_file(str(EMBEDDED_SCENE)))


@pytest.fixture
def everything_installed(monkeypatch):
    monkeypatch.setattr(physics, "backend_available", lambda name: True)


def test_cpu_gets_the_native_engine(everything_installed):
    assert physics.default_backend("cpu") == "mujoco"
    assert physics.default_backend("cpu", _spec(0.01)) == "mujoco"


def test_cuda_prefers_mujoco_torch_unless_the_model_has_friction_loss(everything_installed):
    assert physics.default_backend("cuda") == "mujoco-torch"
    assert physics.default_backend("cuda", _spec(0.0)) == "mujoco-torch"
    assert physics.default_backend("cuda", _spec(0.01)) == "mjx"


def test_cuda_without_gpu_backends_names_the_extras(monkeypatch):
    monkeypatch.setattr(physics, "backend_available", lambda name: False)
    with pytest.raises(ImportError, match=r"waddle\[torch-sim\].*waddle\[mjx\]"):
        physics.default_backend("cuda", _spec(0.0))
    with pytest.raises(ImportError, match=r"pip install 'waddle\[mjx\]'$"):
        physics.default_backend("cuda", _spec(0.01))
    monkeypatch.setattr(physics, "backend_available", lambda name: name == "mujoco-torch")
    with pytest.raises(ImportError, match="mjx"):  # mujoco-torch alone cannot run a friction-loss model
        physics.default_backend("cuda", _spec(0.01))


def test_differentiable_backends_are_the_installed_mjx_and_mujoco_torch(monkeypatch):
    # native MuJoCo has no gradients; MJX and mujoco-torch do, when installed
    installed = tuple(name for name in ("mjx", "mujoco-torch") if physics.backend_available(name))
    assert physics.differentiable_backends() == installed
    monkeypatch.setattr(physics, "backend_available", lambda name: name == "mujoco")
    assert physics.differentiable_backends() == ()
