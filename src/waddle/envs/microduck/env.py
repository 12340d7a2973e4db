"""MicroDuckEnv: locomotion tasks (stand, walk, sidestep, turn, jump, get up) for the MicroDuck biped.

The env is one class; tasks are data (:class:`MicroDuckTask` rows of a
library, see ``tasks.py``) and the reward is a registry of named terms (see
``rewards.py``). Each env picks a row at reset and keeps it for the episode.

Observation (56 values, in this order; the ``*_START`` constants index it):

====================  ====  ===================================================
projected gravity       3   gravity direction in the trunk frame
angular velocity        3   free-joint angular velocity (trunk frame)
body velocity           3   free-joint linear velocity rotated into the trunk frame
command                 2   planar (vx, vy) command of the episode, m/s
joint error            14   joint positions minus the STAND keyframe
joint velocity         14   joint velocities
gait clock              3   sin, cos of the gait phase, and a 0->1 ramp after reset
previous action        14   the action applied by the last step
====================  ====  ===================================================

The action, in the default ``action_mode="residual"``, is a normalized
offset in ``[-1, 1]^14`` around the STAND actuator targets plus the task's
gait prior (zero unless the task sets one): ``ctrl = stand_ctrl + gait_prior
+ action_scale * action``, held for ``CONTROL_DT`` = 0.02 s (50 Hz, 10
physics substeps). Actions outside the action space are clipped to it, as the
bounded action spec says; with ``diagnostics=True`` the fraction of clipped
entries is reported. In both modes a servo target stops at its joint's range,
as the servos do (and as TorchRL's ``MicroDuckEnv`` does). With ``action_mode="robot"`` the env applies the
MicroDuck daemon's law instead: ``ctrl = DEFAULT_JOINT_POS + action_scale *
action`` around upstream's HOME pose (:mod:`~waddle.envs.microduck.robot`),
the gait prior only where the tasks have one (a training device, faded by
``gait_prior_scale``) and no clipping of the action; episodes
start in the HOME pose, and joint errors are measured from it.

Each env's command is a twist: the planar ``"command"`` ``(vx, vy)`` and
``"yaw_rate_command"`` ``(vyaw,)``, drawn at reset from the task's box and
yaw-rate range (zero unless the task turns) and, for tasks with
``command_resample_s``, drawn anew within the episode.

``"sensor_observation"`` (53 values, layout in
:data:`~waddle.envs.microduck.sensors.SENSOR_FIELDS`) is what the robot can
measure: IMU gravity and gyro, encoder positions and velocities, the command,
the gait clock and the previous action, with the noise and delays of the
env's :class:`~waddle.envs.microduck.randomization.MicroDuckRandomization`.
``"robot_observation"`` (61 values, layout in
:data:`~waddle.envs.microduck.robot.ROBOT_FIELDS`) is what the robot's own
daemon feeds its policy: gyro, gravity, joints from the default pose, joint
velocities one control step old, the previous raw action and the twist, with
the same sensor effects. ``"observation"`` stays noise-free ground truth (a
critic's input), as does ``"heading_error"``, the trunk's yaw off the heading
its commands integrate to (what ``heading_hold`` pays for and no sensor
of the robot measures); a randomized env reports each env's drawn values under
``("randomization", <name>)``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import mujoco
import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import Bounded, Categorical, Composite, Unbounded

from waddle.envs.microduck import assets, constants, gait, getup_reference, ground_contact, rewards
from waddle.envs.microduck import robot as robot_contract
from waddle.envs.microduck import tasks as presets
from waddle.envs.microduck.commands import TwistCommands, first
from waddle.envs.microduck.gait import GaitClock
from waddle.envs.microduck.lift_assist import LiftAssist, robot_weight
from waddle.envs.microduck.pushes import PushSchedule
from waddle.envs.microduck.randomization import (
    MicroDuckRandomization,
    ModelFields,
    draw_values,
    nominal_values,
    resolve_randomization,
    value_sizes,
)
from waddle.envs.microduck.sensing import Sensors, delay_line
from waddle.envs.microduck.sensors import SENSOR_DIM, SENSOR_FIELDS, SensorField
from waddle.envs.microduck.symmetry import MIRRORS, SignedPermutation
from waddle.envs.microduck.tasks import MicroDuckTask
from waddle.envs.microduck.tracking import TrackingWindow
from waddle.envs.mujoco_env import MujocoEnv
from waddle.envs.rotations import heading, multiply, projected_gravity, rotate, rotate_inverse, wrap_angle

ROBOT_NOISE_SEED_OFFSET = 0x5EED
"""The robot observation's noise has a generator of its own, seeded ``seed + ROBOT_NOISE_SEED_OFFSET``, so
that the env's other draws (tasks, commands, randomization, pushes) are the same with or without it."""

_REFUSED_KWARGS = ("xml_path", "patch_xml", "frame_skip")


