"""Batched quaternion helpers in MuJoCo's ``(w, x, y, z)`` convention."""

from __future__ import annotations

import math

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


def multiply(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """The Hamilton product ``first * second`` (..., 4): rotate by ``second``, then by ``first``."""
    w1, x1, y1, z1 = first.unbind(-1)
    w2, x2, y2, z2 = second.unbind(-1)
    return torch.stack(
        [
            w1 * w2 - x1 * x2 - y1 * y2 - z1 * z2,
            w1 * x2 + x1 * w2 + y1 * z2 - z1 * y2,
            w1 * y2 - x1 * z2 + y1 * w2 + z1 * x2,
            w1 * z2 + x1 * y2 - y1 * x2 + z1 * w2,
        ],
        dim=-1,
    )


def projected_gravity(quaternion: torch.Tensor) -> torch.Tensor:
    """The unit gravity direction ``(0, 0, -1)`` seen in the body frame."""
    down = torch.zeros(quaternion.shape[:-1] + (3,), dtype=quaternion.dtype, device=quaternion.device)
    down[..., 2] = -1.0
    return rotate_inverse(quaternion, down)


def heading(quaternion: torch.Tensor) -> torch.Tensor:
    """Yaw angle in radians, in ``(-pi, pi]``, of the body's x axis projected on the floor.

    Args:
        quaternion: ``(..., 4)`` in MuJoCo's ``(w, x, y, z)`` order.
    """
    w, x, y, z = quaternion.unbind(-1)
    return torch.atan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


def wrap_angle(angle: torch.Tensor) -> torch.Tensor:
    """``angle`` in radians wrapped to ``[-pi, pi)``: a difference of headings the short way round."""
    return torch.remainder(angle + math.pi, 2 * math.pi) - math.pi
