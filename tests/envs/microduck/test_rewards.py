"""MicroDuck reward terms against values worked by hand, and the registry's behaviour.

Every built-in term is evaluated on a crafted feature TensorDict; the comment
above each expected value is the hand computation, with the default
parameters unless a test overrides them.
"""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from waddle.envs.microduck.rewards import (
    GAIT_TERMS,
    REWARD_PARAMS,
    REWARD_TERMS,
    derived_features,
    evaluate_terms,
    register_reward,
    weighted_terms,
)

BUILT_IN_TERMS = {
    # name: (default weight, per_second), as on the reference page
    "tracking": (2.0, True),
    "yaw_rate": (1.0, True),
    "upright": (2.0, True),
    "pose": (1.0, True),
    "progress": (2.0, True),
    "air_time": (3.0, True),
    "step_air_time": (0.0, True),
    "single_support": (0.0, True),
    "swing_lift": (0.0, True),
    "swing_height": (2.0, True),
    "phase_contact": (3.0, True),
    "double_support": (-1.0, True),
    "ang_vel_xy": (-0.05, True),
    "lin_vel_z": (-2.0, True),
    "action_rate": (-0.1, True),
    "joint_velocity": (-0.001, True),
    "drift": (0.0, True),
    "hop_rhythm": (0.0, True),
    "launch": (0.0, True),
    "jump": (0.0, True),
    "jump_height": (0.0, True),
    "heading_hold": (0.0, True),
    "termination": (-4.0, False),
    "stride_yaw_rate": (0.0, True),
    "getup": (0.0, True),
    "target_past_range": (0.0, True),
}

BUILT_IN_PARAMS = {
    "air_time_max": 0.3,
    "air_time_min": 0.125,
    "drift_speed_scale": 0.3,
    "gait_progress_floor": 0.5,
    "heading_hold_std": 0.5,
    "hop_velocity_amplitude": 0.1,
    "jump_height_scale": 0.03,
    "jump_target_height": 0.005,
    "launch_velocity_scale": 0.5,
    "stride_yaw_rate_std": 0.15,
    "getup_lying_height": 0.05,
    "pose_std": 0.5,
    "progress_off_axis_std": 0.0,
    "progress_overspeed": 0.0,
    "swing_target_height": 0.02,
    "tracking_off_axis_std": 0.05,
    "tracking_relative_std": 0.0,
    "tracking_std": 0.1,
    "tracking_window_cycles": 0.0,
    "upright_std": 0.05**0.5,
    "yaw_rate_std": 0.5**0.5,
}

STANDING_HEIGHT = 0.15


# Tests here register reward terms; the registry is restored after each one.
pytestmark = pytest.mark.usefixtures("restore_reward_registry")


def make_features(n: int = 1, **entries) -> TensorDict:
    """A standing, upright, motionless robot on both feet under a zero command; ``entries`` override."""
    default = {
        "body_velocity": torch.zeros(n, 3),
        "angular_velocity": torch.zeros(n, 3),
        "upright": torch.ones(n),
        "base_height": torch.full((n,), STANDING_HEIGHT),
        "standing_height": torch.full((n,), STANDING_HEIGHT),
        "joint_error": torch.zeros(n, 14),
        "joint_velocity": torch.zeros(n, 14),
        "action": torch.zeros(n, 14),
        "previous_action": torch.zeros(n, 14),
        "contacts": torch.ones(n, 2, dtype=torch.bool),
        "foot_heights": torch.zeros(n, 2),
        "touchdown_air_time": torch.zeros(n, 2),
        "gait_phase": torch.zeros(n),
        "heading_error": torch.zeros(n),
        "command": torch.zeros(n, 2),
        "fallen": torch.zeros(n, dtype=torch.bool),
    }
    for key, value in entries.items():
        dtype = torch.bool if key in ("contacts", "fallen") else torch.float32
        default[key] = torch.as_tensor(value, dtype=dtype).reshape(default[key].shape)
    return TensorDict(default, batch_size=[n])


def make_params(n: int = 1, **overrides: float) -> TensorDict:
    values = {**REWARD_PARAMS, **overrides}
    return TensorDict({key: torch.full((n,), float(value)) for key, value in values.items()}, batch_size=[n])