class MicroDuckEnv(MujocoEnv):
    """Locomotion tasks for the MicroDuck biped on any physics backend.

    Args:
        microduck_root: a microduck_rl checkout, an ``mjlab_microduck``
            package directory or a scene XML. When omitted, the
            ``MICRODUCK_RL_ROOT`` variable, an installed ``mjlab_microduck``,
            a downloaded checkout under ``root`` and finally the embedded
            mesh-free model are tried (:meth:`resolve_scene`).

    Keyword Args:
        tasks: one :class:`MicroDuckTask`, a sequence of them, or a stacked
            library of shape ``(num_tasks,)``. Defaults to :meth:`tracking_task`.
        action_scale: position-target offset in radians of a unit action.
        action_mode: ``"residual"`` (the default: a clipped offset around the
            STAND pose plus the task's gait prior) or ``"robot"`` (the MicroDuck
            daemon's ``DEFAULT_JOINT_POS + action_scale * action``, unclipped;
            a gait prior, if the tasks have one, is added as in residual mode).
        gait_prior_scale: the share of the tasks' gait prior the env adds, >= 0
            (a curriculum fades it: ``waddle train --gait-prior-fade-steps``);
            settable later as the attribute of the same name.
        diagnostics: add every weighted reward term (``diagnostic_reward_<term>``,
            summing to the reward) and pose diagnostics to the observations.
        root: directory of downloaded microduck_rl checkouts.
        download: fetch the pinned microduck_rl commit into ``root`` when no
            other source resolves (``"force"`` re-fetches).
        backend: ``"mujoco"``, ``"mjx"`` or ``"mujoco-torch"``; ``None`` picks
            the best one for ``device`` (native MuJoCo on a CPU).
        low_cost_collisions: replace collision meshes by fitted boxes at load.
        limb_collisions: give the hips, thighs, shins, ankles and neck collision
            boxes (:mod:`~waddle.envs.microduck.ground_contact`), so a robot on the
            floor rests and pushes on its limbs. ``None`` (the default): only when
            a task can lie on the floor (``lying_start_fraction > 0`` or
            ``fall_terminates == 0``).
        max_episode_steps: truncation horizon, at least 1.
        randomization: a :class:`~waddle.envs.microduck.randomization.MicroDuckRandomization`,
            a preset name (``"none"``, the default: the idealized robot, nothing
            drawn; ``"upstream"``: the microduck_rl
            training's ranges) or a mapping of ranges over ``"none"``. Model
            parameters need ``backend="mujoco"`` or ``backend="mjx"`` without
            ``requires_grad``.
        sensor_history: frames of the sensor layout in ``"sensor_observation"``,
            newest first: frame ``k`` (values ``53k .. 53k + 52``) is what the
            robot read ``k`` control steps ago, and a reset fills every frame
            with the first reading. 1 (the default) is the single 53-value frame.
        **kwargs: forwarded to :class:`~waddle.envs.mujoco_env.MujocoEnv`:
            ``num_envs``, ``device``, ``seed``, ``reset_noise_scale``,
            ``from_pixels``, ``render_width``, ``render_height``,
            ``camera_id``, ``dtype``, ``requires_grad``, backend options.

    Example:
        >>> env = MicroDuckEnv(num_envs=4, seed=0)
        >>> rollout = env.rollout(10)
        >>> rollout["observation"].shape
        torch.Size([4, 10, 56])
    """

    NUM_JOINTS: ClassVar[int] = constants.NUM_JOINTS
    FOOT_GEOMS: ClassVar[tuple[str, str]] = constants.FOOT_GEOMS
    FOOT_SITES: ClassVar[tuple[str, str]] = constants.FOOT_SITES
    PROJECTED_GRAVITY_START: ClassVar[int] = 0
    ANGULAR_VELOCITY_START: ClassVar[int] = 3
    BODY_VELOCITY_START: ClassVar[int] = 6
    """Index of the body-frame linear velocity ``(vx, vy, vz)`` in the observation."""
    COMMAND_START: ClassVar[int] = 9
    """Index of the planar command ``(vx, vy)`` in the observation."""
    JOINT_ERROR_START: ClassVar[int] = 11
    JOINT_VELOCITY_START: ClassVar[int] = JOINT_ERROR_START + NUM_JOINTS
    GAIT_PHASE_START: ClassVar[int] = JOINT_VELOCITY_START + NUM_JOINTS
    """Index of the gait clock ``(sin, cos, ramp)`` in the observation."""
    PREVIOUS_ACTION_START: ClassVar[int] = GAIT_PHASE_START + 3
    OBSERVATION_DIM: ClassVar[int] = PREVIOUS_ACTION_START + NUM_JOINTS
    SENSOR_DIM: ClassVar[int] = SENSOR_DIM
    """Width of ``"sensor_observation"``."""
    SENSOR_FIELDS: ClassVar[dict[str, SensorField]] = SENSOR_FIELDS
    """The sensor observation's fields (indices, units) by name."""
    ROBOT_OBSERVATION_DIM: ClassVar[int] = robot_contract.ROBOT_OBSERVATION_DIM
    """Width of ``"robot_observation"``, the robot daemon's policy input."""
    ROBOT_FIELDS: ClassVar[dict[str, SensorField]] = robot_contract.ROBOT_FIELDS
    """The robot observation's fields (indices, units) by name, in the daemon's order."""
    ACTION_MODES: ClassVar[tuple[str, ...]] = ("residual", "robot")
    """``action_mode`` names: offsets around STAND plus the gait prior, clipped to [-1, 1]; or the robot's law."""
    MIRRORS: ClassVar[dict[str, SignedPermutation]] = MIRRORS
    """The left-right reflection of ``"observation"``, ``"sensor_observation"`` and ``"action"``
    (see :mod:`~waddle.envs.microduck.symmetry`; PPO's mirror loss reads it)."""
    HEADING_MEMORY: ClassVar[dict[str, dict[str, float]]] = {"robot_observation": robot_contract.HEADING_MEMORY_LAYOUT}
    """Where an actor's heading memory lives, per observation it reads (``PPOConfig.heading_memory_s``)."""
    SKIP_QPOS: ClassVar[int] = 0
    COMMAND_THRESHOLD: ClassVar[float] = presets.COMMAND_THRESHOLD
    """Planar command speed under which a task counts as standing."""
    GAIT_PHASE_OFFSET: ClassVar[float] = gait.PHASE_OFFSET
    """Phase of the gait clock at the first step, in radians."""
    GAIT_RAMP_DURATION_S: ClassVar[float] = gait.RAMP_DURATION_S
    """Seconds over which the gait ramp feature grows from 0 to 1 after a reset."""
    GAIT_TERMS: ClassVar[tuple[str, ...]] = rewards.GAIT_TERMS
    MIN_HEIGHT_RATIO: ClassVar[float] = 0.55
    """A trunk lower than this fraction of the standing height has fallen."""
    MIN_UPRIGHT: ClassVar[float] = 0.35
    """A trunk whose tilt cosine is below this has fallen (about 70 degrees)."""
    STANDING_UPRIGHT: ClassVar[float] = 0.9
    """A trunk whose tilt cosine (minus projected gravity's z) is above this is upright again (about 26
    degrees): what the robot's runtime reads as standing, and what a task that goes on after a fall pays on."""
    STANDING_TRUNK_HEIGHT: ClassVar[float] = 0.1
    """Trunk height, m, at or above which an upright robot with a foot on the floor stands (:meth:`standing`)."""
    REWARD_TERMS: ClassVar[dict[str, rewards.RewardTerm]] = rewards.REWARD_TERMS
    """Registered reward terms by name, in weight-vector order."""
    REWARD_PARAMS: ClassVar[dict[str, float]] = rewards.REWARD_PARAMS
    """Default value of every term parameter a :class:`MicroDuckTask` carries."""
    ROOT_ENV_VAR: ClassVar[str] = assets.ROOT_ENV_VAR
    MICRODUCK_RL_COMMIT: ClassVar[str] = assets.MICRODUCK_RL_COMMIT
    RENDER_BACKGROUND: ClassVar[tuple[float, float, float] | None] = None
    POSE_DIAGNOSTICS: ClassVar[tuple[str, ...]] = (
        "height",
        "upright",
        "body_velocity_x",
        "body_velocity_y",
        "body_velocity_z",
        "action_saturation_fraction",
        "left_foot_contact",
        "right_foot_contact",
        "left_foot_height",
        "right_foot_height",
    )

    # Task presets and the reward registry live in their own modules; the
    # classmethods keep the reference API (``MicroDuckEnv.tracking_task(...)``).
    tracking_task = staticmethod(presets.tracking_task)
    standing_task = staticmethod(presets.standing_task)
    speed_range_task = staticmethod(presets.speed_range_task)
    sidestep_task = staticmethod(presets.sidestep_task)
    joystick_task = staticmethod(presets.joystick_task)
    getup_task = staticmethod(presets.getup_task)
    joystick_getup_task = staticmethod(presets.joystick_getup_task)
    jump_task = staticmethod(presets.jump_task)
    make_task = staticmethod(presets.make_task)
    register_reward = staticmethod(rewards.register_reward)

    def __init__(
        self,
        microduck_root: str | Path | None = None,
        *,
        tasks: MicroDuckTask | Sequence[MicroDuckTask] | None = None,
        action_scale: float = 0.35,
        action_mode: str = "residual",
        gait_prior_scale: float = 1.0,
        diagnostics: bool = False,
        root: str | Path | None = None,
        download: bool | str = False,
        backend: str | None = None,
        low_cost_collisions: bool = True,
        limb_collisions: bool | None = None,
        max_episode_steps: int = 500,
        randomization: MicroDuckRandomization | str | Mapping[str, Any] | None = "none",
        sensor_history: int = 1,
        **kwargs: Any,
    ) -> None:
        refused = [name for name in _REFUSED_KWARGS if name in kwargs]
        if refused:
            raise TypeError(f"MicroDuckEnv does not accept {refused}: the model and control rate are fixed.")
        if not isinstance(action_scale, (int, float)) or not math.isfinite(action_scale) or action_scale <= 0:
            raise ValueError(f"action_scale must be a finite number > 0, got {action_scale!r}.")
        if isinstance(max_episode_steps, bool) or not isinstance(max_episode_steps, int) or max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be an integer >= 1, got {max_episode_steps!r}.")
        if isinstance(sensor_history, bool) or not isinstance(sensor_history, int) or sensor_history < 1:
            raise ValueError(f"sensor_history must be an integer >= 1 (frames), got {sensor_history!r}.")
        if action_mode not in self.ACTION_MODES:
            raise ValueError(f"action_mode must be one of {self.ACTION_MODES}, got {action_mode!r}.")
        self.action_mode = action_mode
        if isinstance(gait_prior_scale, bool) or not isinstance(gait_prior_scale, (int, float)):
            raise ValueError(f"gait_prior_scale must be a number >= 0, got {gait_prior_scale!r}.")
        if not (math.isfinite(gait_prior_scale) and gait_prior_scale >= 0):
            raise ValueError(f"gait_prior_scale must be a finite number >= 0, got {gait_prior_scale!r}.")
        self.gait_prior_scale = float(gait_prior_scale)
        self.sensor_history = sensor_history
        if sensor_history > 1:
            self.MIRRORS = {**MIRRORS, "sensor_observation": MIRRORS["sensor_observation"].tiled(sensor_history)}
        self.randomization = resolve_randomization(randomization)
        self.scene_path = self.resolve_scene(microduck_root, root=root, download=download)
        spec = assets.load_spec(self.scene_path, low_cost_collisions=low_cost_collisions)
        library = presets.as_task_library(presets.tracking_task() if tasks is None else tasks)
        # Libraries that never start on the floor draw nothing for it; one that can lie down needs the limbs.
        self._lying = bool((library.lying_start_fraction > 0).any())
        self._recovers = bool((library.fall_terminates == 0).any())
        if limb_collisions is None:
            limb_collisions = self._lying or self._recovers
        if not isinstance(limb_collisions, bool):
            raise ValueError(
                f"limb_collisions must be True, False or None (as the tasks need), got {limb_collisions!r}."
            )
        self.limb_collisions = limb_collisions
        if limb_collisions:
            ground_contact.add_limb_collisions(spec)
        kwargs.setdefault("camera_id", constants.TRACKING_CAMERA)
        super().__init__(
            spec,
            frame_skip=round(constants.CONTROL_DT / spec.option.timestep),
            backend=backend,
            site_names=self.FOOT_SITES,
            contact_geom_names=self.FOOT_GEOMS,
            **kwargs,
        )
        assets.check_model(self.model)
        if not hasattr(self, "_robot_rng"):  # unseeded: the robot observation's noise is unseeded too
            self._robot_rng = torch.Generator(device=self.rng.device)
            self._robot_rng.seed()
        self._check_backend_randomizes()
        self.action_scale = float(action_scale)
        self.diagnostics = bool(diagnostics)
        self.max_episode_steps = max_episode_steps
        self.tasks = library.to(self.device)
        self._has_prior = bool(((self.tasks.gait_prior_lift > 0) | (self.tasks.gait_prior_stride_per_mps > 0)).any())
        # Libraries that never turn, share or redraw commands draw nothing for them.
        self._varied_commands = bool(
            (self.tasks.yaw_rate_range != 0).any()
            or (self.tasks.turn_in_place_fraction > 0).any()
            or (self.tasks.sidestep_fraction > 0).any()
            or (self.tasks.standing_fraction > 0).any()
            or (self.tasks.command_resample_s > 0).any()
        )
        self._paid_only_upright = torch.tensor(
            [name != "getup" for name in self.REWARD_TERMS], dtype=torch.bool, device=self.device
        )
        # Rows are gathered per env at every reset, from one packed matrix.
        self._task_table = presets.TaskTable(self.tasks)
        self._configure_from_model()
        self._reference_states = self._reference_trajectories() if self._lying else None
        self._allocate_episode_state()
        self._allocate_tracking_window()
        self._allocate_randomization_state()
        self._make_specs()

    # ------------------------------------------------------------------
    # Construction
    # ------------------------------------------------------------------

    @staticmethod
    def resolve_scene(
        microduck_root: str | Path | None = None,
        *,
        root: str | Path | None = None,
        download: bool | str = False,
    ) -> Path:
        """Locate the MicroDuck scene XML; see :func:`waddle.envs.microduck.assets.resolve_scene`."""
        return assets.resolve_scene(microduck_root, root=root, download=download)

    def _check_backend_randomizes(self) -> None:
        varied = self.randomization.model_parameters
        if not varied or self.physics.per_env_models:
            return
        grad = " with requires_grad=True" if self.requires_grad else ""
        self.physics.close()
        raise ValueError(
            f"randomization varies model parameters {varied} per env, which backend={self.backend!r}{grad} "
            "cannot simulate. Use backend='mujoco' (CPU) or backend='mjx' with requires_grad=False, or keep "
            "those ranges nominal: joint_offset, imu_tilt, pushes, delays and noise work on every backend."
        )

    def _reference_trajectories(self) -> torch.Tensor | None:
        """``(len(LYING_STARTS), steps, nq + nv)``: the states along each side's scripted get-up on the nominal
        model, for the reference starts; ``None`` when no task asks for them."""
        if not bool((self.tasks.reference_start_fraction > 0).any()):
            return None
        home = np.asarray(robot_contract.DEFAULT_JOINT_POS)
        scripted = {
            side: getup_reference.reference_trajectory(self.model, side, home) for side in getup_reference.GETUP_SCRIPTS
        }
        unscripted = np.zeros_like(next(iter(scripted.values())))  # never drawn: _scripted_sides masks it
        self._scripted_sides = torch.tensor([side in scripted for side in presets.LYING_STARTS], device=self.device)
        states = np.stack([scripted.get(side, unscripted) for side in presets.LYING_STARTS])
        return torch.as_tensor(states, dtype=self.dtype, device=self.device)

    def _configure_from_model(self) -> None:
        model = self.model
        key = model.key(constants.STAND_KEYFRAME)
        as_tensor = lambda array: torch.as_tensor(array.copy(), dtype=self.dtype, device=self.device)  # noqa: E731
        self._home_qpos = as_tensor(key.qpos)
        self._home_ctrl = as_tensor(key.ctrl)
        self.default_joint_pos: tuple[float, ...] = tuple(float(value) for value in key.ctrl)
        """The servo targets a zero action holds (before any gait prior), joint order: STAND's, or with
        ``action_mode="robot"`` the robot's HOME pose, to full precision."""
        if self.action_mode == "robot":
            # The robot's default pose: episodes start in it and the actions are offsets from it.
            self.default_joint_pos = robot_contract.DEFAULT_JOINT_POS
            pose = torch.tensor(self.default_joint_pos, dtype=self.dtype, device=self.device)
            self._home_qpos[7:] = pose
            self._home_ctrl = pose.clone()
        # A servo goes no further than its joint's range (a joint without one: half a turn either way).
        joints = model.actuator_trnid[:, 0]
        limited = torch.as_tensor(model.jnt_limited[joints].copy(), device=self.device).bool()
        ranges = as_tensor(model.jnt_range[joints])
        self._target_low = torch.where(limited, ranges[:, 0], self._home_ctrl - math.pi)
        self._target_high = torch.where(limited, ranges[:, 1], self._home_ctrl + math.pi)
        self._standing_height = float(key.qpos[2])
        self._standing_heights = torch.full(
            (self.num_envs,), self._standing_height, dtype=self.dtype, device=self.device
        )

    def _allocate_episode_state(self) -> None:
        n, j = self.num_envs, self.NUM_JOINTS
        zeros = lambda *shape, dtype=self.dtype: torch.zeros(*shape, dtype=dtype, device=self.device)  # noqa: E731
        self._task_id = zeros(n, dtype=torch.long)
        self.gait = GaitClock(n, control_dt=self.control_dt, dtype=self.dtype, device=self.device)
        """Each env's gait clock and the gait prior on it (:class:`~waddle.envs.microduck.gait.GaitClock`)."""
        self.commands = TwistCommands(
            n, control_dt=self.control_dt, varies=self._varied_commands, dtype=self.dtype, device=self.device
        )
        """Each env's twist command, its redraw timer and the heading it commands
        (:class:`~waddle.envs.microduck.commands.TwistCommands`)."""
        self._adopt_episodes()
        self._step_count = zeros(n, dtype=torch.long)
        self._previous_action = zeros(n, j)
        self._contacts = zeros(n, 2, dtype=torch.bool)
        self._foot_heights = zeros(n, 2)
        self._air_time = zeros(n, 2)
        self._touchdown_air_time = zeros(n, 2)

    def _allocate_tracking_window(self) -> None:
        # The clock is slowest at zero command, which bounds every env's window.
        cycles = self.tasks.params["tracking_window_cycles"]
        longest = (cycles / (self.tasks.gait_frequency_hz * self.control_dt)).round().max()
        self.tracking = TrackingWindow(
            self.num_envs,
            int(longest) if bool((cycles > 0).any()) else None,
            control_dt=self.control_dt,
            dtype=self.dtype,
            device=self.device,
        )
        """The velocity and yaw rate each env's command is tracked against
        (:class:`~waddle.envs.microduck.tracking.TrackingWindow`)."""

    def _allocate_randomization_state(self) -> None:
        config, n = self.randomization, self.num_envs
        model = self.model
        root = model.body(constants.ROOT_BODY).id
        self._num_links = int(sum(model.body_rootid[b] == root for b in range(model.nbody)))
        # Float64 so that nominal model values reach the simulator unrounded.
        self._model_fields = (
            ModelFields(model, dtype=torch.float64, device=self.device) if config.varies_model else None
        )
        self._random_values = nominal_values(n, self._num_links, dtype=self.dtype, device=self.device)
        # The IMU's axes in the trunk frame: its site's orientation, then the drawn mounting tilt.
        imu = model.site(constants.IMU_SITE)
        site_rotation = np.empty(9)
        mujoco.mju_quat2Mat(site_rotation, model.site_quat[imu.id])
        imu_site_rotation = torch.as_tensor(site_rotation.reshape(3, 3), dtype=self.dtype, device=self.device)
        self.sensors = Sensors(
            n,
            config,
            imu_site_rotation,
            sensor_history=self.sensor_history,
            num_joints=self.NUM_JOINTS,
            dtype=self.dtype,
            device=self.device,
        )
        """What the IMU and encoders read, and the observations built from them
        (:class:`~waddle.envs.microduck.sensing.Sensors`)."""
        self._action_line = delay_line(n, self.NUM_JOINTS, config.action_delay[1], dtype=self.dtype, device=self.device)
        self.pushes = PushSchedule(n, config, control_dt=self.control_dt, dtype=self.dtype, device=self.device)
        """Each env's push timer and the kicks it deals (:class:`~waddle.envs.microduck.pushes.PushSchedule`)."""
        self._lift = LiftAssist(
            num_envs=n,
            nbody=model.nbody,
            trunk=root,
            weight=robot_weight(model),
            dtype=self.dtype,
            device=self.device,
        )

    def _make_specs(self) -> None:
        n = self.num_envs
        num_tasks = self.tasks.shape[0]
        task_id_spec = Bounded(0, num_tasks - 1, shape=(n, 1), dtype=torch.int64, device=self.device)
        command_spec = Unbounded(shape=(n, 2), dtype=self.dtype, device=self.device)
        yaw_rate_spec = Unbounded(shape=(n, 1), dtype=self.dtype, device=self.device)
        observation = {
            "observation": Unbounded(shape=(n, self.OBSERVATION_DIM), dtype=self.dtype, device=self.device),
            "sensor_observation": Unbounded(
                shape=(n, self.sensor_history * SENSOR_DIM), dtype=self.dtype, device=self.device
            ),
            "robot_observation": Unbounded(shape=(n, self.ROBOT_OBSERVATION_DIM), dtype=self.dtype, device=self.device),
            "command": command_spec.clone(),
            "yaw_rate_command": yaw_rate_spec.clone(),
            "heading_error": Unbounded(shape=(n, 1), dtype=self.dtype, device=self.device),
            "task_id": task_id_spec.clone(),
        }
        if self.from_pixels:
            observation["pixels"] = Bounded(
                0, 255, shape=(n, self.render_height, self.render_width, 3), dtype=torch.uint8, device=self.device
            )
        if self.diagnostics:
            for key in self._diagnostic_keys():
                observation[key] = Unbounded(shape=(n, 1), dtype=self.dtype, device=self.device)
        if self.randomization.active:
            values = {
                name: Unbounded(shape=(n, size), dtype=self.dtype, device=self.device)
                for name, size in value_sizes(self._num_links).items()
            }
            observation["randomization"] = Composite(values, shape=(n,))
        self.observation_spec = Composite(observation, shape=(n,))
        self.state_spec = Composite(
            task_id=task_id_spec, command=command_spec, yaw_rate_command=yaw_rate_spec, shape=(n,)
        )
        self.action_spec = self._make_action_spec()
        self.reward_spec = Unbounded(shape=(n, 1), dtype=self.dtype, device=self.device)
        done = Categorical(2, shape=(n, 1), dtype=torch.bool, device=self.device)
        self.done_spec = Composite(done=done, terminated=done.clone(), truncated=done.clone(), shape=(n,))

    def _make_action_spec(self) -> Bounded:
        """``[-1, 1]^14`` for residual actions; for robot actions, the servos' ranges around the
        default pose, in action units: the only bounds the robot has."""
        n, j = self.num_envs, self.NUM_JOINTS
        if self.action_mode != "robot":
            return Bounded(-1.0, 1.0, shape=(n, j), dtype=self.dtype, device=self.device)
        low = (self._target_low - self._home_ctrl) / self.action_scale
        high = (self._target_high - self._home_ctrl) / self.action_scale
        return Bounded(low.expand(n, j), high.expand(n, j), shape=(n, j), dtype=self.dtype, device=self.device)

    def _diagnostic_keys(self) -> list[str]:
        return [f"diagnostic_reward_{name}" for name in self.REWARD_TERMS] + [
            f"diagnostic_{name}" for name in self.POSE_DIAGNOSTICS
        ]

    def detach_state(self) -> None:
        """Cut the autograd history of the simulator state and of what the env carries between steps.

        Besides the physics state, the previous action (observed, and penalised
        by ``action_rate``) and the foot heights (read by the swing terms) come
        from the last step's graph; a new truncated-BPTT segment must not
        reach back through them.
        """
        super().detach_state()
        self._previous_action = self._previous_action.detach()
        self._foot_heights = self._foot_heights.detach()
        self.tracking.detach()
        self.sensors.detach()
        if self._action_line is not None:
            self._action_line.detach()

    def _set_seed(self, seed: int | None) -> None:
        if seed is None:
            seed = int(torch.empty((), dtype=torch.int64).random_().item())
        super()._set_seed(seed)
        if not hasattr(self, "_robot_rng"):
            self._robot_rng = torch.Generator(device=self.rng.device)
        self._robot_rng.manual_seed(int(seed) + ROBOT_NOISE_SEED_OFFSET)

    # ------------------------------------------------------------------
    # Robot readings
    # ------------------------------------------------------------------

    def foot_contacts(self) -> torch.Tensor:
        """A ``(num_envs, 2)`` bool tensor: left/right sole touching something."""
        return self.physics.contacts()

    def foot_heights(self) -> torch.Tensor:
        """A ``(num_envs, 2)`` tensor of the left/right foot site heights."""
        return self.physics.site_positions()[..., 2].to(self.dtype)

    def base_height(self) -> torch.Tensor:
        """A ``(num_envs,)`` tensor of trunk (free-joint) heights in metres."""
        return self.physics.qpos[:, 2].to(self.dtype)

    @property
    def adds_gait_prior(self) -> bool:
        """Whether a step adds a gait prior to the policy's action (a task has one and its scale is not 0)."""
        return self._has_prior and self.gait_prior_scale > 0

    @property
    def standing_height(self) -> float:
        """Trunk height of the STAND keyframe, metres: what hop heights are measured from."""
        return self._standing_height

    @property
    def lift_assist(self) -> float:
        """The share of the robot's nominal weight held up at every robot's trunk, in [0, 1]
        (:mod:`~waddle.envs.microduck.lift_assist`): a get-up curriculum's helping hand, 0 (no force) unless a
        training run sets it."""
        return self._lift.share

    @lift_assist.setter
    def lift_assist(self, share: float) -> None:
        previous = self._lift.share
        self._lift.share = share
        if not self.physics.applies_forces:
            if self._lift.active:
                self._lift.share = previous
                raise ValueError(
                    f"lift_assist needs a backend that applies forces to bodies; the {self.physics.name!r} "
                    "backend does not: use backend='mujoco'."
                )
        else:  # held over every step until the share changes
            self.physics.apply_forces(self._lift.forces() if self._lift.active else None)

    def heading(self) -> torch.Tensor:
        """A ``(num_envs,)`` tensor of trunk yaw angles in radians, in ``(-pi, pi]``."""
        return heading(self.physics.qpos[:, 3:7].to(self.dtype))

    def fallen(self) -> torch.Tensor:
        """A ``(num_envs,)`` bool tensor: the trunk is down (tilted past ``MIN_UPRIGHT`` or lower than
        ``MIN_HEIGHT_RATIO`` of the standing height), the state that ends an episode whose task says so."""
        return self._fallen(self._read_state(self.physics.qpos.to(self.dtype), self.physics.qvel.to(self.dtype)))

    def standing(self) -> torch.Tensor:
        """A ``(num_envs,)`` bool tensor: the robot stands, its trunk upright (cosine above
        ``STANDING_UPRIGHT``), at least ``STANDING_TRUNK_HEIGHT`` up, and a sole on the floor (a robot that
        swings level in mid-air while it drops does not stand)."""
        upright = -projected_gravity(self.physics.qpos[:, 3:7].to(self.dtype))[:, 2]
        high = self.base_height() >= self.STANDING_TRUNK_HEIGHT
        return (upright > self.STANDING_UPRIGHT) & high & self.foot_contacts().any(-1)

    def _adopt_episodes(self) -> None:
        """Derive what each env's task and command fix for the episode: its task row, reward
        params and gait clock frequency (Hz)."""
        self._episode_task = task = self._task_table[self._task_id]
        self._episode_params = task["params"]
        self.gait.adopt(task, self.commands.command)
        cycles = self._episode_params["tracking_window_cycles"]
        steps = (cycles / (self.gait.frequency * self.control_dt)).round().clamp_min(1.0)
        self._window_steps = torch.where(cycles > 0, steps, torch.zeros_like(steps)).long()

    def gait_prior(self, step_count: torch.Tensor | None = None) -> torch.Tensor:
        """The ``(num_envs, 14)`` actuator-target offset the task's gait prior adds this step (or at tick
        ``step_count``, per env).

        An open-loop stepping pattern on the gait clock that the policy's action
        corrects (a residual policy), :meth:`GaitClock.prior
        <waddle.envs.microduck.gait.GaitClock.prior>` at ``gait_prior_scale``.
        The phase and command are in the observation, so the policy sees
        everything the prior depends on.
        """
        steps = self._step_count if step_count is None else step_count
        return self.gait.prior(self._episode_task, self.commands.command, steps, self.gait_prior_scale)

    def _read_state(self, qpos: torch.Tensor, qvel: torch.Tensor) -> dict[str, torch.Tensor]:
        """What the observation, the sensors, the reward features and the diagnostics share, computed once."""
        quaternion = qpos[:, 3:7]
        phase, ramp = self.gait.read(self._step_count)
        return {
            "qpos": qpos,
            "qvel": qvel,
            "quaternion": quaternion,
            "heading": heading(quaternion),
            "gravity": projected_gravity(quaternion),
            "body_velocity": rotate_inverse(quaternion, qvel[:, :3]),
            "joint_error": qpos[:, 7:] - self._home_qpos[7:],
            "phase": phase,
            "clock": torch.stack([phase.sin(), phase.cos(), ramp], dim=-1),
        }

    def _observation(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        qvel = state["qvel"]
        return torch.cat(
            [
                state["gravity"],
                qvel[:, 3:6],
                state["body_velocity"],
                self.commands.command,
                state["joint_error"],
                qvel[:, 6:],
                state["clock"],
                self._previous_action,
            ],
            dim=-1,
        )

    def _fallen(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        upright = -state["gravity"][:, 2]
        return (state["qpos"][:, 2] < self.MIN_HEIGHT_RATIO * self._standing_height) | (upright < self.MIN_UPRIGHT)

    # ------------------------------------------------------------------
    # Reset
    # ------------------------------------------------------------------

    def _reset(self, tensordict: TensorDictBase | None = None, **kwargs) -> TensorDictBase:
        mask = None
        if tensordict is not None and "_reset" in tensordict.keys():
            mask = tensordict["_reset"].reshape(self.num_envs).to(self.device, torch.bool)
        rows = torch.ones(self.num_envs, dtype=torch.bool, device=self.device) if mask is None else mask

        task_id = self._draw_task_id(tensordict, rows)
        episode_task = self._task_table[task_id]
        command, yaw_rate = self.commands.draw(tensordict, episode_task, rows, self.rng)
        qpos, qvel = self._initial_state(episode_task, command)
        self._draw_randomization(rows)
        self.physics.reset(qpos, qvel, mask)

        column = rows.unsqueeze(-1)
        self._task_id = torch.where(rows, task_id, self._task_id)
        pinned = tensordict is not None and ("command" in tensordict.keys() or "yaw_rate_command" in tensordict.keys())
        self.commands.begin(rows, command, yaw_rate, episode_task, pinned=pinned, generator=self.rng)
        self._adopt_episodes()
        self._step_count = torch.where(rows, torch.zeros_like(self._step_count), self._step_count)
        self._previous_action = torch.where(column, torch.zeros_like(self._previous_action), self._previous_action)
        self._air_time = torch.where(column, torch.zeros_like(self._air_time), self._air_time)
        self._touchdown_air_time = torch.where(column, torch.zeros_like(self._air_time), self._touchdown_air_time)
        self._contacts = self.foot_contacts()
        self._foot_heights = self.foot_heights()
        state = self._read_state(self.physics.qpos, self.physics.qvel)
        self.commands.aim(rows, state["heading"])
        self.tracking.reset(rows, state["qpos"], state["heading"])

        out = self._observation_dict(state, reset_rows=rows)
        if self.diagnostics:
            zeros = torch.zeros(self.num_envs, len(self.REWARD_TERMS), dtype=self.dtype, device=self.device)
            out.update(self._diagnostics(state, zeros, torch.zeros_like(self._previous_action)))
        false = torch.zeros(self.num_envs, 1, dtype=torch.bool, device=self.device)
        out.update(done=false, terminated=false.clone(), truncated=false.clone())
        return TensorDict(out, batch_size=self.batch_size, device=self.device)

    def _draw_randomization(self, rows: torch.Tensor) -> None:
        """Draw every reset env's randomized values and hand the model parameters to the backend."""
        config = self.randomization
        if self._action_line is not None:
            self._action_line.fill(self._home_ctrl.expand(self.num_envs, -1), rows)
        if not config.active:
            return
        drawn = draw_values(config, self.num_envs, self._num_links, self.rng, dtype=self.dtype, device=self.device)
        column = rows.unsqueeze(-1)
        values = {name: torch.where(column, value, self._random_values[name]) for name, value in drawn.items()}
        self._random_values = values
        if self._model_fields is not None:
            as_double = {name: value.to(torch.float64) for name, value in values.items()}
            self.physics.set_model_fields(self._model_fields.fields(as_double), rows)
        self.sensors.adopt(values, rows)
        if self._action_line is not None:
            self._action_line.set_delay(values["action_delay"].squeeze(-1), rows)
        if config.pushes:
            self.pushes.begin(rows, self.rng)

    def _push(self) -> None:
        """Kick the trunk of each env whose push timer ran out."""
        pushed = self.pushes.tick(self.rng)
        if pushed is None:
            return
        due, kick = pushed
        qvel = self.physics.qvel.to(self.dtype).clone()
        qvel[:, :2] += kick
        self.physics.set_qvel(qvel, due)

    def _draw_task_id(self, tensordict: TensorDictBase | None, rows: torch.Tensor) -> torch.Tensor:
        num_tasks = self.tasks.shape[0]
        if tensordict is not None and "task_id" in tensordict.keys():
            task_id = tensordict["task_id"].to(self.device)
            if task_id.shape == (self.num_envs, 1):
                task_id = task_id.squeeze(-1)
            if task_id.shape != (self.num_envs,) or task_id.is_floating_point() or task_id.dtype == torch.bool:
                raise ValueError(
                    f"task_id at reset must be an integer tensor of shape ({self.num_envs},) or "
                    f"({self.num_envs}, 1); got {task_id.dtype} of shape {tuple(task_id.shape)}."
                )
            task_id = task_id.long()
            outside = rows & ((task_id < 0) | (task_id >= num_tasks))
            if outside.any():
                raise ValueError(
                    f"task_id at reset must index the library of {num_tasks} tasks (0..{num_tasks - 1}); "
                    f"got {first(task_id[outside].tolist())}."
                )
            return torch.where(rows, task_id, self._task_id)
        return torch.multinomial(self.tasks.weight, self.num_envs, replacement=True, generator=self.rng)

    def _uniform(self, *shape: int) -> torch.Tensor:
        """Uniform samples in [-1, 1) from the env's generator."""
        return 2.0 * torch.rand(*shape, generator=self.rng, device=self.device, dtype=self.dtype) - 1.0

    def _initial_state(
        self, episode_task: Mapping[str, Any], command: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.num_envs
        qpos = self._home_qpos.expand(n, -1).clone()
        qvel = torch.zeros(n, self.physics.nv, dtype=self.dtype, device=self.device)
        if self.reset_noise_scale > 0:
            qpos[:, :2] += self.reset_noise_scale * self._uniform(n, 2)
            qvel += self.reset_noise_scale * self._uniform(n, self.physics.nv)
        qpos[:, 7:] += episode_task["joint_reset_noise_scale"].unsqueeze(-1) * self._uniform(n, self.NUM_JOINTS)

        # Warm start: a fraction of the moving tasks' envs start already moving
        # along the command, so walking is seen before it is discovered.
        speed_low, speed_high = episode_task["warm_start_velocity"].unbind(-1)
        speed = speed_low + torch.rand(n, generator=self.rng, device=self.device, dtype=self.dtype) * (
            speed_high - speed_low
        )
        planar_speed = command.norm(dim=-1)
        warm = (
            torch.rand(n, generator=self.rng, device=self.device, dtype=self.dtype)
            < episode_task["warm_start_fraction"]
        )
        warm &= planar_speed > self.COMMAND_THRESHOLD
        direction_body = torch.nn.functional.pad(command / planar_speed.clamp_min(1e-8).unsqueeze(-1), (0, 1))
        velocity_world = speed.unsqueeze(-1) * rotate(qpos[:, 3:7], direction_body)
        qvel[:, :3] = torch.where(warm.unsqueeze(-1), velocity_world, qvel[:, :3])
        if self._lying:
            lying = torch.rand(n, generator=self.rng, device=self.device, dtype=self.dtype)
            lying = lying < episode_task["lying_start_fraction"]
            drop, side, turn = self._lying_qpos(episode_task["lying_start_side"])
            lying_qvel = torch.zeros_like(qvel)
            if self._reference_states is not None:
                drop, lying_qvel = self._reference_starts(episode_task, side, turn, drop, lying_qvel)
            qpos = torch.where(lying.unsqueeze(-1), drop, qpos)
            qvel = torch.where(lying.unsqueeze(-1), lying_qvel, qvel)
        return qpos, qvel

    def _reference_starts(
        self,
        episode_task: Mapping[str, Any],
        side: torch.Tensor,
        turn: torch.Tensor,
        qpos: torch.Tensor,
        qvel: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``qpos`` and ``qvel`` with ``reference_start_fraction`` of the envs moved to a state drawn uniformly
        along ``side``'s scripted get-up (where that side has a script), turned by ``turn`` about the
        vertical and centred on the env's origin (the free joint's angular velocity is in the trunk's frame:
        it needs no turn)."""
        n, nq = self.num_envs, self.physics.nq
        states = self._reference_states
        step = torch.randint(states.shape[1], (n,), generator=self.rng, device=self.device)
        chosen = torch.rand(n, generator=self.rng, device=self.device, dtype=self.dtype)
        chosen = ((chosen < episode_task["reference_start_fraction"]) & self._scripted_sides[side]).unsqueeze(-1)
        state = states[side, step]
        ref_qpos, ref_qvel = state[:, :nq].clone(), state[:, nq:].clone()
        ref_qpos[:, :2] = self._home_qpos[:2]
        ref_qpos[:, 3:7] = multiply(turn, ref_qpos[:, 3:7])
        ref_qvel[:, :3] = rotate(turn, ref_qvel[:, :3])
        return torch.where(chosen, ref_qpos, qpos), torch.where(chosen, ref_qvel, qvel)

    def _lying_qpos(self, side: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Positions of a drop onto the floor: the trunk at ``LYING_DROP_HEIGHT`` turned onto ``side`` (an index
        of ``LYING_STARTS``, -1: drawn) at a drawn heading, each joint at a uniform angle within its range;
        with the side (drawn where -1) and the heading's quaternion."""
        n = self.num_envs
        draw = torch.randint(len(presets.LYING_STARTS), (n,), generator=self.rng, device=self.device)
        side = torch.where(side < 0, draw, side.long())
        yaw = math.pi * self._uniform(n)
        unit = torch.rand(n, self.NUM_JOINTS, generator=self.rng, device=self.device, dtype=self.dtype)
        joints = self._target_low + unit * (self._target_high - self._target_low)
        tilts = torch.tensor(
            [presets.LYING_TILTS[name] for name in presets.LYING_STARTS], dtype=self.dtype, device=self.device
        )[side]
        turn = torch.stack([(yaw / 2).cos(), torch.zeros_like(yaw), torch.zeros_like(yaw), (yaw / 2).sin()], dim=-1)
        qpos = self._home_qpos.expand(n, -1).clone()
        qpos[:, 2] = presets.LYING_DROP_HEIGHT
        qpos[:, 3:7] = multiply(turn, tilts)
        qpos[:, 7:] = joints
        return qpos, side, turn

    # ------------------------------------------------------------------
    # Step
    # ------------------------------------------------------------------

    def _step(self, tensordict: TensorDictBase) -> TensorDictBase:
        action = self._checked_action(tensordict["action"])
        clipped = action if self.action_mode == "robot" else action.clamp(-1.0, 1.0)
        target, past_range = self._servo_targets(clipped, self._step_count)
        if self._action_line is not None:
            target = self._action_line.push(target)
        if self.randomization.active:
            # The servo drives its biased encoder reading to the target, so the joint settles off by the bias.
            target = target - self.sensors.joint_offset
            if self.randomization.pushes:
                self._push()
        self.physics.step(target)
        qpos, qvel = self.physics.qpos, self.physics.qvel
        nonfinite = ~torch.isfinite(torch.cat((qpos, qvel), dim=-1)).all(-1) | self.physics.diverged
        if nonfinite.any():
            # Keep the batch finite: the broken envs report the home pose and
            # are terminated, so they are reset before anyone reads them again.
            home_qvel = torch.zeros_like(qvel)
            qpos = torch.where(nonfinite.unsqueeze(-1), self._home_qpos.expand_as(qpos), qpos)
            qvel = torch.where(nonfinite.unsqueeze(-1), home_qvel, qvel)

        self._step_count = self._step_count + 1
        self._update_contacts(nonfinite)
        state = self._read_state(qpos, qvel)
        self.commands.turn()
        self.tracking.advance(state, self._window_steps, self._step_count)
        features = self._reward_features(state, clipped, past_range)
        features["fallen"] = features["fallen"] | nonfinite
        features.update(rewards.derived_features(features))
        weighted = rewards.weighted_terms(
            rewards.evaluate_terms(features, self._episode_params),
            self._episode_task["reward_weights"],
            self.control_dt,
        )
        terminated = features["fallen"] & (self._episode_task["fall_terminates"] > 0)
        if self._recovers:
            not_up = features["fallen"] | (features["upright"] <= self.STANDING_UPRIGHT)
            weighted = self._unpaid_until_upright(weighted, not_up & ~terminated)
        truncated = self._step_count >= self.max_episode_steps
        self._previous_action = clipped
        if self.commands.redraw_due(self._episode_task, state["heading"], self.rng):
            self._adopt_episodes()

        out = self._observation_dict(state)
        if self.diagnostics:
            out.update(self._diagnostics(state, weighted, action))
        out.update(
            reward=weighted.sum(-1, keepdim=True),
            terminated=terminated.unsqueeze(-1),
            truncated=truncated.unsqueeze(-1),
            done=(terminated | truncated).unsqueeze(-1),
        )
        return TensorDict(out, batch_size=self.batch_size, device=self.device)

    def _unpaid_until_upright(self, weighted: torch.Tensor, not_up: torch.Tensor) -> torch.Tensor:
        """``weighted`` with the positive shares of every term but ``getup`` zeroed for the envs ``not_up``
        (down, or tilted past ``STANDING_UPRIGHT``): a robot that lies still, or props itself half up on
        its belly, earns only the ``getup`` term's share of the way up; its penalties stand."""
        unpaid = (weighted > 0) & not_up.unsqueeze(-1) & self._paid_only_upright
        return torch.where(unpaid, torch.zeros_like(weighted), weighted)

    def _checked_action(self, action: torch.Tensor) -> torch.Tensor:
        expected = (self.num_envs, self.NUM_JOINTS)
        if tuple(action.shape) != expected:
            raise ValueError(f"action must have shape {expected}, got {tuple(action.shape)}.")
        if not action.is_floating_point():
            raise ValueError(f"action must be a floating tensor of shape {expected}, got dtype {action.dtype}.")
        if not torch.isfinite(action).all():
            bad = (~torch.isfinite(action)).any(-1).nonzero().flatten().tolist()
            raise ValueError(f"action of shape {expected} has non-finite entries in envs {first(bad)}.")
        return action.to(self.dtype)

    def _update_contacts(self, nonfinite: torch.Tensor) -> None:
        """Advance the per-foot air-time bookkeeping after a physics step."""
        contacts = self.foot_contacts() & ~nonfinite.unsqueeze(-1)
        landed = contacts & (self._air_time > 0)
        self._touchdown_air_time = torch.where(landed, self._air_time, torch.zeros_like(self._air_time))
        self._air_time = torch.where(contacts, torch.zeros_like(self._air_time), self._air_time + self.control_dt)
        self._contacts = contacts
        heights = self.foot_heights()
        self._foot_heights = torch.where(nonfinite.unsqueeze(-1), torch.zeros_like(heights), heights)

    def reward_features(self, state: Mapping[str, torch.Tensor], action: torch.Tensor) -> dict[str, torch.Tensor]:
        """The per-step features every reward term reads, as a dict of ``(num_envs, ...)`` tensors.

        ``state`` holds ``qpos`` and ``qvel`` after the step and ``action`` is
        the normalized action that led there; contacts, air times, the
        tracked velocity of a tracking window and the previous action come
        from the env's current bookkeeping. See
        :func:`waddle.envs.microduck.rewards.register_reward` for the entries.
        """
        qpos, qvel = state["qpos"].to(self.dtype), state["qvel"].to(self.dtype)
        action = action.to(self.dtype)
        # The step that led to ``state`` added the prior of the tick before the count moved on.
        _, past_range = self._servo_targets(action, (self._step_count - 1).clamp_min(0))
        return self._reward_features(self._read_state(qpos, qvel), action, past_range)

    def _servo_targets(self, action: torch.Tensor, step_count: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The servo targets ``action`` sets at tick ``step_count``, stopped at the joints' ranges, and the
        radians by which the asked targets lay past those ranges (0 within them)."""
        asked = self._home_ctrl + self.action_scale * action
        if self.action_mode != "robot" or self.adds_gait_prior:
            asked = asked + self.gait_prior(step_count)
        target = asked.clamp(self._target_low, self._target_high)
        return target, (asked - target).abs()

    def _reward_features(
        self, state: dict[str, torch.Tensor], action: torch.Tensor, target_past_range: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        qvel = state["qvel"]
        return {
            "body_velocity": state["body_velocity"],
            "angular_velocity": qvel[:, 3:6],
            "upright": (-state["gravity"][:, 2]).clamp(-1.0, 1.0),
            "base_height": state["qpos"][:, 2],
            "standing_height": self._standing_heights,
            "joint_error": state["joint_error"],
            "joint_velocity": qvel[:, 6:],
            "action": action.to(self.dtype),
            "target_past_range": target_past_range,
            "previous_action": self._previous_action,
            "contacts": self._contacts,
            "foot_heights": self._foot_heights,
            "touchdown_air_time": self._touchdown_air_time,
            "gait_phase": state["phase"],
            "heading_error": wrap_angle(state["heading"] - self.commands.target_heading),
            "command": self.commands.command,
            "yaw_rate_command": self.commands.yaw_rate,
            "tracked_velocity": self.tracking.velocity if self.tracking.keeps_ring else state["body_velocity"][:, :2],
            "tracked_yaw_rate": self.tracking.yaw_rate,
            "fallen": self._fallen(state),
        }

    def _observation_dict(
        self, state: dict[str, torch.Tensor], reset_rows: torch.Tensor | None = None
    ) -> dict[str, torch.Tensor]:
        sensors, command, previous_action = self.sensors, self.commands.command, self._previous_action
        readings = sensors.read(state, self._home_qpos[7:], reset_rows)
        out = {
            "observation": self._observation(state),
            "sensor_observation": sensors.sensor_observation(
                readings, command, previous_action, self._uniform, reset_rows
            ),
            "robot_observation": sensors.robot_observation(
                readings, command, self.commands.yaw_rate, previous_action, self._robot_rng
            ),
            "command": self.commands.command.clone(),
            "yaw_rate_command": self.commands.yaw_rate.unsqueeze(-1).clone(),
            "heading_error": wrap_angle(state["heading"] - self.commands.target_heading).unsqueeze(-1),
            "task_id": self._task_id.unsqueeze(-1).clone(),
        }
        if self.randomization.active:
            out["randomization"] = TensorDict(self._random_values, batch_size=self.batch_size, device=self.device)
        if self.from_pixels:
            out["pixels"] = self.render()
        return out

    def _diagnostics(
        self, state: dict[str, torch.Tensor], weighted: torch.Tensor, action: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        out = {f"diagnostic_reward_{name}": weighted[:, i : i + 1] for i, name in enumerate(self.REWARD_TERMS)}
        body_velocity = state["body_velocity"]
        pose = {
            "height": state["qpos"][:, 2],
            "upright": -state["gravity"][:, 2],
            "body_velocity_x": body_velocity[:, 0],
            "body_velocity_y": body_velocity[:, 1],
            "body_velocity_z": body_velocity[:, 2],
            "action_saturation_fraction": (action.abs() > 1.0).to(self.dtype).mean(-1),
            "left_foot_contact": self._contacts[:, 0].to(self.dtype),
            "right_foot_contact": self._contacts[:, 1].to(self.dtype),
            "left_foot_height": self._foot_heights[:, 0],
            "right_foot_height": self._foot_heights[:, 1],
        }
        out.update({f"diagnostic_{name}": value.unsqueeze(-1) for name, value in pose.items()})
        return out
