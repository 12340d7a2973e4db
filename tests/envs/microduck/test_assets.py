"""Scene resolution, the pinned download, model checks and low-cost collisions."""

from __future__ import annotations

import functools
import http.server
import io
import shutil
import struct
import threading
import zipfile
from pathlib import Path

import mujoco
import numpy as np
import pytest

from waddle.envs.microduck import assets
from waddle.envs.microduck.constants import FOOT_GEOMS, FOOT_SITES, JOINT_NAMES, STAND_KEYFRAME

REFERENCE = Path(__file__).parents[2] / "data" / "microduck_reference"
COMMIT = assets.MICRODUCK_RL_COMMIT
_real_installed_package_dir = assets._installed_package_dir


def duck_xml(joints=JOINT_NAMES, foot_sites=FOOT_SITES, foot_geoms=FOOT_GEOMS, keyframe=True, marker="") -> str:
    """A minimal MJCF with the MicroDuck layout, built from primitive geoms."""
    feet = {"left_ankle": 0, "right_ankle": 1}
    bodies = []
    for i, joint in enumerate(joints):
        extra = ""
        if joint in feet and feet[joint] < len(foot_sites):
            extra += f'<site name="{foot_sites[feet[joint]]}" pos="0 0 -0.05"/>'
        if joint in feet and feet[joint] < len(foot_geoms):
            name = foot_geoms[feet[joint]]
            extra += f'<geom name="{name}" type="box" size=".02 .01 .005" pos="0 0 -.05"/>'
        y = 0.01 * (i - len(joints) / 2)
        bodies.append(
            f'<body name="b_{joint}" pos="0 {y:.3f} -0.02"><joint name="{joint}" axis="0 1 0"/>'
            f'<geom type="capsule" size=".005 .02" mass=".01"/>{extra}</body>'
        )
    actuators = "".join(f'<position joint="{j}" kp="1"/>' for j in joints)
    zeros = " ".join("0" for _ in joints)
    key = (
        f'<keyframe><key name="{STAND_KEYFRAME}" qpos="0 0 0.12 1 0 0 0 {zeros}" ctrl="{zeros}"/></keyframe>'
        if keyframe
        else ""
    )
    return (
        f'<mujoco model="fake_duck{marker}"><worldbody>'
        '<geom name="floor" type="plane" size="1 1 .1"/>'
        f'<body name="trunk_base" pos="0 0 .12"><freejoint/><geom type="box" size=".04 .03 .02"/>'
        f"{''.join(bodies)}</body></worldbody><actuator>{actuators}</actuator>{key}</mujoco>"
    )


def write_scene(base: Path, layout: str = "checkout", marker: str = "") -> Path:
    """Write a fake microduck_rl checkout, package dir or bare scene under ``base``."""
    relative = {
        "checkout": assets.CHECKOUT_SCENE,
        "package": assets.PACKAGE_SCENE,
        "file": Path("my_scene.xml"),
    }[layout]
    scene = base / relative
    scene.parent.mkdir(parents=True, exist_ok=True)
    scene.write_text(duck_xml(marker=marker))
    return scene.resolve()


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No env vars, no installed package, and an embedded scene of the test's own."""
    monkeypatch.delenv(assets.ROOT_ENV_VAR, raising=False)
    monkeypatch.delenv(assets.URL_ENV_VAR, raising=False)
    monkeypatch.setattr(assets, "_installed_package_dir", lambda: None)
    embedded = write_scene(tmp_path / "embedded", "file")
    monkeypatch.setattr(assets, "EMBEDDED_SCENE", embedded)
    return embedded


# -- resolution ---------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["checkout", "package", "file"])
def test_explicit_root_accepts_each_form(tmp_path, isolated, layout):
    scene = write_scene(tmp_path / "given", layout)
    given = scene if layout == "file" else tmp_path / "given"
    assert assets.resolve_scene(given, root=tmp_path / "cache") == scene


def test_resolution_order(tmp_path, isolated, monkeypatch):
    explicit = write_scene(tmp_path / "explicit")
    from_env = write_scene(tmp_path / "env", "package")
    package = write_scene(tmp_path / "site" / "mjlab_microduck", "package")
    (package.parents[2] / "__init__.py").write_text("")
    cached = write_scene(assets.checkout_dir(tmp_path / "cache"))
    monkeypatch.setenv(assets.ROOT_ENV_VAR, str(tmp_path / "env"))
    monkeypatch.setattr(assets, "_installed_package_dir", _real_installed_package_dir)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    resolve = functools.partial(assets.resolve_scene, root=tmp_path / "cache")

    assert resolve(tmp_path / "explicit") == explicit
    assert resolve() == from_env
    monkeypatch.delenv(assets.ROOT_ENV_VAR)
    assert resolve() == package
    shutil.rmtree(tmp_path / "site")
    monkeypatch.setattr(assets, "_installed_package_dir", lambda: None)
    assert resolve() == cached
    shutil.rmtree(tmp_path / "cache")
    assert resolve() == isolated


