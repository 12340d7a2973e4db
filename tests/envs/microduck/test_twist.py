"""Twist commands (vx, vy, vyaw), the robot's action law and the seed's factories against TorchRL's env."""

from __future__ import annotations

import math
import re

import pytest
import torch
from tensordict import TensorDict

from waddle.envs.microduck import MicroDuckEnv
from waddle.envs.microduck.constants import JOINT_NAMES
from waddle.envs.microduck.rewards import step_air_time, yaw_rate
from waddle.envs.microduck.robot import DEFAULT_JOINT_POS
from waddle.envs.microduck.tasks import WALKING_PRIOR


def joystick_env(num_envs: int = 4, **task_overrides) -> MicroDuckEnv:
    task = MicroDuckEnv.joystick_task(**task_overrides)
    return MicroDuckEnv(tasks=[task], num_envs=num_envs, seed=0, action_mode="robot", action_scale=0.7)


def pinned(num_envs: int, command: tuple[float, float], yaw: float) -> TensorDict:
    return TensorDict(
        command=torch.tensor([command] * num_envs),
        yaw_rate_command=torch.full((num_envs, 1), yaw),
        batch_size=[num_envs],
    )


# ---------------------------------------------------------------------------
# Drawing and holding twists
# ---------------------------------------------------------------------------


def test_the_joystick_draw_has_its_shares_of_standing_and_turning_in_place():
    env = joystick_env(8192)
    td = env.reset()
    planar, yaw = td["command"], td["yaw_rate_command"].squeeze(-1)
    still = planar.abs().sum(-1) == 0
    standing = still & (yaw == 0)
    turning = still & (yaw != 0)
    # 10 % stand and 15 % turn in place: binomial standard errors are 0.3 and 0.4 points at 8192 draws.
    assert abs(standing.float().mean().item() - 0.10) < 0.015
    assert abs(turning.float().mean().item() - 0.15) < 0.02
    assert (yaw[turning].abs() >= 0.4 - 1e-6).all() and (yaw.abs() <= 1.0).all()  # 0.4 of the 1.0 rad/s range
    moving = ~still
    assert (planar[moving, 0].abs() <= 0.4).all() and (planar[moving, 1].abs() <= 0.3).all()
    assert planar[moving].abs().amax(0).tolist() > [0.35, 0.25]  # the whole box is drawn
    env.close()