def term(name: str, features: TensorDict, **params: float) -> torch.Tensor:
    return REWARD_TERMS[name].fn(features, make_params(features.batch_size[0], **params))


def assert_values(actual: torch.Tensor, expected: list[float]) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------
# Registry contents
# ---------------------------------------------------------------------------


def test_built_in_terms_weights_and_order():
    assert list(REWARD_TERMS) == list(BUILT_IN_TERMS)
    assert {name: (t.weight, t.per_second) for name, t in REWARD_TERMS.items()} == BUILT_IN_TERMS
    assert "heading" not in REWARD_TERMS  # the reference page's example term, not a built-in


def test_built_in_params_defaults():
    assert REWARD_PARAMS == pytest.approx(BUILT_IN_PARAMS)
    assert set(REWARD_PARAMS) == set(BUILT_IN_PARAMS)


def test_heading_hold_by_hand():
    features = make_features(3, heading_error=[0.0, 0.5, -1.0])
    # exp(-e^2 / 0.5^2): 1, exp(-1), exp(-4); the sign of the turn does not matter.
    assert_values(term("heading_hold", features), [1.0, math.exp(-1.0), math.exp(-4.0)])
    assert_values(term("heading_hold", features, heading_hold_std=1.0), [1.0, math.exp(-0.25), math.exp(-1.0)])


def test_gait_terms():
    assert GAIT_TERMS == ("air_time", "swing_height", "phase_contact", "double_support")


# ---------------------------------------------------------------------------
# Built-in terms, by hand
# ---------------------------------------------------------------------------


def test_tracking():
    features = make_features(
        4,
        command=[[0.2, 0.0], [0.0, 0.0], [0.0, 0.15], [0.2, 0.0]],
        body_velocity=[[0.25, 0.02, 0.0], [0.03, 0.04, 0.0], [0.02, 0.15, 0.0], [0.2, 0.05, 0.0]],
    )
    assert_values(
        term("tracking", features),
        [
            # forward 0.2: error (0.05, 0.02), along 0.05, across 0.02:
            # exp(-(0.05^2 / 0.1^2 + 0.02^2 / 0.05^2)) = exp(-(0.25 + 0.16)) = exp(-0.41)
            math.exp(-0.41),
            # standing: no axis, isotropic: exp(-(0.03^2 + 0.04^2) / 0.1^2) = exp(-0.25)
            math.exp(-0.25),
            # sidestep 0.15 to the left: forward drift 0.02 is across: exp(-0.02^2 / 0.05^2) = exp(-0.16)
            math.exp(-0.16),
            # forward 0.2, lateral error 0.05 across: exp(-0.05^2 / 0.05^2) = exp(-1)
            math.exp(-1.0),
        ],
    )


def test_tracking_reads_the_tracked_velocity_when_given():
    body = [[0.32, 0.07, 0.01], [0.05, -0.06, 0.0]]
    command = [[0.2, 0.0], [0.2, 0.0]]
    tracked = make_features(2, command=command, body_velocity=body)
    tracked["tracked_velocity"] = torch.tensor([[0.2, 0.0], [0.25, 0.05]])
    # stride-averaged (0.2, 0): no error, exp(0) = 1; (0.25, 0.05): along 0.05, across 0.05:
    # exp(-(0.05^2 / 0.1^2 + 0.05^2 / 0.05^2)) = exp(-1.25)
    assert_values(term("tracking", tracked), [1.0, math.exp(-1.25)])
    # progress and the gait gate read the instantaneous velocity: 0.32 / 0.2 clipped to 1, 0.05 / 0.2 = 0.25;
    # double support pays 0.5 + 0.5 * clip(ratio, 0, 1) = 1 and 0.625
    assert_values(term("progress", tracked), [1.0, 0.25])
    assert_values(term("double_support", tracked), [1.0, 0.625])
    # without the entry the instantaneous body velocity is tracked:
    # along 0.12, across 0.07: exp(-(1.44 + 1.96)) = exp(-3.4); along -0.15, across 0.06: exp(-(2.25 + 1.44))
    instantaneous = make_features(2, command=command, body_velocity=body)
    assert_values(term("tracking", instantaneous), [math.exp(-3.4), math.exp(-3.69)])
    assert_values(term("progress", instantaneous), [1.0, 0.25])


