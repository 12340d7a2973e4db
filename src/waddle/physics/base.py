"""The contract every physics backend implements.

A backend simulates ``num_envs`` copies of one MuJoCo model. Its whole state,
as far as the envs are concerned, is ``(qpos, qvel, time)``; everything else a
task reads (site positions, contact flags) is derived from the last substep of
the most recent :meth:`PhysicsBackend.step`. That keeps the contract small
enough that a C engine, MJX and mujoco-torch can all honour it, and lets a
differentiable backend carry the autograd history through ``qpos``/``qvel``.

Semantics shared by all backends:

* ``site_positions()`` and ``contacts()`` report what MuJoCo computed in the
  forward pass of the last substep (before its integration), which is what
  ``MjData.site_xpos`` and ``MjData.contact`` hold after ``mj_step`` in every
  MuJoCo implementation. After a reset they are refreshed for the reset envs.
* A geom's contact flag is true when MuJoCo generated at least one contact
  involving it (penetration distance below the pair's margin).
* ``diverged`` flags the envs whose simulation broke down (a non-finite
  state, or one MuJoCo would refuse): the envs end such an env's episode
  and reset it, and the rest of the batch carries on. Resetting an env
  clears its flag.

Two optional abilities serve domain randomization: :meth:`set_model_fields`
gives each env its own values of some model fields (friction, masses, servo
constants), and :meth:`set_qvel` changes velocities mid-episode (pushes)
without restarting the envs' clocks. A backend that cannot do them says so in
:attr:`PhysicsBackend.per_env_models` and raises a
:class:`NotImplementedError` that names alternatives.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import ClassVar

import mujoco
import torch


class PhysicsBackend(abc.ABC):
    """Batched simulation of ``num_envs`` copies of one MuJoCo model.

    Args:
        model: the MuJoCo model, compiled (``MjModel``) or as an ``MjSpec``.
            Backends may add instrumentation (the native backend adds sensors
            to read sites and contacts in bulk, which needs the spec); they
            never change the physics.
        num_envs: number of simulators, at least 1.
        frame_skip: physics substeps per :meth:`step` call, at least 1.
        site_names: sites whose world positions :meth:`site_positions` returns,
            in this order.
        contact_geom_names: geoms whose contact flags :meth:`contacts` returns,
            in this order.
        device: torch device of every tensor the backend returns.
        dtype: floating dtype of every tensor the backend returns.
        requires_grad: whether :meth:`step` records an autograd graph from
            ``(qpos, qvel, ctrl)`` to the new state. Only backends with
            ``differentiable = True`` accept it.
    """

    name: ClassVar[str]
    differentiable: ClassVar[bool] = False

    def __init__(
        self,
        model: mujoco.MjModel | mujoco.MjSpec,
        *,
        num_envs: int,
        frame_skip: int,
        site_names: Sequence[str] = (),
        contact_geom_names: Sequence[str] = (),
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        requires_grad: bool = False,
    ) -> None:
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}.")
        if int(frame_skip) < 1:
            raise ValueError(f"frame_skip must be >= 1, got {frame_skip}.")
        if requires_grad and not self.differentiable:
            raise ValueError(
                f"requires_grad=True is not supported by the {self.name!r} backend, "
                "which is not differentiable; use backend='mjx' or backend='mujoco-torch'."
            )
        if isinstance(model, mujoco.MjSpec):
            self.spec: mujoco.MjSpec | None = model
            model = model.compile()
        else:
            self.spec = None
        self.model = model
        self.num_envs = int(num_envs)
        self.frame_skip = int(frame_skip)
        self.device = torch.device(device)
        self.dtype = dtype
        self.requires_grad = bool(requires_grad)
        self.site_ids = _lookup_ids(model, mujoco.mjtObj.mjOBJ_SITE, site_names, "site")
        self.contact_geom_ids = _lookup_ids(model, mujoco.mjtObj.mjOBJ_GEOM, contact_geom_names, "geom")

    @property
    def nq(self) -> int:
        return self.model.nq

    @property
    def nv(self) -> int:
        return self.model.nv

    @property
    def nu(self) -> int:
        return self.model.nu

    @property
    def control_dt(self) -> float:
        """Simulated seconds advanced by one :meth:`step`."""
        return self.model.opt.timestep * self.frame_skip

    @abc.abstractmethod
    def reset(self, qpos: torch.Tensor, qvel: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Set the state of all envs, or of the envs where ``mask`` is true.

        ``qpos`` is ``(num_envs, nq)`` and ``qvel`` ``(num_envs, nv)``; rows of
        envs outside ``mask`` are ignored. Reset envs restart their clock at 0.
        """

    @abc.abstractmethod
    def step(self, ctrl: torch.Tensor) -> None:
        """Advance every env by ``frame_skip`` substeps holding ``ctrl`` ``(num_envs, nu)``."""

    @property
    @abc.abstractmethod
    def qpos(self) -> torch.Tensor:
        """``(num_envs, nq)`` generalized positions."""

    @property
    @abc.abstractmethod
    def qvel(self) -> torch.Tensor:
        """``(num_envs, nv)`` generalized velocities."""

    @property
    @abc.abstractmethod
    def time(self) -> torch.Tensor:
        """``(num_envs,)`` simulated time since each env's last reset."""

    @property
    @abc.abstractmethod
    def diverged(self) -> torch.Tensor:
        """``(num_envs,)`` bool: the env's simulation broke down.

        True once the env's state became non-finite or beyond MuJoCo's limits
        (``mjMAXVAL``) in a step; its ``qpos``/``qvel`` then mean nothing
        (backends may report them as NaN) and the env layer terminates it.
        Resetting the env to a sane state clears it. Reading it never records
        autograd history.
        """

    @abc.abstractmethod
    def site_positions(self) -> torch.Tensor:
        """``(num_envs, len(site_names), 3)`` world positions of the tracked sites."""

    @abc.abstractmethod
    def contacts(self) -> torch.Tensor:
        """``(num_envs, len(contact_geom_names))`` bool: the tracked geom touches something."""

    @property
    def per_env_models(self) -> bool:
        """Whether :meth:`set_model_fields` can give each env its own model parameters."""
        return False

    def set_model_fields(self, fields: Mapping[str, torch.Tensor], mask: torch.Tensor | None = None) -> None:
        """Give each env its own values of the named ``MjModel`` fields.

        Args:
            fields: field name (an ``MjModel`` attribute, such as
                ``"geom_friction"``) to a ``(num_envs, *shape)`` tensor holding
                each env's whole copy of that field.
            mask: ``(num_envs,)`` bool; only these envs' fields change (all
                when ``None``). Call it before :meth:`reset` of the same envs,
                so the reset's forward pass already sees the new model.

        Constants MuJoCo derives from the fields at compile time keep their
        nominal values on every backend: ``body_invweight0`` and
        ``dof_invweight0`` (which scale the constraint regularization), and
        ``body_subtreemass`` unless it is set too. The mass matrix always comes
        from the per-env masses and inertias (the native backend turns off
        MuJoCo's precomputed ``dof_M0`` shortcut for 'simple' bodies).
        """
        raise NotImplementedError(
            f"The {self.name!r} backend cannot give envs their own model parameters; "
            "use backend='mujoco' (CPU) or backend='mjx' with requires_grad=False."
        )

    def set_qvel(self, qvel: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Replace the velocities ``(num_envs, nv)`` of the envs where ``mask`` is true.

        Unlike :meth:`reset`, positions, clocks and the solver's carry are kept:
        this is a push in the middle of an episode.
        """
        raise NotImplementedError(
            f"The {self.name!r} backend cannot change velocities mid-episode; use backend='mujoco' or backend='mjx'."
        )

    @property
    def applies_forces(self) -> bool:
        """Whether :meth:`apply_forces` can hold external forces on the bodies."""
        return False

    def apply_forces(self, xfrc: torch.Tensor | None) -> None:
        """Hold external forces on the bodies over the following steps, until replaced or cleared.

        Args:
            xfrc: ``(num_envs, nbody, 6)``: per env and body, a force (N) then a torque (N m), in the world
                frame, at the body's centre of mass (MuJoCo's ``MjData.xfrc_applied``); ``None`` clears
                them all.
        """
        raise NotImplementedError(
            f"The {self.name!r} backend cannot apply external forces to bodies; use backend='mujoco'."
        )

    def detach(self) -> None:  # noqa: B027 - a no-op for backends without an autograd history
        """Cut the autograd history of the state (a truncated-BPTT boundary)."""

    def close(self) -> None:  # noqa: B027 - a no-op for backends that hold nothing
        """Release threads, devices and other resources held by the backend."""


def _lookup_ids(model: mujoco.MjModel, obj: mujoco.mjtObj, names: Sequence[str], kind: str) -> list[int]:
    ids = []
    for name in names:
        idx = mujoco.mj_name2id(model, obj, name)
        if idx < 0:
            raise ValueError(f"The model has no {kind} named {name!r}.")
        ids.append(idx)
    return ids
