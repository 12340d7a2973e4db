"""MicroDuck tasks as data: one :class:`MicroDuckTask` row per task, stacked into a library.

A task fixes, for the episodes that draw it, the command box, the reset
distribution, the gait clock and the reward (one weight per registered term
and the term parameters). Tasks are presets over one env, not env
subclasses: :func:`tracking_task`, :func:`standing_task`,
:func:`speed_range_task`, :func:`sidestep_task`, :func:`joystick_task` and :func:`jump_task` all
call :func:`make_task`, and :func:`as_task_library` turns one task or several
into the ``(num_tasks,)`` library an env holds.

Example:
    >>> library = as_task_library([tracking_task(0.2, weight=2.0), jump_task()])
    >>> library.shape, list(library.name)
    (torch.Size([2]), ['tracking+0.20', 'jump'])
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from tensordict import TensorDict, tensorclass

from waddle.envs.microduck.rewards import (
    COMMAND_THRESHOLD,
    GAIT_TERMS,
    REWARD_PARAMS,
    REWARD_TERMS,
    check_weights,
    default_weights,
)

__all__ = [
    "COMMAND_THRESHOLD",
    "MicroDuckTask",
    "as_task_library",
    "joystick_task",
    "jump_task",
    "make_task",
    "sidestep_task",
    "speed_range_task",
    "standing_task",
    "TaskTable",
    "tracking_task",
]

GAIT_FREQUENCY_HZ = 1.8913
"""Gait clock frequency of the fixed-speed presets: the cadence of the reference walking gait."""

JOINT_RESET_NOISE_SCALE = 0.02
"""Half-width in radians of the uniform joint noise added at reset."""

POSE_STD_STANDING = 0.1
"""Tight pose Gaussian for standing: the joints should stay at the keyframe."""

POSE_STD_MOVING = 0.5
"""Loose pose Gaussian for walking and hopping, which need the legs to move."""

GAIT_PRIOR_LIFT = 0.25
"""Leg-shortening amplitude, radians at the hip, of the walking presets' gait prior (about 1.3 cm of foot lift)."""

HOP_FREQUENCY_HZ = 2.0
"""Clock of the jump task: the beat ``hop_rhythm`` follows."""

JUMP_REWARD_WEIGHTS: dict[str, float] = {
    "hop_rhythm": 1.0,
    "launch": 30.0,
    "jump": 10.0,
    "jump_height": 10.0,
    "drift": -5.0,
    "lin_vel_z": 0.0,
}
"""Weights the jump preset sets on top of the registered defaults (gait terms are off too)."""

WALKING_PRIOR: dict[str, float] = {"gait_prior_lift": GAIT_PRIOR_LIFT}
"""The gait prior the walking recipes of ``waddle train`` (walk, speed-range, sidestep) switch on with
``tracking_task(0.2, **WALKING_PRIOR)``: the swing-leg lift only. With a hip stride as well (``gait_prior_stride_per_mps=1.0``) PPO learned gaits that
walked in circles (350-540 degrees of turn in 10 s); the policy finds its own stride."""

SPEED_RANGE_CLOCK_HZ = 0.75
"""Gait clock of the speed-range preset at zero command, Hz."""

SPEED_RANGE_CLOCK_HZ_PER_MPS = 6.0
"""Clock frequency the speed-range preset adds per m/s of command: 1.35 Hz at 0.1 m/s, 1.95 at 0.2, 2.55 at 0.3.

Steps then come 2.7 to 5.1 times a second; on this clock seeds 0, 1 and 2 walked 0.117 / 0.216 / 0.281,
0.110 / 0.205 / 0.281 and 0.123 / 0.207 / 0.286 m/s at 0.1 / 0.2 / 0.3 with 100 % survival, on strides of
4.1-5.6 cm. With 1 Hz + 5 Hz per m/s (1.5 to 2.5 Hz) seed 0 walked
0.166 / 0.233 / 0.277 m/s at 0.1 / 0.2 / 0.3; with 0.25 Hz + 8 Hz per m/s (1.05 to 2.65 Hz) the 0.1 m/s
gait held its speed but was marginal, stepping twice a second: seeds 0 and 2 fell in 6 % and 3 % of
20-s episodes there, about 2.4 s after reset (``benchmarks/learning.py --parts speed-range``)."""

SPEED_RANGE_TRACKING_STD = 0.025
"""Narrowest width of the speed-range preset's tracking Gaussian along the command, m/s (``tracking_std``).

A fixed 0.05 (half the registered default) cost 30 % of the term for 0.03 m/s off any command; at
0.1 m/s, where that is 30 % of the speed, the policies of three seeds walked 0.115-0.135."""

SPEED_RANGE_TRACKING_RELATIVE_STD = 0.25
"""Width of the speed-range preset's tracking Gaussian along the command as a fraction of the commanded
speed (``tracking_relative_std``): 0.025 m/s at 0.1, 0.05 at 0.2 (the former fixed width), 0.075 at 0.3.
Walking 0.035 m/s too fast at 0.1 now costs 86 % of the term (was 39 %)."""

TRACKING_WINDOW_CYCLES = 1.0
"""Gait cycles the walking presets average the tracked velocity over (``tracking_window_cycles``).

Within a stride a walking MicroDuck surges and sways (lateral velocity swings of about the
0.05 m/s width of the tracking Gaussian across the command), so a Gaussian of the instantaneous
velocity paid a walking policy about a tenth of its weight whatever its mean speed, and the
progress clip at the command let the fast half of a stride's speeds pay past it. Over a whole
cycle the surge and sway average out: ``tracking`` and ``progress`` see the speed the robot makes
good (the gait terms' gate keeps the instantaneous velocity, see ``rewards._stepping_gate``)."""

