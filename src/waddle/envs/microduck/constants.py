"""Constants of the embedded MicroDuck model (``waddle/assets/microduck``)."""

from __future__ import annotations

from pathlib import Path

ASSET_DIR: Path = Path(__file__).resolve().parents[2] / "assets" / "microduck"
"""Folder holding ``microduck.xml`` (the robot) and ``scene.xml`` (robot, floor, keyframes)."""

EMBEDDED_SCENE: Path = ASSET_DIR / "scene.xml"
"""The MJCF file to load: the mesh-free robot on a flat floor."""

JOINT_NAMES: tuple[str, ...] = (
    "left_hip_yaw",
    "left_hip_roll",
    "left_hip_pitch",
    "left_knee",
    "left_ankle",
    "neck_pitch",
    "head_pitch",
    "head_yaw",
    "head_roll",
    "right_hip_yaw",
    "right_hip_roll",
    "right_hip_pitch",
    "right_knee",
    "right_ankle",
)
"""The actuated hinge joints in upstream order; actuator ``i`` drives joint ``i``, of the same name."""

NUM_JOINTS: int = 14
"""Number of actuated joints (and of position actuators)."""

LEFT_LEG: slice = slice(0, 5)
"""Left-leg joints within ``JOINT_NAMES`` (hip yaw, hip roll, hip pitch, knee, ankle)."""

HEAD: slice = slice(5, 9)
"""Neck and head joints within ``JOINT_NAMES`` (neck pitch, head pitch, head yaw, head roll)."""

RIGHT_LEG: slice = slice(9, 14)
"""Right-leg joints within ``JOINT_NAMES``, in the same order as ``LEFT_LEG``."""

ROOT_BODY: str = "trunk_base"
"""The floating base body; it carries the free joint ``trunk_base_freejoint``."""

HEAD_BODY: str = "jaw_soft"
"""The head's heaviest link (0.19 kg of the head's 0.28 kg): where the head's centre of mass is randomized."""

IMU_SITE: str = "imu"
"""Site of the trunk IMU, used by the orientation, gyro, velocimeter and accelerometer sensors."""

FOOT_SITES: tuple[str, str] = ("left_foot", "right_foot")
"""Sole-centre sites of the left and right foot."""

FOOT_GEOMS: tuple[str, str] = ("left_foot_collision", "right_foot_collision")
"""Collision boxes of the left and right sole."""

KEYFRAMES: tuple[str, ...] = ("INIT", "STAND", "SIT", "FOLD")
"""Keyframes in ``scene.xml``, in file order (copied from upstream ``scene_walk.xml``)."""

STAND_KEYFRAME: str = "STAND"
"""Keyframe with the robot standing on both feet, trunk at ``STANDING_HEIGHT``."""

TRACKING_CAMERA: str = "track"
"""Camera that follows the robot's centre of mass from the front-right, for videos."""

TIMESTEP: float = 0.002
"""Physics timestep of ``scene.xml``, in seconds."""

CONTROL_DT: float = 0.02
"""Control period in seconds (50 Hz, ``CONTROL_DT / TIMESTEP`` = 10 physics steps per action)."""

STANDING_HEIGHT: float = 0.12
"""Height of the ``trunk_base`` origin above the floor in the STAND keyframe, in metres."""

TOTAL_MASS: float = 0.737
"""Total robot mass in kg (sum of the reference inertials, 0.7372 kg)."""

# Gait prior patterns: joint offsets per radian of amplitude, in JOINT_NAMES order.
# Read off the model's kinematics (tests/envs/microduck/test_gait_prior.py checks
# them there): in the sagittal plane the sole stays level while
# hip_pitch - knee + ankle is constant, and the right leg's pitch axes point
# the other way from the left's.
SWING_LIFT_LEFT: tuple[float, ...] = (0, 0, 1, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0)
"""Shortens the left leg, sole level: about 5 cm of foot lift per radian."""

SWING_LIFT_RIGHT: tuple[float, ...] = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, -1, -2, -1)
"""Shortens the right leg, sole level: the mirror of :data:`SWING_LIFT_LEFT`."""

STRIDE: tuple[float, ...] = (0, 0, 1, 0, -1, 0, 0, 0, 0, 0, 0, 1, 0, -1)
"""Swings the left foot back and the right foot forward (about 7 cm per radian), soles level."""
