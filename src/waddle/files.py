"""Output files written whole or not at all, with the permissions the user's umask gives.

Every file waddle writes (checkpoints, metrics, curves, configs, videos,
exports) goes through a temporary file in the target's directory, is flushed
to disk and renamed over the target (``os.replace`` is atomic on POSIX and
Windows), so a crash or Ctrl-C mid-write leaves the previous file whole.
``tempfile.mkstemp`` creates its file private (mode 0600); before the rename
it gets ``0666 & ~umask``, the mode ``open()`` would have given it (0644 under
the usual umask 022).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)  # elsewhere the only reader is the setter: put it back at once
    os.umask(mask)
    return mask


def default_file_mode() -> int:
    """Mode a new file gets from ``open()`` under the current umask."""
    return 0o666 & ~current_umask()


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` to write to; on success it replaces ``path``.

    The temporary name ends with ``path``'s suffix, so writers that pick a
    format from the extension (imageio, matplotlib) work. When the body raises
    (or the process dies) ``path`` keeps its previous content and the
    temporary file is removed (after a hard kill it stays as a hidden
    ``.<name>.*`` file).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as file:
            os.fsync(file.fileno())
        os.chmod(tmp, default_file_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_directory(path.parent)


def atomic_write(path: str | Path, write: Callable[[Any], None], *, mode: str = "wb") -> None:
    """Write ``path`` by calling ``write`` on an open temporary file, then rename it in place.

    Args:
        path: the target file.
        write: receives the open temporary file.
        mode: ``"wb"`` or ``"w"``.
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_write: mode must be 'wb' or 'w', got {mode!r}.")
    with atomic_path(path) as tmp, open(tmp, mode) as file:
        write(file)
        file.flush()


def _fsync_directory(directory: Path) -> None:
    """Make a rename durable (a no-op where directories cannot be opened, as on Windows)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
