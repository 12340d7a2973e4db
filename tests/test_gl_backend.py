"""The GL backend choice: the user's MUJOCO_GL when it works, else EGL, OSMesa, GLFW; never a crash."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from waddle import gl_backend
from waddle.gl_backend import GLSelection, choose


def works_only(*available: str):
    return lambda name: None if name in available else f"{name} missing here"


def test_a_requested_backend_that_works_is_kept():
    assert choose("osmesa", works_only("egl", "osmesa")) == GLSelection("osmesa", "osmesa", ())


def test_a_requested_backend_that_is_missing_falls_back_in_order():
    selection = choose("osmesa", works_only("egl", "glfw"))
    assert selection.backend == "egl"
    assert selection.tried == (("osmesa", "osmesa missing here (asked for by MUJOCO_GL)"),)
    assert "MUJOCO_GL=egl" in selection.describe() and "osmesa missing here" in selection.describe()


def test_unset_tries_egl_then_osmesa_then_glfw():
    selection = choose("", works_only("glfw"))
    assert selection.backend == "glfw"
    assert [name for name, _ in selection.tried] == ["egl", "osmesa"]


def test_nothing_works_turns_rendering_off_and_says_what_to_install():
    selection = choose("osmesa", works_only())
    assert selection.backend is None
    assert [name for name, _ in selection.tried] == ["osmesa", "egl", "glfw"]
    message = selection.describe()
    assert "no OpenGL backend works" in message
    assert "apt-get install libegl1 libegl-mesa0" in message and "apt-get install libosmesa6" in message


def test_unknown_names_are_not_backends():
    assert "not a backend MuJoCo knows" in gl_backend.probe("vulkan")


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    environ = {key: value for key, value in os.environ.items() if key not in ("MUJOCO_GL", "PYOPENGL_PLATFORM")}
    environ.update(env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=environ, capture_output=True, text=True, timeout=300
    )


NO_GL_LIBRARIES = """
    import ctypes
    real_cdll = ctypes.CDLL
    def no_gl(name, *args, **kwargs):
        if any(lib in str(name) for lib in ("EGL", "OSMesa", "glfw")):
            raise OSError(f"{name}: cannot open shared object file")
        return real_cdll(name, *args, **kwargs)
    ctypes.CDLL = no_gl
    import importlib.util
    real_find_spec = importlib.util.find_spec
    importlib.util.find_spec = lambda name, *a: None if name == "glfw" else real_find_spec(name, *a)
"""


def test_a_machine_without_any_gl_library_imports_steps_and_explains():
    result = _run(
        NO_GL_LIBRARIES
        + """
    import os, torch
    from waddle.envs import MicroDuckEnv
    from waddle.physics.render import BatchRenderer
    print("MUJOCO_GL", os.environ["MUJOCO_GL"])
    env = MicroDuckEnv(num_envs=2, seed=0)
    rollout = env.rollout(5)
    print("finite", bool(torch.isfinite(rollout["next", "reward"]).all()))
    try:
        BatchRenderer(env.model, width=32, height=24)
    except RuntimeError as err:
        print("error", err)
    """,
        MUJOCO_GL="osmesa",
        DISPLAY="",
    )
    assert result.returncode == 0, result.stderr
    assert "MUJOCO_GL disable" in result.stdout
    assert "finite True" in result.stdout
    error = result.stdout.split("error ", 1)[1]
    for fragment in (
        "osmesa: libOSMesa not found (asked for by MUJOCO_GL)",
        "egl: libEGL not found",
        "glfw: no display",
    ):
        assert fragment in error
    assert "apt-get install libosmesa6" in error


def test_an_invalid_mujoco_gl_does_not_break_import():
    result = _run("import waddle, os, mujoco; print(os.environ['MUJOCO_GL'])", MUJOCO_GL="bogus")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() in ("egl", "osmesa", "glfw", "disable")


@pytest.mark.rendering
@pytest.mark.parametrize("backend", ["egl", "osmesa"])
def test_each_installed_backend_renders(backend):
    reason = gl_backend.probe(backend)
    if reason is not None:
        if os.environ.get("WADDLE_REQUIRE_RENDERING") == "1":
            pytest.fail(f"{backend}: {reason}; CI installs both EGL and OSMesa")
        pytest.skip(f"{backend}: {reason}")
    result = _run(
        """
        import os, mujoco, torch
        from waddle.physics.render import BatchRenderer
        model = mujoco.MjModel.from_xml_string(
            '<mujoco><worldbody><light pos="0 0 2"/><geom type="sphere" size=".3" rgba="1 0 0 1"/>'
            '<camera name="c" pos="0 -1 0" xyaxes="1 0 0 0 0 1"/></worldbody></mujoco>')
        image = BatchRenderer(model, width=32, height=24).render(torch.zeros(1, 0), camera="c")[0]
        red = image[..., 0].float() - image[..., 1].float()
        print(os.environ["MUJOCO_GL"], int((red > 100).sum()))
        """,
        MUJOCO_GL=backend,
    )
    assert result.returncode == 0, result.stderr
    name, red_pixels = result.stdout.split()
    assert name == backend
    assert int(red_pixels) > 100  # the red sphere fills the middle of the 32x24 frame
