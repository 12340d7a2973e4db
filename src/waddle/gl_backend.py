"""Choose MuJoCo's OpenGL backend before ``mujoco`` is imported.

MuJoCo reads ``MUJOCO_GL`` once, when it is first imported, and on Linux
imports PyOpenGL for that backend there and then. A backend whose system
library is missing (``MUJOCO_GL=osmesa`` without libOSMesa, say) makes
``import mujoco`` itself raise, and every import of waddle with it. So
``import waddle`` runs :func:`configure` first: it keeps ``MUJOCO_GL`` when
it names a backend whose library loads, and otherwise tries EGL, then OSMesa,
then GLFW (which needs a display). When none is there, rendering is turned off
(``MUJOCO_GL=disable``): physics and training work, and a renderer raises an
error that lists what was tried and what to install.

The checks are cheap (about 30 ms): they load the libraries with ctypes and,
for EGL, count the devices MuJoCo would render on; they never import PyOpenGL,
whose platform can be chosen only once per process.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import platform
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

GL_ENV_VAR = "MUJOCO_GL"
FALLBACK_ORDER: tuple[str, ...] = ("egl", "osmesa", "glfw")
"""Backends tried, in order, when ``MUJOCO_GL`` is unset or names one that does not work."""
DISABLED = "disable"
"""The ``MUJOCO_GL`` value that makes MuJoCo skip OpenGL altogether."""

INSTALL_HINT = (
    "Install one OpenGL backend: EGL (Debian/Ubuntu: apt-get install libegl1 libegl-mesa0; renders on "
    "the CPU through Mesa, or on an NVIDIA GPU with its driver) or OSMesa (apt-get install libosmesa6), "
    "then start Python again; waddle picks the first one that works, or the one MUJOCO_GL names."
)

_MUJOCO_OFF_VALUES = ("disable", "disabled", "off", "false", "0")
_GLFW_ALIASES = ("glfw", "glx", "enable", "enabled", "on", "true", "1")
"""Values MuJoCo maps to its GLFW context on Linux."""

_LIBRARIES = {
    "egl": ("libEGL.so.1", "libEGL.so"),
    "osmesa": ("libOSMesa.so.8", "libOSMesa.so.6", "libOSMesa.so"),
    "glfw": ("libglfw.so.3", "libglfw.so"),
}


@dataclass(frozen=True)
class GLSelection:
    """What :func:`configure` found: the backend chosen and why the others were passed over."""

    backend: str | None
    """The ``MUJOCO_GL`` value in force, or ``None`` when no backend works (rendering is off)."""
    requested: str
    """``MUJOCO_GL`` as the user set it (``""`` when unset)."""
    tried: tuple[tuple[str, str], ...]
    """``(backend, why it was not used)`` for each backend rejected, in the order tried."""

    def describe(self) -> str:
        """One line for users: what is in force and what was passed over."""
        rejected = "; ".join(f"{name}: {reason}" for name, reason in self.tried)
        if self.backend is None and self.requested in _MUJOCO_OFF_VALUES:
            return f"rendering is turned off ({GL_ENV_VAR}={self.requested}); unset it to let waddle choose a backend"
        if self.backend is None:
            return f"no OpenGL backend works for MuJoCo (tried {rejected}). {INSTALL_HINT}"
        head = f"MuJoCo renders with {GL_ENV_VAR}={self.backend}"
        return f"{head} (passed over {rejected})" if rejected else head


def probe(backend: str) -> str | None:
    """``None`` when ``backend``'s library loads here, else the reason it cannot be used."""
    if backend == "egl":
        return _probe_egl()
    if backend == "osmesa":
        return None if _load_first(_LIBRARIES["osmesa"]) else "libOSMesa not found"
    if backend in _GLFW_ALIASES:
        if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
            return "no display (DISPLAY is unset)"
        return None if _glfw_library_found() else "the GLFW library was not found"
    return f"not a backend MuJoCo knows on Linux (it knows {', '.join(FALLBACK_ORDER)})"


def choose(
    requested: str,
    works: Callable[[str], str | None] = probe,
    order: Sequence[str] = FALLBACK_ORDER,
) -> GLSelection:
    """Pick a backend: ``requested`` if it works, else the first of ``order`` that does.

    Args:
        requested: the user's ``MUJOCO_GL`` value, lower case (``""`` when unset).
        works: returns ``None`` for a usable backend, else the reason it is not.
        order: the fallback order.
    """
    tried: list[tuple[str, str]] = []
    if requested:
        reason = works(requested)
        if reason is None:
            return GLSelection(requested, requested, ())
        tried.append((requested, f"{reason} (asked for by {GL_ENV_VAR})"))
    for backend in order:
        if backend == requested:
            continue
        reason = works(backend)
        if reason is None:
            return GLSelection(backend, requested, tuple(tried))
        tried.append((backend, reason))
    return GLSelection(None, requested, tuple(tried))


_SELECTION: GLSelection | None = None
PLATFORM_DEFAULT = "platform default"
"""The backend recorded off Linux, where MuJoCo picks its own (CGL, WGL or GLFW)."""


def configure() -> GLSelection:
    """Set ``MUJOCO_GL`` to a backend that works, once per process; returns the selection.

    Off Linux, or when the user turned rendering off, the variable is left as
    it is. When ``mujoco`` was imported before waddle the variable no longer
    matters; the choice is still made, and :class:`~waddle.physics.render.BatchRenderer`
    builds its context with the chosen backend.
    """
    global _SELECTION
    if _SELECTION is None:
        requested = os.environ.get(GL_ENV_VAR, "").strip().lower()
        if platform.system() != "Linux":
            _SELECTION = GLSelection(requested or PLATFORM_DEFAULT, requested, ())
        elif requested in _MUJOCO_OFF_VALUES:
            _SELECTION = GLSelection(None, requested, ())
        else:
            _SELECTION = choose(requested)
            if "mujoco" not in sys.modules:
                os.environ[GL_ENV_VAR] = _SELECTION.backend or DISABLED
    return _SELECTION


def _load_first(names: Sequence[str]) -> ctypes.CDLL | None:
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _glfw_library_found() -> bool:
    # MuJoCo's dependency, the glfw wheel, ships the library; a system one also does.
    return _load_first(_LIBRARIES["glfw"]) is not None or importlib.util.find_spec("glfw") is not None


def _probe_egl() -> str | None:
    """EGL works for MuJoCo when it lists at least one device (MuJoCo renders on a device display)."""
    library = _load_first(_LIBRARIES["egl"])
    if library is None:
        return "libEGL not found"
    get_proc = library.eglGetProcAddress
    get_proc.restype = ctypes.c_void_p
    get_proc.argtypes = [ctypes.c_char_p]
    address = get_proc(b"eglQueryDevicesEXT")
    if not address:
        return "EGL lacks the device extension (EGL_EXT_device_enumeration) MuJoCo renders with"
    query_devices = ctypes.CFUNCTYPE(
        ctypes.c_uint, ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_int)
    )(address)
    count = ctypes.c_int(0)
    if not query_devices(0, None, ctypes.byref(count)) or count.value < 1:
        return "EGL lists no device (install Mesa's libegl-mesa0 for CPU rendering, or a GPU driver)"
    return None
