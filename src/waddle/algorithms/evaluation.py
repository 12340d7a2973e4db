"""Deterministic evaluation of a trained policy on MicroDuck, optionally filmed.

Every trainer's ``deterministic_policy()`` (see :class:`~waddle.algorithms.trainer.Trainer`)
is one ``observation -> action`` module with its observation normaliser inside;
:func:`policy_from_checkpoint` rebuilds it from a checkpoint, and :func:`evaluate`
runs it for one episode in each env of a batch under one command (and one
task) and reports what a locomotion policy is judged on: survival, speeds, yaw
drift, foot clearance, step frequency and, for hopping, hop height, airborne
fraction and hop frequency. :func:`evaluate_tasks` does that for every task of
the env's library and every command of each task; :func:`task_commands` lists
the commands of a task library.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torch import nn
from torchrl.envs import EnvBase

from waddle.algorithms.checkpoint import CheckpointError
from waddle.algorithms.ppo import ActorObservationError, check_actor_observation
from waddle.algorithms.presets import make_env, make_trainer
from waddle.algorithms.recovery import RecoveryTracker
from waddle.algorithms.run_plan import RunPlan
from waddle.algorithms.task_library import TaskLibraryError
from waddle.envs.microduck.randomization import resolve_randomization
from waddle.envs.rotations import wrap_angle
from waddle.modules.networks import OBSERVATION_KEY
from waddle.modules.task_embedding import TASK_ID_KEY, act
from waddle.video import write_video


def observation_key(policy: nn.Module) -> str:
    """The env entry ``policy`` reads: ``"observation"``, or ``"sensor_observation"`` for a sensors policy."""
    return getattr(policy, "observation_key", OBSERVATION_KEY)


def trained_env_options(checkpoint: Mapping[str, Any]) -> dict[str, Any]:
    """The MicroDuckEnv options a checkpoint's policy needs in every env it runs in:
    ``RunPlan.from_checkpoint(checkpoint).policy_env_options``."""
    return RunPlan.from_checkpoint(checkpoint, require_run=False).policy_env_options


def policy_from_checkpoint(
    checkpoint: Mapping[str, Any],
    env: EnvBase,
    device: torch.device | str = "cpu",
    *,
    actor_observation: str | None = None,
) -> nn.Module:
    """Rebuild the trainer a checkpoint came from around ``env`` and return its deterministic policy.

    ``env`` only needs the observation and action specs of the training env
    (any batch size and backend). When the checkpoint records its run and
    ``env`` draws another randomization than the run did, the networks are built
    on a one-env copy of the training env instead: a PPO critic reads the drawn
    values, so its width follows the randomization (the policy does not).

    Args:
        checkpoint: a loaded checkpoint.
        env: the env the policy will run in.
        device: where the policy lives.
        actor_observation: when given, the observation the caller will feed
            (``"full"`` or ``"sensors"``); a checkpoint trained on the other is refused.

    Raises:
        CheckpointError: the checkpoint's config or state does not rebuild its trainer, it
            was trained on another task library than ``env``'s, its actor reads another
            observation than ``actor_observation``, or ``env`` stacks another number of
            sensor frames than the training env did.
    """
    plan = RunPlan.from_checkpoint(checkpoint, require_run=False)
    if actor_observation is not None:
        try:
            check_actor_observation(plan.actor_observation, actor_observation)
        except ActorObservationError as err:
            raise CheckpointError(str(err)) from None
    history, scale = plan.run.sensor_history, plan.run.action_scale
    if plan.actor_observation == "sensors" and getattr(env, "sensor_history", history) != history:
        raise CheckpointError(
            f"the checkpoint's actor reads {history} frame(s) of sensor readings and the env stacks "
            f"{env.sensor_history}: build the env with sensor_history={history}."
        )
    if getattr(env, "action_scale", scale) != scale:
        raise CheckpointError(
            f"the checkpoint's actions were trained at action_scale={scale} rad per unit and the env's is "
            f"{env.action_scale}: build the env with action_scale={scale}."
        )
    built_on, spare = env, None
    randomization = getattr(env, "randomization", None)
    if plan.run_recorded and randomization is not None:
        trained = plan.run.randomization
        if randomization != resolve_randomization(trained):
            options = plan.policy_env_options
            built_on = spare = make_env(plan.run.task, num_envs=1, seed=0, randomization=trained, **options)
    algo = plan.algo
    try:
        trainer = make_trainer(algo, built_on, plan.algorithm, device)
        trainer.load_state_dict(checkpoint["trainer"])
    except (TaskLibraryError, ActorObservationError) as err:
        raise CheckpointError(str(err)) from None
    except (KeyError, TypeError, ValueError, RuntimeError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(f"the checkpoint's {algo} state does not fit its config: {reason[:200]}") from None
    finally:
        if spare is not None:
            spare.close()
    return trainer.deterministic_policy()


@dataclass(frozen=True)
class EvaluationResult:
    """What ``waddle eval`` prints for one command: one episode per env, cut at ``max_steps``."""

    episodes: int
    """Number of episodes (one per env)."""
    mean_return: float
    """Mean undiscounted episode return."""
    mean_episode_length: float
    """Mean episode length in env steps."""
    velocity_tracking_error: float
    """Mean over all steps of |planar body velocity - command|, m/s."""
    mean_forward_speed: float
    """Mean over the episodes that did not fall of the episode's mean forward body-frame speed, m/s."""
    mean_lateral_speed: float
    """As ``mean_forward_speed``, for the lateral (leftward) body-frame speed."""
    fall_rate: float
    """Fraction of episodes that ended by falling rather than by the time limit."""
    yaw_drift_deg: float
    """Mean over the episodes that did not fall of |heading change| from reset to the end, degrees."""
    yaw_drift_p95_deg: float
    """95th percentile of the same."""
    foot_clearance: float
    """Mean peak height of a swing foot above its height at reset, over every completed swing, m."""
    step_frequency_hz: float
    """Touchdowns per second (both feet counted) in the episodes that did not fall."""
    action_saturation: float = float("nan")
    """Fraction of the action entries at a bound of the action space (within 1e-3), over the steps of the
    episodes that did not fall: near 1 for a bang-bang policy, which servos on a robot cannot follow."""
    action_change: float = float("nan")
    """Mean absolute change of an action entry from one step to the next, in action units (the first step
    counts from the zero action of the reset), over the episodes that did not fall: 2 flips between the
    bounds at every step."""
    command: tuple[float, ...] | None = None
    """The twist every env was reset with, ``(vx, vy)`` or ``(vx, vy, vyaw)``, when one was pinned."""
    mean_yaw_rate: float = float("nan")
    """Mean over the episodes that did not fall of their heading change over their duration, rad/s."""
    hop_height: float = float("nan")
    """Mean over the flights (both feet off the ground, then a touchdown) of the episodes that did not
    fall of the flight's peak trunk height above the standing height, m (NaN without a flight or a
    ``base_height()`` reading)."""
    airborne_fraction: float = float("nan")
    """Fraction of the steps of the episodes that did not fall with both feet off the ground."""
    hop_frequency_hz: float = float("nan")
    """Flights ended by a touchdown per second in the episodes that did not fall."""
    task: str | None = None
    """Name of the task every env was reset with, when one was pinned."""
    task_id: int | None = None
    """Index of that task in the env's library."""
    hop_task: bool = False
    """Whether that task rewards hops (its ``jump`` reward weight is positive): its hop figures are reported."""
    falls: int = 0
    """Falls started during the episodes, an episode that starts on the floor counting one
    (:mod:`~waddle.algorithms.recovery`); a fall that ends its episode counts too."""
    recovered_fraction: float = float("nan")
    """Share of the falls after which the robot stood again (projected gravity z below -0.9, the trunk
    at least 0.1 m up) within its episode."""
    time_to_stand_s: float = float("nan")
    """Mean seconds from a fall to standing again, over the recovered falls."""
    time_to_stand_p95_s: float = float("nan")
    """95th percentile of the same."""
    time_lying_s: float = float("nan")
    """Mean seconds spent down per fall."""
    recovery_task: bool = False
    """Whether that task goes on after a fall (``fall_terminates == 0``): its recovery figures are reported."""

    @property
    def survival(self) -> float:
        """Fraction of episodes that did not fall."""
        return 1.0 - self.fall_rate

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def task_commands(tasks: Any) -> list[tuple[float, float]]:
    """The commands ``waddle eval`` runs for a task library, in library order, without repeats.

    A task with a fixed command gives that command; a task with a command box
    gives its low corner, its centre and its high corner (0.1, 0.2 and 0.3
    m/s for the ``speed-range`` task).
    """
    commands: list[tuple[float, float]] = []
    for low, high in zip(tasks.command_low.tolist(), tasks.command_high.tolist()):
        corners = [low] if low == high else [low, [(a + b) / 2 for a, b in zip(low, high)], high]
        for corner in corners:
            command = (round(corner[0], 6), round(corner[1], 6))
            if command not in commands:
                commands.append(command)
    return commands