def test_tracking_relative_width_scales_with_the_command():
    features = make_features(
        4,
        command=[[0.1, 0.0], [0.3, 0.0], [0.0, 0.0], [0.1, 0.0]],
        body_velocity=[[0.135, 0.0, 0.0], [0.27, 0.0, 0.0], [0.03, 0.04, 0.0], [0.1, 0.05, 0.0]],
    )
    paid = term("tracking", features, tracking_std=0.025, tracking_relative_std=0.25)
    assert_values(
        paid,
        [
            # 0.035 over 0.1: width max(0.025, 0.025) = 0.025: exp(-(0.035 / 0.025)^2) = exp(-1.96)
            math.exp(-1.96),
            # 0.03 under 0.3: width max(0.025, 0.075) = 0.075: exp(-(0.03 / 0.075)^2) = exp(-0.16)
            math.exp(-0.16),
            # standing: isotropic at the floor width 0.025: exp(-(0.03^2 + 0.04^2) / 0.025^2) = exp(-4)
            math.exp(-4.0),
            # across stays at tracking_off_axis_std 0.05: exp(-0.05^2 / 0.05^2) = exp(-1)
            math.exp(-1.0),
        ],
    )
    # relative 0 leaves the fixed width: 0.035 over 0.1 with 0.1 wide: exp(-0.1225)
    assert_values(term("tracking", features)[:1], [math.exp(-0.1225)])


def test_tracking_is_tighter_across_the_command_than_along_it():
    features = make_features(2, command=[[0.2, 0.0], [0.2, 0.0]], body_velocity=[[0.25, 0, 0], [0.2, 0.05, 0]])
    along, across = term("tracking", features)
    # exp(-0.25) along versus exp(-1) across for the same 0.05 m/s error
    assert along > across


def test_yaw_rate():
    features = make_features(2, angular_velocity=[[0.0, 0.0, 0.5], [3.0, 3.0, 0.0]])
    # exp(-0.5^2 / 0.5) = exp(-0.5); roll and pitch rates are ignored: exp(0) = 1
    assert_values(term("yaw_rate", features), [math.exp(-0.5), 1.0])


def test_stride_yaw_rate_reads_the_tracked_yaw_rate_against_the_command():
    features = make_features(3, angular_velocity=[[0.0, 0.0, 2.0]] * 3)
    features["tracked_yaw_rate"] = torch.tensor([0.0, 0.15, -0.3])
    features["yaw_rate_command"] = torch.tensor([0.0, 0.0, 0.0])
    # exp(-e^2 / 0.15^2) of the stride's yaw rate: the instantaneous 2 rad/s twist is not read.
    assert_values(term("stride_yaw_rate", features), [1.0, math.exp(-1.0), math.exp(-4.0)])
    features["yaw_rate_command"] = torch.tensor([0.5, 0.15, -0.3])
    assert_values(term("stride_yaw_rate", features), [math.exp(-((0.5 / 0.15) ** 2)), 1.0, 1.0])
    # Without the entry the term falls back to the instantaneous yaw rate: 2 rad/s off a zero command.
    del features["tracked_yaw_rate"], features["yaw_rate_command"]
    assert_values(term("stride_yaw_rate", features, stride_yaw_rate_std=2.0), [math.exp(-1.0)] * 3)


def test_getup_pays_for_the_way_up_and_nothing_for_lying():
    # Standing height 0.12, lying height 0.05: the height fraction is (h - 0.05) / 0.07.
    features = make_features(
        5,
        upright=[1.0, 1.0, 0.0, 0.6, -1.0],
        base_height=[0.12, 0.085, 0.064, 0.12, 0.12],
        standing_height=[0.12] * 5,
    )
    # Upright and standing: 1; upright halfway up: 0.5; on its back at its lying height: 0;
    # tilted (cos 0.6) at full height: 0.36; upside down: 0.
    assert_values(term("getup", features), [1.0, 0.5, 0.0, 0.36, 0.0])
    features = make_features(1, base_height=[0.047], standing_height=[0.12])  # folded upright on its legs
    assert_values(term("getup", features), [0.0])


def test_upright():
    features = make_features(3, upright=[math.cos(0.1), math.cos(0.3), 1.0])
    # tilt 0.1: exp(-0.01 / 0.05) = exp(-0.2); tilt 0.3: exp(-0.09 / 0.05) = exp(-1.8); level: 1
    assert_values(term("upright", features), [math.exp(-0.2), math.exp(-1.8), 1.0])


