"""Per-env domain randomization, latency and sensor noise for :class:`MicroDuckEnv`.

:class:`MicroDuckRandomization` holds ranges; each env draws its own values
from them at every reset (from the env's generator, so a seed fixes them) and
keeps them for the episode. Three kinds of quantities are drawn:

* model parameters (friction, masses, centres of mass, servo constants):
  :class:`ModelFields` turns the drawn scales and offsets into per-env copies
  of MuJoCo model fields, which the physics backend simulates per env;
* what the env does around the physics: the encoder bias (on the servo
  targets and on the encoders), the IMU mounting tilt, the action and IMU
  delays (:class:`DelayLine`) and pushes;
* uniform sensor noise, drawn afresh at every observation.

Two presets are named in :data:`PRESETS`: ``"none"`` (nothing drawn, today's
idealized robot) and ``"upstream"`` (the ranges of the microduck_rl training,
see ``docs/microduck.md``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import mujoco
import numpy as np
import torch

from waddle.envs.microduck import constants

Range = tuple[float, float]

SCALE_FIELDS: tuple[str, ...] = ("friction", "mass", "armature", "frictionloss", "damping", "voltage")
"""Ranges that multiply a model value: their bounds must be >= 0 (``mass`` > 0)."""

OFFSET_FIELDS: tuple[str, ...] = ("trunk_com", "head_com", "joint_offset", "push_velocity")
"""Ranges added to a nominal value (metres, radians or m/s): any sign."""

DELAY_FIELDS: tuple[str, ...] = ("action_delay", "imu_delay")
"""Integer ranges of control steps, drawn per env inclusive of both bounds."""

NOISE_FIELDS: tuple[str, ...] = ("gravity_noise", "gyro_noise", "joint_position_noise", "joint_velocity_noise")
"""Half-widths of uniform noise added to the sensor observation."""

MODEL_FIELDS: tuple[str, ...] = (
    "geom_friction",
    "body_mass",
    "body_inertia",
    "body_ipos",
    "body_subtreemass",
    "dof_armature",
    "dof_frictionloss",
    "dof_damping",
    "actuator_forcerange",
)
"""The ``MjModel`` fields a randomized env gives each simulator its own copy of."""


@dataclasses.dataclass(frozen=True)
class MicroDuckRandomization:
    """Ranges each env draws from at reset, plus latency and noise settings.

    Every range is a ``(low, high)`` pair drawn uniformly; ``(1, 1)`` scales and
    ``(0, 0)`` offsets leave the robot as modelled. The defaults are the
    ``"none"`` preset. Build one from a preset with :meth:`preset`, which
    checks the names of its overrides.

    Example:
        >>> config = MicroDuckRandomization.preset("upstream", action_delay=(0, 2))
        >>> config.friction, config.action_delay, config.varies_model
        ((0.7, 1.3), (0, 2), True)
    """

    friction: Range = (1.0, 1.0)
    """Scale of the sliding friction of the foot-floor contacts (feet and floor geoms both, since
    MuJoCo takes the larger friction of the two geoms in contact)."""
    mass: Range = (1.0, 1.0)
    """Scale of each robot link's mass and rotational inertia, drawn per link."""
    trunk_com: Range = (0.0, 0.0)
    """Offset in metres of the trunk's centre of mass, drawn per axis of the trunk frame."""
    head_com: Range = (0.0, 0.0)
    """Offset in metres of the head's centre of mass (its heaviest link), drawn per axis."""
    armature: Range = (1.0, 1.0)
    """Scale of each joint's armature (rotor inertia through the gearbox), drawn per joint."""
    frictionloss: Range = (1.0, 1.0)
    """Scale of each joint's friction loss (the servo's Coulomb friction), drawn per joint."""
    damping: Range = (1.0, 1.0)
    """Scale of each joint's damping (the servo's back-EMF), drawn per joint."""
    voltage: Range = (1.0, 1.0)
    """Battery-voltage scale of every servo: multiplies the actuators' ``forcerange`` and the
    joint damping."""
    joint_offset: Range = (0.0, 0.0)
    """Encoder bias in radians, drawn per joint: the servo holds ``target - bias`` and the
    encoder reads ``angle + bias``."""
    imu_tilt: Range = (0.0, 0.0)
    """Mounting tilt of the IMU in radians, about an axis drawn uniformly in the trunk's
    horizontal plane."""
    push_velocity: Range = (0.0, 0.0)
    """Kick in m/s added to each of the trunk's world x and y velocities at a push."""
    push_interval: Range = (3.0, 6.0)
    """Seconds between pushes, drawn again after each one (pushes need a nonzero ``push_velocity``)."""
    action_delay: tuple[int, int] = (0, 0)
    """Control steps between the policy's action and the servos receiving it, drawn per env."""
    imu_delay: tuple[int, int] = (0, 0)
    """Control steps by which the IMU readings (gravity, gyro) lag, drawn per env."""
    joint_velocity_delay: int = 0
    """Control steps by which every env's joint velocity lags (the robot's is one step late)."""
    gravity_noise: float = 0.0
    """Half-width of the uniform noise on the projected gravity."""
    gyro_noise: float = 0.0
    """Half-width in rad/s of the uniform noise on the gyro."""
    joint_position_noise: float = 0.0
    """Half-width in radians of the uniform noise on the joint positions."""
    joint_velocity_noise: float = 0.0
    """Half-width in rad/s of the uniform noise on the joint velocities."""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in DELAY_FIELDS:
                object.__setattr__(self, field.name, _delay_range(field.name, value))
            elif field.name == "joint_velocity_delay":
                if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                    raise ValueError(f"joint_velocity_delay must be an integer >= 0 (control steps), got {value!r}.")
            elif field.name in NOISE_FIELDS:
                if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                    raise ValueError(f"{field.name} must be a finite number >= 0, got {value!r}.")
                if value < 0:
                    raise ValueError(f"{field.name} is a noise half-width and must be >= 0, got {value!r}.")
                object.__setattr__(self, field.name, float(value))
            else:
                object.__setattr__(self, field.name, _float_range(field.name, value))
        for name in SCALE_FIELDS:
            low = getattr(self, name)[0]
            if low < 0 or (name == "mass" and low == 0):
                bound = "> 0" if name == "mass" else ">= 0"
                raise ValueError(f"{name} is a scale: its range must be {bound}, got {getattr(self, name)}.")
        if self.imu_tilt[0] < 0:
            raise ValueError(f"imu_tilt is an angle magnitude: its range must be >= 0 rad, got {self.imu_tilt}.")
        if self.push_interval[0] <= 0:
            raise ValueError(f"push_interval must be > 0 seconds, got {self.push_interval}.")

    @classmethod
    def names(cls) -> list[str]:
        """The accepted parameter names, in declaration order."""
        return [field.name for field in dataclasses.fields(cls)]

    @classmethod
    def preset(cls, name: str = "none", **overrides: Any) -> MicroDuckRandomization:
        """The preset ``name`` (a key of :data:`PRESETS`) with ``overrides`` replacing some of its fields."""
        if name not in PRESETS:
            raise ValueError(f"randomization preset must be one of {sorted(PRESETS)}, got {name!r}.")
        return PRESETS[name].replace(**overrides)

    def replace(self, **overrides: Any) -> MicroDuckRandomization:
        """A copy with ``overrides`` replacing fields; unknown names are refused with the accepted ones."""
        unknown = sorted(set(overrides) - set(self.names()))
        if unknown:
            raise ValueError(f"unknown randomization parameter(s) {unknown}; accepted names: {self.names()}.")
        return dataclasses.replace(self, **overrides)

    def with_pushes_scaled(self, scale: float) -> MicroDuckRandomization:
        """A copy whose push kicks are ``scale`` times as hard (``push_velocity`` scaled; intervals kept).

        Training on harder pushes than the robot will meet buys a margin on the
        preset's own pushes (``waddle train --push-scale``).

        Raises:
            ValueError: ``scale`` is not a finite number > 0, or this
                randomization has no pushes to scale.

        Example:
            >>> [round(v, 9) for v in MicroDuckRandomization.preset("upstream").with_pushes_scaled(1.5).push_velocity]
            [-0.45, 0.45]
        """
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"push scale must be a finite number > 0, got {scale!r}.")
        if not self.pushes:
            raise ValueError(
                f"a push scale of {scale} needs a randomization that pushes (push_velocity is {self.push_velocity}); "
                "the 'upstream' preset does."
            )
        low, high = self.push_velocity
        return self.replace(push_velocity=(low * scale, high * scale))

    @property
    def active(self) -> bool:
        """Whether anything differs from the idealized robot (the ``"none"`` preset)."""
        return self != NONE

    @property
    def model_parameters(self) -> list[str]:
        """The randomized parameters that live in the MuJoCo model (friction, masses, servo constants)."""
        nominal = {"trunk_com": (0.0, 0.0), "head_com": (0.0, 0.0)}
        names = (*SCALE_FIELDS, *nominal)
        return [name for name in names if getattr(self, name) != nominal.get(name, (1.0, 1.0))]

    @property
    def varies_model(self) -> bool:
        """Whether envs need their own MuJoCo model parameters (a backend that supports it)."""
        return bool(self.model_parameters)

    @property
    def pushes(self) -> bool:
        """Whether the env pushes the trunk at random intervals."""
        return self.push_velocity != (0.0, 0.0)

    @property
    def noisy(self) -> bool:
        return any(getattr(self, name) > 0 for name in NOISE_FIELDS)