PROGRESS_OFF_AXIS_STD = 0.1
"""Width, m/s, of the walking presets' gate on ``progress`` (``progress_off_axis_std``): the Gaussian of
the stride-averaged velocity across the command that multiplies the progress credit.

Without it ``progress`` paid for the speed along the command whatever the robot did across it: walk
seed 1 settled on a diagonal gait, 0.192 m/s forward and 0.082 m/s to the left, where ``tracking``
(0.05 wide across) paid 7 % of its weight and ``progress`` all of it. Gated, that gait keeps half of
``progress``; a straight one (0.005 m/s across) keeps 99.8 %. The gate is wider than ``tracking``'s
across-width so that it still pulls a gait 0.1 m/s off its line back toward it."""

WALKING_TRACKING: dict[str, float] = {
    "tracking_window_cycles": TRACKING_WINDOW_CYCLES,
    "progress_off_axis_std": PROGRESS_OFF_AXIS_STD,
}
"""Term parameters the walking presets (tracking, speed range, sidestep) set: the stride-averaged
velocity is tracked, and progress across the command is not paid for."""

SPEED_RANGE_STRIDE_PER_MPS = 1.0
"""Hip swing of the speed-range recipe's gait prior, radians per m/s of forward command (0.3 rad, about
2 cm of foot travel each way, at 0.3 m/s). Without it the policies sat at their action bounds 80 % of the
time at 0.3 m/s and walked 0.263-0.269 there (seed 1); with it seed 1 walked 0.128 / 0.222 / 0.272 at
0.1 / 0.2 / 0.3 m/s. The walk preset, whose gait needs no more range, keeps 0."""

SPEED_RANGE_PRIOR: dict[str, float] = {**WALKING_PRIOR, "gait_prior_stride_per_mps": SPEED_RANGE_STRIDE_PER_MPS}
"""The gait prior ``waddle train --task speed-range`` trains with: the swing-leg lift and the hip swing."""

WALKING_REWARD_WEIGHTS: dict[str, float] = {"heading_hold": 2.0}
"""Weights the walking presets set on top of the registered defaults: hold the heading of the reset."""

LYING_STARTS: tuple[str, ...] = ("back", "front", "left", "right")
"""Ways an episode can start on the floor: pitched 90 degrees backward (the trunk's rear down), forward (the
head down), or rolled 90 degrees onto the left or the right side."""

_HALF = math.sqrt(0.5)
LYING_TILTS: dict[str, tuple[float, float, float, float]] = {
    "back": (_HALF, 0.0, -_HALF, 0.0),  # -90 degrees about y
    "front": (_HALF, 0.0, _HALF, 0.0),  # +90 about y
    "left": (_HALF, -_HALF, 0.0, 0.0),  # -90 about x
    "right": (_HALF, _HALF, 0.0, 0.0),  # +90 about x
}
"""The trunk's orientation (w, x, y, z) on each of :data:`LYING_STARTS` at heading 0."""

LYING_DROP_HEIGHT = 0.2
"""Height, m, of the trunk from which a lying start is dropped: clear of the floor whatever the joints."""

TASK_FIELDS: dict[str, Any] = {
    "warm_start_velocity": (0.0, 0.0),
    "warm_start_fraction": 0.0,
    "joint_reset_noise_scale": JOINT_RESET_NOISE_SCALE,
    "gait_frequency_hz": GAIT_FREQUENCY_HZ,
    "gait_frequency_per_mps": 0.0,
    "gait_prior_lift": 0.0,
    "gait_prior_stride_per_mps": 0.0,
    "yaw_rate_range": (0.0, 0.0),
    "turn_in_place_fraction": 0.0,
    "sidestep_fraction": 0.0,
    "standing_fraction": 0.0,
    "command_resample_s": (0.0, 0.0),
    "lying_start_fraction": 0.0,
    "lying_start_side": -1.0,
    "reference_start_fraction": 0.0,
    "fall_terminates": 1.0,
}
"""Reset and clock fields :func:`make_task` accepts by name, with their defaults."""