def test_a_sidestep_share_steps_sideways_only_and_leaves_the_other_draws_as_they_were():
    plain, sidestepping = joystick_env(8192, sidestep_fraction=0.0), joystick_env(8192)
    before, after = plain.reset(), sidestepping.reset()
    planar, yaw = after["command"], after["yaw_rate_command"].squeeze(-1)
    changed = (planar != before["command"]).any(-1) | (yaw != before["yaw_rate_command"].squeeze(-1))
    sideways = (planar[:, 0] == 0) & (planar[:, 1] != 0) & (yaw == 0)
    # The preset's 15 % share sits above the 25 % that stand or turn: only draws of the box move into it.
    assert abs(sideways.float().mean().item() - 0.15) < 0.02  # standard error 0.4 points at 8192 draws
    assert torch.equal(changed, sideways)
    speed = planar[sideways, 1].abs()
    assert (speed >= 0.25 * 0.3 - 1e-6).all() and (speed <= 0.3 + 1e-6).all()  # 0.075-0.3 m/s of the 0.3 box
    assert abs((planar[sideways, 1] > 0).float().mean().item() - 0.5) < 0.05  # both ways
    plain.close()
    sidestepping.close()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"sidestep_fraction": 1.5}, "sidestep_fraction must be in [0, 1]"),
        ({"sidestep_fraction": 0.8}, "turn_in_place_fraction + sidestep_fraction + standing_fraction must be <= 1"),
    ],
)
def test_a_bad_sidestep_share_is_refused_by_name(overrides, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        joystick_env(2, **overrides)


def test_a_sidestep_share_needs_a_lateral_range():
    with pytest.raises(ValueError, match="sidestep_fraction > 0 needs a command box with a lateral"):
        MicroDuckEnv(tasks=[MicroDuckEnv.tracking_task(0.2, sidestep_fraction=0.1)], num_envs=2)


def test_a_pinned_twist_is_held_and_a_drawn_one_is_redrawn_within_the_episode():
    env = joystick_env(4, command_resample_s=(0.09, 0.09))  # a new twist after 5 control steps
    td = env.reset(pinned(4, (0.2, 0.0), 0.5))
    for _ in range(6):
        td = env.step(td.set("action", torch.zeros(4, 14)))["next"]
    torch.testing.assert_close(td["command"], torch.tensor([[0.2, 0.0]] * 4))
    torch.testing.assert_close(td["yaw_rate_command"], torch.full((4, 1), 0.5))
    td = env.reset()
    first = torch.cat([td["command"], td["yaw_rate_command"]], dim=-1)
    for _ in range(4):
        td = env.step(td.set("action", torch.zeros(4, 14)))["next"]
    torch.testing.assert_close(torch.cat([td["command"], td["yaw_rate_command"]], dim=-1), first)
    td = env.step(td.set("action", torch.zeros(4, 14)))["next"]
    after = torch.cat([td["command"], td["yaw_rate_command"]], dim=-1)
    assert (after != first).any(-1).all()  # every env has a new twist at 0.1 s
    # The new command turns from the heading the robot has when it comes.
    torch.testing.assert_close(env.commands.target_heading, env.heading())
    env.close()


def test_the_commanded_heading_turns_at_the_yaw_rate_command():
    env = joystick_env(2)
    td = env.reset(pinned(2, (0.0, 0.0), 0.5))
    start = env.heading().clone()
    for step in range(1, 11):
        td = env.step(td.set("action", torch.zeros(2, 14)))["next"]
        torch.testing.assert_close(env.commands.target_heading, start + 0.5 * 0.02 * step)
    state = TensorDict(qpos=env.physics.qpos.clone(), qvel=env.physics.qvel.clone(), batch_size=[2])
    features = env.reward_features(state, torch.zeros(2, 14))
    expected = torch.remainder(env.heading() - (start + 0.1) + math.pi, 2 * math.pi) - math.pi
    torch.testing.assert_close(features["heading_error"], expected)
    assert features["yaw_rate_command"].tolist() == [0.5, 0.5]
    env.close()


def test_the_stride_yaw_rate_is_the_headings_change_over_the_tracking_window():
    env = joystick_env(3)
    td = env.reset(pinned(3, (0.2, 0.0), 0.5))
    window = env._window_steps.clone()
    assert (window > 5).all()  # a gait cycle is longer than the 25 steps below only if this holds
    generator = torch.Generator().manual_seed(0)
    headings = [env.heading().clone()]
    for step in range(1, 26):
        action = torch.rand(3, 14, generator=generator) * 2.0 - 1.0
        td = env.step(td.set("action", action))["next"]
        headings.append(env.heading().clone())
        # Unwrapped by hand: each step's turn is small, so the wrapped difference is the turn.
        turns = torch.stack([torch.atan2((b - a).sin(), (b - a).cos()) for a, b in zip(headings, headings[1:])])
        span = torch.minimum(window, torch.tensor(step))
        expected = torch.stack([turns[step - int(k) : step, i].sum() for i, k in enumerate(span)]) / (span * 0.02)
        torch.testing.assert_close(env.tracking.yaw_rate, expected, atol=1e-4, rtol=1e-4)
        target = headings[0] + 0.5 * 0.02 * step
        error = torch.atan2((headings[-1] - target).sin(), (headings[-1] - target).cos())
        torch.testing.assert_close(td["heading_error"].squeeze(-1), error, atol=1e-5, rtol=0)
    assert env.tracking.yaw_rate.abs().max() > 0.05  # the random actions turned the trunk
    env.close()


def test_the_critic_of_a_robot_actor_reads_the_heading_error():
    from waddle.algorithms.ppo import critic_keys

    env = joystick_env(2)
    assert critic_keys(env, "robot_observation") == ["observation", "robot_observation", "heading_error"]
    assert critic_keys(env, "observation") == ["observation"]
    env.close()


@pytest.mark.parametrize(
    "entry, value, message",
    [
        ("yaw_rate_command", torch.full((2, 1), 1.5), r"outside the task's yaw_rate_range .* high=\[1.0, 1.0\]"),
        ("yaw_rate_command", torch.full((2, 3), 0.1), r"\(2, 1\) or \(2,\) tensor"),
        ("yaw_rate_command", torch.full((2, 1), math.nan), "finite"),
    ],
)
def test_a_bad_pinned_yaw_rate_is_refused_with_the_range(entry, value, message):
    env = joystick_env(2)
    with pytest.raises(ValueError, match=message):
        env.reset(TensorDict({entry: value}, batch_size=[2]))
    env.close()


# ---------------------------------------------------------------------------
# The robot's action law
# ---------------------------------------------------------------------------


def test_robot_actions_are_offsets_from_home_bounded_by_the_joint_ranges():
    env = joystick_env(1)
    assert env.default_joint_pos == DEFAULT_JOINT_POS
    home = torch.tensor(DEFAULT_JOINT_POS)
    stand = torch.tensor(env.model.key("STAND").ctrl, dtype=torch.float32)
    assert (home - stand).abs().argmax() == 6 and float(home[6] - stand[6]) == pytest.approx(2 * 0.3491, abs=1e-4)
    # The spec's bounds are where a target meets its joint's range: (range - HOME) / action_scale.
    joints = env.model.actuator_trnid[:, 0]
    low, high = (torch.tensor(column, dtype=torch.float32) for column in env.model.jnt_range[joints].T)
    torch.testing.assert_close(env.action_spec.space.low[0], (low - home) / 0.7)
    torch.testing.assert_close(env.action_spec.space.high[0], (high - home) / 0.7)
    assert float(env.action_spec.space.high[0, 1]) == pytest.approx((0.38397 + 0.0873) / 0.7, abs=1e-4)
    # Episodes start in the HOME pose.
    env.reset()
    torch.testing.assert_close(env.physics.qpos[0, 7:].float(), home, atol=0.021, rtol=0)
    env.close()


def test_the_seed_factories_simulate_what_torchrls_do():
    from torchrl.envs import MicroDuckEnv as TorchRLMicroDuckEnv

    scene = MicroDuckEnv.resolve_scene()
    observations = {}
    for name, prior in (("waddle", {}), ("waddle+prior", WALKING_PRIOR)):
        env = MicroDuckEnv(
            tasks=[MicroDuckEnv.tracking_task(0.2, joint_reset_noise_scale=0.0, **prior)],
            num_envs=1,
            reset_noise_scale=0.0,
            seed=0,
        )
        observations[name] = rollout(env)
    reference = TorchRLMicroDuckEnv(
        scene,
        backend="mujoco",
        num_envs=1,
        tasks=[TorchRLMicroDuckEnv.tracking_task(0.2, joint_reset_noise_scale=0.0)],
        reset_noise_scale=0.0,
    )
    observations["torchrl"] = rollout(reference)
    assert observations["torchrl"].shape == (40, 56)
    torch.testing.assert_close(observations["waddle"], observations["torchrl"], atol=1e-5, rtol=0)
    assert (observations["waddle+prior"] - observations["torchrl"]).abs().max() > 0.1  # the prior is what differed


def rollout(env) -> torch.Tensor:
    """40 steps of the same actions, in the action space, from the env's reset."""
    generator = torch.Generator().manual_seed(0)
    td = env.reset()
    rows = []
    for _ in range(40):
        action = (2 * torch.rand(1, 14, generator=generator) - 1).reshape(*td.batch_size, 14)
        td = env.step(td.set("action", action.to(td["observation"].dtype)))["next"]
        rows.append(td["observation"].reshape(-1).float())
    env.close()
    return torch.stack(rows)


# ---------------------------------------------------------------------------
# Reward terms of the twist
# ---------------------------------------------------------------------------


def features(**entries) -> dict[str, torch.Tensor]:
    base = {
        "body_velocity": torch.zeros(1, 3),
        "angular_velocity": torch.zeros(1, 3),
        "upright": torch.ones(1),
        "command": torch.zeros(1, 2),
        "yaw_rate_command": torch.zeros(1),
        "touchdown_air_time": torch.zeros(1, 2),
        "contacts": torch.ones(1, 2, dtype=torch.bool),
        "foot_heights": torch.zeros(1, 2),
        "gait_phase": torch.zeros(1),
    }
    base.update(entries)
    return base


PARAMS = {
    "yaw_rate_std": torch.tensor([0.3]),
    "air_time_min": torch.tensor([0.125]),
    "air_time_max": torch.tensor([0.3]),
    "gait_progress_floor": torch.tensor([0.25]),
}


def test_yaw_rate_tracks_the_yaw_rate_command():
    turning = features(angular_velocity=torch.tensor([[0.0, 0.0, 0.4]]), yaw_rate_command=torch.tensor([0.5]))
    torch.testing.assert_close(yaw_rate(turning, PARAMS), torch.tensor([math.exp(-((0.1 / 0.3) ** 2))]))
    # Without a command entry the term keeps its old meaning: a Gaussian of the yaw rate around zero.
    still = features(angular_velocity=torch.tensor([[0.0, 0.0, 0.4]]))
    del still["yaw_rate_command"]
    torch.testing.assert_close(yaw_rate(still, PARAMS), torch.tensor([math.exp(-((0.4 / 0.3) ** 2))]))


def test_step_air_time_pays_landings_by_how_much_of_the_twist_is_done():
    landing = torch.tensor([[0.2, 0.0]])  # 0.075 s past the 0.125 s minimum
    walking = features(
        touchdown_air_time=landing, command=torch.tensor([[0.2, 0.0]]), body_velocity=torch.tensor([[0.1, 0.0, 0.0]])
    )
    torch.testing.assert_close(step_air_time(walking, PARAMS), torch.tensor([0.075 * (0.25 + 0.75 * 0.5)]))
    turning = features(
        touchdown_air_time=landing,
        yaw_rate_command=torch.tensor([-0.5]),
        angular_velocity=torch.tensor([[0.0, 0.0, -0.5]]),
    )
    torch.testing.assert_close(step_air_time(turning, PARAMS), torch.tensor([0.075]))
    # Under a standing twist a landing pays nothing: stepping in place is not the standing optimum.
    assert step_air_time(features(touchdown_air_time=landing), PARAMS).item() == 0.0


def test_a_target_past_a_joints_range_is_costed_by_the_radians_it_overreaches():
    """The servo stops at the range the compiled model declares; the joystick recipe's cost pays for what the
    action asked past it, per radian and per second, and nothing for a target inside it (weighted -1 here, so
    the diagnostic is minus the radians times the control step)."""
    env = MicroDuckEnv(
        tasks=[MicroDuckEnv.joystick_task(reward_weights={"target_past_range": -1.0})],
        num_envs=3,
        seed=0,
        action_mode="robot",
        action_scale=0.7,
        diagnostics=True,
    )
    hip, knee = JOINT_NAMES.index("left_hip_roll"), JOINT_NAMES.index("right_knee")
    hip_low, hip_high = (float(x) for x in env.model.joint("left_hip_roll").range)
    knee_low = float(env.model.joint("right_knee").range[0])
    action = torch.zeros(3, 14)
    action[0, hip] = (hip_high + 0.3 - DEFAULT_JOINT_POS[hip]) / 0.7  # 0.3 rad past the top
    action[1, knee] = (knee_low - 0.2 - DEFAULT_JOINT_POS[knee]) / 0.7  # 0.2 rad under the bottom
    action[2, hip] = (0.5 * (hip_low + hip_high) - DEFAULT_JOINT_POS[hip]) / 0.7  # inside: free
    td = env.reset(pinned(3, (0.0, 0.0), 0.0))
    td = env.step(td.set("action", action))["next"]
    cost = td["diagnostic_reward_target_past_range"].squeeze(-1)
    torch.testing.assert_close(cost, torch.tensor([-0.3, -0.2, 0.0]) * 0.02, atol=1e-6, rtol=0)
    env.close()