def _float_range(name: str, value: Any) -> Range:
    try:
        low, high = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a (low, high) pair of numbers, got {value!r}.") from None
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"{name} must be finite, got {value!r}.")
    if low > high:
        raise ValueError(f"{name} must have low <= high, got low={low} > high={high}.")
    return (low, high)


def _delay_range(name: str, value: Any) -> tuple[int, int]:
    pair = tuple(value) if isinstance(value, (tuple, list)) else None
    if pair is None or len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) for v in pair):
        raise ValueError(f"{name} must be a (low, high) pair of integers (control steps), got {value!r}.")
    low, high = pair
    if low < 0:
        raise ValueError(f"{name} must be >= 0 control steps, got {value!r}.")
    if low > high:
        raise ValueError(f"{name} must have low <= high, got low={low} > high={high}.")
    return (low, high)


NONE = MicroDuckRandomization()

UPSTREAM = MicroDuckRandomization(
    friction=(0.7, 1.3),
    mass=(0.95, 1.05),
    trunk_com=(-0.003, 0.003),
    head_com=(-0.01, 0.01),
    armature=(0.9, 1.1),
    frictionloss=(0.9, 1.1),
    damping=(1.0, 1.0),
    voltage=(0.85, 1.05),
    joint_offset=(-0.015, 0.015),
    imu_tilt=(0.0, math.radians(6.0)),
    push_velocity=(-0.3, 0.3),
    push_interval=(3.0, 6.0),
    action_delay=(0, 1),
    imu_delay=(0, 1),
    joint_velocity_delay=1,
    gravity_noise=0.01,
    gyro_noise=0.03,
    joint_position_noise=0.001,
    joint_velocity_noise=0.25,
)
"""The microduck_rl training's ranges. Upstream gives no figure for the battery voltage or the
command delay: ``voltage`` spans 15 % of sag to 5 % over nominal and ``action_delay`` 0-1 steps
(as the IMU's); servo kd randomization is off upstream, so ``damping`` moves only with the voltage."""