def test_upright_has_a_finite_gradient_at_zero_tilt():
    cosine = torch.tensor([1.0, 1.0 - 1e-5, 0.9], requires_grad=True)
    features = make_features(3)
    features["upright"] = cosine
    term("upright", features).sum().backward()
    # d/dc exp(-acos(c)^2 / s^2) at c -> 1 is exp(0) * 2 / s^2 = 2 / 0.05 = 40
    assert torch.isfinite(cosine.grad).all()
    torch.testing.assert_close(cosine.grad[:2], torch.tensor([40.0, 40.0]), rtol=1e-3, atol=0.0)


def test_pose():
    one_joint = torch.zeros(14)
    one_joint[0] = 0.7
    features = make_features(2, joint_error=torch.stack([torch.full((14,), 0.25), one_joint]))
    # mean(0.25^2) = 0.0625: exp(-0.0625 / 0.25) = exp(-0.25)
    # one joint off by 0.7: mean = 0.49 / 14 = 0.035: exp(-0.035 / 0.25) = exp(-0.14)
    assert_values(term("pose", features), [math.exp(-0.25), math.exp(-0.14)])
    # a tighter pose_std = 0.1 (standing): exp(-0.0625 / 0.01) = exp(-6.25)
    assert term("pose", features, pose_std=0.1)[0].item() == pytest.approx(math.exp(-6.25), rel=1e-5)


def test_progress():
    features = make_features(
        5,
        command=[[0.2, 0.0], [0.2, 0.0], [0.2, 0.0], [0.0, 0.0], [-0.2, 0.0]],
        body_velocity=[[0.1, 0.3, 0], [0.5, 0, 0], [-0.1, 0, 0], [0.3, 0, 0], [-0.1, 0, 0]],
    )
    # along / speed: 0.1 / 0.2 = 0.5 (lateral ignored); 0.5 / 0.2 clipped to 1; -0.1 / 0.2 = -0.5;
    # standing command: 0; backward command: (-0.1 * -1) / 0.2 = 0.5
    assert_values(term("progress", features), [0.5, 1.0, -0.5, 0.0, 0.5])


def test_progress_off_axis_gate_reads_the_tracked_velocity_across_the_command():
    features = make_features(
        5,
        command=[[0.2, 0.0], [0.2, 0.0], [0.2, 0.0], [0.0, 0.15], [0.0, 0.0]],
        body_velocity=[[0.2, 0.3, 0], [0.2, 0.0, 0], [0.1, 0.0, 0], [0.05, 0.15, 0], [0.2, 0.1, 0]],
    )
    features["tracked_velocity"] = torch.tensor([[0.2, 0.0], [0.19, 0.082], [0.1, -0.1], [0.05, 0.15], [0.2, 0.1]])
    gated = term("progress", features, progress_off_axis_std=0.1)
    assert_values(
        gated,
        [
            # instantaneous sway 0.3 across, stride average straight: gate exp(0) = 1, credit 0.2 / 0.2 = 1
            1.0,
            # the diagonal gait of walk seed 1: 0.082 across, exp(-0.082^2 / 0.1^2) = exp(-0.6724)
            math.exp(-0.6724),
            # 0.1 to the right, credit 0.5: 0.5 * exp(-1)
            0.5 * math.exp(-1.0),
            # sidestep 0.15 left, forward 0.05 across it: credit 1 * exp(-0.25)
            math.exp(-0.25),
            # standing: no progress to gate
            0.0,
        ],
    )
    # width 0 turns the gate off: the credit alone
    assert_values(term("progress", features), [1.0, 1.0, 0.5, 1.0, 0.0])


