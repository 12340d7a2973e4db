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
        corners = _visual_corners(model, model.body(body_name).id)
        center, rotation, half = _oriented_box(corners)
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


def _visual_corners(model: mujoco.MjModel, body: int) -> np.ndarray:
    """The 8 corners of each visual geom's bounding box of ``body``, in the body frame, ``(8k, 3)``."""
    signs = np.array([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], dtype=float)
    corners = []
    for geom in range(model.ngeom):
        if model.geom_bodyid[geom] != body or model.geom_group[geom] != _VISUAL_GROUP:
            continue
        aabb = model.geom_aabb[geom]
        local = aabb[:3] + signs * aabb[3:]
        rotation = np.zeros(9)
        mujoco.mju_quat2Mat(rotation, model.geom_quat[geom])
        corners.append(local @ rotation.reshape(3, 3).T + model.geom_pos[geom])
    if not corners:
        raise ValueError(f"body {model.body(body).name!r} has no visual geoms to fit a collision box to.")
    return np.concatenate(corners)


def _oriented_box(points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Centre, rotation (columns: the box axes, right-handed) and half sizes of a box holding ``points``."""
    mean = points.mean(0)
    _, _, axes = np.linalg.svd(points - mean, full_matrices=True)
    rotation = axes.T.copy()
    if np.linalg.det(rotation) < 0:
        rotation[:, 2] = -rotation[:, 2]
    projected = (points - mean) @ rotation
    low, high = projected.min(0), projected.max(0)
    center = mean + rotation @ ((low + high) / 2)
    return center, rotation, (high - low) / 2