PRESETS: dict[str, MicroDuckRandomization] = {"none": NONE, "upstream": UPSTREAM}
"""Named randomization presets."""


def resolve_randomization(value: MicroDuckRandomization | str | Mapping[str, Any] | None) -> MicroDuckRandomization:
    """A :class:`MicroDuckRandomization` from a preset name, a mapping of overrides on ``"none"``, or ``None``."""
    if value is None:
        return NONE
    if isinstance(value, MicroDuckRandomization):
        return value
    if isinstance(value, str):
        return MicroDuckRandomization.preset(value)
    if isinstance(value, Mapping):
        return NONE.replace(**value)
    raise ValueError(
        "randomization must be a MicroDuckRandomization, a preset name "
        f"({sorted(PRESETS)}) or a mapping of parameter ranges, got {type(value).__name__}."
    )


# ----------------------------------------------------------------------------
# Draws
# ----------------------------------------------------------------------------


def value_sizes(num_links: int) -> dict[str, int]:
    """Name -> width of each value the env reports under ``("randomization", name)``.

    Every value is reported whatever the ranges (a degenerate range gives a
    constant), so the layout depends on the robot only.
    """
    j = constants.NUM_JOINTS
    return {
        "friction": 1,
        "mass": num_links,
        "trunk_com": 3,
        "head_com": 3,
        "armature": j,
        "frictionloss": j,
        "damping": j,
        "voltage": 1,
        "joint_offset": j,
        "imu_tilt": 2,
        "action_delay": 1,
        "imu_delay": 1,
    }


