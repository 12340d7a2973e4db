"""mp4 files from frames, with no system FFmpeg: imageio-ffmpeg ships its own binary."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from waddle.files import atomic_path


def write_video(path: str | Path, frames: torch.Tensor | np.ndarray | Sequence, *, fps: int) -> Path:
    """Write ``frames`` to an H.264 mp4 at ``path``, atomically; returns the path.

    Args:
        path: the target ``.mp4`` file.
        frames: ``(T, H, W, 3)`` uint8 RGB (a tensor, an array or a list of ``(H, W, 3)`` frames),
            such as a rollout's ``"pixels"`` for one env.
        fps: frames per second, >= 1.

    Example:
        >>> from waddle.envs import MicroDuckEnv
        >>> env = MicroDuckEnv(num_envs=1, from_pixels=True, render_width=160, render_height=120)
        >>> write_video("rollout.mp4", env.rollout(10)["pixels"][0], fps=50).name  # 10 frames of env 0
        'rollout.mp4'
    """
    try:
        import imageio.v2 as imageio
        import imageio_ffmpeg  # noqa: F401  (the bundled ffmpeg binary imageio writes mp4 with)
    except ImportError as err:
        raise RuntimeError("writing a video needs imageio and imageio-ffmpeg: pip install 'waddle[train]'") from err
    if isinstance(fps, bool) or not isinstance(fps, int) or fps < 1:
        raise ValueError(f"write_video: fps must be an integer >= 1, got {fps!r}.")
    if isinstance(frames, torch.Tensor):
        frames = frames.detach().cpu().numpy()
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or len(frames) == 0:
        raise ValueError(
            f"write_video: frames must be (T, H, W, 3) uint8 with T >= 1, got {frames.dtype} {frames.shape}."
        )
    path = Path(path)
    with atomic_path(path) as tmp, warnings.catch_warnings():
        # The encoder is a subprocess, which Python starts by fork and exec; after JAX has started its threads
        # (an MJX run) Python warns about the fork, but exec follows at once and nothing of the parent runs.
        warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
        with imageio.get_writer(
            tmp, format="FFMPEG", fps=fps, codec="libx264", macro_block_size=1, quality=7
        ) as writer:
            for frame in frames:
                writer.append_data(frame)
    return path