def hop_tasks(tasks: Any) -> list[bool]:
    """Per row of a task library, whether it rewards hops (a positive ``jump`` reward weight)."""
    from waddle.envs.microduck.rewards import REWARD_TERMS

    if "jump" not in REWARD_TERMS:
        return [False] * tasks.shape[0]
    column = list(REWARD_TERMS).index("jump")
    return (tasks.reward_weights[:, column] > 0).tolist()


@torch.no_grad()
def evaluate(
    env: EnvBase,
    policy: nn.Module,
    *,
    command: tuple[float, float] | None = None,
    task_id: int | None = None,
    video_path: str | Path | None = None,
    video_size: tuple[int, int] = (320, 240),
    max_steps: int | None = None,
) -> EvaluationResult:
    """Run ``policy`` until every env of ``env`` has finished one episode or ``max_steps`` steps.

    Args:
        env: a MicroDuck env, or any env with its observation layout
            (``BODY_VELOCITY_START``, a ``"command"`` entry) and its
            ``foot_heights()``, ``foot_contacts()``, ``heading()`` and
            ``control_dt``; with ``base_height()`` and ``standing_height``
            as well, hop heights are measured.
        policy: ``observation -> action``, or ``(observation, task_id) ->
            action`` for a task-conditioned policy (``reads_task_id``), which
            gets the env's ``"task_id"`` entry. It is fed the env entry its
            ``observation_key`` names (``"observation"`` without one).
        command: pin this planar command at reset in every env (it must lie
            in each env's task box); by default each env draws its own.
        task_id: reset every env into this task of the env's library; by
            default each env draws its own.
        video_path: when given, film env 0's episode from the env's camera
            (``"track"``) to this mp4 file at the control rate.
        video_size: ``(width, height)`` of the video.
        max_steps: stop after this many steps (the env's episode limit by default).

    Returns:
        the :class:`EvaluationResult`.
    """
    num_envs = env.batch_size[0]
    key = observation_key(policy)
    max_steps = int(max_steps or getattr(env, "max_episode_steps", 1000))
    velocity_start = env.BODY_VELOCITY_START
    device = next(iter(policy.buffers()), torch.zeros(())).device
    zeros = lambda *shape, dtype=torch.float32: torch.zeros(*shape, dtype=dtype)  # noqa: E731
    episode_return, tracking_error_sum = zeros(num_envs), zeros(num_envs)
    velocity_sum = zeros(num_envs, 2)
    episode_length = zeros(num_envs, dtype=torch.long)
    fell = zeros(num_envs, dtype=torch.bool)
    running = torch.ones(num_envs, dtype=torch.bool)
    yaw_drift = zeros(num_envs)
    touchdowns = zeros(num_envs)
    clearance_sum, clearance_count = 0.0, 0
    airborne_steps, hops = zeros(num_envs), zeros(num_envs)
    hop_height_sum, hop_height_count = zeros(num_envs), zeros(num_envs)
    measures_height = callable(getattr(env, "base_height", None)) and hasattr(env, "standing_height")
    space = getattr(env.action_spec, "space", None)
    low, high = (space.low.float().cpu(), space.high.float().cpu()) if space is not None else (-torch.inf, torch.inf)
    saturation_sum, change_sum = zeros(num_envs), zeros(num_envs)
    previous_action = None
    watches_falls = callable(getattr(env, "fallen", None)) and callable(getattr(env, "standing", None))
    recovery = RecoveryTracker(num_envs, env.control_dt) if watches_falls else None

    frames, renderer = [], None
    if video_path is not None:
        from waddle.physics.render import BatchRenderer

        renderer = BatchRenderer(env.model, width=video_size[0], height=video_size[1])
        camera = getattr(env, "camera_id", None)

    pinned = {}
    if command is not None:
        pinned["command"] = torch.tensor([command[:2]], dtype=torch.float32).expand(num_envs, 2).to(env.device)
        if len(command) == 3:
            pinned["yaw_rate_command"] = torch.full((num_envs, 1), float(command[2]), device=env.device)
    if task_id is not None:
        pinned[TASK_ID_KEY] = torch.full((num_envs, 1), int(task_id), dtype=torch.long, device=env.device)
    reset_td = TensorDict(pinned, batch_size=env.batch_size, device=env.device) if pinned else None
    td = env.reset(reset_td)
    yaw = env.heading().float().cpu()
    rest_height = env.foot_heights().float().cpu()
    contacts = env.foot_contacts().cpu()
    swing_peak = torch.where(contacts, torch.zeros_like(rest_height), rest_height)
    flight_peak = torch.full((num_envs,), -torch.inf)
    if measures_height:
        above = env.base_height().float().cpu() - float(env.standing_height)
        flight_peak = torch.where(contacts.any(-1), flight_peak, above)
    if recovery is not None:
        recovery.observe(env.standing(), env.fallen(), running)
    try:
        for _ in range(max_steps):
            if renderer is not None and running[0]:
                frames.append(renderer.render(env.physics.qpos[:1], camera=camera)[0].numpy())
            task = td.get(TASK_ID_KEY, None)
            action = act(policy, td[key].to(device), None if task is None else task.to(device))
            td = env.step(td.set("action", action.to(env.device)))
            out = td["next"]
            applied = torch.maximum(torch.minimum(action.detach().float().cpu(), high), low)
            if previous_action is None:
                previous_action = torch.zeros_like(applied)
            bound = ((applied - low).abs() <= 1e-3) | ((high - applied).abs() <= 1e-3)
            saturation_sum += torch.where(running, bound.float().mean(-1), 0.0)
            change_sum += torch.where(running, (applied - previous_action).abs().mean(-1), 0.0)
            previous_action = applied
            velocity = out["observation"][:, velocity_start : velocity_start + 2].float().cpu()
            reward = out["reward"].reshape(num_envs).float().cpu()
            done = out["done"].reshape(num_envs).cpu()
            terminated = out["terminated"].reshape(num_envs).cpu()
            error = (velocity - out["command"].float().cpu()).norm(dim=-1)

            episode_return += torch.where(running, reward, 0.0)
            episode_length += running.long()
            tracking_error_sum += torch.where(running, error, 0.0)
            velocity_sum += torch.where(running.unsqueeze(-1), velocity, 0.0)

            new_yaw = env.heading().float().cpu()
            yaw_drift += torch.where(running & ~terminated, wrap_angle(new_yaw - yaw), 0.0)
            yaw = new_yaw
            heights, new_contacts = env.foot_heights().float().cpu(), env.foot_contacts().cpu()
            counted = running & ~terminated
            landed = new_contacts & ~contacts & counted.unsqueeze(-1)
            touchdowns += landed.sum(-1)
            clearance_sum += float((swing_peak - rest_height)[landed].sum())
            clearance_count += int(landed.sum())
            swing_peak = torch.where(new_contacts, torch.zeros_like(heights), torch.maximum(swing_peak, heights))

            # A flight: both feet off the ground; it ends as a hop at the next touchdown.
            flying, was_flying = ~new_contacts.any(-1), ~contacts.any(-1)
            airborne_steps += (flying & counted).float()
            hop = was_flying & ~flying & counted
            hops += hop.float()
            if measures_height:
                above = env.base_height().float().cpu() - float(env.standing_height)
                hop_height_sum += torch.where(hop, flight_peak, 0.0)
                hop_height_count += hop.float()
                flight_peak = torch.where(flying, torch.maximum(flight_peak, above), -torch.inf)
            contacts = new_contacts

            fell |= running & terminated
            if recovery is not None:
                recovery.observe(env.standing(), env.fallen(), running)
            running &= ~done
            if not running.any():
                break
            td = out.exclude("reward", "done", "terminated", "truncated")
    finally:
        if renderer is not None:
            renderer.close()
    if video_path is not None:
        write_video(video_path, frames, fps=round(1.0 / env.control_dt))

    lengths = episode_length.clamp_min(1).float()
    standing = ~fell
    mean_velocity = velocity_sum / lengths.unsqueeze(-1)
    drift_deg = torch.rad2deg(yaw_drift.abs())[standing]
    seconds = lengths[standing] * env.control_dt
    nan = float("nan")
    flights = hop_height_count[standing].sum()
    return EvaluationResult(
        episodes=num_envs,
        mean_return=float(episode_return.mean()),
        mean_episode_length=float(episode_length.float().mean()),
        velocity_tracking_error=float(tracking_error_sum.sum() / lengths.sum()),
        mean_forward_speed=float(mean_velocity[standing, 0].mean()) if standing.any() else nan,
        mean_lateral_speed=float(mean_velocity[standing, 1].mean()) if standing.any() else nan,
        fall_rate=float(fell.float().mean()),
        yaw_drift_deg=float(drift_deg.mean()) if standing.any() else nan,
        yaw_drift_p95_deg=float(torch.quantile(drift_deg, 0.95)) if standing.any() else nan,
        foot_clearance=clearance_sum / clearance_count if clearance_count else nan,
        step_frequency_hz=float((touchdowns[standing] / seconds).mean()) if standing.any() else nan,
        action_saturation=float((saturation_sum / lengths)[standing].mean()) if standing.any() else nan,
        action_change=float((change_sum / lengths)[standing].mean()) if standing.any() else nan,
        command=None if command is None else tuple(float(value) for value in command),
        mean_yaw_rate=float((yaw_drift[standing] / seconds).mean()) if standing.any() else nan,
        hop_height=float(hop_height_sum[standing].sum() / flights) if flights > 0 else nan,
        airborne_fraction=float(airborne_steps[standing].sum() / lengths[standing].sum()) if standing.any() else nan,
        hop_frequency_hz=float((hops[standing] / seconds).mean()) if standing.any() else nan,
        task_id=None if task_id is None else int(task_id),
        **({} if recovery is None else dataclasses.asdict(recovery.summary())),
    )


