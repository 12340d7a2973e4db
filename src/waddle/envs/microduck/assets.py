"""Where the MicroDuck model comes from, and how it is loaded and checked.

:func:`resolve_scene` finds a scene XML, trying in order:

1. an explicit ``microduck_root``: a microduck_rl checkout, an
   ``mjlab_microduck`` package directory, or a scene XML path;
2. the :data:`ROOT_ENV_VAR` environment variable (same forms);
3. an installed ``mjlab_microduck`` package (found without importing it);
4. a checkout of the pinned upstream commit under ``root`` (fetched by
   :func:`download_microduck_rl` when ``download`` asks for it);
5. the model embedded in waddle.

:func:`load_spec` and :func:`load_model` parse and compile a scene, optionally
swapping collision meshes for fitted boxes, and :func:`check_model` verifies
the layout the env relies on.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import urllib.request
import warnings
import zipfile
from pathlib import Path

import mujoco
import numpy as np

from waddle.envs.microduck.constants import (
    EMBEDDED_SCENE,
    FOOT_GEOMS,
    FOOT_SITES,
    JOINT_NAMES,
    STAND_KEYFRAME,
)

logger = logging.getLogger(__name__)

MICRODUCK_RL_REPO = "pollen-robotics/microduck_rl"
MICRODUCK_RL_COMMIT = "d424a0c899f6b33cbd3daeb279913134349c0b63"
ROOT_ENV_VAR = "MICRODUCK_RL_ROOT"
URL_ENV_VAR = "WADDLE_MICRODUCK_URL"
DEFAULT_URL = f"https://github.com/{MICRODUCK_RL_REPO}/archive/{{commit}}.zip"
DEFAULT_ROOT = Path("~/.cache/waddle/microduck")

# Scene locations inside each accepted directory form, tried in this order.
CHECKOUT_SCENE = Path("src/mjlab_microduck/robot/microduck/scene_walk.xml")
PACKAGE_SCENE = Path("robot/microduck/scene_walk.xml")
SCENE_NAME = "scene_walk.xml"

DOWNLOAD_TIMEOUT_S = 60.0
_COLLISION_GROUP = 3


def resolve_scene(
    microduck_root: str | os.PathLike | None = None,
    *,
    root: str | os.PathLike | None = None,
    download: bool | str = False,
) -> Path:
    """Return the path of the MicroDuck scene XML to load.

    Args:
        microduck_root: a microduck_rl checkout, an ``mjlab_microduck`` package
            directory, or a scene XML file. When given and it does not resolve,
            a :class:`FileNotFoundError` lists every path tried; nothing else is
            searched.
        root: where pinned upstream checkouts live (default
            ``~/.cache/waddle/microduck``).
        download: ``True`` fetches the pinned checkout into ``root`` when it is
            missing, ``"force"`` fetches it again; ``False`` never downloads.
            Only step 4 of the search depends on it, so an earlier source
            (``microduck_root``, :data:`ROOT_ENV_VAR`, an installed package)
            still wins.

    Example:
        >>> resolve_scene().name  # doctest: +SKIP
        'scene.xml'
    """
    if not (isinstance(download, bool) or download == "force"):
        raise ValueError(f"download must be True, False or 'force', got {download!r}.")
    tried: list[Path] = []

    if microduck_root is not None:
        scene = _find_scene(Path(microduck_root).expanduser(), tried)
        if scene is None:
            raise FileNotFoundError(
                f"microduck_root={str(microduck_root)!r} holds no MicroDuck scene; tried:\n" + _bullets(tried)
            )
        return scene

    env_root = os.environ.get(ROOT_ENV_VAR)
    if env_root:
        env_tried: list[Path] = []
        scene = _find_scene(Path(env_root).expanduser(), env_tried)
        if scene is not None:
            return scene
        tried += env_tried
        warnings.warn(
            f"{ROOT_ENV_VAR}={env_root!r} holds no MicroDuck scene (tried "
            f"{', '.join(map(str, env_tried))}); looking elsewhere.",
            stacklevel=2,
        )

    package_dir = _installed_package_dir()
    if package_dir is not None:
        scene = _find_scene(package_dir, tried)
        if scene is not None:
            return scene

    root_dir = Path(root if root is not None else DEFAULT_ROOT).expanduser()
    checkout = checkout_dir(root_dir)
    if download is not False and (download == "force" or not (checkout / CHECKOUT_SCENE).is_file()):
        download_microduck_rl(root_dir, MICRODUCK_RL_COMMIT, force=download == "force")
    scene = _find_scene(checkout, tried)
    if scene is not None:
        return scene

    embedded = Path(EMBEDDED_SCENE)
    tried.append(embedded)
    if embedded.is_file():
        return embedded.resolve()
    raise FileNotFoundError("No MicroDuck scene found; tried:\n" + _bullets(tried))


def checkout_dir(root: str | os.PathLike, commit: str = MICRODUCK_RL_COMMIT) -> Path:
    """The directory that holds the checkout of ``commit`` under ``root``."""
    return Path(root).expanduser() / f"microduck_rl-{commit}"


def download_microduck_rl(
    root: str | os.PathLike,
    commit: str = MICRODUCK_RL_COMMIT,
    *,
    force: bool = False,
) -> Path:
    """Fetch the microduck_rl archive at ``commit`` into ``root`` and return the checkout.

    The archive URL is ``DEFAULT_URL`` unless :data:`URL_ENV_VAR` gives a
    format string with ``{commit}`` (for mirrors). The archive is downloaded
    and extracted in a temporary directory inside ``root`` and then renamed
    into place, so other processes see either no checkout or a whole one. A
    caller that loses a download race keeps the winner's checkout. On failure
    nothing is left behind.

    Args:
        root: directory that holds checkouts; created if missing.
        commit: the upstream commit to fetch.
        force: fetch again and replace an existing checkout.
    """
    target = checkout_dir(root, commit)
    if not force and (target / CHECKOUT_SCENE).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    url = os.environ.get(URL_ENV_VAR) or DEFAULT_URL
    url = url.format(commit=commit)
    staging = Path(tempfile.mkdtemp(prefix=".download-", dir=target.parent))
    try:
        logger.info("Downloading microduck_rl %s from %s", commit, url)
        archive = staging / "archive.zip"
        try:
            with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response:
                with archive.open("wb") as out:
                    shutil.copyfileobj(response, out)
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(staging / "extracted")
        except (OSError, zipfile.BadZipFile) as err:
            raise ConnectionError(
                f"Could not fetch microduck_rl {commit} from {url}: {err}. Set "
                f"{URL_ENV_VAR} to a mirror URL ('.../{{commit}}.zip'), or pass microduck_root= "
                "a local checkout."
            ) from err
        checkout = _archive_top(staging / "extracted")
        if not (checkout / CHECKOUT_SCENE).is_file():
            raise FileNotFoundError(f"The archive from {url} has no {CHECKOUT_SCENE}.")
        previous = staging / "previous"
        if force and target.exists():
            # Move the old checkout aside (one rename) so the new one can take its place.
            try:
                os.rename(target, previous)
            except FileNotFoundError:
                pass  # another forced download moved it first
        try:
            os.rename(checkout, target)
        except OSError:
            # Another caller renamed its checkout into place first: use theirs.
            if not (target / CHECKOUT_SCENE).is_file():
                if previous.exists() and not target.exists():
                    os.rename(previous, target)
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def load_spec(scene_path: str | os.PathLike, *, low_cost_collisions: bool = False) -> mujoco.MjSpec:
    """Parse the scene at ``scene_path`` into an uncompiled :class:`mujoco.MjSpec`.

    Args:
        scene_path: an MJCF file; meshes and includes resolve relative to it.
        low_cost_collisions: replace every colliding mesh geom (non-zero
            contype or conaffinity, or collision group 3) by a box fitted to
            the mesh's bounding box in the geom's frame. Body masses and
            inertias stay those of the original model, so only contacts change.
    """
    spec = mujoco.MjSpec.from_file(str(scene_path))
    if low_cost_collisions:
        _box_collision_meshes(spec)
    return spec


def load_model(scene_path: str | os.PathLike, *, low_cost_collisions: bool = False) -> mujoco.MjModel:
    """Compile the scene at ``scene_path``; the arguments are those of :func:`load_spec`."""
    return load_spec(scene_path, low_cost_collisions=low_cost_collisions).compile()


def check_model(model: mujoco.MjModel, *, source: str | os.PathLike | None = None) -> None:
    """Raise :class:`ValueError` naming everything the MicroDuck env needs but ``model`` lacks.

    Checked: a free joint followed by :data:`JOINT_NAMES` in order, one
    actuator per joint in that order, the ``STAND`` keyframe, the foot sites
    and the foot geoms.

    Args:
        model: the compiled model.
        source: where it came from, quoted in the error.
    """
    problems = []
    names = [mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, j) for j in range(model.njnt)]
    if model.njnt == 0 or model.jnt_type[0] != mujoco.mjtJoint.mjJNT_FREE:
        problems.append("the first joint must be a free joint (the floating trunk)")
    hinges = names[1:] if model.njnt and model.jnt_type[0] == mujoco.mjtJoint.mjJNT_FREE else names
    if hinges != list(JOINT_NAMES):
        missing = [n for n in JOINT_NAMES if n not in hinges]
        extra = [n for n in hinges if n not in JOINT_NAMES]
        detail = []
        if missing:
            detail.append(f"missing {missing}")
        if extra:
            detail.append(f"unexpected {extra}")
        if not detail:
            detail.append(f"order is {hinges}")
        problems.append(f"joints must be {list(JOINT_NAMES)}: " + ", ".join(detail))
    else:
        driven = [
            names[model.actuator_trnid[a, 0]] if model.actuator_trntype[a] == mujoco.mjtTrn.mjTRN_JOINT else None
            for a in range(model.nu)
        ]
        if driven != list(JOINT_NAMES):
            problems.append(f"actuators must drive {list(JOINT_NAMES)} in order, got {driven}")
    if mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_KEY, STAND_KEYFRAME) < 0:
        problems.append(f"missing keyframe {STAND_KEYFRAME!r}")
    for kind, obj, wanted in (
        ("site", mujoco.mjtObj.mjOBJ_SITE, FOOT_SITES),
        ("geom", mujoco.mjtObj.mjOBJ_GEOM, FOOT_GEOMS),
    ):
        missing = [n for n in wanted if mujoco.mj_name2id(model, obj, n) < 0]
        if missing:
            problems.append(f"missing foot {kind}s {missing}")
    if problems:
        where = f" {str(source)!r}" if source is not None else ""
        raise ValueError(f"The model{where} does not have the MicroDuck layout:\n" + _bullets(problems))


def _find_scene(path: Path, tried: list[Path]) -> Path | None:
    """The scene XML that ``path`` names or holds, recording each candidate in ``tried``."""
    if path.is_file():
        tried.append(path)
        return path.resolve()
    for candidate in (path / CHECKOUT_SCENE, path / PACKAGE_SCENE, path / SCENE_NAME):
        tried.append(candidate)
        if candidate.is_file():
            return candidate.resolve()
    return None


def _installed_package_dir() -> Path | None:
    """Directory of an installed ``mjlab_microduck`` package, found without importing it."""
    try:
        found = importlib.util.find_spec("mjlab_microduck")
    except (ImportError, ValueError):
        return None
    if found is None or not found.submodule_search_locations:
        return None
    return Path(next(iter(found.submodule_search_locations)))


def _archive_top(extracted: Path) -> Path:
    """The checkout inside an extracted archive: its single top directory, if it has one."""
    entries = list(extracted.iterdir()) if extracted.is_dir() else []
    if len(entries) == 1 and entries[0].is_dir():
        return entries[0]
    return extracted


def _box_collision_meshes(spec: mujoco.MjSpec) -> None:
    """Swap each colliding mesh geom of ``spec`` for a box around its mesh, in place."""
    # Compile a copy: a geom compiled once keeps fitting itself to its old mesh.
    compiled = spec.copy()
    model = compiled.compile()
    body_ids = [body.id for body in compiled.bodies]
    replaced_bodies = set()
    for geom, gid in zip(spec.geoms, [g.id for g in compiled.geoms], strict=True):
        if model.geom_type[gid] != mujoco.mjtGeom.mjGEOM_MESH:
            continue
        collides = model.geom_contype[gid] or model.geom_conaffinity[gid]
        if not (collides or model.geom_group[gid] == _COLLISION_GROUP):
            continue
        mesh = model.geom_dataid[gid]
        start, count = model.mesh_vertadr[mesh], model.mesh_vertnum[mesh]
        # The compiler recentres mesh vertices; undo that to get them in the geom frame.
        rot = np.empty(9)
        mujoco.mju_quat2Mat(rot, model.mesh_quat[mesh])
        verts = model.mesh_vert[start : start + count] @ rot.reshape(3, 3).T + model.mesh_pos[mesh]
        low, high = verts.min(axis=0), verts.max(axis=0)
        center = (low + high) / 2
        geom_quat = _spec_quat(spec, geom)
        mujoco.mju_quat2Mat(rot, geom_quat)
        geom.pos = np.asarray(geom.pos) + rot.reshape(3, 3) @ center
        geom.type = mujoco.mjtGeom.mjGEOM_BOX
        geom.size = np.maximum((high - low) / 2, 1e-6)
        geom.meshname = ""
        replaced_bodies.add(model.geom_bodyid[gid])
    # Pin the inertia the meshes gave, so that boxes change contacts and nothing else.
    for body, bid in zip(spec.bodies, body_ids, strict=True):
        if bid in replaced_bodies and bid > 0:
            body.explicitinertial = True
            body.mass = model.body_mass[bid]
            body.ipos = model.body_ipos[bid]
            body.iquat = model.body_iquat[bid]
            body.inertia = model.body_inertia[bid]
            body.fullinertia = [np.nan, 0, 0, 0, 0, 0]
            body.ialt.type = mujoco.mjtOrientation.mjORIENTATION_QUAT


def _spec_quat(spec: mujoco.MjSpec, element) -> np.ndarray:
    """The orientation of ``element`` relative to its parent, as a quaternion."""
    if element.alt.type == mujoco.mjtOrientation.mjORIENTATION_QUAT:
        quat = np.asarray(element.quat, dtype=float)
    else:
        quat = np.asarray(spec.resolve_orientation(spec.compiler.degree, spec.compiler.eulerseq, element.alt))
    return quat / np.linalg.norm(quat)


def _bullets(items) -> str:
    return "\n".join(f"  - {item}" for item in items)