def test_progress_overspeed_takes_back_the_excess():
    features = make_features(
        6,
        command=[[0.1, 0.0], [0.1, 0.0], [0.1, 0.0], [0.1, 0.0], [0.0, 0.0], [0.0, -0.2]],
        body_velocity=[[0.05, 0, 0], [0.1, 0, 0], [0.18, 0, 0], [0.5, 0, 0], [0.3, 0, 0], [0.1, -0.3, 0]],
    )
    # fractions 0.5, 1, 1.8, 5, standing, 0.3 / 0.2 = 1.5 along a sideways command;
    # overspeed 1: 0.5, 1, 1 - 0.8 = 0.2, 1 - 4 clipped to -1, 0, 1 - 0.5 = 0.5
    assert_values(term("progress", features, progress_overspeed=1.0), [0.5, 1.0, 0.2, -1.0, 0.0, 0.5])
    # overspeed 0.5: 1 - 0.4 = 0.6 and 1 - 2 = -1 and 1 - 0.25 = 0.75
    assert_values(term("progress", features, progress_overspeed=0.5), [0.5, 1.0, 0.6, -1.0, 0.0, 0.75])


def test_air_time():
    features = make_features(
        3,
        touchdown_air_time=[[0.2, 0.0], [0.5, 0.1], [0.2, 0.2]],
        command=[[0.2, 0.0], [0.0, 0.0], [0.2, 0.0]],
        body_velocity=[[0.1, 0, 0], [0, 0, 0], [0.2, 0, 0]],
        upright=[1.0, 1.0, 0.3],
    )
    assert_values(
        term("air_time", features),
        [
            # credit: clamp(0.2, 0.125, 0.3) - 0.125 = 0.075, other foot 0;
            # gate: progress 0.1 / 0.2 = 0.5 -> 0.5 + 0.5 * 0.5 = 0.75: 0.075 * 0.75
            0.075 * 0.75,
            # credit: min(0.5, 0.3) - 0.125 = 0.175, 0.1 < min gives 0; standing: gate = floor 0.5
            0.175 * 0.5,
            # tilted past GAIT_MIN_UPRIGHT = 0.35: no credit
            0.0,
        ],
    )


def test_swing_height():
    quarter = math.pi / 2
    features = make_features(
        3,
        gait_phase=[quarter, quarter, quarter],
        foot_heights=[[0.01, 0.05], [0.01, 0.05], [0.03, 0.0]],
        command=[[0.2, 0.0], [-0.2, 0.0], [0.0, 0.0]],
        body_velocity=[[0.2, 0, 0], [-0.2, 0, 0], [0, 0, 0]],
    )
    assert_values(
        term("swing_height", features),
        [
            # sin = 1 > 0, forward: left swings: 0.01 / 0.02 = 0.5; full progress, gate 1
            0.5,
            # backward command mirrors the clock: right swings: min(0.05 / 0.02, 1) = 1; gate 1
            1.0,
            # standing command, left swings: min(0.03 / 0.02, 1) = 1; gate = floor 0.5
            0.5,
        ],
    )


def test_phase_contact():
    quarter = math.pi / 2
    features = make_features(
        4,
        gait_phase=[quarter, quarter, -quarter, quarter],
        contacts=[[False, True], [True, True], [True, False], [True, False]],
        command=[[0.2, 0.0]] * 4,
        body_velocity=[[0.2, 0, 0]] * 4,
    )
    # sin > 0: left swings, right stands: (F, T) -> 1; double support -> 0;
    # sin < 0: right swings: (T, F) -> 1; sin > 0 but standing on the left only -> 0 (gate 1 throughout)
    assert_values(term("phase_contact", features), [1.0, 0.0, 1.0, 0.0])


def test_double_support():
    features = make_features(
        3,
        contacts=[[True, True], [True, False], [True, True]],
        command=[[0.0, 0.0], [0.0, 0.0], [0.2, 0.0]],
        body_velocity=[[0, 0, 0], [0, 0, 0], [0.1, 0, 0]],
    )
    # both feet, standing: floor 0.5; one foot: 0; both feet at half the command: 0.5 + 0.5 * 0.5
    assert_values(term("double_support", features), [0.5, 0.0, 0.75])


def test_ang_vel_xy():
    features = make_features(1, angular_velocity=[[0.3, -0.4, 1.0]])
    # 0.3^2 + 0.4^2 = 0.25 (yaw ignored)
    assert_values(term("ang_vel_xy", features), [0.25])


def test_lin_vel_z():
    features = make_features(1, body_velocity=[[1.0, 1.0, 0.5]])
    # 0.5^2
    assert_values(term("lin_vel_z", features), [0.25])