def draw_values(
    config: MicroDuckRandomization,
    num_envs: int,
    num_links: int,
    generator: torch.Generator,
    *,
    dtype: torch.dtype,
    device: torch.device,
) -> dict[str, torch.Tensor]:
    """One draw of every value of :func:`value_sizes` for ``num_envs`` envs, in a fixed order.

    ``imu_tilt`` is the tilt as a rotation vector ``(x, y)`` in the trunk
    frame (its norm is the tilt angle); delays are whole steps stored as
    floats, so that a critic can concatenate every value.
    """

    def uniform(bounds, width):
        low, high = bounds
        fraction = torch.rand(num_envs, width, generator=generator, dtype=dtype, device=device)
        return low + fraction * (high - low)

    def steps(bounds):
        low, high = bounds
        fraction = torch.rand(num_envs, 1, generator=generator, dtype=dtype, device=device)
        return (low + torch.floor(fraction * (high - low + 1))).clamp(max=high)

    sizes = value_sizes(num_links)
    out = {}
    for name in ("friction", "mass", "trunk_com", "head_com", "armature", "frictionloss", "damping", "voltage"):
        out[name] = uniform(getattr(config, name), sizes[name])
    out["joint_offset"] = uniform(config.joint_offset, sizes["joint_offset"])
    angle = uniform(config.imu_tilt, 1)
    azimuth = uniform((0.0, 2.0 * math.pi), 1)
    out["imu_tilt"] = angle * torch.cat([azimuth.cos(), azimuth.sin()], dim=-1)
    out["action_delay"] = steps(config.action_delay)
    out["imu_delay"] = steps(config.imu_delay)
    return out


def nominal_values(
    num_envs: int, num_links: int, *, dtype: torch.dtype, device: torch.device
) -> dict[str, torch.Tensor]:
    """The values of an unrandomized robot: unit scales, zero offsets and delays."""
    ones = ("friction", "mass", "armature", "frictionloss", "damping", "voltage")
    return {
        name: (torch.ones if name in ones else torch.zeros)(num_envs, size, dtype=dtype, device=device)
        for name, size in value_sizes(num_links).items()
    }


def tilt_rotation(rotation_vector: torch.Tensor) -> torch.Tensor:
    """``(..., 3, 3)`` rotation matrices of horizontal rotation vectors ``(..., 2)`` (Rodrigues)."""
    vector = torch.nn.functional.pad(rotation_vector, (0, 1))
    angle = vector.norm(dim=-1, keepdim=True)
    axis = vector / angle.clamp_min(1e-12)
    x, y, z = axis.unbind(-1)
    zero = torch.zeros_like(x)
    cross = torch.stack([zero, -z, y, z, zero, -x, -y, x, zero], dim=-1).reshape(*axis.shape[:-1], 3, 3)
    sin, cos = angle.sin().unsqueeze(-1), angle.cos().unsqueeze(-1)
    eye = torch.eye(3, dtype=vector.dtype, device=vector.device)
    return eye + sin * cross + (1 - cos) * (cross @ cross)


# ----------------------------------------------------------------------------
# Model fields
# ----------------------------------------------------------------------------


