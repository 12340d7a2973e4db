"""MicroDuckEnv on a differentiable backend: gradients reach the actions, and
``detach_state`` starts a segment that does not reach back into the last one.

The env carries tensors from one step to the next besides the physics state
(the previous action, the foot heights); all of them must be cut, or the next
segment's backward runs into the freed graph of the previous one. mujoco-torch
(eager, 2 envs, friction loss ignored) keeps this to seconds; MJX needs
minutes of compilation and is tested in ``tests/physics``.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("mujoco_torch", reason="needs the torch-sim extra: pip install 'waddle[torch-sim]'")

from waddle.envs.microduck import MicroDuckEnv  # noqa: E402


def test_gradients_reach_the_actions_and_detach_state_cuts_every_carried_tensor():
    env = MicroDuckEnv(backend="mujoco-torch", frictionloss="ignore", num_envs=2, requires_grad=True, seed=0)
    weights = torch.zeros(MicroDuckEnv.NUM_JOINTS, requires_grad=True)
    td = env.reset()
    for segment in range(2):
        loss = 0.0
        for _ in range(2):
            td["action"] = (torch.tanh(weights) + 0.1).expand(2, -1)
            td = env.step(td)["next"]
            loss = loss + td["reward"].sum() + td["observation"].sum()
        loss.backward()  # segment 1 used to fail: "backward through the graph a second time"
        assert torch.isfinite(weights.grad).all(), segment
        assert weights.grad.abs().sum() > 0, segment
        weights.grad = None
        env.detach_state()
        td = td.detach()