def test_action_rate():
    features = make_features(1, action=torch.full((1, 14), 0.3), previous_action=torch.full((1, 14), 0.2))
    # 14 * (0.3 - 0.2)^2 = 0.14
    assert_values(term("action_rate", features), [0.14])


def test_joint_velocity():
    features = make_features(1, joint_velocity=torch.full((1, 14), -2.0))
    # 14 * 2^2 = 56
    assert_values(term("joint_velocity", features), [56.0])


def test_drift():
    features = make_features(2, body_velocity=[[0.09, 0.12, 1.0], [0.3, 0.4, 0.0]])
    # |(0.09, 0.12)| = 0.15: 0.15 / 0.3 = 0.5; |(0.3, 0.4)| = 0.5: 0.5 / 0.3 capped at 1
    assert_values(term("drift", features), [0.5, 1.0])


def test_hop_rhythm():
    features = make_features(
        4,
        gait_phase=[0.0, math.pi, math.pi, 0.0],
        body_velocity=[[0, 0, 0.05], [0, 0, 0.05], [0, 0, -0.3], [0, 0, 0.05]],
        upright=[1.0, 1.0, 1.0, 0.2],
    )
    # cos 0 = 1, up on the beat: 0.05 / 0.1 = 0.5; cos pi = -1: rising off the beat: -0.5;
    # falling on the down beat: 0.3 / 0.1 = 3 clipped to 1; tilted past 0.35: 0
    assert_values(term("hop_rhythm", features), [0.5, -0.5, 1.0, 0.0])


def test_launch():
    features = make_features(
        3,
        body_velocity=[[0, 0, 0.25], [0, 0, 0.25], [0, 0, -0.1]],
        contacts=[[True, True], [True, False], [True, True]],
    )
    # planted, rising: 0.25 / 0.5 = 0.5; one foot up: 0; planted, sinking: clipped to 0
    assert_values(term("launch", features), [0.5, 0.0, 0.0])


def test_jump():
    features = make_features(
        3,
        base_height=[STANDING_HEIGHT + 0.002, STANDING_HEIGHT + 0.01, STANDING_HEIGHT + 0.01],
        contacts=[[False, False], [False, False], [True, False]],
    )
    # airborne 2 mm up: 0.002 / 0.005 = 0.4; 10 mm up: capped at 1; one foot down: 0
    assert_values(term("jump", features), [0.4, 1.0, 0.0])


def test_jump_height():
    features = make_features(
        4,
        base_height=[STANDING_HEIGHT + 0.015, STANDING_HEIGHT + 0.04, STANDING_HEIGHT + 0.02, STANDING_HEIGHT - 0.01],
        contacts=[[False, False], [False, False], [False, True], [False, False]],
    )
    # airborne 1.5 cm up: 0.015 / 0.03 = 0.5; 4 cm up: capped at 1; one foot down: 0; below standing: 0
    assert_values(term("jump_height", features), [0.5, 1.0, 0.0, 0.0])


def test_termination():
    features = make_features(2, fallen=[True, False])
    assert_values(term("termination", features), [1.0, 0.0])


# ---------------------------------------------------------------------------
# evaluate_terms and weighted_terms
# ---------------------------------------------------------------------------


def test_evaluate_terms_stacks_every_term_in_registry_order():
    features = make_features(2, body_velocity=[[0.1, 0, 0.5], [0, 0, 0]], fallen=[False, True])
    params = make_params(2)
    values = evaluate_terms(features, params)
    assert values.shape == (2, len(REWARD_TERMS))
    for index, registered in enumerate(REWARD_TERMS.values()):
        torch.testing.assert_close(values[:, index], registered.fn(features, params))


def test_weighted_terms_scales_per_second_terms_and_sums_to_the_reward():
    names = list(REWARD_TERMS)
    values = torch.ones(1, len(names))
    weights = torch.zeros(1, len(names))
    weights[0, names.index("tracking")] = 2.0
    weights[0, names.index("termination")] = -4.0
    weighted = weighted_terms(values, weights, control_dt=0.02)
    # tracking is a rate: 2 * 1 * 0.02 = 0.04; termination is one-off: -4 * 1 = -4; reward -3.96
    assert weighted[0, names.index("tracking")].item() == pytest.approx(0.04)
    assert weighted[0, names.index("termination")].item() == pytest.approx(-4.0)
    assert weighted.sum(-1).item() == pytest.approx(-3.96)


