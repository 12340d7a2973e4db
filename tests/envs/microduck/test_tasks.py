"""MicroDuck tasks as data: presets, make_task overrides, stacking and library validation."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from waddle.envs.microduck.rewards import GAIT_TERMS, REWARD_PARAMS, REWARD_TERMS, register_reward, tracking
from waddle.envs.microduck.tasks import (
    COMMAND_THRESHOLD,
    SPEED_RANGE_PRIOR,
    MicroDuckTask,
    TaskTable,
    as_task_library,
    jump_task,
    make_task,
    sidestep_task,
    speed_range_task,
    standing_task,
    tracking_task,
)

# Tests here register reward terms; the registry is restored after each one.
pytestmark = pytest.mark.usefixtures("restore_reward_registry")


def weights_of(task: MicroDuckTask) -> dict[str, float]:
    return dict(zip(REWARD_TERMS, task.reward_weights.tolist(), strict=True))


def defaults() -> dict[str, float]:
    return {name: term.weight for name, term in REWARD_TERMS.items()}


def assert_vector(actual: torch.Tensor, expected: list[float] | float) -> None:
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=torch.float32))


# ---------------------------------------------------------------------------
# Presets
# ---------------------------------------------------------------------------


def test_command_threshold():
    assert COMMAND_THRESHOLD == 0.01


def test_tracking_task():
    task = tracking_task(0.2)
    assert task.name == "tracking+0.20"
    assert_vector(task.command_low, [0.2, 0.0])
    assert_vector(task.command_high, [0.2, 0.0])
    assert weights_of(task) == pytest.approx({**defaults(), "heading_hold": 2.0})
    assert_vector(task.params["pose_std"], 0.5)
    assert_vector(task.gait_prior_lift, 0.0)  # TorchRL's factory: no prior unless asked for
    assert_vector(task.gait_prior_stride_per_mps, 0.0)
    assert_vector(task.gait_frequency_hz, 1.8913)
    assert_vector(task.gait_frequency_per_mps, 0.0)
    assert_vector(task.params["tracking_window_cycles"], 1.0)  # the stride-averaged velocity
    assert_vector(task.params["progress_off_axis_std"], 0.1)  # no progress credit for a diagonal gait
    assert_vector(task.params["tracking_relative_std"], 0.0)
    assert_vector(task.warm_start_fraction, 0.0)
    assert_vector(task.joint_reset_noise_scale, 0.02)
    assert_vector(task.weight, 1.0)
    assert tracking_task().name == "tracking+0.03"
    assert tracking_task(-0.1).name == "tracking-0.10"


@pytest.mark.parametrize("speed", [0.0, 0.01, -0.01, 0.005])
def test_tracking_at_or_under_the_threshold_is_standing(speed):
    task = tracking_task(speed, weight=2.0)
    assert task.name == "standing"
    assert_vector(task.command_high, [0.0, 0.0])
    assert_vector(task.weight, 2.0)


def test_tracking_just_over_the_threshold_walks():
    assert tracking_task(0.011).name == "tracking+0.01"


def test_standing_task():
    task = standing_task()
    assert task.name == "standing"
    assert_vector(task.command_low, [0.0, 0.0])
    assert_vector(task.command_high, [0.0, 0.0])
    expected = {**defaults(), **dict.fromkeys(GAIT_TERMS, 0.0)}
    assert weights_of(task) == pytest.approx(expected)
    assert_vector(task.params["pose_std"], 0.1)
    assert_vector(task.params["tracking_window_cycles"], 0.0)  # any motion at all is off the command
    assert_vector(task.params["progress_off_axis_std"], 0.0)


def test_speed_range_task():
    task = speed_range_task()
    assert task.name == "speed_range+0.10..+0.30"
    assert_vector(task.command_low, [0.1, 0.0])
    assert_vector(task.command_high, [0.3, 0.0])
    # clock: 0.75 Hz + 6 Hz per m/s, so 1.35 Hz at 0.1 m/s, 1.95 Hz at 0.2 and 2.55 Hz at 0.3
    assert_vector(task.gait_frequency_hz, 0.75)
    assert_vector(task.gait_frequency_per_mps, 6.0)
    clock = task.gait_frequency_hz + task.gait_frequency_per_mps * torch.tensor([0.1, 0.2, 0.3])
    torch.testing.assert_close(clock, torch.tensor([1.35, 1.95, 2.55]))
    # the tracking Gaussian is a quarter of the command wide along it, at least 0.025 m/s
    assert_vector(task.params["tracking_std"], 0.025)
    assert_vector(task.params["tracking_relative_std"], 0.25)
    assert_vector(task.params["progress_off_axis_std"], 0.1)
    assert_vector(task.params["tracking_off_axis_std"], 0.05)
    assert_vector(task.params["tracking_window_cycles"], 1.0)
    assert weights_of(task) == pytest.approx({**defaults(), "heading_hold": 2.0})
    assert_vector(task.gait_prior_lift, 0.0)  # TorchRL's factory: no prior unless asked for
    assert_vector(task.gait_prior_stride_per_mps, 0.0)
    # waddle train's speed-range recipe: the lift, and the hips swing 0.3 rad at 0.3 m/s
    assert SPEED_RANGE_PRIOR == {"gait_prior_lift": 0.25, "gait_prior_stride_per_mps": 1.0}
    features = TensorDict(
        {
            "command": torch.tensor([[0.1, 0.0]]),
            "body_velocity": torch.tensor([[0.13, 0.0, 0.0]]),
            "upright": torch.ones(1),
            "gait_phase": torch.zeros(1),
        },
        batch_size=[1],
    )
    paid = tracking(features, task.params.unsqueeze(0))
    # 0.03 m/s over a 0.1 command, width max(0.025, 0.25 * 0.1) = 0.025: exp(-(0.03 / 0.025)^2) = exp(-1.44)
    torch.testing.assert_close(paid, torch.tensor([math.exp(-1.44)]))
    # the same 0.03 over 0.3, width 0.25 * 0.3 = 0.075: exp(-(0.03 / 0.075)^2) = exp(-0.16)
    features["command"] = torch.tensor([[0.3, 0.0]])
    features["body_velocity"] = torch.tensor([[0.33, 0.0, 0.0]])
    paid = tracking(features, task.params.unsqueeze(0))
    torch.testing.assert_close(paid, torch.tensor([math.exp(-0.16)]))


def test_sidestep_task():
    task = sidestep_task()
    assert task.name == "sidestep+0.15"
    assert_vector(task.command_low, [0.0, 0.15])
    assert_vector(task.command_high, [0.0, 0.15])
    assert weights_of(task) == pytest.approx({**defaults(), "heading_hold": 2.0})
    assert_vector(task.gait_prior_lift, 0.0)  # TorchRL's factory: no prior unless asked for
    assert_vector(task.params["progress_off_axis_std"], 0.1)  # across a sideways command is forward
    assert sidestep_task(-0.1).name == "sidestep-0.10"


def test_jump_task():
    task = jump_task()
    assert task.name == "jump"
    assert_vector(task.command_high, [0.0, 0.0])
    weights = weights_of(task)
    assert all(weights[name] == 0.0 for name in GAIT_TERMS)
    assert weights["hop_rhythm"] == 1.0
    assert weights["launch"] == 30.0
    assert weights["jump"] == 10.0
    assert weights["jump_height"] == 10.0
    assert weights["drift"] == -5.0
    assert weights["lin_vel_z"] == 0.0
    assert weights["tracking"] == 2.0  # tracking toward zero stays on
    assert_vector(task.params["pose_std"], 0.5)
    assert_vector(task.gait_frequency_hz, 2.0)


def test_presets_accept_weight_reward_weights_name_and_overrides():
    task = tracking_task(0.2, weight=3.0, reward_weights={"tracking": 4.0}, tracking_std=0.2, name="walk")
    assert task.name == "walk"
    assert_vector(task.weight, 3.0)
    assert weights_of(task)["tracking"] == 4.0
    assert_vector(task.params["tracking_std"], 0.2)
    # preset choices can be overridden too: turn a gait term back on while standing
    assert weights_of(standing_task(reward_weights={"air_time": 1.5}))["air_time"] == 1.5
    assert weights_of(jump_task(reward_weights={"launch": 5.0}))["launch"] == 5.0
    assert_vector(jump_task(gait_frequency_hz=3.0).gait_frequency_hz, 3.0)
    assert_vector(speed_range_task(0.0, 0.2, pose_std=0.3).params["pose_std"], 0.3)


# ---------------------------------------------------------------------------
# make_task
# ---------------------------------------------------------------------------


def test_make_task_overrides_fields_and_params_by_name():
    task = make_task(
        (0.1, -0.1),
        (0.3, 0.1),
        name="box",
        weight=0.5,
        warm_start_velocity=(0.1, 0.2),
        warm_start_fraction=0.25,
        joint_reset_noise_scale=0.05,
        gait_frequency_hz=1.5,
        gait_frequency_per_mps=2.0,
        air_time_min=0.1,
    )
    assert_vector(task.warm_start_velocity, [0.1, 0.2])
    assert_vector(task.warm_start_fraction, 0.25)
    assert_vector(task.joint_reset_noise_scale, 0.05)
    assert_vector(task.gait_frequency_hz, 1.5)
    assert_vector(task.gait_frequency_per_mps, 2.0)
    assert_vector(task.params["air_time_min"], 0.1)
    assert_vector(task.params["air_time_max"], REWARD_PARAMS["air_time_max"])
    assert set(task.params.keys()) == set(REWARD_PARAMS)
    assert task.reward_weights.shape == (len(REWARD_TERMS),)


def test_make_task_unknown_override_names_the_accepted_ones():
    with pytest.raises(ValueError, match=r"unknown override 'tracking_sigma'.*tracking_std"):
        make_task((0.0, 0.0), (0.0, 0.0), name="x", tracking_sigma=0.2)
    with pytest.raises(ValueError, match=r"unknown override 'velocity'.*warm_start_fraction"):
        tracking_task(0.2, velocity=0.3)


def test_make_task_unknown_reward_weight_names_the_registered_terms():
    with pytest.raises(
        ValueError,
        match=r"make_task\('tracking\+0\.20'\): reward_weights names unregistered terms \['heading'\]; the terms: tracking",
    ):
        tracking_task(0.2, reward_weights={"heading": 1.0})


@pytest.mark.parametrize("weight", [float("inf"), True, "1"])
def test_make_task_refuses_a_reward_weight_that_is_not_a_finite_number(weight):
    with pytest.raises(
        ValueError, match=r"make_task\('tracking\+0\.20'\): reward_weights\['pose'\] must be a finite number"
    ):
        tracking_task(0.2, reward_weights={"pose": weight})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"command_low": (0.3, 0.0), "command_high": (0.1, 0.0)}, "command_low must be <= command_high"),
        ({"command_low": (0.1,)}, "command_low must be 2 numbers"),
        ({"warm_start_velocity": 0.2}, "warm_start_velocity must be 2 numbers"),
        ({"warm_start_velocity": (0.3, 0.1)}, "warm_start_velocity must be"),
        ({"warm_start_fraction": 1.5}, r"warm_start_fraction must be in \[0, 1\]"),
        ({"joint_reset_noise_scale": -0.1}, "joint_reset_noise_scale must be >= 0"),
        ({"gait_frequency_hz": 0.0}, "gait_frequency_hz must be > 0"),
        ({"gait_frequency_per_mps": -1.0}, "gait_frequency_per_mps must be >= 0"),
        ({"weight": -1.0}, "weight must be >= 0"),
        ({"weight": float("inf")}, "weight must be finite"),
        ({"pose_std": float("nan")}, r"params\['pose_std'\] must be finite"),
        ({"progress_off_axis_std": -0.1}, r"params\['progress_off_axis_std'\] must be >= 0 \(0: off\)"),
        ({"tracking_relative_std": -0.25}, r"params\['tracking_relative_std'\] must be >= 0"),
        ({"reward_weights": {"pose": float("nan")}}, r"reward_weights\['pose'\] must be a finite number, got nan"),
        ({"name": ""}, "name must be a non-empty string"),
    ],
)
def test_make_task_range_checks(kwargs, message):
    arguments = {"command_low": (0.0, 0.0), "command_high": (0.2, 0.0), "name": "bad", **kwargs}
    with pytest.raises(ValueError, match=message):
        make_task(arguments.pop("command_low"), arguments.pop("command_high"), **arguments)


# ---------------------------------------------------------------------------
# Stacking and libraries
# ---------------------------------------------------------------------------


def test_tasks_stack_into_a_library():
    library = torch.stack([tracking_task(0.2, weight=2.0), jump_task(), standing_task()])
    assert isinstance(library, MicroDuckTask)
    assert library.shape == (3,)
    assert list(library.name) == ["tracking+0.20", "jump", "standing"]
    assert_vector(library.weight, [2.0, 1.0, 1.0])
    assert library.reward_weights.shape == (3, len(REWARD_TERMS))
    assert library.params.batch_size == (3,)
    rows = library[torch.tensor([1, 1, 0])]
    assert list(rows.name) == ["jump", "jump", "tracking+0.20"]
    assert_vector(rows.command_high[:, 0], [0.0, 0.0, 0.2])


def test_as_task_library_accepts_one_task_a_sequence_or_a_stack():
    assert as_task_library(jump_task()).shape == (1,)
    assert list(as_task_library(None).name) == ["tracking+0.03"]
    sequence = as_task_library([standing_task(), speed_range_task(0.1, 0.3)])
    assert list(sequence.name) == ["standing", "speed_range+0.10..+0.30"]
    stacked = as_task_library(torch.stack([standing_task(), jump_task()]))
    assert list(stacked.name) == ["standing", "jump"]


def test_as_task_library_refusals():
    with pytest.raises(ValueError, match="at least one task"):
        as_task_library([])
    with pytest.raises(ValueError, match="sum to zero"):
        as_task_library([standing_task(weight=0.0), jump_task(weight=0.0)])
    with pytest.raises(ValueError, match="one batch dimension"):
        as_task_library(torch.stack([standing_task(), jump_task()]).unsqueeze(0))
    with pytest.raises(TypeError, match="MicroDuckTask"):
        as_task_library("standing")
    with pytest.raises(TypeError, match="only MicroDuckTask rows stack"):
        as_task_library([standing_task(), {"name": "jump"}])


def test_a_task_built_before_register_reward_is_refused_with_the_reason():
    stale = tracking_task(0.2)
    before = len(REWARD_TERMS)

    @register_reward("heading", heading_std=0.3)
    def heading(features, params):
        return torch.exp(-features["angular_velocity"][..., 2].square() / params["heading_std"].square())

    fresh = tracking_task(0.2, reward_weights={"heading": 1.0}, heading_std=0.5)
    assert fresh.reward_weights[-1].item() == 1.0
    assert_vector(fresh.params["heading_std"], 0.5)
    message = rf"has {before} reward weights but {before + 1} reward terms are registered.*built before register_reward"
    with pytest.raises(ValueError, match=message):
        torch.stack([stale, fresh])
    with pytest.raises(ValueError, match=message):
        as_task_library(stale)
    with pytest.raises(ValueError, match=message):
        as_task_library([fresh, stale])
    assert as_task_library([fresh]).shape == (1,)


def test_params_must_have_exactly_the_registered_keys():
    task = standing_task()
    task.params = task.params.exclude("pose_std")
    with pytest.raises(ValueError, match=r"missing \['pose_std'\]"):
        as_task_library(task)
    task = standing_task()
    task.params["unused_std"] = torch.tensor(1.0)
    with pytest.raises(ValueError, match=r"unexpected \['unused_std'\]"):
        as_task_library([task])


def test_as_task_library_checks_rows_of_a_prebuilt_stack():
    library = torch.stack([standing_task(), tracking_task(0.2)])
    library.command_low[1, 0] = 0.5  # now above command_high in vx
    with pytest.raises(ValueError, match=r"task \['tracking\+0.20'\]: command_low must be <= command_high"):
        as_task_library(library)


def test_task_table_gathers_the_rows_of_the_library_without_names():
    library = as_task_library([tracking_task(0.2), jump_task(), standing_task()])
    table = TaskTable(library)
    assert len(table) == 3
    task_id = torch.tensor([2, 0, 0, 1, 2])
    rows = table[task_id]
    fields = {name for name in library.to_tensordict().keys() if name != "name"}
    assert set(rows) == fields
    assert set(rows["params"]) == set(REWARD_PARAMS)
    for i, task in enumerate(task_id.tolist()):
        row = library[task]
        for name in fields - {"params"}:
            assert rows[name].shape == (5, *getattr(row, name).shape)
            assert rows[name].dtype == getattr(row, name).dtype
            assert torch.equal(rows[name][i], getattr(row, name)), name
        for key in REWARD_PARAMS:
            assert torch.equal(rows["params"][key][i], row.params[key])


def test_task_table_keeps_each_entry_s_dtype_and_exact_values():
    library = as_task_library([tracking_task(0.2), standing_task()])
    library.params["tracking_std"] = torch.tensor([0.1, 1 / 3], dtype=torch.float64)
    rows = TaskTable(library)[torch.tensor([1, 0])]
    assert rows["params"]["tracking_std"].dtype == torch.float64
    assert rows["params"]["tracking_std"].tolist() == [1 / 3, 0.1]
    assert rows["reward_weights"].dtype == library.reward_weights.dtype