def test_explicit_root_that_does_not_resolve_lists_every_place(tmp_path, isolated):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as info:
        assets.resolve_scene(missing, root=tmp_path / "cache")
    for relative in (assets.CHECKOUT_SCENE, assets.PACKAGE_SCENE, assets.SCENE_NAME):
        assert str(missing / relative) in str(info.value)


def test_bad_env_var_warns_then_falls_back(tmp_path, isolated, monkeypatch):
    monkeypatch.setenv(assets.ROOT_ENV_VAR, str(tmp_path / "nowhere"))
    with pytest.warns(UserWarning, match=assets.ROOT_ENV_VAR):
        assert assets.resolve_scene(root=tmp_path / "cache") == isolated


def test_nothing_found_lists_every_place(tmp_path, isolated, monkeypatch):
    monkeypatch.setenv(assets.ROOT_ENV_VAR, str(tmp_path / "env"))
    isolated.unlink()
    with pytest.raises(FileNotFoundError) as info, pytest.warns(UserWarning):
        assets.resolve_scene(root=tmp_path / "cache")
    message = str(info.value)
    assert str(tmp_path / "env" / assets.CHECKOUT_SCENE) in message
    assert str(assets.checkout_dir(tmp_path / "cache") / assets.CHECKOUT_SCENE) in message
    assert str(isolated) in message


@pytest.mark.parametrize("download", ["yes", "Force", 1, None])
def test_bad_download_value(download):
    with pytest.raises(ValueError, match="download must be True, False or 'force'"):
        assets.resolve_scene(download=download)


# -- download -----------------------------------------------------------------------


def checkout_zip(marker: str = "", with_scene: bool = True) -> bytes:
    """A GitHub-style archive: one ``microduck_rl-<commit>/`` directory."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        top = f"microduck_rl-{COMMIT}"
        zf.writestr(f"{top}/README.md", f"fake checkout {marker}")
        if with_scene:
            zf.writestr(f"{top}/{assets.CHECKOUT_SCENE.as_posix()}", duck_xml(marker=marker))
    return buffer.getvalue()


class ArchiveServer:
    """Serves ``files`` (URL path -> bytes) on 127.0.0.1 from a daemon thread."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            timeout = 10

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                server.requests.append(self.path)
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_port}{path}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def server(isolated, monkeypatch):
    """A mirror at ``/mirror/{commit}.zip``, named by the URL environment variable."""
    served = ArchiveServer()
    served.files[f"/mirror/{COMMIT}.zip"] = checkout_zip("v1")
    monkeypatch.setenv(assets.URL_ENV_VAR, served.url("/mirror/{commit}.zip"))
    monkeypatch.setattr(assets, "DOWNLOAD_TIMEOUT_S", 10.0)
    yield served
    served.stop()


def test_default_url_is_the_pinned_github_archive():
    assert assets.DEFAULT_URL.format(commit=COMMIT) == (
        "https://github.com/pollen-robotics/microduck_rl/archive/d424a0c899f6b33cbd3daeb279913134349c0b63.zip"
    )


def test_download_fetches_once_from_the_mirror(tmp_path, server):
    root = tmp_path / "cache"
    assert assets.resolve_scene(root=root) != assets.checkout_dir(root) / assets.CHECKOUT_SCENE
    assert server.requests == []

    scene = assets.resolve_scene(root=root, download=True)
    assert scene == (assets.checkout_dir(root) / assets.CHECKOUT_SCENE).resolve()
    assert server.requests == [f"/mirror/{COMMIT}.zip"]
    assert sorted(p.name for p in root.iterdir()) == [f"microduck_rl-{COMMIT}"]
    assets.check_model(assets.load_model(scene), source=scene)

    assert assets.resolve_scene(root=root, download=True) == scene
    assert len(server.requests) == 1


def test_force_fetches_again(tmp_path, server):
    root = tmp_path / "cache"
    scene = assets.resolve_scene(root=root, download=True)
    assert "fake_duckv1" in scene.read_text()
    server.files[f"/mirror/{COMMIT}.zip"] = checkout_zip("v2")
    assert assets.resolve_scene(root=root, download="force") == scene
    assert "fake_duckv2" in scene.read_text()
    assert len(server.requests) == 2
    assert sorted(p.name for p in root.iterdir()) == [f"microduck_rl-{COMMIT}"]


