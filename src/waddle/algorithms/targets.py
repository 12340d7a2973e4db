"""Return and value-target maths shared by the analytic-gradient algorithms.

Pure functions over ``[T, N]`` tensors (``T`` steps, ``N`` envs), no state.
They keep the autograd graph of their inputs, so the same code gives APG's and
SHAC's actor objectives (differentiated through the env) and, under
``no_grad``, SHAC's critic targets.

Conventions, matching :class:`~waddle.collectors.DifferentiableRollout`:

* ``rewards[t]`` is the reward of step ``t``;
* ``next_values[t]`` is the value of the observation step ``t`` produced
  (before any auto-reset), so ``next_values[t] = values[t + 1]`` inside an
  episode;
* ``terminated[t]``: step ``t`` ended its episode in a terminal state, which
  is worth 0; ``dones[t]``: step ``t`` ended its episode for any reason
  (terminated or truncated), so step ``t + 1`` belongs to another episode;
* ``alive[t]``: step ``t`` belongs to the env's first episode of the window
  (true up to and including its first done).
"""

from __future__ import annotations

import torch


def discounts(num_steps: int, gamma: float, like: torch.Tensor) -> torch.Tensor:
    """``[gamma^0, ..., gamma^(T-1)]`` as a ``[T, 1]`` column with ``like``'s dtype and device."""
    steps = torch.arange(num_steps, dtype=like.dtype, device=like.device)
    return torch.pow(torch.as_tensor(gamma, dtype=like.dtype, device=like.device), steps)[:, None]


def segment_ends(alive: torch.Tensor) -> torch.Tensor:
    """``[T, N]`` bool: the last alive step of each env (its first done, or the window's end)."""
    alive_next = torch.cat([alive[1:], torch.zeros_like(alive[:1])])
    return alive & ~alive_next


def horizon_returns(
    rewards: torch.Tensor,
    alive: torch.Tensor,
    gamma: float,
    *,
    next_values: torch.Tensor | None = None,
    terminated: torch.Tensor | None = None,
) -> torch.Tensor:
    """Discounted return of each env over its alive steps, bootstrapped where it stops.

    ``sum_t gamma^t r_t`` over alive steps, plus ``gamma^(t+1) V(s_{t+1})`` at
    the env's last alive step ``t`` unless that step terminated (a truncation
    or the end of the window leaves the future to the value function). Steps
    after the first done contribute nothing, not even NaN.

    Args:
        rewards: ``[T, N]``.
        alive: ``[T, N]`` bool.
        gamma: discount factor.
        next_values: ``[T, N]`` bootstrap values; ``None`` gives the plain
            discounted sum.
        terminated: ``[T, N]`` bool, required with ``next_values``.

    Returns:
        ``[N]``.
    """
    weights = discounts(rewards.shape[0], gamma, rewards)
    total = (weights * torch.where(alive, rewards, torch.zeros_like(rewards))).sum(0)
    if next_values is None:
        return total
    if terminated is None:
        raise ValueError("terminated is required when next_values is given.")
    bootstrap = segment_ends(alive) & ~terminated
    values = torch.where(bootstrap, next_values, torch.zeros_like(next_values))
    return total + (gamma * weights * values).sum(0)


def td_lambda_targets(
    rewards: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    dones: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """TD(lambda) value targets ``G_t``, computed backwards over the window.

    ``G_t = r_t + gamma * (1 - terminated_t) * ((1 - lam) V_{t+1} + lam G_{t+1})``,
    where the blend falls back to ``V_{t+1}`` alone at the window's last step
    and at a done (``G_{t+1}`` belongs to another episode there). ``lam = 0``
    gives one-step TD targets; ``lam = 1`` the Monte-Carlo return bootstrapped
    at the window's end.

    Args:
        rewards: ``[T, N]``.
        next_values: ``[T, N]``, the value of each step's next observation.
        terminated: ``[T, N]`` bool.
        dones: ``[T, N]`` bool (terminated or truncated).
        gamma: discount factor.
        lam: the lambda of TD(lambda), in ``[0, 1]``.

    Returns:
        ``[T, N]``.
    """
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam must be in [0, 1], got {lam}.")
    num_steps = rewards.shape[0]
    targets = []
    next_return = next_values[-1]
    for t in reversed(range(num_steps)):
        continues = ~dones[t] if t < num_steps - 1 else torch.zeros_like(dones[t])
        blend = torch.where(continues, (1.0 - lam) * next_values[t] + lam * next_return, next_values[t])
        blend = torch.where(terminated[t], torch.zeros_like(blend), blend)
        next_return = rewards[t] + gamma * blend
        targets.append(next_return)
    return torch.stack(targets[::-1])
