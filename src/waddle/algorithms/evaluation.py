"""Deterministic evaluation of a trained policy on MicroDuck, optionally filmed.

Every trainer's ``deterministic_policy()`` (see :class:`~waddle.algorithms.trainer.Trainer`)
is one ``observation -> action`` module with its observation normaliser inside;
:func:`policy_from_checkpoint` rebuilds it from a checkpoint, and :func:`evaluate`
runs it for one full episode in each env of a batch and reports return, episode
length, velocity-tracking error and fall rate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torchrl.envs import EnvBase

from waddle.algorithms.checkpoint import CheckpointError
from waddle.algorithms.presets import make_config, make_trainer, upgrade_config_fields
from waddle.video import write_video


def policy_from_checkpoint(
    checkpoint: Mapping[str, Any], env: EnvBase, device: torch.device | str = "cpu"
) -> nn.Module:
    """Rebuild the trainer a checkpoint came from around ``env`` and return its deterministic policy.

    ``env`` only needs the observation and action specs of the training env
    (any batch size and backend).

    Raises:
        CheckpointError: the checkpoint's config or state does not rebuild its trainer.
    """
    algo = checkpoint["algo"]
    try:
        config = make_config(algo, upgrade_config_fields(algo, checkpoint["config"]["algorithm"]))
        trainer = make_trainer(algo, env, config, device)
        trainer.load_state_dict(checkpoint["trainer"])
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"the checkpoint's {algo} state does not fit its config: {reason[:200]}") from None
    return trainer.deterministic_policy()


@dataclass(frozen=True)
class EvaluationResult:
    """What ``waddle eval`` prints; means over one episode per env."""

    episodes: int
    """Number of episodes (one per env)."""
    mean_return: float
    """Mean undiscounted episode return."""
    mean_episode_length: float
    """Mean episode length in env steps."""
    velocity_tracking_error: float
    """Mean over all steps of |planar body velocity - command|, m/s."""
    mean_forward_speed: float
    """Mean over episodes of the episode's mean forward body-frame speed, m/s."""
    fall_rate: float
    """Fraction of episodes that ended by falling rather than by the time limit."""

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@torch.no_grad()
def evaluate(
    env: EnvBase,
    policy: nn.Module,
    *,
    video_path: str | Path | None = None,
    video_size: tuple[int, int] = (320, 240),
    max_steps: int | None = None,
) -> EvaluationResult:
    """Run ``policy`` until every env of ``env`` has finished one episode.

    Args:
        env: a MicroDuck env (its observation carries the body velocity at
            ``BODY_VELOCITY_START`` and a ``"command"`` entry).
        policy: ``observation -> action``.
        video_path: when given, film env 0's episode from the env's camera
            (``"track"``) to this mp4 file at the control rate.
        video_size: ``(width, height)`` of the video.
        max_steps: stop after this many steps (the env's episode limit by default).

    Returns:
        the :class:`EvaluationResult`.
    """
    num_envs = env.batch_size[0]
    max_steps = int(max_steps or getattr(env, "max_episode_steps", 1000))
    velocity_start = getattr(env, "BODY_VELOCITY_START", 6)
    device = next(iter(policy.buffers()), torch.zeros(())).device
    episode_return = torch.zeros(num_envs)
    episode_length = torch.zeros(num_envs, dtype=torch.long)
    tracking_error_sum = torch.zeros(num_envs)
    forward_speed_sum = torch.zeros(num_envs)
    fell = torch.zeros(num_envs, dtype=torch.bool)
    running = torch.ones(num_envs, dtype=torch.bool)

    frames, renderer = [], None
    if video_path is not None:
        from waddle.physics.render import BatchRenderer

        renderer = BatchRenderer(env.model, width=video_size[0], height=video_size[1])
        camera = getattr(env, "camera_id", None)

    td = env.reset()
    try:
        for _ in range(max_steps):
            if renderer is not None and running[0]:
                frames.append(renderer.render(env.physics.qpos[:1], camera=camera)[0].numpy())
            action = policy(td["observation"].to(device)).to(env.device)
            td = env.step(td.set("action", action))
            out = td["next"]
            velocity = out["observation"][:, velocity_start : velocity_start + 2].cpu()
            command = out["command"].cpu()
            reward = out["reward"].reshape(num_envs).cpu()
            done = out["done"].reshape(num_envs).cpu()
            terminated = out["terminated"].reshape(num_envs).cpu()

            episode_return += torch.where(running, reward, torch.zeros_like(reward))
            episode_length += running.long()
            tracking_error_sum += torch.where(running, (velocity - command).norm(dim=-1), torch.zeros(num_envs))
            forward_speed_sum += torch.where(running, velocity[:, 0], torch.zeros(num_envs))
            fell |= running & terminated
            running &= ~done
            if not running.any():
                break
            td = td["next"].exclude("reward", "done", "terminated", "truncated")
    finally:
        if renderer is not None:
            renderer.close()
    if video_path is not None:
        write_video(video_path, frames, fps=round(1.0 / getattr(env, "control_dt", 0.02)))

    lengths = episode_length.clamp_min(1).float()
    return EvaluationResult(
        episodes=num_envs,
        mean_return=float(episode_return.mean()),
        mean_episode_length=float(episode_length.float().mean()),
        velocity_tracking_error=float(tracking_error_sum.sum() / lengths.sum()),
        mean_forward_speed=float((forward_speed_sum / lengths).mean()),
        fall_rate=float(fell.float().mean()),
    )


@torch.no_grad()
def film(env: EnvBase, policy: nn.Module, path: str | Path, *, frames: int = 250,
         size: tuple[int, int] = (320, 240)) -> None:
    """Film env 0 of ``env`` under ``policy`` for ``frames`` control steps to an mp4 file.

    Envs that finish an episode are reset and filming goes on.
    """
    from waddle.physics.render import BatchRenderer

    device = next(iter(policy.buffers()), torch.zeros(())).device
    images = []
    with BatchRenderer(env.model, width=size[0], height=size[1]) as renderer:
        td = env.reset()
        for _ in range(frames):
            images.append(renderer.render(env.physics.qpos[:1], camera=getattr(env, "camera_id", None))[0].numpy())
            action = policy(td["observation"].to(device)).to(env.device)
            _, td = env.step_and_maybe_reset(td.set("action", action))
    write_video(path, images, fps=round(1.0 / getattr(env, "control_dt", 0.02)))