@tensorclass
class MicroDuckTask:
    """One MicroDuck task as a row of tensors and a name; a library is a stack of rows.

    Stack tasks with :func:`torch.stack` (which checks that every task has the
    full weight vector and parameter keys) or :func:`as_task_library` (which
    also range checks every field). Index a library with ``library[task_id]``
    to get one row per env.

    Args:
        command_low: lower corner of the planar command box ``(vx, vy)`` in
            m/s, shape ``(2,)``. A fixed command has ``command_low == command_high``.
        command_high: upper corner of the box, shape ``(2,)``; the command is
            drawn uniformly in the box at reset and held for the episode.
        warm_start_velocity: ``(low, high)`` speed in m/s, shape ``(2,)``: a
            warm-started env begins moving along its command at a speed drawn
            from it.
        warm_start_fraction: fraction of the resets under a nonzero command
            that are warm-started, in ``[0, 1]``.
        joint_reset_noise_scale: half-width in radians of the uniform noise
            added to the joint positions at reset.
        gait_frequency_hz: gait clock frequency at zero command.
        gait_frequency_per_mps: clock frequency added per m/s of command speed.
        gait_prior_lift: amplitude in radians of the leg shortening the gait
            prior adds to the clock's swing leg (0: no prior); see
            :meth:`~waddle.envs.microduck.MicroDuckEnv.gait_prior`.
        gait_prior_stride_per_mps: hip swing amplitude of the gait prior in
            radians per m/s of forward command.
        yaw_rate_range: ``(low, high)`` of the yaw-rate command in rad/s,
            shape ``(2,)``, drawn uniformly with the planar command; ``(0, 0)``
            (the default) never turns.
        turn_in_place_fraction: share of the draws that turn in place: no
            planar command and a yaw rate of at least
            :data:`TURN_IN_PLACE_MIN_FRACTION` of the range's largest magnitude.
        sidestep_fraction: share of the draws that step sideways: no forward
            or yaw command and a lateral speed of at least
            :data:`SIDESTEP_MIN_FRACTION` of the box's largest ``|vy|``.
        standing_fraction: share of the draws that stand: a zero twist.
        command_resample_s: ``(low, high)`` seconds, shape ``(2,)``, after which
            an env draws a new command within the episode (each interval drawn
            uniformly); ``(0, 0)`` (the default) holds the reset's command.
        lying_start_fraction: share of the episodes that start on the floor:
            dropped from :data:`LYING_DROP_HEIGHT` lying on one of
            :data:`LYING_STARTS`, at a random heading, its joints at random
            angles within their ranges.
        lying_start_side: index into :data:`LYING_STARTS` of the way such an
            episode starts lying, or -1 (the default) for any of them.
        reference_start_fraction: share of those episodes that start instead
            at a state drawn along their side's scripted get-up
            (:mod:`~waddle.envs.microduck.getup_reference`), at a random
            heading: a training aid that shows the policy the way up; 0 (the
            default) drops every one. ``waddle eval`` and the benchmarks
            start every episode with a drop.
        fall_terminates: 1 (the default): a fall ends the episode; 0: a fall
            is a state to get up from, and while fallen the task's positive
            terms other than ``getup`` pay nothing.
        reward_weights: one weight per registered term, in the order of
            :data:`~waddle.envs.microduck.rewards.REWARD_TERMS`, shape
            ``(num_terms,)``. An all-zero row gives zero reward.
        params: one scalar per key of
            :data:`~waddle.envs.microduck.rewards.REWARD_PARAMS`.
        weight: share of the task in the env's own draw at reset, >= 0.
        name: label for logs and evaluation.
    """

    command_low: torch.Tensor
    command_high: torch.Tensor
    warm_start_velocity: torch.Tensor
    warm_start_fraction: torch.Tensor
    joint_reset_noise_scale: torch.Tensor
    gait_frequency_hz: torch.Tensor
    gait_frequency_per_mps: torch.Tensor
    gait_prior_lift: torch.Tensor
    gait_prior_stride_per_mps: torch.Tensor
    yaw_rate_range: torch.Tensor
    turn_in_place_fraction: torch.Tensor
    sidestep_fraction: torch.Tensor
    standing_fraction: torch.Tensor
    command_resample_s: torch.Tensor
    lying_start_fraction: torch.Tensor
    lying_start_side: torch.Tensor
    reference_start_fraction: torch.Tensor
    fall_terminates: torch.Tensor
    reward_weights: torch.Tensor
    params: TensorDict
    weight: torch.Tensor
    name: str


