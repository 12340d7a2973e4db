"""MicroDuck reward terms: small pure functions in one ordered registry.

A term reads the step's features and the episode's task parameters and
returns one value per env::

    def term(features: Mapping[str, Tensor], params: Mapping[str, Tensor]) -> Tensor  # shape (N,)

The env passes plain dicts of tensors (TensorDicts work the same way, and the
tests use them); ``features`` holds, for ``N`` envs, the entries

========================  ==========  ==========================================
key                       shape       meaning
========================  ==========  ==========================================
``body_velocity``         ``(N, 3)``  base linear velocity in the body frame
``angular_velocity``      ``(N, 3)``  base angular velocity in the body frame
``upright``               ``(N,)``    cosine of the trunk tilt
``base_height``           ``(N,)``    base height above the floor
``standing_height``       ``(N,)``    base height of the standing keyframe
``joint_error``           ``(N, 14)`` joint positions minus the standing pose
``joint_velocity``        ``(N, 14)`` joint velocities
``action``                ``(N, 14)`` normalized action of this step
``target_past_range``     ``(N, 14)`` radians by which the servo target this action asks for lies
                                      past its joint's range (0 within it; optional)
``previous_action``       ``(N, 14)`` normalized action of the previous step
``contacts``              ``(N, 2)``  bool, left and right foot on the floor
``foot_heights``          ``(N, 2)``  left and right foot height
``touchdown_air_time``    ``(N, 2)``  air time of a foot that landed this step, else 0
``gait_phase``            ``(N,)``    gait clock phase in radians
``heading_error``         ``(N,)``    trunk yaw minus the commanded heading (its yaw at reset, or at
                                      the last new command, plus the yaw-rate command integrated
                                      since), wrapped to ``[-pi, pi)``
``command``               ``(N, 2)``  planar velocity command ``(vx, vy)``
``yaw_rate_command``      ``(N,)``    yaw-rate command, rad/s (optional: zero when absent)
``tracked_velocity``      ``(N, 2)``  planar velocity the command is tracked against: the body
                                      velocity's ``(vx, vy)``, or its average over the task's
                                      tracking window (``tracking_window_cycles``)
``tracked_yaw_rate``      ``(N,)``    yaw rate the yaw command is tracked against over a stride: the
                                      heading's change over the tracking window per second, or the
                                      body's instantaneous yaw rate (optional)
``fallen``                ``(N,)``    bool, the trunk fell this step
========================  ==========  ==========================================

and ``params`` holds one ``(N,)`` entry per key of :data:`REWARD_PARAMS`.

Several built-in terms share quantities derived from those entries (the
speed along the command, the upright gate, the clock's swing foot). The env
computes them once per step with :func:`derived_features` and adds them to
``features``; the shared helpers read them there and compute them when they
are missing, so a term also works on the entries above alone.

:data:`REWARD_TERMS` is ordered: its order is the order of every task's
``reward_weights`` vector and of the columns of :func:`evaluate_terms`. The
reward of a step is the row sum of :func:`weighted_terms`, and each column is
that term's share, ready to be logged by name.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from tensordict import TensorDictBase

Features = Mapping[str, torch.Tensor] | TensorDictBase
TermFn = Callable[[Features, Features], torch.Tensor]

COMMAND_THRESHOLD = 0.01
"""Planar command speed (m/s) at or under which a task counts as standing."""

YAW_RATE_THRESHOLD = 0.05
"""Yaw-rate command (rad/s) at or under which a twist counts as not turning."""

GAIT_MIN_UPRIGHT = 0.35
"""Tilt cosine under which the contact and hop terms pay nothing (about 70 degrees)."""

GAIT_TERMS: tuple[str, ...] = ("air_time", "swing_height", "phase_contact", "double_support")
"""Terms that shape stepping; the standing and jump presets turn them off."""

RESERVED_PARAM_NAMES = frozenset(
    {
        "name",
        "weight",
        "reward_weights",
        "params",
        "command_low",
        "command_high",
        "warm_start_velocity",
        "warm_start_fraction",
        "joint_reset_noise_scale",
        "gait_frequency_hz",
        "gait_frequency_per_mps",
        "gait_prior_lift",
        "gait_prior_stride_per_mps",
        "yaw_rate_range",
        "turn_in_place_fraction",
        "sidestep_fraction",
        "standing_fraction",
        "command_resample_s",
        "lying_start_fraction",
        "lying_start_side",
        "reference_start_fraction",
        "fall_terminates",
    }
)
"""Names a task already uses for its own fields; ``make_task`` overrides share one namespace."""


@dataclass(frozen=True)
class RewardTerm:
    """One registered term: its function, default weight and time scaling."""

    fn: TermFn
    """``(features, params) -> Tensor`` of shape ``(N,)``."""
    weight: float
    """Weight of the term in every preset unless a task's ``reward_weights`` say otherwise."""
    per_second: bool
    """If True the term is a rate and is multiplied by the control period."""
    params: tuple[str, ...] = ()
    """Names of the :data:`REWARD_PARAMS` entries this term registered."""


