"""BatchRenderer: image shapes, that images follow qpos, and the missing-GL errors.

The drawing tests are marked ``rendering``: skipped, with the reason, only on a
machine where no OpenGL backend works, and failed there under CI.
"""

from __future__ import annotations

import mujoco
import pytest
import torch

from waddle import gl_backend
from waddle.physics.render import BatchRenderer

SCENE = """
<mujoco>
  <worldbody>
    <light pos="0 0 2" dir="0 0 -1"/>
    <geom type="plane" size="1 1 .1" rgba=".2 .3 .4 1"/>
    <camera name="side" pos="0 -1 .3" xyaxes="1 0 0 0 0 1"/>
    <body name="ball" pos="0 0 .2">
      <freejoint/>
      <geom type="sphere" size=".08" rgba="1 .2 .1 1"/>
    </body>
  </worldbody>
</mujoco>
"""
WIDTH, HEIGHT = 40, 30
drawing = pytest.mark.rendering


@pytest.fixture(scope="module")
def model():
    return mujoco.MjModel.from_xml_string(SCENE)


@pytest.fixture(scope="module")
def renderer(model):
    built = BatchRenderer(model, width=WIDTH, height=HEIGHT)
    yield built
    built.close()


def ball_qpos(x: torch.Tensor) -> torch.Tensor:
    """Free-joint poses with the ball at ``(x, 0, 0.2)``, upright."""
    qpos = torch.zeros(len(x), 7)
    qpos[:, 0], qpos[:, 2], qpos[:, 3] = x, 0.2, 1.0
    return qpos


@drawing
def test_render_shape_and_dtype(renderer):
    images = renderer.render(ball_qpos(torch.zeros(3)), camera="side")
    assert images.shape == (3, HEIGHT, WIDTH, 3)
    assert images.dtype == torch.uint8
    assert renderer.size == (WIDTH, HEIGHT)
    assert images.float().std() > 0  # not a blank frame


@drawing
def test_images_follow_qpos(renderer):
    images = renderer.render(ball_qpos(torch.tensor([0.0, 0.0, 0.25])), camera="side")
    assert torch.equal(images[0], images[1])
    assert (images[0].float() - images[2].float()).abs().mean() > 1.0


@drawing
def test_camera_by_name_or_id(renderer, model):
    qpos = ball_qpos(torch.tensor([0.1]))
    side = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, "side")
    assert torch.equal(renderer.render(qpos, camera="side"), renderer.render(qpos, camera=side))
    assert renderer.render(qpos).shape == (1, HEIGHT, WIDTH, 3)  # free camera
    with pytest.raises(ValueError, match="'top' is not in the model"):
        renderer.render(qpos, camera="top")
    with pytest.raises(ValueError, match="camera id"):
        renderer.render(qpos, camera=5)


@drawing
def test_rejects_bad_qpos_shape(renderer):
    with pytest.raises(ValueError, match=r"shape \(N, 7\)"):
        renderer.render(torch.zeros(7))


@drawing
def test_larger_than_offscreen_buffer(model):
    with BatchRenderer(model, width=model.vis.global_.offwidth + 8, height=12) as wide:
        images = wide.render(ball_qpos(torch.zeros(1)))
    assert images.shape == (1, 12, model.vis.global_.offwidth + 8, 3)


def test_context_failure_says_what_was_chosen_and_what_to_install(model, monkeypatch):
    def no_gl(*args, **kwargs):
        raise RuntimeError("Failed to create OSMesa GL context.")

    monkeypatch.setattr(gl_backend, "_SELECTION", gl_backend.GLSelection("osmesa", "", ()))
    monkeypatch.setattr(mujoco, "Renderer", no_gl)
    with pytest.raises(RuntimeError) as info:
        BatchRenderer(model, width=WIDTH, height=HEIGHT)
    message = str(info.value)
    for hint in ("MUJOCO_GL=osmesa", "Failed to create OSMesa GL context.", "apt-get install libosmesa6", "libegl1"):
        assert hint in message


def test_no_backend_error_lists_what_was_tried(model, monkeypatch):
    tried = (("osmesa", "libOSMesa not found (asked for by MUJOCO_GL)"), ("egl", "libEGL not found"))
    monkeypatch.setattr(gl_backend, "_SELECTION", gl_backend.GLSelection(None, "osmesa", tried))
    with pytest.raises(RuntimeError, match="Cannot render: no OpenGL backend works") as info:
        BatchRenderer(model, width=WIDTH, height=HEIGHT)
    message = str(info.value)
    for hint in ("osmesa: libOSMesa not found", "egl: libEGL not found", "apt-get install libosmesa6", "libegl-mesa0"):
        assert hint in message
