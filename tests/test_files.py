"""Atomic output files: whole or absent, with the mode the umask gives."""

from __future__ import annotations

import os
import stat

import pytest

from waddle.files import atomic_path, atomic_write, current_umask


@pytest.fixture
def umask():
    """Set the process umask for one test and restore it after."""
    previous = os.umask(0o022)
    os.umask(previous)
    yield lambda mask: os.umask(mask)
    os.umask(previous)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_files_get_the_mode_open_would_give(tmp_path, umask, mask, mode):
    umask(mask)
    assert current_umask() == mask
    atomic_write(tmp_path / "metrics.csv", lambda file: file.write("a,b\n"), mode="w")
    with atomic_path(tmp_path / "curve.png") as tmp:
        tmp.write_bytes(b"png")
    for name in ("metrics.csv", "curve.png"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == mode
    plain = tmp_path / "plain"
    plain.write_text("x")  # what open() gives under the same umask
    assert stat.S_IMODE(plain.stat().st_mode) == mode


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "checkpoint.pt"
    target.write_bytes(b"old")

    def half_then_fail(file):
        file.write(b"new but incomplete")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        atomic_write(target, half_then_fail)
    assert target.read_bytes() == b"old"
    assert sorted(path.name for path in tmp_path.iterdir()) == ["checkpoint.pt"]


def test_the_temporary_name_keeps_the_suffix_for_format_sniffing_writers(tmp_path):
    with atomic_path(tmp_path / "sub" / "video.mp4") as tmp:
        assert tmp.suffix == ".mp4" and tmp.parent == tmp_path / "sub" and tmp.name.startswith(".video.mp4.")
        tmp.write_bytes(b"x")
    assert (tmp_path / "sub" / "video.mp4").read_bytes() == b"x"


def test_bad_mode_is_refused(tmp_path):
    with pytest.raises(ValueError, match="mode must be 'wb' or 'w'"):
        atomic_write(tmp_path / "x", lambda file: None, mode="a")
