"""Offscreen images of a batch of states.

Rendering is CPU-side and reads nothing but ``qpos``: each row is copied into
one scratch :class:`mujoco.MjData`, forwarded, and drawn by one
:class:`mujoco.Renderer`. It therefore works the same for every physics
backend (native MuJoCo, MJX, mujoco-torch) and never touches their state.

MuJoCo needs an OpenGL backend. ``import waddle`` chooses one that works
before MuJoCo is imported (see :mod:`waddle.gl_backend`): the one ``MUJOCO_GL``
names, else EGL, OSMesa or GLFW. When none works, the renderer raises an error
that lists what was tried and what to install.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
from collections.abc import Iterator

import mujoco
import numpy as np
import torch

from waddle import gl_backend

# MUJOCO_GL value -> module holding MuJoCo's GLContext for it (Linux).
_GL_MODULES = {"egl": "mujoco.egl", "osmesa": "mujoco.osmesa", "glfw": "mujoco.glfw"}


class BatchRenderer:
    """Draw RGB images of ``N`` states of one model.

    Args:
        model: the compiled model. When ``width``/``height`` exceed its
            offscreen buffer, a copy with a larger buffer is rendered instead.
        width: image width in pixels.
        height: image height in pixels.

    Raises:
        RuntimeError: no OpenGL backend works; the message says what to install.

    Example:
        >>> model = mujoco.MjModel.from_xml_string(
        ...     "<mujoco><worldbody><light pos='0 0 2'/>"
        ...     "<body><freejoint/><geom size='0.1'/></body></worldbody></mujoco>"
        ... )
        >>> qpos = torch.as_tensor(model.qpos0).repeat(4, 1)  # four copies of the initial pose
        >>> with BatchRenderer(model, width=64, height=48) as renderer:
        ...     renderer.render(qpos).shape
        torch.Size([4, 48, 64, 3])
    """

    def __init__(self, model: mujoco.MjModel, *, width: int = 320, height: int = 240) -> None:
        if int(width) < 1 or int(height) < 1:
            raise ValueError(f"width and height must be >= 1, got {width}x{height}.")
        self.width, self.height = int(width), int(height)
        glob = model.vis.global_
        if self.width > glob.offwidth or self.height > glob.offheight:
            model = copy.deepcopy(model)
            model.vis.global_.offwidth = max(self.width, glob.offwidth)
            model.vis.global_.offheight = max(self.height, glob.offheight)
        self.model = model
        selection = gl_backend.configure()
        if selection.backend is None:
            raise RuntimeError(f"Cannot render: {selection.describe()}")
        self.backend = selection.backend
        self._data = mujoco.MjData(model)
        try:
            with _gl_context_for(self.backend):
                self._renderer = mujoco.Renderer(model, height=self.height, width=self.width)
        except Exception as err:
            raise RuntimeError(
                f"Could not create a MuJoCo renderer: {selection.describe()}, which failed with "
                f"{type(err).__name__}: {err}. {gl_backend.INSTALL_HINT}"
            ) from err

    @property
    def size(self) -> tuple[int, int]:
        """``(width, height)`` of the images."""
        return self.width, self.height

    def render(self, qpos: torch.Tensor, *, camera: int | str | None = None) -> torch.Tensor:
        """Images of each row of ``qpos``.

        Args:
            qpos: ``(N, nq)`` generalized positions.
            camera: a camera name or id; ``None`` or ``-1`` is MuJoCo's free camera.

        Returns:
            ``(N, height, width, 3)`` uint8 RGB on ``qpos``'s device.
        """
        if qpos.ndim != 2 or qpos.shape[1] != self.model.nq:
            raise ValueError(f"qpos must have shape (N, {self.model.nq}), got {tuple(qpos.shape)}.")
        camera_id = self._camera_id(camera)
        rows = qpos.detach().to("cpu", torch.float64).numpy()
        frames = np.empty((len(rows), self.height, self.width, 3), dtype=np.uint8)
        for i, row in enumerate(rows):
            self._data.qpos[:] = row
            mujoco.mj_forward(self.model, self._data)
            self._renderer.update_scene(self._data, camera=camera_id)
            self._renderer.render(out=frames[i])
        return torch.from_numpy(frames).to(qpos.device)

    def close(self) -> None:
        """Free the GL context now rather than at garbage collection."""
        renderer = getattr(self, "_renderer", None)
        if renderer is not None:
            renderer.close()
            self._renderer = None

    def __enter__(self) -> BatchRenderer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _camera_id(self, camera: int | str | None) -> int:
        if camera is None:
            return -1
        if isinstance(camera, str):
            camera_id = mujoco.mj_name2id(self.model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
            if camera_id < 0:
                names = [self.model.camera(i).name for i in range(self.model.ncam)]
                raise ValueError(f"camera {camera!r} is not in the model; its cameras: {names}.")
            return camera_id
        camera_id = int(camera)
        if not -1 <= camera_id < self.model.ncam:
            raise ValueError(f"camera id must be in [-1, {self.model.ncam}), got {camera_id}.")
        return camera_id


@contextlib.contextmanager
def _gl_context_for(backend: str) -> Iterator[None]:
    """Make :class:`mujoco.Renderer` use ``backend``'s GL context while it is built.

    MuJoCo picks its GL context class when it is imported; if that happened
    before ``import waddle`` with ``MUJOCO_GL`` unset, it picked GLFW, which
    needs a display. This swaps in the context class of ``backend`` for the
    duration of one construction.
    """
    gl_context = getattr(inspect.getmodule(mujoco.Renderer), "gl_context", None)
    wanted = _GL_MODULES.get(backend)
    current = getattr(gl_context, "GLContext", None)
    if gl_context is None or wanted is None or (current is not None and current.__module__.startswith(wanted)):
        yield
        return
    gl_context.GLContext = importlib.import_module(wanted).GLContext
    try:
        yield
    finally:
        if current is None:
            del gl_context.GLContext
        else:
            gl_context.GLContext = current