REWARD_TERMS: dict[str, RewardTerm] = {}
"""Registered terms by name, in weight-vector order."""

REWARD_PARAMS: dict[str, float] = {}
"""Default value of every term parameter a task carries."""


def register_reward(
    name: str, *, weight: float = 0.0, per_second: bool = True, **params: float
) -> Callable[[TermFn], TermFn]:
    """Decorator adding a reward term that every task can weight.

    Args:
        name: term name, unique; it names the term's column in logs and diagnostics.
        weight: default weight in every preset. ``0.0`` (the default) leaves
            existing presets unchanged until their ``reward_weights`` name it.
        per_second: True for a rate, multiplied by the control period; False
            for a one-off amount such as the fall penalty.
        **params: defaults of the parameters the term reads from ``params``.
            A parameter name belongs to one term only.

    Tasks carry one weight per registered term, so register terms before
    building tasks: a task built earlier is refused by the env.

    Example:
        >>> @register_reward("still_head", still_head_std=1.0)
        ... def still_head(features, params):
        ...     head = features["joint_velocity"][..., 5:9].square().sum(-1)
        ...     return torch.exp(-head / params["still_head_std"].square())
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"register_reward: name must be a non-empty string, got {name!r}.")
    _check_unregistered(name)
    if not isinstance(per_second, bool):
        raise ValueError(f"register_reward({name!r}): per_second must be True or False, got {per_second!r}.")
    if not _is_finite_number(weight):
        raise ValueError(f"register_reward({name!r}): weight must be a finite number, got {weight!r}.")
    for key, value in params.items():
        if key in RESERVED_PARAM_NAMES:
            raise ValueError(
                f"register_reward({name!r}): param {key!r} is a task field name; "
                f"reserved names: {sorted(RESERVED_PARAM_NAMES)}."
            )
        if key in REWARD_PARAMS:
            raise ValueError(
                f"register_reward({name!r}): param {key!r} is already registered by term "
                f"{_param_owner(key)!r}; a parameter name may be registered by one term only."
            )
        if not _is_finite_number(value):
            raise ValueError(f"register_reward({name!r}): param {key!r} must be a finite number, got {value!r}.")

    def decorator(fn: TermFn) -> TermFn:
        if not callable(fn):
            raise ValueError(f"register_reward({name!r}) decorates a function (features, params) -> Tensor.")
        _check_unregistered(name)
        REWARD_TERMS[name] = RewardTerm(fn, float(weight), per_second, tuple(params))
        REWARD_PARAMS.update({key: float(value) for key, value in params.items()})
        return fn

    return decorator


def evaluate_terms(features: Features, params: Features) -> torch.Tensor:
    """Unweighted value of every registered term, ``(N, num_terms)`` in registry order.

    A term that returns NaN or inf for an env whose features are all finite
    raises a ``ValueError`` naming the term and the envs. Envs with a
    non-finite feature (a diverged physics state, whose episode the env ends)
    are left as they are.
    """
    batch = tuple(features["upright"].shape)
    dtype = features["body_velocity"].dtype
    columns = []
    for name, term in REWARD_TERMS.items():
        value = term.fn(features, params)
        if tuple(value.shape) != batch:
            raise ValueError(
                f"reward term {name!r} returned shape {tuple(value.shape)}; "
                f"terms return one value per env, shape {batch}."
            )
        columns.append(value.to(dtype))
    values = torch.stack(columns, dim=-1)
    bad = ~torch.isfinite(values.detach())
    if bad.any():  # one host sync per call; the rest only runs on a broken term
        if isinstance(features, TensorDictBase):
            leaves = features.values(include_nested=True, leaves_only=True)
        else:
            leaves = features.values()
        finite_state = torch.stack(
            [torch.isfinite(v.detach()).reshape(batch[0], -1).all(-1) for v in leaves if v.is_floating_point()],
            dim=-1,
        ).all(-1)
        bad &= finite_state.unsqueeze(-1)
        broken = {name: bad[:, i].nonzero().flatten().tolist() for i, name in enumerate(REWARD_TERMS)}
        broken = {name: envs for name, envs in broken.items() if envs}
        if broken:
            raise ValueError(
                "reward terms must be finite for a finite state; "
                + "; ".join(
                    f"term {name!r} returned NaN or inf for envs {envs[:20]}{' ...' if len(envs) > 20 else ''}"
                    for name, envs in broken.items()
                )
                + "."
            )
    return values


def weighted_terms(term_values: torch.Tensor, weights: torch.Tensor, control_dt: float) -> torch.Tensor:
    """Each term's share of the reward, ``(N, num_terms)``; the row sum is the reward.

    Args:
        term_values: output of :func:`evaluate_terms`, ``(N, num_terms)``.
        weights: one weight row per env, ``(N, num_terms)`` (or one shared
            ``(num_terms,)`` row), in registry order.
        control_dt: control period in seconds; per-second terms are
            multiplied by it.

    A zero weight yields exactly zero, even for a non-finite term value, so an
    all-zero row gives zero reward.
    """
    num_terms = len(REWARD_TERMS)
    if term_values.shape[-1:] != (num_terms,):
        raise ValueError(
            f"term_values must end with one column per registered term ({num_terms}), "
            f"got shape {tuple(term_values.shape)}."
        )
    if weights.shape[-1:] != (num_terms,):
        raise ValueError(
            f"weights must have one entry per registered term ({num_terms}: {tuple(REWARD_TERMS)}), "
            f"got shape {tuple(weights.shape)}; register terms before building tasks."
        )
    if not _is_finite_number(control_dt) or float(control_dt) <= 0:
        raise ValueError(f"control_dt must be a finite number of seconds > 0, got {control_dt!r}.")
    scale = _time_scale(float(control_dt), term_values.dtype, term_values.device)
    weights = weights.to(term_values.dtype)
    return torch.where(weights != 0, term_values * weights * scale, torch.zeros_like(term_values))


_TIME_SCALES: dict[tuple, torch.Tensor] = {}


def _time_scale(control_dt: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Per-term factor of :func:`weighted_terms` (``control_dt`` for rates, else 1), built once per registry."""
    per_second = tuple(term.per_second for term in REWARD_TERMS.values())
    key = (per_second, control_dt, dtype, device)
    scale = _TIME_SCALES.get(key)
    if scale is None:
        scale = torch.tensor([control_dt if rate else 1.0 for rate in per_second], dtype=dtype, device=device)
        _TIME_SCALES[key] = scale
    return scale