def test_default_weights_on_a_crafted_step():
    features = make_features(1, angular_velocity=[[0.3, -0.4, 0.5]], fallen=[True])
    weights = torch.tensor([[t.weight for t in REWARD_TERMS.values()]])
    reward = weighted_terms(evaluate_terms(features, make_params(1)), weights, 0.02).sum()
    # Standing still, upright, on both feet, zero command: tracking 1, upright 1, pose 1, yaw exp(-0.5),
    # gait terms 0 but double support 0.5 (floor), ang_vel_xy 0.25, fall 1:
    # 0.02 * (2 + 1 * exp(-0.5) + 2 + 1 - 1 * 0.5 - 0.05 * 0.25) - 4
    expected = 0.02 * (2 + math.exp(-0.5) + 2 + 1 - 0.5 - 0.05 * 0.25) - 4
    assert reward.item() == pytest.approx(expected, rel=1e-5)


def test_all_zero_weight_row_gives_zero_reward_even_for_non_finite_terms():
    values = torch.full((2, len(REWARD_TERMS)), float("nan"))
    weights = torch.zeros(2, len(REWARD_TERMS))
    weights[1, 0] = 1.0
    weighted = weighted_terms(values, weights, 0.02)
    assert torch.equal(weighted[0], torch.zeros(len(REWARD_TERMS)))
    assert torch.isnan(weighted[1, 0])


def test_weighted_terms_refuses_stale_weight_rows():
    values = torch.ones(2, len(REWARD_TERMS))
    with pytest.raises(ValueError, match="weights must have one entry per registered term"):
        weighted_terms(values, torch.ones(2, len(REWARD_TERMS) - 1), 0.02)
    with pytest.raises(ValueError, match="term_values must end with one column per registered term"):
        weighted_terms(values[:, :-1], torch.ones(2, len(REWARD_TERMS)), 0.02)
    with pytest.raises(ValueError, match="control_dt"):
        weighted_terms(values, torch.ones(2, len(REWARD_TERMS)), 0.0)


def test_gradients_are_finite_at_rest():
    features = make_features(3)
    for key in ("body_velocity", "angular_velocity", "upright", "joint_error", "action", "base_height"):
        features[key] = features[key].clone().requires_grad_(True)
    weights = torch.tensor([t.weight for t in REWARD_TERMS.values()]).expand(3, -1)
    weighted_terms(evaluate_terms(features, make_params(3)), weights, 0.02).sum().backward()
    for key in ("body_velocity", "angular_velocity", "upright", "joint_error", "action", "base_height"):
        assert torch.isfinite(features[key].grad).all(), key


def test_derived_features_by_hand():
    # Env 0 walks at 0.1 m/s under a 0.2 forward command, clock phase pi/2 (left swings);
    # env 1 walks 0.3 m/s backward under a -0.2 command, phase pi/2 mirrored (right swings), tilted 80 degrees;
    # env 2 stands (zero command) while sliding sideways.
    features = make_features(
        3,
        command=[[0.2, 0.0], [-0.2, 0.0], [0.0, 0.0]],
        body_velocity=[[0.1, 0.05, 0.0], [-0.3, 0.0, 0.0], [0.0, 0.4, 0.0]],
        gait_phase=[math.pi / 2, math.pi / 2, 0.3],
        upright=[1.0, math.cos(math.radians(80)), 1.0],
    )
    derived = derived_features(features)
    torch.testing.assert_close(derived["command_axis"], torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 0.0]]))
    assert derived["moving"].tolist() == [True, True, False]
    # 0.1 / 0.2 along the command; 0.3 / 0.2 along a backward command; standing has no ratio.
    assert_values(derived["speed_ratio"], [0.5, 1.5, 0.0])
    assert derived["upright_gate"].tolist() == [1.0, 0.0, 1.0]  # cos 80 deg = 0.17 < 0.35
    assert derived["left_swings"].tolist() == [True, False, True]