@pytest.mark.parametrize(
    "archive, error",
    [
        (None, ConnectionError),
        (b"not a zip", ConnectionError),
        (checkout_zip(with_scene=False), FileNotFoundError),
    ],
    ids=["http-404", "corrupt-zip", "no-scene"],
)
def test_failed_download_leaves_nothing(tmp_path, server, archive, error):
    if archive is None:
        server.files.clear()
    else:
        server.files[f"/mirror/{COMMIT}.zip"] = archive
    root = tmp_path / "cache"
    with pytest.raises(error):
        assets.resolve_scene(root=root, download=True)
    assert list(root.iterdir()) == []


def test_download_that_loses_the_race_keeps_the_winner(tmp_path, server, monkeypatch):
    root = tmp_path / "cache"
    target = assets.checkout_dir(root)
    real_archive_top = assets._archive_top

    def another_process_finishes_first(extracted):
        write_scene(target, marker="winner")
        return real_archive_top(extracted)

    monkeypatch.setattr(assets, "_archive_top", another_process_finishes_first)
    assert assets.download_microduck_rl(root, COMMIT) == target
    assert "fake_duckwinner" in (target / assets.CHECKOUT_SCENE).read_text()
    assert sorted(p.name for p in root.iterdir()) == [target.name]


def test_concurrent_downloads_agree(tmp_path, server):
    root = tmp_path / "cache"
    results, errors = [], []

    def fetch() -> None:
        try:
            results.append(assets.download_microduck_rl(root, COMMIT))
        except Exception as err:  # surfaced below
            errors.append(err)

    threads = [threading.Thread(target=fetch) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert results == [assets.checkout_dir(root)] * 4
    assert sorted(p.name for p in root.iterdir()) == [f"microduck_rl-{COMMIT}"]
    assert (assets.checkout_dir(root) / assets.CHECKOUT_SCENE).is_file()


# -- model checks -------------------------------------------------------------------


def test_check_model_accepts_the_layout():
    assets.check_model(mujoco.MjModel.from_xml_string(duck_xml()))


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        ({"foot_sites": FOOT_SITES[:1]}, FOOT_SITES[1]),
        ({"foot_geoms": ()}, FOOT_GEOMS[0]),
        ({"keyframe": False}, f"missing keyframe {STAND_KEYFRAME!r}"),
        ({"joints": JOINT_NAMES[:-1]}, f"missing [{JOINT_NAMES[-1]!r}]"),
        ({"joints": (*JOINT_NAMES, "tail")}, "unexpected ['tail']"),
        ({"joints": JOINT_NAMES[1::-1] + JOINT_NAMES[2:]}, "order is"),
    ],
    ids=["foot-site", "foot-geoms", "keyframe", "missing-joint", "extra-joint", "joint-order"],
)
def test_check_model_names_what_is_missing(kwargs, expected):
    model = mujoco.MjModel.from_xml_string(duck_xml(**kwargs))
    with pytest.raises(ValueError, match="MicroDuck layout") as info:
        assets.check_model(model, source="fake.xml")
    assert expected in str(info.value)
    assert "'fake.xml'" in str(info.value)


def binary_stl(low, high) -> bytes:
    """A closed box mesh from ``low`` to ``high``, as binary STL."""
    lo, hi = np.asarray(low, float), np.asarray(high, float)
    corner = lambda i: np.where([i & 1, i & 2, i & 4], hi, lo)  # noqa: E731
    quads = [(0, 2, 3, 1), (4, 5, 7, 6), (0, 1, 5, 4), (2, 6, 7, 3), (0, 4, 6, 2), (1, 3, 7, 5)]
    triangles = [t for a, b, c, d in quads for t in ((a, b, c), (a, c, d))]
    out = bytearray(80) + struct.pack("<I", len(triangles))
    for tri in triangles:
        out += struct.pack("<3f", 0, 0, 0)
        for i in tri:
            out += struct.pack("<3f", *corner(i))
        out += struct.pack("<H", 0)
    return bytes(out)