def default_weights() -> dict[str, float]:
    """Registered default weight of every term, in registry order."""
    return {name: term.weight for name, term in REWARD_TERMS.items()}


def check_weights(weights: Mapping[str, object], owner: str = "reward_weights") -> None:
    """Raise a ValueError, naming ``owner``, unless ``weights`` maps registered terms to finite numbers.

    Example:
        >>> check_weights({"tracking": 2.0})
        >>> check_weights({"pose": float("nan")})
        Traceback (most recent call last):
        ...
        ValueError: reward_weights['pose'] must be a finite number, got nan.
    """
    unknown = sorted(set(weights) - set(REWARD_TERMS))
    if unknown:
        raise ValueError(f"{owner} names unregistered terms {unknown}; the terms: {', '.join(REWARD_TERMS)}.")
    for name, value in weights.items():
        if not _is_finite_number(value):
            raise ValueError(f"{owner}[{name!r}] must be a finite number, got {value!r}.")


def _check_unregistered(name: str) -> None:
    if name in REWARD_TERMS:
        raise ValueError(
            f"register_reward: a term named {name!r} is already registered; registered terms: {tuple(REWARD_TERMS)}."
        )


def _param_owner(key: str) -> str | None:
    return next((name for name, term in REWARD_TERMS.items() if key in term.params), None)