def test_terms_read_the_derived_features_the_env_adds():
    features = make_features(
        2,
        command=[[0.2, 0.0], [0.0, 0.15]],
        body_velocity=[[0.1, 0.02, 0.01], [0.03, 0.1, 0.0]],
        contacts=[[False, True], [True, False]],  # the clock's stance foot down in both
        foot_heights=[[0.01, 0.0], [0.0, 0.03]],
        gait_phase=[0.4, -1.0],
    )
    params = make_params(2)
    plain = evaluate_terms(features, params)
    with_derived = dict(features.items())
    with_derived.update(derived_features(features))
    torch.testing.assert_close(evaluate_terms(with_derived, params), plain, rtol=0, atol=0)
    # A stale derived entry is what the terms read: the env owns them.
    with_derived["upright_gate"] = torch.zeros(2)
    names = list(REWARD_TERMS)
    gated = evaluate_terms(with_derived, params)
    for name in ("air_time", "swing_height", "phase_contact", "double_support"):
        assert gated[:, names.index(name)].abs().max() == 0.0, name
    assert plain[:, names.index("phase_contact")].abs().max() > 0


# ---------------------------------------------------------------------------
# register_reward
# ---------------------------------------------------------------------------


def test_register_reward_appends_a_column_and_its_params():
    @register_reward("heading", heading_std=0.3)
    def heading(features, params):
        return torch.exp(-features["angular_velocity"][..., 2].square() / params["heading_std"].square())

    assert list(REWARD_TERMS)[-1] == "heading"
    assert REWARD_TERMS["heading"].weight == 0.0 and REWARD_TERMS["heading"].per_second
    assert REWARD_PARAMS["heading_std"] == 0.3
    features = make_features(1, angular_velocity=[[0.0, 0.0, 0.3]])
    values = evaluate_terms(features, make_params(1))
    # exp(-0.3^2 / 0.3^2) = exp(-1), in the last column
    assert values.shape == (1, len(BUILT_IN_TERMS) + 1)
    assert values[0, -1].item() == pytest.approx(math.exp(-1.0))


def test_registry_is_restored_between_tests():
    assert list(REWARD_TERMS) == list(BUILT_IN_TERMS)
    assert "heading_std" not in REWARD_PARAMS


def test_duplicate_term_name_is_refused():
    with pytest.raises(ValueError, match="a term named 'tracking' is already registered"):
        register_reward("tracking")


def test_a_param_belongs_to_one_term():
    with pytest.raises(ValueError, match="'tracking_std' is already registered by term 'tracking'"):
        register_reward("wide_tracking", tracking_std=0.5)
    assert "wide_tracking" not in REWARD_TERMS


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weight": float("nan")}, "weight must be a finite number"),
        ({"weight": "1"}, "weight must be a finite number"),
        ({"per_second": 1}, "per_second must be True or False"),
        ({"my_scale": float("inf")}, "param 'my_scale' must be a finite number"),
        ({"gait_frequency_hz": 2.0}, "param 'gait_frequency_hz' is a task field name"),
        ({"reward_weights": 2.0}, "param 'reward_weights' is a task field name"),
    ],
)
def test_register_reward_validates_its_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        register_reward("new_term", **kwargs)
    assert "new_term" not in REWARD_TERMS
    with pytest.raises(ValueError, match="name must be a non-empty string"):
        register_reward("")


def test_term_with_a_wrong_shape_is_named():
    @register_reward("broken")
    def broken(features, params):
        return features["joint_error"]

    with pytest.raises(ValueError, match="reward term 'broken' returned shape"):
        evaluate_terms(make_features(2), make_params(2))


def test_non_finite_term_on_a_finite_state_is_named_with_its_envs():
    @register_reward("flaky")
    def flaky(features, params):
        return torch.tensor([0.0, math.nan, math.inf, math.nan])

    velocity = torch.zeros(4, 3)
    velocity[3, 0] = math.nan  # env 3 diverged: its NaN is the physics', not the term's
    with pytest.raises(ValueError, match=r"term 'flaky' returned NaN or inf for envs \[1, 2\]\.$"):
        evaluate_terms(make_features(4, body_velocity=velocity), make_params(4))


def test_non_finite_state_passes_through_the_terms():
    velocity = torch.zeros(2, 3)
    velocity[1, 0] = math.nan
    values = evaluate_terms(make_features(2, body_velocity=velocity), make_params(2))
    assert torch.isfinite(values[0]).all()
    assert torch.isnan(values[1, list(REWARD_TERMS).index("tracking")])
