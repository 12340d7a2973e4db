"""mp4 output through imageio-ffmpeg's own binary (no system FFmpeg needed)."""

from __future__ import annotations

import stat
import warnings

import numpy as np
import pytest
import torch

from waddle.video import write_video


def test_frames_round_trip(tmp_path):
    frames = torch.zeros(12, 24, 32, 3, dtype=torch.uint8)
    frames[:, :, :16, 0] = 255  # left half red
    frames[6:, :, 16:, 2] = 255  # right half blue from frame 6 on
    path = write_video(tmp_path / "out.mp4", frames, fps=25)
    import imageio.v2 as imageio

    with imageio.get_reader(path) as reader:
        assert reader.get_meta_data()["fps"] == 25
        decoded = np.stack([reader.get_data(i) for i in range(reader.count_frames())])
    assert decoded.shape == (12, 24, 32, 3)
    # H.264 is lossy: compare half-frame means with a generous margin.
    assert decoded[:, 4:-4, 2:12, 0].mean() > 200 and decoded[:, 4:-4, 2:12, 2].mean() < 40
    assert decoded[:5, 4:-4, 20:30, 2].mean() < 40 and decoded[8:, 4:-4, 20:30, 2].mean() > 200
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~_umask()
    assert [p.name for p in tmp_path.iterdir()] == ["out.mp4"]


def _umask() -> int:
    from waddle.files import current_umask

    return current_umask()


@pytest.mark.parametrize(
    "frames, fps, match",
    [
        (np.zeros((2, 8, 8, 3), np.float32), 25, "uint8"),
        (np.zeros((2, 8, 8), np.uint8), 25, r"\(T, H, W, 3\)"),
        (np.zeros((0, 8, 8, 3), np.uint8), 25, "T >= 1"),
        (np.zeros((2, 8, 8, 3), np.uint8), 0, "fps must be an integer >= 1"),
    ],
)
def test_bad_input_is_refused_before_anything_is_written(tmp_path, frames, fps, match):
    with pytest.raises(ValueError, match=match):
        write_video(tmp_path / "bad.mp4", frames, fps=fps)
    assert not list(tmp_path.iterdir())


def test_writing_after_jax_started_its_threads_warns_of_no_fork(tmp_path):
    # An MJX run films its policy at the end: JAX then warns at every fork, and the encoder is a subprocess.
    jnp = pytest.importorskip("jax.numpy", reason="needs the mjx extra: pip install 'waddle[mjx]'")
    jnp.ones(3).block_until_ready()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        write_video(tmp_path / "clip.mp4", np.zeros((3, 16, 16, 3), np.uint8), fps=10)
    assert (tmp_path / "clip.mp4").stat().st_size > 0
    assert not [w for w in caught if "fork" in str(w.message)]