def evaluate_tasks(
    env: EnvBase,
    policy: nn.Module,
    *,
    command: tuple[float, float] | None = None,
    video_path: str | Path | None = None,
    video_task: str | None = None,
    max_steps: int | None = None,
) -> list[EvaluationResult]:
    """:func:`evaluate` every task of ``env``'s library, each under each of its commands.

    One :func:`evaluate` call per row: every env is reset into the task (its
    ``task_id`` pinned) and the command; a task's commands are
    :func:`task_commands` of its row (or ``command`` alone when given). Rows
    come in library order and carry the task's name, id and whether it
    rewards hops (:func:`hop_tasks`).

    Args:
        env: a MicroDuck env (it needs ``tasks``); ``num_envs`` is the number
            of episodes per row.
        policy: as for :func:`evaluate`.
        command: evaluate only this planar command, in every task.
        video_path: film env 0 of the first row to this mp4 file.
        video_task: film the first row of the task of this name instead.
        max_steps: as for :func:`evaluate`.

    Raises:
        ValueError: ``video_task`` is not a task of the library.
    """
    tasks = env.tasks
    names = [tasks.name] if isinstance(tasks.name, str) else list(tasks.name)
    filmed = names[0] if video_task is None else video_task
    if filmed not in names:
        raise ValueError(f"video_task: {video_task!r} is not a task of this library; its tasks are {names}")
    hopping = hop_tasks(tasks)
    recovering = (tasks.fall_terminates.reshape(-1) == 0).tolist()
    results = []
    for index, name in enumerate(names):
        commands = [command] if command is not None else task_commands(tasks[index : index + 1])
        for number, pinned in enumerate(commands):
            video = video_path if name == filmed and number == 0 else None
            result = evaluate(env, policy, command=pinned, task_id=index, video_path=video, max_steps=max_steps)
            results.append(
                dataclasses.replace(result, task=name, hop_task=hopping[index], recovery_task=recovering[index])
            )
    return results


@torch.no_grad()
def film(
    env: EnvBase, policy: nn.Module, path: str | Path, *, frames: int = 250, size: tuple[int, int] = (320, 240)
) -> None:
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
            task = td.get(TASK_ID_KEY, None)
            action = act(policy, td[observation_key(policy)].to(device), None if task is None else task.to(device))
            action = action.to(env.device)
            _, td = env.step_and_maybe_reset(td.set("action", action))
    write_video(path, images, fps=round(1.0 / env.control_dt))