def _is_finite_number(value: object) -> bool:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype == torch.bool:
        value = value.item()
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


# ---------------------------------------------------------------------------
# Shared pieces of the built-in terms
# ---------------------------------------------------------------------------


def _command_axis(command: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Unit vector along the command (zero when standing), the commanded speed, and the moving mask."""
    speed = torch.linalg.vector_norm(command, dim=-1)
    moving = speed > COMMAND_THRESHOLD
    axis = command / speed.clamp_min(1e-8).unsqueeze(-1)
    return torch.where(moving.unsqueeze(-1), axis, torch.zeros_like(axis)), speed, moving


def yaw_rate_command(features: Features) -> torch.Tensor:
    """``features["yaw_rate_command"]`` (rad/s), or zeros when the features lack it."""
    value = features.get("yaw_rate_command", None)
    return torch.zeros_like(features["upright"]) if value is None else value


def twist_active(features: Features) -> torch.Tensor:
    """True where the command asks the robot to move: a planar speed above :data:`COMMAND_THRESHOLD`
    or a yaw rate above :data:`YAW_RATE_THRESHOLD`."""
    planar = torch.linalg.vector_norm(features["command"], dim=-1) > COMMAND_THRESHOLD
    return planar | (yaw_rate_command(features).abs() > YAW_RATE_THRESHOLD)


def twist_progress(features: Features) -> torch.Tensor:
    """How much of its twist an env does, in [0, 1]: the speed along the planar command over its speed,
    or, with no planar command, the yaw rate over the commanded yaw rate (0 under a standing command)."""
    yaw_command = yaw_rate_command(features)
    turning = features["angular_velocity"][..., 2] / torch.where(yaw_command == 0, 1.0, yaw_command)
    turning = torch.where(yaw_command.abs() > YAW_RATE_THRESHOLD, turning, torch.zeros_like(turning))
    planar = _derived(features, "moving")
    return torch.where(planar, _speed_ratio(features), turning).clamp(0.0, 1.0)


def tracked_velocity(features: Features) -> torch.Tensor:
    """``features["tracked_velocity"]``, or the body velocity's planar part when the features lack it."""
    value = features.get("tracked_velocity", None)
    return features["body_velocity"][..., :2] if value is None else value


def derived_features(features: Features) -> dict[str, torch.Tensor]:
    """The quantities several built-in terms share, computed once from ``features``.

    ========================  ==========  ==========================================
    key                       shape       meaning
    ========================  ==========  ==========================================
    ``command_axis``          ``(N, 2)``  unit vector along the command, zero when standing
    ``moving``                ``(N,)``    bool, the command is above :data:`COMMAND_THRESHOLD`
    ``speed_ratio``           ``(N,)``    velocity along the command over its speed, unclipped; 0 when standing
    ``upright_gate``          ``(N,)``    1 while the trunk is upright enough to step or hop, else 0
    ``left_swings``           ``(N,)``    bool, the gait clock puts the left foot in swing
    ========================  ==========  ==========================================

    The env adds them to the features it passes to the terms. Shared helpers
    read them and compute them when they are missing.
    """
    axis, speed, moving = _command_axis(features["command"])
    along = (features["body_velocity"][..., :2] * axis).sum(-1)
    ratio = along / speed.clamp_min(1e-8)
    upright = features["upright"]
    direction = torch.where(features["command"][..., 0] < 0, -1.0, 1.0)
    return {
        "command_axis": axis,
        "moving": moving,
        "speed_ratio": torch.where(moving, ratio, torch.zeros_like(ratio)),
        "upright_gate": (upright >= GAIT_MIN_UPRIGHT).to(upright.dtype),
        "left_swings": direction * torch.sin(features["gait_phase"]) > 0,
    }


def _derived(features: Features, key: str) -> torch.Tensor:
    """``features[key]`` if the env derived it this step, else computed from the base entries."""
    value = features.get(key, None)
    return derived_features(features)[key] if value is None else value


def _split_along_command(vector: torch.Tensor, features: Features) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Planar ``vector`` along the command, squared across it, and the moving mask.

    A standing command has no axis: along is zero and all of ``vector`` is across.
    """
    axis, moving = _derived(features, "command_axis"), _derived(features, "moving")
    along = (vector * axis).sum(-1)
    across = vector[..., 1] * axis[..., 0] - vector[..., 0] * axis[..., 1]
    return along, torch.where(moving, across.square(), vector.square().sum(-1)), moving


def _speed_ratio(features: Features) -> torch.Tensor:
    """Velocity along the command over the commanded speed, unclipped; zero when standing."""
    return _derived(features, "speed_ratio")


def _upright_gate(features: Features) -> torch.Tensor:
    """1 while the trunk is upright enough to step or hop, else 0."""
    return _derived(features, "upright_gate")


def _stepping_gate(features: Features, params: Features) -> torch.Tensor:
    """Gait credit: ``floor + (1 - floor) * progress`` (progress clipped to [0, 1]), while upright.

    Stepping in place keeps ``gait_progress_floor`` of the credit, so a policy
    can leave the standing optimum; the rest needs motion along the command.
    """
    floor = params["gait_progress_floor"]
    progress = _speed_ratio(features).clamp(0.0, 1.0)
    return (floor + (1.0 - floor) * progress) * _upright_gate(features)


def _left_swings(features: Features) -> torch.Tensor:
    """True where the gait clock puts the left foot in swing (mirrored for backward commands)."""
    return _derived(features, "left_swings")


def _tilt_squared(upright: torch.Tensor) -> torch.Tensor:
    """Squared tilt angle from its cosine, with a finite gradient at zero tilt.

    ``acos`` has an infinite slope at 1, so near upright the series
    ``acos(c)**2 = 2 (1 - c) + O((1 - c)**2)`` is used instead.
    """
    cosine = upright.clamp(-1.0, 1.0)
    near = cosine > 1.0 - 1e-4
    safe = torch.where(near, torch.zeros_like(cosine), cosine)
    return torch.where(near, 2.0 * (1.0 - cosine), torch.acos(safe).square())


# ---------------------------------------------------------------------------
# Built-in terms, in weight-vector order
# ---------------------------------------------------------------------------


@register_reward(
    "tracking",
    weight=2.0,
    tracking_std=0.1,
    tracking_relative_std=0.0,
    tracking_off_axis_std=0.05,
    tracking_window_cycles=0.0,
)
def tracking(features: Features, params: Features) -> torch.Tensor:
    """Gaussian of the planar velocity error, ``tracking_off_axis_std`` across the command (isotropic when standing).

    Along the command the width is ``max(tracking_std, tracking_relative_std * |command|)``:
    a relative width asks the same fraction of every commanded speed, so 0.135 m/s
    under a 0.1 command costs what 0.27 costs under 0.2.

    The velocity is ``tracked_velocity``: the env averages the body velocity over
    ``tracking_window_cycles`` gait cycles (0: the instantaneous velocity). The
    other terms read the instantaneous velocity: ``progress`` and the gait gate
    credit a step that surges forward at once, which is how PPO finds walking.
    """
    error = tracked_velocity(features) - features["command"]
    along, across_sq, moving = _split_along_command(error, features)
    speed = torch.linalg.vector_norm(features["command"], dim=-1)
    along_std = torch.maximum(params["tracking_std"], params["tracking_relative_std"] * speed)
    across_std = torch.where(moving, params["tracking_off_axis_std"], params["tracking_std"])
    return torch.exp(-along.square() / along_std.square() - across_sq / across_std.square())


@register_reward("yaw_rate", weight=1.0, yaw_rate_std=0.5**0.5)
def yaw_rate(features: Features, params: Features) -> torch.Tensor:
    """Gaussian of the yaw rate's error from the ``yaw_rate_command`` (zero when the features lack it)."""
    error = features["angular_velocity"][..., 2] - yaw_rate_command(features)
    return torch.exp(-error.square() / params["yaw_rate_std"].square())


@register_reward("upright", weight=2.0, upright_std=0.05**0.5)
def upright(features: Features, params: Features) -> torch.Tensor:
    """Gaussian of the trunk tilt angle."""
    return torch.exp(-_tilt_squared(features["upright"]) / params["upright_std"].square())


@register_reward("pose", weight=1.0, pose_std=0.5)
def pose(features: Features, params: Features) -> torch.Tensor:
    """Gaussian of the mean squared joint error from the standing pose."""
    return torch.exp(-features["joint_error"].square().mean(-1) / params["pose_std"].square())


@register_reward("progress", weight=2.0, progress_overspeed=0.0, progress_off_axis_std=0.0)
def progress(features: Features, params: Features) -> torch.Tensor:
    """Linear in the velocity along the command, as a fraction of it in [-1, 1]; zero when standing.

    Past the command, ``progress_overspeed`` times the excess fraction is taken
    back (1: a tent peaking at the command), so walking faster than asked
    costs more than the tracking kernel's flat tail does.

    With ``progress_off_axis_std > 0`` the credit is multiplied by a Gaussian of
    the ``tracked_velocity`` across the command, of that width: a robot that
    walks diagonally makes no progress. The gate reads the tracked (stride-averaged)
    velocity, so the sway inside a stride costs nothing; the fraction itself reads
    the instantaneous velocity.
    """
    ratio = _speed_ratio(features)
    excess = (ratio - 1.0).clamp_min(0.0)
    credit = (ratio.clamp(-1.0, 1.0) - params["progress_overspeed"] * excess).clamp(-1.0, 1.0)
    std = params["progress_off_axis_std"]
    _, across_sq, _ = _split_along_command(tracked_velocity(features), features)  # standing: credit is 0
    gate = torch.where(std > 0, torch.exp(-across_sq / std.clamp_min(1e-8).square()), torch.ones_like(std))
    return credit * gate


@register_reward("air_time", weight=3.0, air_time_min=0.125, air_time_max=0.3, gait_progress_floor=0.5)
def air_time(features: Features, params: Features) -> torch.Tensor:
    """Air time of each landing foot inside ``[air_time_min, air_time_max]``, counted from the minimum."""
    low = params["air_time_min"].unsqueeze(-1)
    high = params["air_time_max"].unsqueeze(-1)
    credit = torch.clamp(features["touchdown_air_time"], low, high) - low
    return credit.sum(-1) * _stepping_gate(features, params)


@register_reward("step_air_time", weight=0.0)
def step_air_time(features: Features, params: Features) -> torch.Tensor:
    """Air time of each landing foot inside ``[air_time_min, air_time_max]``, counted from the minimum,
    while the twist command asks to move (walk or turn), scaled by how much of it the robot does.

    The clock-free twin of ``air_time``: it reads no gait phase, so a policy that sees none (the robot's
    observation) is paid for what it can tell it did. The credit is ``floor + (1 - floor) * progress``
    (``gait_progress_floor``) of the landing, progress being the speed along the planar command over its
    speed or, turning in place, the yaw rate over the commanded one, clipped to [0, 1]: an air-time reward
    paid whenever a command exists lets a policy settle on stepping in place (microduck_rl issue 46). A
    standing command pays nothing.
    """
    low = params["air_time_min"].unsqueeze(-1)
    high = params["air_time_max"].unsqueeze(-1)
    credit = (torch.clamp(features["touchdown_air_time"], low, high) - low).sum(-1)
    return credit * _twist_gate(features, params)


def _twist_gate(features: Features, params: Features) -> torch.Tensor:
    """``floor + (1 - floor) * twist_progress`` while the twist asks to move and the trunk is upright, else 0."""
    floor = params["gait_progress_floor"]
    active = twist_active(features).to(floor.dtype)
    return (floor + (1.0 - floor) * twist_progress(features)) * active * _upright_gate(features)


@register_reward("single_support", weight=0.0)
def single_support(features: Features, params: Features) -> torch.Tensor:
    """1 with exactly one foot on the floor, while the twist asks to move (scaled as ``step_air_time``).

    The clock-free twin of ``phase_contact``: it pays for a step whichever foot swings, so a policy that
    sees no clock can earn it."""
    one = features["contacts"].sum(-1) == 1
    return one.to(features["upright"].dtype) * _twist_gate(features, params)


@register_reward("swing_lift", weight=0.0)
def swing_lift(features: Features, params: Features) -> torch.Tensor:
    """Height of the foot in the air over ``swing_target_height`` (capped at one) while the other foot
    stands, and the twist asks to move (scaled as ``step_air_time``): the clock-free twin of ``swing_height``."""
    contacts = features["contacts"]
    one = (contacts.sum(-1) == 1).to(features["upright"].dtype)
    lift = (features["foot_heights"] / params["swing_target_height"].unsqueeze(-1)).clamp(0.0, 1.0)
    airborne = (lift * (~contacts).to(lift.dtype)).sum(-1)
    return airborne * one * _twist_gate(features, params)


@register_reward("swing_height", weight=2.0, swing_target_height=0.02)
def swing_height(features: Features, params: Features) -> torch.Tensor:
    """Lift of the clock's swing foot as a fraction of ``swing_target_height``, capped at one."""
    left = _left_swings(features)
    swing = torch.stack((left, ~left), dim=-1)
    lift = (features["foot_heights"] / params["swing_target_height"].unsqueeze(-1)).clamp(0.0, 1.0)
    return (lift * swing).sum(-1) * _stepping_gate(features, params)


@register_reward("phase_contact", weight=3.0)
def phase_contact(features: Features, params: Features) -> torch.Tensor:
    """1 on single support on the clock's stance foot, with the swing foot in the air."""
    left = _left_swings(features)
    expected = torch.stack((~left, left), dim=-1)
    in_phase = (features["contacts"] == expected).all(-1)
    return in_phase.to(features["upright"].dtype) * _stepping_gate(features, params)


@register_reward("double_support", weight=-1.0)
def double_support(features: Features, params: Features) -> torch.Tensor:
    """1 with both feet on the floor (a penalty under its negative weight)."""
    planted = features["contacts"].all(-1)
    return planted.to(features["upright"].dtype) * _stepping_gate(features, params)


@register_reward("ang_vel_xy", weight=-0.05)
def ang_vel_xy(features: Features, params: Features) -> torch.Tensor:
    """Squared roll and pitch rates."""
    return features["angular_velocity"][..., :2].square().sum(-1)


@register_reward("lin_vel_z", weight=-2.0)
def lin_vel_z(features: Features, params: Features) -> torch.Tensor:
    """Squared vertical base velocity."""
    return features["body_velocity"][..., 2].square()


@register_reward("action_rate", weight=-0.1)
def action_rate(features: Features, params: Features) -> torch.Tensor:
    """Squared change of the action since the previous step."""
    return (features["action"] - features["previous_action"]).square().sum(-1)


@register_reward("joint_velocity", weight=-0.001)
def joint_velocity(features: Features, params: Features) -> torch.Tensor:
    """Squared joint velocities."""
    return features["joint_velocity"].square().sum(-1)


@register_reward("drift", weight=0.0, drift_speed_scale=0.3)
def drift(features: Features, params: Features) -> torch.Tensor:
    """Planar speed over ``drift_speed_scale``, capped at one: linear where tracking saturates."""
    speed = torch.linalg.vector_norm(features["body_velocity"][..., :2], dim=-1)
    return (speed / params["drift_speed_scale"]).clamp(max=1.0)


@register_reward("hop_rhythm", weight=0.0, hop_velocity_amplitude=0.1)
def hop_rhythm(features: Features, params: Features) -> torch.Tensor:
    """Vertical velocity on the beat (up while cos(phase) > 0) over ``hop_velocity_amplitude``, in [-1, 1]."""
    beat = torch.sign(torch.cos(features["gait_phase"]))
    fraction = features["body_velocity"][..., 2] * beat / params["hop_velocity_amplitude"]
    return fraction.clamp(-1.0, 1.0) * _upright_gate(features)


@register_reward("launch", weight=0.0, launch_velocity_scale=0.5)
def launch(features: Features, params: Features) -> torch.Tensor:
    """Upward velocity with both feet planted over ``launch_velocity_scale``, in [0, 1]: the take-off."""
    planted = features["contacts"].all(-1).to(features["upright"].dtype)
    upward = (features["body_velocity"][..., 2] / params["launch_velocity_scale"]).clamp(0.0, 1.0)
    return upward * planted * _upright_gate(features)


def _airborne_rise(features: Features, scale: torch.Tensor) -> torch.Tensor:
    """Height above standing over ``scale``, in [0, 1], while both feet are off the floor and upright."""
    rise = ((features["base_height"] - features["standing_height"]) / scale).clamp(0.0, 1.0)
    airborne = (~features["contacts"].any(-1)).to(rise.dtype)
    return rise * airborne * _upright_gate(features)


@register_reward("jump", weight=0.0, jump_target_height=0.005)
def jump(features: Features, params: Features) -> torch.Tensor:
    """Height above standing with both feet off the floor, full from ``jump_target_height`` on."""
    return _airborne_rise(features, params["jump_target_height"])


@register_reward("jump_height", weight=0.0, jump_height_scale=0.03)
def jump_height(features: Features, params: Features) -> torch.Tensor:
    """Height above standing with both feet off the floor over ``jump_height_scale``, in [0, 1].

    ``jump`` saturates at a few millimetres so the first hop is paid in full;
    this term keeps paying up to centimetres, so the hop has a reason to grow.
    """
    return _airborne_rise(features, params["jump_height_scale"])


@register_reward("heading_hold", weight=0.0, heading_hold_std=0.5)
def heading_hold(features: Features, params: Features) -> torch.Tensor:
    """Gaussian of the heading error: the trunk keeps the heading its command gives it (the heading at
    reset, turned by the yaw-rate command since)."""
    return torch.exp(-features["heading_error"].square() / params["heading_hold_std"].square())


@register_reward("termination", weight=-4.0, per_second=False)
def termination(features: Features, params: Features) -> torch.Tensor:
    """1 on the step the trunk falls (a one-off penalty, not scaled by the control period)."""
    return features["fallen"].to(features["upright"].dtype)


@register_reward("stride_yaw_rate", weight=0.0, stride_yaw_rate_std=0.15)
def stride_yaw_rate(features: Features, params: Features) -> torch.Tensor:
    """Gaussian of the ``tracked_yaw_rate``'s error from the ``yaw_rate_command``.

    The heading's change over a stride leaves out the twist every step puts
    into the trunk, so the kernel can be narrow enough to see a slow, steady
    turn away from the command: the drift off a straight line.
    """
    value = features.get("tracked_yaw_rate", None)
    measured = features["angular_velocity"][..., 2] if value is None else value
    error = measured - yaw_rate_command(features)
    return torch.exp(-error.square() / params["stride_yaw_rate_std"].square())


@register_reward("getup", weight=0.0, getup_lying_height=0.05)
def getup(features: Features, params: Features) -> torch.Tensor:
    """How far up the robot is: the squared upright cosine (0 on a side, the back or the front) times the
    trunk's height as a fraction of the way from ``getup_lying_height`` to standing.

    0.05 m is a little above the trunk of a robot folded upright on its legs (0.047 m), so the way up from
    there pays from its first centimetre, while a robot lying on its back or a side (upright cosine near 0)
    earns next to nothing; standing earns 1.
    """
    upright = features["upright"].clamp(0.0, 1.0)
    lying = params["getup_lying_height"]
    height = (features["base_height"] - lying) / (features["standing_height"] - lying)
    return upright.square() * height.clamp(0.0, 1.0)


@register_reward("target_past_range", weight=0.0)
def target_past_range(features: Features, params: Features) -> torch.Tensor:
    """Radians, summed over the joints, by which the servo targets lie past the joints' ranges.

    A servo stops at its range whatever it is told, so a target past it moves nothing more; what it does
    is keep the servo pressing on its stop. Isaac Lab's velocity tasks cost the same thing on the joint
    positions (``joint_pos_limits``); here it is the target, the one thing the policy sets.
    """
    value = features.get("target_past_range", None)
    return features["upright"].new_zeros(features["upright"].shape) if value is None else value.sum(-1)
