"""The MicroDuck's contact with the floor when it lies down: one box per limb.

The embedded model collides with the floor through its soles, its trunk and
its head only, which is all walking needs. A robot on the floor also rests
and pushes on its hips, thighs, shins, ankles and neck. :func:`add_limb_collisions`
gives each of those bodies one collision box, oriented along the body's
visual parts (their corners' principal axes) and as long as they reach, so
a leg on the floor bears on the floor where the real leg would.

The boxes are primitives in the model's collision class (contype 2,
conaffinity 1): they touch the floor and never each other, and they weigh
nothing (masses come from the inertials). The env adds them only when a task
can lie down (``lying_start_fraction > 0`` or ``fall_terminates == 0``), so
walking pays no extra contacts.
"""

from __future__ import annotations

import mujoco
import numpy as np

LIMB_BODIES: tuple[str, ...] = (
    "hip_l",
    "upper_leg_left",
    "leg",
    "ankle_left",
    "hip_l_2",
    "upper_leg_right",
    "leg_2",
    "ankle_right",
    "neck",
)
"""Bodies that get a collision box: each hip bracket, thigh, shin and ankle, and the neck."""

LIMB_GEOM_SUFFIX = "_limb_collision"
"""A limb box is named after its body: ``<body>_limb_collision``."""

_COLLISION_CLASS = "collision"
_VISUAL_GROUP = 2


def limb_geom_names() -> tuple[str, ...]:
    """The names :func:`add_limb_collisions` gives its boxes, in :data:`LIMB_BODIES` order."""
    return tuple(body + LIMB_GEOM_SUFFIX for body in LIMB_BODIES)


def add_limb_collisions(spec: mujoco.MjSpec) -> tuple[str, ...]:
    """Add one collision box per body of :data:`LIMB_BODIES` to ``spec``, in place; return their names.

    A box holds every corner of its body's visual geoms' bounding boxes, along
    the principal axes of those corners.

    Raises:
        ValueError: ``spec`` lacks a body of :data:`LIMB_BODIES` or already has the boxes.
    """
    model = spec.compile()
    names = limb_geom_names()
    present = [name for name in names if _geom_id(model, name) >= 0]
    if present:
        raise ValueError(f"the model already has limb collision boxes {present}.")
    collision = spec.find_default(_COLLISION_CLASS)
    for body_name, geom_name in zip(LIMB_BODIES, names, strict=True):
        body = spec.body(body_name)
        if body is None:
            raise ValueError(f"the MicroDuck model has no body {body_name!r} to give a limb collision box.")
        body_id = model.body(body_name).id
        holders = _collision_geoms(model, body_id)
        # Along a sole's own axes a box around the parts above it cannot reach below it; along the parts'
        # principal axes it could (a corner of the tilted box pokes under the sole and props the robot up).
        axes = _geom_rotation(model, holders[0]) if holders else None
        center, rotation, half = _oriented_box(_visual_corners(model, body_id, holders), axes)
        quat = np.zeros(4)
        mujoco.mju_mat2Quat(quat, rotation.reshape(-1))
        geom = body.add_geom(collision) if collision is not None else body.add_geom()
        geom.name = geom_name
        geom.type = mujoco.mjtGeom.mjGEOM_BOX
        geom.pos = center
        geom.quat = quat
        geom.size = np.maximum(half, 1e-3)
        if collision is None:
            geom.contype, geom.conaffinity, geom.group = 2, 1, 3
    return names


def _geom_id(model: mujoco.MjModel, name: str) -> int:
    return mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, name)


_SIGNS = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], dtype=float)
_INSIDE_TOLERANCE = 1e-3
"""How far, m, a visual part may reach out of a collision geom and still count as inside it."""


def _collision_geoms(model: mujoco.MjModel, body: int) -> list[int]:
    """The geoms of ``body`` that already collide (an ankle's sole)."""
    return [g for g in range(model.ngeom) if model.geom_bodyid[g] == body and model.geom_contype[g]]


def _visual_corners(model: mujoco.MjModel, body: int, holders: list[int]) -> np.ndarray:
    """The 8 corners of each visual geom's bounding box of ``body``, in the body frame, ``(8k, 3)``; the
    parts that one of the collision geoms ``holders`` already holds (the sole's own visual) are left out."""
    corners = []
    for geom in range(model.ngeom):
        if model.geom_bodyid[geom] != body or model.geom_group[geom] != _VISUAL_GROUP:
            continue
        part = _aabb_corners(model, geom)
        if any(_inside(model, holder, part) for holder in holders):
            continue
        corners.append(part)
    if not corners:
        raise ValueError(f"body {model.body(body).name!r} has no visual geoms to fit a collision box to.")
    return np.concatenate(corners)


def _geom_rotation(model: mujoco.MjModel, geom: int) -> np.ndarray:
    rotation = np.zeros(9)
    mujoco.mju_quat2Mat(rotation, model.geom_quat[geom])
    return rotation.reshape(3, 3)


def _aabb_corners(model: mujoco.MjModel, geom: int) -> np.ndarray:
    """The 8 corners of ``geom``'s bounding box in its body's frame."""
    aabb = model.geom_aabb[geom]
    return (aabb[:3] + _SIGNS * aabb[3:]) @ _geom_rotation(model, geom).T + model.geom_pos[geom]


def _inside(model: mujoco.MjModel, holder: int, points: np.ndarray) -> bool:
    """Whether every point (body frame) lies within ``holder``'s bounding box, give or take the tolerance."""
    local = (points - model.geom_pos[holder]) @ _geom_rotation(model, holder)
    aabb = model.geom_aabb[holder]
    return bool((np.abs(local - aabb[:3]) <= aabb[3:] + _INSIDE_TOLERANCE).all())


def _oriented_box(points: np.ndarray, axes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centre, rotation (columns: the box axes, right-handed) and half sizes of a box holding ``points``,
    along ``axes`` (a rotation matrix) when given, else along the points' principal axes."""
    mean = points.mean(0)
    if axes is None:
        _, _, principal = np.linalg.svd(points - mean, full_matrices=True)
        rotation = principal.T.copy()
        if np.linalg.det(rotation) < 0:
            rotation[:, 2] = -rotation[:, 2]
    else:
        rotation = np.asarray(axes, dtype=float)
    projected = (points - mean) @ rotation
    low, high = projected.min(0), projected.max(0)
    center = mean + rotation @ ((low + high) / 2)
    return center, rotation, (high - low) / 2
