"""Batched quaternion helpers in MuJoCo's ``(w, x, y, z)`` convention."""

from __future__ import annotations

import torch


def rotate(quaternion: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """Rotate ``vector`` (..., 3) by the unit ``quaternion`` (..., 4): body to world."""
    w = quaternion[..., :1]
    axis = quaternion[..., 1:]
    twice_cross = 2.0 * torch.linalg.cross(axis, vector, dim=-1)
    return vector + w * twice_cross + torch.linalg.cross(axis, twice_cross, dim=-1)


def rotate_inverse(quaternion: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
    """Rotate ``vector`` by the inverse of ``quaternion``: world to body."""
    conjugate = torch.cat([quaternion[..., :1], -quaternion[..., 1:]], dim=-1)
    return rotate(conjugate, vector)


def projected_gravity(quaternion: torch.Tensor) -> torch.Tensor:
    """The unit gravity direction ``(0, 0, -1)`` seen in the body frame."""
    down = torch.zeros(quaternion.shape[:-1] + (3,), dtype=quaternion.dtype, device=quaternion.device)
    down[..., 2] = -1.0
    return rotate_inverse(quaternion, down)