class ModelFields:
    """Per-env MuJoCo model fields from drawn scales and offsets, batched in torch.

    Reads the nominal values from ``model`` once. :meth:`fields` returns, for
    each name of :data:`MODEL_FIELDS`, a ``(num_envs, *shape)`` tensor holding
    every env's full copy of that field, ready for
    :meth:`~waddle.physics.base.PhysicsBackend.set_model_fields`.

    Args:
        model: the nominal model (a backend's, so its ids are the simulated ones).
        dtype, device: of the returned tensors.
    """

    def __init__(self, model: mujoco.MjModel, *, dtype: torch.dtype, device: torch.device) -> None:
        def tensor(array):
            return torch.as_tensor(np.array(array), dtype=dtype, device=device)

        self.base = {name: tensor(getattr(model, name)) for name in MODEL_FIELDS}
        root = model.body(constants.ROOT_BODY).id
        self.links = torch.as_tensor(
            [b for b in range(model.nbody) if model.body_rootid[b] == root], dtype=torch.long, device=device
        )
        self.trunk = root
        self.head = model.body(constants.HEAD_BODY).id
        joint_ids = [model.joint(name).id for name in constants.JOINT_NAMES]
        self.dofs = torch.as_tensor([model.jnt_dofadr[j] for j in joint_ids], dtype=torch.long, device=device)
        feet = [model.geom(name).id for name in constants.FOOT_GEOMS]
        # The world's colliding geoms are the floor the feet touch.
        floor = [
            g
            for g in range(model.ngeom)
            if model.geom_bodyid[g] == 0 and (model.geom_contype[g] or model.geom_conaffinity[g])
        ]
        self.friction_geoms = torch.as_tensor(feet + floor, dtype=torch.long, device=device)
        # subtree[b, c] = 1 when body c lies in b's subtree: subtree masses are a matrix product.
        subtree = np.zeros((model.nbody, model.nbody))
        for child in range(model.nbody):
            body = child
            while True:
                subtree[body, child] = 1.0
                if body == 0:
                    break
                body = model.body_parentid[body]
        self.subtree = tensor(subtree)

    @property
    def num_links(self) -> int:
        """Bodies of the robot (the trunk and everything under it); ``mass`` has one scale per link."""
        return int(self.links.numel())

    def fields(self, values: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Every env's copy of each :data:`MODEL_FIELDS` entry under the drawn ``values``."""
        n = values["friction"].shape[0]

        def expand(name):
            base = self.base[name]
            return base.expand(n, *base.shape).clone()

        friction = expand("geom_friction")
        friction[:, self.friction_geoms, 0] *= values["friction"]

        mass_scale = torch.ones(n, self.base["body_mass"].shape[0], dtype=friction.dtype, device=friction.device)
        mass_scale[:, self.links] = values["mass"]
        body_mass = self.base["body_mass"] * mass_scale
        ipos = expand("body_ipos")
        ipos[:, self.trunk] += values["trunk_com"]
        ipos[:, self.head] += values["head_com"]

        def joints(name, scale):
            out = expand(name)
            out[:, self.dofs] *= scale
            return out

        voltage = values["voltage"]
        return {
            "geom_friction": friction,
            "body_mass": body_mass,
            "body_inertia": self.base["body_inertia"] * mass_scale.unsqueeze(-1),
            "body_ipos": ipos,
            "body_subtreemass": body_mass @ self.subtree.T,
            "dof_armature": joints("dof_armature", values["armature"]),
            "dof_frictionloss": joints("dof_frictionloss", values["frictionloss"]),
            "dof_damping": joints("dof_damping", values["damping"] * voltage),
            "actuator_forcerange": self.base["actuator_forcerange"] * voltage.unsqueeze(-1),
        }


# ----------------------------------------------------------------------------
# Delays
# ----------------------------------------------------------------------------


class DelayLine:
    """Per-env delays of 0..``max_delay`` steps: a ring of each env's last ``max_delay + 1`` values.

    :meth:`push` stores this step's values and returns, for each env, the
    values pushed ``delay[env]`` steps ago; :meth:`fill` makes the reset envs'
    whole history equal to one value (a robot at rest has read the same thing
    for a while). Updates are out of place, so values may carry autograd
    history.

    Args:
        num_envs, width: shape of the values pushed each step.
        max_delay: the longest delay, in steps.
    """

    def __init__(self, num_envs: int, width: int, max_delay: int, *, dtype: torch.dtype, device: torch.device) -> None:
        self.length = max_delay + 1
        self.buffer = torch.zeros(num_envs, self.length, width, dtype=dtype, device=device)
        self.delay = torch.zeros(num_envs, dtype=torch.long, device=device)
        self.head = 0
        self._rows = torch.arange(num_envs, device=device)

    def set_delay(self, delay: torch.Tensor, rows: torch.Tensor) -> None:
        """Give the envs where ``rows`` is true the per-env ``delay`` (integer steps, ``(num_envs,)``)."""
        delay = delay.to(self.delay.device, torch.long).reshape(-1)
        if int(delay.max()) >= self.length or int(delay.min()) < 0:
            raise ValueError(f"delay must be within 0..{self.length - 1} steps, got {delay.tolist()}.")
        self.delay = torch.where(rows, delay, self.delay)

    def fill(self, value: torch.Tensor, rows: torch.Tensor) -> None:
        """Set every stored step of the envs where ``rows`` is true to ``value`` ``(num_envs, width)``."""
        self.buffer = torch.where(rows[:, None, None], value.unsqueeze(1).to(self.buffer.dtype), self.buffer)

    def push(self, value: torch.Tensor) -> torch.Tensor:
        """Store ``value`` ``(num_envs, width)`` as the newest step and return each env's delayed value."""
        self.head = (self.head + 1) % self.length
        slot = torch.tensor([self.head], device=self.buffer.device)
        self.buffer = self.buffer.index_copy(1, slot, value.unsqueeze(1).to(self.buffer.dtype))
        return self.buffer[self._rows, (self.head - self.delay) % self.length]

    def read(self) -> torch.Tensor:
        """Each env's delayed value as of the last push or fill, without storing anything."""
        return self.buffer[self._rows, (self.head - self.delay) % self.length]

    def detach(self) -> None:
        self.buffer = self.buffer.detach()


__all__ = [
    "MODEL_FIELDS",
    "PRESETS",
    "DelayLine",
    "MicroDuckRandomization",
    "ModelFields",
    "draw_values",
    "nominal_values",
    "resolve_randomization",
    "tilt_rotation",
    "value_sizes",
]
