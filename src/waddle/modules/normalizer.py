"""A running mean/variance normaliser that stays inside the autograd graph."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class RunningNormalizer(nn.Module):
    """Normalise features by running statistics: ``clamp((x - mean) / sqrt(var + eps))``.

    The statistics are buffers (so they travel with ``state_dict`` and
    ``.to(device)``) and change only through :meth:`update`, which merges a
    batch with Chan et al.'s parallel form of Welford's algorithm. ``forward``
    is one differentiable tensor expression, so gradients flow through it to
    the input and an ONNX export bakes the statistics in as constants.

    Args:
        shape: feature shape (an int for a flat feature vector).
        eps: added to the variance before the square root.
        clip: normalised values are clamped to ``[-clip, clip]``; ``None``
            disables clamping.

    Example:
        >>> import torch
        >>> norm = RunningNormalizer(3)
        >>> norm.update(torch.randn(1000, 3) * 2.0 + 1.0)
        >>> norm(torch.ones(2, 3)).shape
        torch.Size([2, 3])
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, shape: int | Sequence[int], *, eps: float = 1e-8, clip: float | None = 10.0) -> None:
        super().__init__()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if eps <= 0:
            raise ValueError(f"eps must be > 0, got {eps}.")
        if clip is not None and clip <= 0:
            raise ValueError(f"clip must be > 0 or None, got {clip}.")
        self.shape = torch.Size(shape)
        self.eps = float(eps)
        self.clip = None if clip is None else float(clip)
        self.register_buffer("mean", torch.zeros(shape))
        self.register_buffer("var", torch.ones(shape))
        # An integer count survives ``module.to(dtype)`` and never loses increments.
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Merge a batch ``[..., *shape]`` into the running mean and (population) variance."""
        if x.shape[x.ndim - len(self.shape) :] != self.shape:
            raise ValueError(f"x must end with the feature shape {tuple(self.shape)}, got {tuple(x.shape)}.")
        batch = x.detach().reshape(-1, *self.shape).to(self.mean.dtype)
        n_batch = batch.shape[0]
        if n_batch == 0:
            return
        batch_mean = batch.mean(0)
        batch_var = batch.var(0, unbiased=False)
        n_old = self.count.to(batch.dtype)  # a tensor: no host sync on GPU
        total = n_old + n_batch
        delta = batch_mean - self.mean
        m2 = self.var * n_old + batch_var * n_batch + delta**2 * (n_old * n_batch / total)
        self.mean.add_(delta * (n_batch / total))
        self.var.copy_(m2 / total)
        self.count.add_(n_batch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` (differentiable in ``x``)."""
        y = (x - self.mean) / torch.sqrt(self.var + self.eps)
        if self.clip is not None:
            y = torch.clamp(y, -self.clip, self.clip)
        return y

    def extra_repr(self) -> str:
        return f"shape={tuple(self.shape)}, eps={self.eps}, clip={self.clip}"