def test_upstream_layout_passes_the_checks(tmp_path):
    """The vendored upstream MJCF, with box placeholders for its absent meshes."""
    for name in ("robot_walk.xml", "scene_walk.xml"):
        shutil.copy(REFERENCE / name, tmp_path / name)
    spec = mujoco.MjSpec.from_file(str(tmp_path / "scene_walk.xml"))
    (tmp_path / "assets").mkdir()
    for mesh in spec.meshes:
        placeholder = binary_stl([0, 0, 0], [0.01, 0.02, 0.03])
        (tmp_path / "assets" / Path(mesh.file).name).write_bytes(placeholder)

    model = assets.load_model(tmp_path / "scene_walk.xml")
    assets.check_model(model)
    cheap = assets.load_model(tmp_path / "scene_walk.xml", low_cost_collisions=True)
    assets.check_model(cheap)
    for name in FOOT_GEOMS:
        assert model.geom(name).type == mujoco.mjtGeom.mjGEOM_MESH
        assert cheap.geom(name).type == mujoco.mjtGeom.mjGEOM_BOX
    np.testing.assert_allclose(cheap.body_mass, model.body_mass)


# A triangular prism: its principal axes are not the file's axes, so the
# compiler re-centres and rotates it, which the fitted box must undo.
PRISM = np.array(
    [
        [0.01, -0.02, 0.0],
        [0.07, -0.02, 0.0],
        [0.01, 0.01, 0.0],
        [0.01, -0.02, 0.02],
        [0.07, -0.02, 0.02],
        [0.01, 0.01, 0.02],
    ]
)
PRISM_OBJ = "".join(f"v {x} {y} {z}\n" for x, y, z in PRISM) + (
    "f 1 3 2\nf 4 5 6\nf 1 2 5\nf 1 5 4\nf 2 3 6\nf 2 6 5\nf 3 1 4\nf 3 4 6\n"
)
MESH_SCENE = """
<mujoco>
  <asset><mesh name="prism" file="prism.obj"/></asset>
  <worldbody>
    <geom name="floor" type="plane" size="1 1 .1"/>
    <body name="link" pos="0 0 .3" euler="0.1 0.2 0.3">
      <freejoint/>
      <geom name="visual" type="mesh" mesh="prism" contype="0" conaffinity="0" group="2"/>
      <frame pos="0.01 0 0" euler="0 0 0.4">
        <geom name="collision" type="mesh" mesh="prism" group="3"
              pos="0.02 0.01 -0.03" euler="0.3 -0.2 0.5"/>
      </frame>
      <geom name="self_only" type="mesh" mesh="prism" contype="2" conaffinity="2" pos="0 0.05 0"/>
      <geom name="ghost" type="mesh" mesh="prism" contype="0" conaffinity="0" group="3"
            pos="0 -0.05 0"/>
    </body>
  </worldbody>
</mujoco>
"""


def test_low_cost_collisions_fit_boxes_to_meshes(tmp_path):
    (tmp_path / "prism.obj").write_text(PRISM_OBJ)
    (tmp_path / "scene.xml").write_text(MESH_SCENE)
    exact = assets.load_model(tmp_path / "scene.xml")
    cheap = assets.load_model(tmp_path / "scene.xml", low_cost_collisions=True)

    assert exact.geom("visual").type == cheap.geom("visual").type == mujoco.mjtGeom.mjGEOM_MESH
    half_extent = (PRISM.max(0) - PRISM.min(0)) / 2
    for name in ("collision", "self_only", "ghost"):
        assert cheap.geom(name).type == mujoco.mjtGeom.mjGEOM_BOX, name
        np.testing.assert_allclose(cheap.geom(name).size, half_extent, atol=1e-6)
    np.testing.assert_allclose(cheap.body_mass, exact.body_mass, rtol=1e-6)
    np.testing.assert_allclose(cheap.body_inertia, exact.body_inertia, rtol=1e-6)

    # In the world, the box is exactly the mesh's bounding box in the box frame.
    exact_data, cheap_data = mujoco.MjData(exact), mujoco.MjData(cheap)
    mujoco.mj_forward(exact, exact_data)
    mujoco.mj_forward(cheap, cheap_data)
    for name in ("collision", "self_only"):
        mesh = exact.geom(name).dataid[0]
        start, count = exact.mesh_vertadr[mesh], exact.mesh_vertnum[mesh]
        geom = exact_data.geom(name)
        world = exact.mesh_vert[start : start + count] @ geom.xmat.reshape(3, 3).T + geom.xpos
        box = cheap_data.geom(name)
        local = (world - box.xpos) @ box.xmat.reshape(3, 3)
        np.testing.assert_allclose(local.max(0), half_extent, atol=1e-6)
        np.testing.assert_allclose(local.min(0), -half_extent, atol=1e-6)