def make_task(
    command_low: Sequence[float],
    command_high: Sequence[float],
    *,
    name: str,
    weight: float = 1.0,
    reward_weights: Mapping[str, float] | None = None,
    **overrides: Any,
) -> MicroDuckTask:
    """Build a task from a command box, a name and overrides.

    Args:
        command_low: ``(vx, vy)`` lower corner of the command box, m/s.
        command_high: ``(vx, vy)`` upper corner of the command box, m/s.
        name: label of the task.
        weight: share of the task in the env's own draw at reset.
        reward_weights: term name to weight, replacing the registered
            defaults of those terms.
        **overrides: reset and clock fields (the keys of :data:`TASK_FIELDS`)
            or term parameters (keys of ``REWARD_PARAMS``) by name.

    Example:
        >>> task = make_task((0.1, 0.0), (0.3, 0.0), name="walk", tracking_std=0.2, gait_frequency_per_mps=5.0)
        >>> round(float(task.params["tracking_std"]), 6), float(task.gait_frequency_per_mps)
        (0.2, 5.0)
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"make_task: name must be a non-empty string, got {name!r}.")
    fields = dict(TASK_FIELDS)
    params = dict(REWARD_PARAMS)
    for key, value in overrides.items():
        if key in fields:
            fields[key] = value
        elif key in params:
            params[key] = value
        else:
            raise ValueError(
                f"make_task({name!r}): unknown override {key!r}; accepted: the task fields "
                f"{sorted(fields)} or the reward params {sorted(params)}."
            )
    check_weights(reward_weights or {}, f"make_task({name!r}): reward_weights")
    weights = default_weights()
    weights.update(reward_weights or {})
    weight_row = [_as_float(value, (), f"reward_weights[{term!r}]", name) for term, value in weights.items()]
    task = MicroDuckTask(
        command_low=_as_float(command_low, (2,), "command_low", name),
        command_high=_as_float(command_high, (2,), "command_high", name),
        warm_start_velocity=_as_float(fields["warm_start_velocity"], (2,), "warm_start_velocity", name),
        warm_start_fraction=_as_float(fields["warm_start_fraction"], (), "warm_start_fraction", name),
        joint_reset_noise_scale=_as_float(fields["joint_reset_noise_scale"], (), "joint_reset_noise_scale", name),
        gait_frequency_hz=_as_float(fields["gait_frequency_hz"], (), "gait_frequency_hz", name),
        gait_frequency_per_mps=_as_float(fields["gait_frequency_per_mps"], (), "gait_frequency_per_mps", name),
        gait_prior_lift=_as_float(fields["gait_prior_lift"], (), "gait_prior_lift", name),
        gait_prior_stride_per_mps=_as_float(fields["gait_prior_stride_per_mps"], (), "gait_prior_stride_per_mps", name),
        yaw_rate_range=_as_float(fields["yaw_rate_range"], (2,), "yaw_rate_range", name),
        turn_in_place_fraction=_as_float(fields["turn_in_place_fraction"], (), "turn_in_place_fraction", name),
        sidestep_fraction=_as_float(fields["sidestep_fraction"], (), "sidestep_fraction", name),
        standing_fraction=_as_float(fields["standing_fraction"], (), "standing_fraction", name),
        command_resample_s=_as_float(fields["command_resample_s"], (2,), "command_resample_s", name),
        lying_start_fraction=_as_float(fields["lying_start_fraction"], (), "lying_start_fraction", name),
        lying_start_side=_as_float(fields["lying_start_side"], (), "lying_start_side", name),
        reference_start_fraction=_as_float(fields["reference_start_fraction"], (), "reference_start_fraction", name),
        fall_terminates=_as_float(fields["fall_terminates"], (), "fall_terminates", name),
        reward_weights=torch.stack(weight_row),
        params=TensorDict({key: _as_float(value, (), key, name) for key, value in params.items()}, batch_size=[]),
        weight=_as_float(weight, (), "weight", name),
        name=name,
        batch_size=[],
    )
    _check_rows(task.unsqueeze(0))
    return task


# ---------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------


def tracking_task(
    speed: float = 0.03,
    *,
    weight: float = 1.0,
    reward_weights: Mapping[str, float] | None = None,
    **overrides: Any,
) -> MicroDuckTask:
    """Walk at a fixed forward speed in m/s (negative walks backward); the default task.

    The gait terms are on, the pose Gaussian loose and ``heading_hold``
    weighted (:data:`WALKING_REWARD_WEIGHTS`). There is no gait prior, so the
    env simulates what TorchRL's ``MicroDuckEnv.tracking_task`` does with the
    same arguments; ``**WALKING_PRIOR`` switches the swing-leg lift on (the
    ``waddle train --task walk`` recipe does). A speed at or under
    :data:`COMMAND_THRESHOLD` has no direction to walk in and gives
    :func:`standing_task` instead. ``overrides`` (including ``name=``) go to
    :func:`make_task`.
    """
    speed = float(speed)
    if abs(speed) <= COMMAND_THRESHOLD:
        return standing_task(weight=weight, reward_weights=reward_weights, **overrides)
    return make_task(
        (speed, 0.0),
        (speed, 0.0),
        weight=weight,
        reward_weights={**WALKING_REWARD_WEIGHTS, **(reward_weights or {})},
        **{
            "name": f"tracking{speed:+.2f}",
            "pose_std": POSE_STD_MOVING,
            **WALKING_TRACKING,
            **overrides,
        },
    )


def standing_task(
    *, weight: float = 1.0, reward_weights: Mapping[str, float] | None = None, **overrides: Any
) -> MicroDuckTask:
    """Balance in place under a zero command.

    The gait terms are off and the pose Gaussian tight, which leaves tracking
    toward zero velocity, posture, uprightness and the regularization costs.
    """
    return make_task(
        (0.0, 0.0),
        (0.0, 0.0),
        weight=weight,
        reward_weights={**dict.fromkeys(GAIT_TERMS, 0.0), **(reward_weights or {})},
        **{"name": "standing", "pose_std": POSE_STD_STANDING, **overrides},
    )


def speed_range_task(
    low: float = 0.1,
    high: float = 0.3,
    *,
    weight: float = 1.0,
    reward_weights: Mapping[str, float] | None = None,
    **overrides: Any,
) -> MicroDuckTask:
    """Track a forward speed drawn uniformly in ``[low, high]`` m/s at every reset.

    The gait clock runs at :data:`SPEED_RANGE_CLOCK_HZ` plus
    :data:`SPEED_RANGE_CLOCK_HZ_PER_MPS` per m/s of command, so the rewarded
    cadence follows the commanded speed, and the tracking Gaussian is a fixed
    fraction of the command wide (:data:`SPEED_RANGE_TRACKING_RELATIVE_STD`, at
    least :data:`SPEED_RANGE_TRACKING_STD`): one policy modulates its speed
    instead of settling on one gait. No gait prior by default;
    :data:`SPEED_RANGE_PRIOR` is the one ``waddle train --task speed-range``
    adds (swing-leg lift and a hip swing that grows with the command).
    """
    low, high = float(low), float(high)
    return make_task(
        (low, 0.0),
        (high, 0.0),
        weight=weight,
        reward_weights={**WALKING_REWARD_WEIGHTS, **(reward_weights or {})},
        **{
            "name": f"speed_range{low:+.2f}..{high:+.2f}",
            "gait_frequency_hz": SPEED_RANGE_CLOCK_HZ,
            "gait_frequency_per_mps": SPEED_RANGE_CLOCK_HZ_PER_MPS,
            "tracking_std": SPEED_RANGE_TRACKING_STD,
            "tracking_relative_std": SPEED_RANGE_TRACKING_RELATIVE_STD,
            "pose_std": POSE_STD_MOVING,
            **WALKING_TRACKING,
            **overrides,
        },
    )


def sidestep_task(
    speed: float = 0.15,
    *,
    weight: float = 1.0,
    reward_weights: Mapping[str, float] | None = None,
    **overrides: Any,
) -> MicroDuckTask:
    """Walk sideways at ``speed`` m/s, to the left when positive.

    Same clock and contact terms as forward walking; only the tracked
    velocity component changes (the tracking Gaussian is tighter across the
    command, so forward drift costs more than a lateral speed error). No gait
    prior unless asked for (``**WALKING_PRIOR``).
    """
    speed = float(speed)
    return make_task(
        (0.0, speed),
        (0.0, speed),
        weight=weight,
        reward_weights={**WALKING_REWARD_WEIGHTS, **(reward_weights or {})},
        **{
            "name": f"sidestep{speed:+.2f}",
            "pose_std": POSE_STD_MOVING,
            **WALKING_TRACKING,
            **overrides,
        },
    )


TURN_IN_PLACE_MIN_FRACTION = 0.4
"""A turn-in-place command's yaw rate is at least this fraction of its range's largest magnitude (0.4 rad/s
of upstream's 1.0): a slower turn is hardly a turn."""

SIDESTEP_MIN_FRACTION = 0.25
"""A sidestep command's lateral speed is at least this fraction of its box's largest ``|vy|`` (0.075 m/s of
upstream's 0.3): above the standing threshold, and as slow as a careful sidestep on the gamepad."""

JOYSTICK_LINEAR_RANGE: tuple[tuple[float, float], tuple[float, float]] = ((-0.4, -0.3), (0.4, 0.3))
"""``(low, high)`` corners of the joystick preset's planar command box, m/s: upstream's velocity task."""

JOYSTICK_YAW_RATE_RANGE: tuple[float, float] = (-1.0, 1.0)
"""The joystick preset's yaw-rate command range, rad/s: upstream's."""

JOYSTICK_TURN_IN_PLACE_FRACTION = 0.15
"""Share of the joystick preset's commands that turn in place. Upstream found that without such a share
turning on the spot was about 2 % of the data and never learned."""

JOYSTICK_SIDESTEP_FRACTION = 0.15
"""Share of the joystick preset's commands that step sideways and do nothing else. Drawn from the box alone,
almost every command carries some vy, and the policies tracked about a third of it (0.022 m/s of a 0.1 m/s
sidestep on the nominal robot): the pure sidestep, like the pure turn, needs a share of its own."""

JOYSTICK_STANDING_FRACTION = 0.1
"""Share of the joystick preset's commands that stand (upstream grows its share from 2 % to 25 %)."""

JOYSTICK_RESAMPLE_S: tuple[float, float] = (3.0, 8.0)
"""Seconds between the joystick preset's new commands: an episode of 20 s holds several."""

JOYSTICK_PARAMS: dict[str, float] = {
    "pose_std": POSE_STD_MOVING,
    "tracking_std": 0.1,
    "tracking_relative_std": 0.25,
    "tracking_off_axis_std": 0.1,
    "progress_off_axis_std": PROGRESS_OFF_AXIS_STD,
    "tracking_window_cycles": TRACKING_WINDOW_CYCLES,
    "yaw_rate_std": 0.3,
    "gait_progress_floor": 0.25,
}
"""Term parameters of the joystick preset: the stride-averaged velocity tracked within a tenth of a m/s
each way (a quarter of the command along it at speed), the yaw rate within 0.3 rad/s."""

JOYSTICK_REWARD_WEIGHTS: dict[str, float] = {
    "air_time": 0.0,
    "double_support": 0.0,
    "phase_contact": 2.0,
    "swing_height": 2.0,
    "step_air_time": 3.0,
    "single_support": 2.0,
    "swing_lift": 2.0,
    "yaw_rate": 2.0,
    "stride_yaw_rate": 2.0,
    "heading_hold": 2.0,
    "pose": 0.5,
    "target_past_range": -1.0,
}
"""Weights the joystick preset sets over the registered defaults. The clock-free stepping terms pay for
steps while the twist asks to move, by how much of the twist the robot does (``step_air_time``,
``single_support``, ``swing_lift``); the clock's own terms (``phase_contact``, ``swing_height``) pay for
stepping in time with the clock, the beat the joystick recipe's fading gait prior lifts the legs to;
the yaw rate is tracked at each step and over a stride (``stride_yaw_rate``: its narrow kernel sees the
slow turn that makes a straight walk drift), ``heading_hold`` keeps the heading the yaw command
integrates to, and ``target_past_range`` costs servo targets past the joints' ranges (without it, a walking
file held its hip rolls' targets past their stops in two ticks of three)."""


def joystick_task(
    *, weight: float = 1.0, reward_weights: Mapping[str, float] | None = None, **overrides: Any
) -> MicroDuckTask:
    """Follow a gamepad's twist ``(vx, vy, vyaw)``: upstream's velocity task.

    The planar command is drawn in :data:`JOYSTICK_LINEAR_RANGE` and the yaw
    rate in :data:`JOYSTICK_YAW_RATE_RANGE`; :data:`JOYSTICK_TURN_IN_PLACE_FRACTION`
    of the draws turn in place, :data:`JOYSTICK_SIDESTEP_FRACTION` step sideways and
    :data:`JOYSTICK_STANDING_FRACTION` stand, and
    every env draws a new command every 3-8 s (:data:`JOYSTICK_RESAMPLE_S`).
    Nothing in it needs a gait clock: it is the task for ``action_mode="robot"``
    and the robot's observation.

    Example:
        >>> task = joystick_task()
        >>> task.yaw_rate_range.tolist(), task.command_resample_s.tolist()
        ([-1.0, 1.0], [3.0, 8.0])
    """
    low, high = JOYSTICK_LINEAR_RANGE
    return make_task(
        low,
        high,
        weight=weight,
        reward_weights={**JOYSTICK_REWARD_WEIGHTS, **(reward_weights or {})},
        **{
            "name": "joystick",
            "yaw_rate_range": JOYSTICK_YAW_RATE_RANGE,
            "turn_in_place_fraction": JOYSTICK_TURN_IN_PLACE_FRACTION,
            "sidestep_fraction": JOYSTICK_SIDESTEP_FRACTION,
            "standing_fraction": JOYSTICK_STANDING_FRACTION,
            "command_resample_s": JOYSTICK_RESAMPLE_S,
            **JOYSTICK_PARAMS,
            **overrides,
        },
    )


GETUP_REWARD_WEIGHTS: dict[str, float] = {"getup": 5.0, "termination": 0.0}
"""Weights the get-up presets set: ``getup`` pays for the way up, and a fall costs nothing of its own (the
episode goes on, and while the robot is down every other positive term pays nothing)."""

GETUP_JOYSTICK_LYING_FRACTION = 0.25
"""Share of :func:`joystick_getup_task`'s episodes that start on the floor; the others fall by themselves
or under the randomization's pushes."""


def getup_task(
    *, weight: float = 1.0, reward_weights: Mapping[str, float] | None = None, **overrides: Any
) -> MicroDuckTask:
    """Stand up from the floor and stay up: upstream's stand-up task.

    Every episode starts with a drop onto the back, the front or a side
    (:data:`LYING_STARTS`) with the joints at random angles, and a fall does
    not end it (``fall_terminates=0``): the task is :func:`standing_task`'s
    balance with :data:`GETUP_REWARD_WEIGHTS` over it. An env given a task that
    lies down adds the limbs' collision boxes
    (:mod:`~waddle.envs.microduck.ground_contact`).

    Example:
        >>> task = getup_task()
        >>> float(task.lying_start_fraction), float(task.fall_terminates)
        (1.0, 0.0)
    """
    return standing_task(
        weight=weight,
        reward_weights={**GETUP_REWARD_WEIGHTS, **(reward_weights or {})},
        **{"name": "getup", "lying_start_fraction": 1.0, "fall_terminates": 0.0, **overrides},
    )


def joystick_getup_task(
    *, weight: float = 1.0, reward_weights: Mapping[str, float] | None = None, **overrides: Any
) -> MicroDuckTask:
    """:func:`joystick_task` in which a fall is a state to get up from: upstream's ``VelStand``.

    :data:`GETUP_JOYSTICK_LYING_FRACTION` of the episodes start on the floor, a
    fall does not end an episode, and ``getup`` pays for the way back up
    (:data:`GETUP_REWARD_WEIGHTS`); the twist is drawn and redrawn as in
    :func:`joystick_task`.
    """
    return joystick_task(
        weight=weight,
        reward_weights={**GETUP_REWARD_WEIGHTS, **(reward_weights or {})},
        **{
            "name": "joystick-getup",
            "lying_start_fraction": GETUP_JOYSTICK_LYING_FRACTION,
            "fall_terminates": 0.0,
            **overrides,
        },
    )


def jump_task(
    *, weight: float = 1.0, reward_weights: Mapping[str, float] | None = None, **overrides: Any
) -> MicroDuckTask:
    """Hop in place under a zero command.

    The hop terms are weighted in the order a policy discovers a hop:
    ``hop_rhythm`` (1) pays for vertical velocity on a 2 Hz beat, starting a
    crouch-and-extend cycle from standing; ``launch`` (30) pays for upward
    velocity with both feet planted, up to take-off speed; ``jump`` (10) pays
    for height gained with both feet in the air, in full from 5 mm, so the
    first real hop is reinforced hard; ``jump_height`` (10) keeps paying for
    airborne height up to 3 cm, so the hop has a reason to grow past the
    first millimetres. The gait terms and the vertical velocity cost are off
    and the pose Gaussian is loose so the robot can crouch and extend;
    ``drift`` (-5) keeps the hop in place where the zero-command tracking
    Gaussian has saturated. The weak MicroDuck servos cannot leave the floor
    at the default action scale (0.35 rad per unit); from a walking policy
    trained at 1.0, PPO learns hops of about 3 cm (docs/microduck.md,
    "Jumping: what the servos allow"). Sample this row more often
    (``weight=3.0``) when mixing it with walking tasks.
    """
    return make_task(
        (0.0, 0.0),
        (0.0, 0.0),
        weight=weight,
        reward_weights={**dict.fromkeys(GAIT_TERMS, 0.0), **JUMP_REWARD_WEIGHTS, **(reward_weights or {})},
        **{"name": "jump", "pose_std": POSE_STD_MOVING, "gait_frequency_hz": HOP_FREQUENCY_HZ, **overrides},
    )


# ---------------------------------------------------------------------------
# Libraries and validation
# ---------------------------------------------------------------------------


def as_task_library(tasks: MicroDuckTask | Sequence[MicroDuckTask] | None = None) -> MicroDuckTask:
    """One task, a sequence of tasks or a stacked library, as a checked ``(num_tasks,)`` library.

    ``None`` gives the default library, ``tracking_task()``. Every row must
    carry one reward weight per registered term and exactly the registered
    parameters, and pass the range checks of :func:`make_task`; the task
    weights must not all be zero.
    """
    if tasks is None:
        tasks = tracking_task()
    if isinstance(tasks, MicroDuckTask):
        if tasks.batch_dims > 1:
            raise ValueError(f"tasks: a library has one batch dimension, got shape {tuple(tasks.shape)}.")
        library = tasks.unsqueeze(0) if tasks.batch_dims == 0 else tasks
    else:
        if isinstance(tasks, (str, bytes)) or not isinstance(tasks, Sequence):
            raise TypeError(f"tasks must be a MicroDuckTask or a sequence of them, got {type(tasks).__name__}.")
        tasks = list(tasks)
        if not tasks:
            raise ValueError("tasks: a library needs at least one task, got an empty sequence.")
        _check_stackable(tasks)
        library = torch.stack(tasks)
    if library.shape[0] == 0:
        raise ValueError("tasks: a library needs at least one task, got an empty stack.")
    library = library.contiguous()
    _check_rows(library)
    if library.weight.sum() <= 0:
        raise ValueError(
            f"tasks: the task weights {library.weight.tolist()} sum to zero; at least one must be positive."
        )
    return library


class TaskTable:
    """The library's tensors, names left out, packed into one ``(num_tasks, width)`` matrix to gather rows from.

    An env gathers one row per env at every reset. ``table[task_id]`` is one
    ``index_select`` of the matrix and a view of its columns per entry, a dict
    of ``(len(task_id), ...)`` tensors with the params under ``"params"``.
    Indexing the library's TensorDict walks every entry through TensorDict's
    Python: 131 us a gather at 256 envs, against 48 us here.

    Example:
        >>> table = TaskTable(as_task_library([standing_task(), tracking_task(0.2)]))
        >>> rows = table[torch.tensor([1, 1, 0])]
        >>> rows["command_high"].shape, rows["params"]["tracking_std"].shape
        (torch.Size([3, 2]), torch.Size([3]))
    """

    def __init__(self, library: MicroDuckTask) -> None:
        table = library.to_tensordict()
        del table["name"]
        leaves = list(table.items(include_nested=True, leaves_only=True))
        # One dtype holds every entry exactly; each is cast back to its own when read.
        dtype = leaves[0][1].dtype
        for _, value in leaves[1:]:
            dtype = torch.promote_types(dtype, value.dtype)
        columns, self._layout, start = [], [], 0
        for key, value in leaves:
            flat = value.reshape(value.shape[0], -1)
            path = key if isinstance(key, tuple) else (key,)
            self._layout.append((path, start, start + flat.shape[1], tuple(value.shape[1:]), value.dtype))
            columns.append(flat.to(dtype))
            start += flat.shape[1]
        self.matrix = torch.cat(columns, dim=1)

    def __len__(self) -> int:
        return self.matrix.shape[0]

    def __getitem__(self, task_id: torch.Tensor) -> dict[str, Any]:
        rows = self.matrix.index_select(0, task_id)
        out: dict[str, Any] = {}
        for path, start, stop, shape, dtype in self._layout:
            # One view op per entry: a reset makes about fifty of them.
            if not shape:
                value = rows.select(1, start)
            elif len(shape) == 1:
                value = rows[:, start:stop]
            else:
                value = rows[:, start:stop].unflatten(1, shape)
            if dtype != rows.dtype:
                value = value.to(dtype)
            target = out
            for part in path[:-1]:
                target = target.setdefault(part, {})
            target[path[-1]] = value
        return out


def _check_stackable(tasks: Sequence[Any]) -> None:
    """Clear errors for tasks that cannot form one library; ``torch.stack`` runs this first."""
    tasks = list(tasks)
    stray = [type(task).__name__ for task in tasks if not isinstance(task, MicroDuckTask)]
    if stray:
        raise TypeError(f"tasks: only MicroDuckTask rows stack into a library, got {stray}.")
    for task in tasks:
        _check_registry(task.reward_weights.shape[-1], set(task.params.keys()), _names(task))
    shapes = {(tuple(task.command_low.shape), tuple(task.warm_start_velocity.shape)) for task in tasks}
    if len(shapes) > 1:
        raise ValueError(f"tasks: command boxes and warm-start ranges must have the same shapes, got {shapes}.")


def _check_registry(num_weights: int, param_keys: set[str], names: list[str]) -> None:
    """The weight vector and params must match the registry as it is now."""
    num_terms = len(REWARD_TERMS)
    if num_weights != num_terms:
        raise ValueError(
            f"task {names} has {num_weights} reward weights but {num_terms} reward terms are registered "
            f"{tuple(REWARD_TERMS)}: it was built before register_reward added terms (or against another "
            "registry). Register every term before building tasks, then build the tasks again."
        )
    missing = sorted(set(REWARD_PARAMS) - param_keys)
    extra = sorted(param_keys - set(REWARD_PARAMS))
    if missing or extra:
        raise ValueError(
            f"task {names} params must have exactly the REWARD_PARAMS keys: missing {missing}, unexpected {extra}. "
            "A task built before register_reward added terms lacks their params; build tasks after registering."
        )


def _check_rows(rows: MicroDuckTask) -> None:
    """Shape, finiteness and range checks on a ``(num_tasks,)`` stack of tasks."""
    _check_registry(rows.reward_weights.shape[-1], set(rows.params.keys()), _names(rows))
    shapes = {"command_low": (2,), "command_high": (2,), "warm_start_velocity": (2,), "weight": ()}
    shapes.update(dict.fromkeys(("warm_start_fraction", "joint_reset_noise_scale", "gait_frequency_hz"), ()))
    shapes.update(gait_frequency_per_mps=(), gait_prior_lift=(), gait_prior_stride_per_mps=())
    shapes.update(yaw_rate_range=(2,), command_resample_s=(2,), turn_in_place_fraction=(), standing_fraction=())
    shapes.update(sidestep_fraction=())
    shapes.update(lying_start_fraction=(), lying_start_side=(), reference_start_fraction=(), fall_terminates=())
    for field, shape in shapes.items():
        got = tuple(getattr(rows, field).shape[1:])
        if got != shape:
            raise ValueError(f"task field {field} must have shape {shape}, got {got}.")
    columns = {field: getattr(rows, field) for field in (*TASK_FIELDS, "command_low", "command_high")}
    columns.update(reward_weights=rows.reward_weights, weight=rows.weight)
    columns.update({f"params[{key!r}]": value for key, value in rows.params.items()})
    for field, value in columns.items():
        _require(rows, torch.isfinite(value), f"{field} must be finite")
    _require(rows, rows.command_low <= rows.command_high, "command_low must be <= command_high in vx and vy")
    speeds = rows.warm_start_velocity
    ordered = (speeds >= 0) & (speeds[:, :1] <= speeds[:, 1:])
    _require(rows, ordered, "warm_start_velocity must be (low, high) with 0 <= low <= high")
    fraction = rows.warm_start_fraction
    _require(rows, (fraction >= 0) & (fraction <= 1), "warm_start_fraction must be in [0, 1]")
    _require(rows, rows.joint_reset_noise_scale >= 0, "joint_reset_noise_scale must be >= 0")
    _require(rows, rows.gait_frequency_hz > 0, "gait_frequency_hz must be > 0")
    _require(rows, rows.gait_frequency_per_mps >= 0, "gait_frequency_per_mps must be >= 0")
    _require(rows, rows.gait_prior_lift >= 0, "gait_prior_lift must be >= 0")
    _require(rows, rows.gait_prior_stride_per_mps >= 0, "gait_prior_stride_per_mps must be >= 0")
    _require(rows, rows.weight >= 0, "weight must be >= 0")
    yaw = rows.yaw_rate_range
    _require(rows, yaw[:, 0] <= yaw[:, 1], "yaw_rate_range must be (low, high) with low <= high")
    resample = rows.command_resample_s
    ordered = (resample >= 0).all(-1) & (resample[:, 0] <= resample[:, 1])
    ordered &= (resample[:, 1] == 0) | (resample[:, 0] > 0)
    _require(rows, ordered, "command_resample_s must be (0, 0) (hold the command) or (low, high) with 0 < low <= high")
    shares = {
        "turn_in_place_fraction": rows.turn_in_place_fraction,
        "sidestep_fraction": rows.sidestep_fraction,
        "standing_fraction": rows.standing_fraction,
    }
    for field, share in shares.items():
        _require(rows, (share >= 0) & (share <= 1), f"{field} must be in [0, 1]")
    _require(rows, sum(shares.values()) <= 1, f"{' + '.join(shares)} must be <= 1")
    lying = rows.lying_start_fraction
    _require(rows, (lying >= 0) & (lying <= 1), "lying_start_fraction must be in [0, 1]")
    reference = rows.reference_start_fraction
    _require(rows, (reference >= 0) & (reference <= 1), "reference_start_fraction must be in [0, 1]")
    side = rows.lying_start_side
    named = (side == -1) | ((side >= 0) & (side < len(LYING_STARTS)) & (side == side.round()))
    _require(rows, named, f"lying_start_side must be -1 (any) or the index of one of {LYING_STARTS}")
    ends = rows.fall_terminates
    _require(rows, (ends == 0) | (ends == 1), "fall_terminates must be 1 (a fall ends the episode) or 0")
    turns = (rows.turn_in_place_fraction == 0) | (yaw.abs().amax(-1) > 0)
    _require(rows, turns, "turn_in_place_fraction > 0 needs a yaw_rate_range to turn in")
    lateral = torch.maximum(rows.command_low[:, 1].abs(), rows.command_high[:, 1].abs())
    sidesteps = (rows.sidestep_fraction == 0) | (lateral > 0)
    _require(rows, sidesteps, "sidestep_fraction > 0 needs a command box with a lateral (vy) extent to step in")
    for key in ("tracking_relative_std", "progress_off_axis_std"):  # 0 turns each off
        _require(rows, rows.params[key] >= 0, f"params[{key!r}] must be >= 0 (0: off)")
    bad_names = [name for name in _names(rows) if not isinstance(name, str) or not name]
    if bad_names:
        raise ValueError(f"every task needs a non-empty string name, got {bad_names}.")


def _require(rows: MicroDuckTask, ok: torch.Tensor, message: str) -> None:
    """Raise naming the tasks whose rows fail ``ok`` (reduced over all but the task dimension)."""
    ok = ok.reshape(ok.shape[0], -1).all(-1)
    if not bool(ok.all()):
        names = _names(rows)
        failing = [names[i] for i in (~ok).nonzero().flatten().tolist()]
        raise ValueError(f"task {failing}: {message}.")


def _names(tasks: MicroDuckTask) -> list[str]:
    name = tasks.name
    return [name] if isinstance(name, str) else list(name)


def _as_float(value: Any, shape: tuple[int, ...], field: str, name: str) -> torch.Tensor:
    try:
        tensor = torch.as_tensor(value, dtype=torch.float32)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ValueError(f"make_task({name!r}): {field} must be a number or numbers, got {value!r}.") from error
    if tuple(tensor.shape) != shape:
        kind = "a number" if shape == () else f"{shape[0]} numbers"
        raise ValueError(f"make_task({name!r}): {field} must be {kind}, got {value!r}.")
    return tensor.clone()


def _stack_checked_torch_function(cls, func, types, args=(), kwargs=None):
    """``torch.stack`` on tasks explains registry and shape mismatches before stacking."""
    if func is torch.stack:
        tensors = args[0] if args else (kwargs or {}).get("tensors", ())
        _check_stackable(tensors)
    return _TENSORCLASS_TORCH_FUNCTION(func, types, args, kwargs)


_TENSORCLASS_TORCH_FUNCTION = MicroDuckTask.__torch_function__
MicroDuckTask.__torch_function__ = classmethod(_stack_checked_torch_function)
