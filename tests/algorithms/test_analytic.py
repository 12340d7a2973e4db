"""The building blocks APG and SHAC share."""

import math

import torch

from waddle.algorithms.analytic import guarded_step


def test_guarded_step_skips_a_non_finite_gradient_without_hiding_it():
    param = torch.nn.Parameter(torch.tensor([1.0]))
    optimizer = torch.optim.SGD([param], lr=1.0)
    step = guarded_step(param.sum() * math.inf, optimizer, [param], 1.0)
    assert step["skipped"] == 1.0  # the loss itself is inf
    loss = torch.sqrt(param - 1.0).sum()  # finite loss (0), infinite gradient
    step = guarded_step(loss, optimizer, [param], 1.0)
    assert step["skipped"] == 1.0 and not math.isfinite(step["grad_norm"])
    assert param.item() == 1.0 and not torch.isfinite(param.grad).all()
