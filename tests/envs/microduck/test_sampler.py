"""MicroDuckTaskSampler: draws, fixed ids, seeding, and partial resets inside a TransformedEnv."""

from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Composite, Unbounded
from torchrl.envs import Compose, EnvBase, StepCounter, TransformedEnv

from waddle.envs.microduck.sampler import MicroDuckTaskSampler


class EchoTaskEnv(EnvBase):
    """A stand-in for MicroDuckEnv: each env holds the ``task_id`` it was last reset with.

    Like the real env, it reads ``task_id`` from the reset input for the
    resetting envs only (all envs without a ``_reset`` mask) and exposes it in
    its observation and state specs. Env 0 is done every ``episode_length``
    steps, the others never, so rollouts exercise partial resets.
    """

    def __init__(self, num_envs: int = 4, num_tasks: int = 3, episode_length: int = 2) -> None:
        super().__init__(batch_size=torch.Size([num_envs]))
        ids = Bounded(0, num_tasks - 1, shape=(num_envs, 1), dtype=torch.int64)
        self.observation_spec = Composite(task_id=ids.clone(), shape=(num_envs,))
        self.state_spec = Composite(task_id=ids.clone(), shape=(num_envs,))
        self.action_spec = Unbounded((num_envs, 1))
        self.reward_spec = Unbounded((num_envs, 1))
        self.num_tasks = num_tasks
        self.episode_length = episode_length
        self.task_id = torch.zeros(num_envs, 1, dtype=torch.int64)
        self.steps = torch.zeros(num_envs, 1, dtype=torch.int64)
        self.reset_inputs: list[TensorDict | None] = []
        self.seeds: list[int | None] = []

    def _reset(self, tensordict, **kwargs):
        self.reset_inputs.append(None if tensordict is None else tensordict.clone())
        rows = torch.ones(self.batch_size[0], 1, dtype=torch.bool)
        if tensordict is not None and "_reset" in tensordict.keys():
            rows = tensordict["_reset"].reshape(-1, 1)
        if tensordict is not None and "task_id" in tensordict.keys():
            self.task_id = torch.where(rows, tensordict["task_id"].reshape(-1, 1), self.task_id)
        self.steps = torch.where(rows, torch.zeros_like(self.steps), self.steps)
        done = torch.zeros(*self.batch_size, 1, dtype=torch.bool)
        return TensorDict(task_id=self.task_id.clone(), done=done, terminated=done.clone(), batch_size=self.batch_size)

    def _step(self, tensordict):
        self.steps = self.steps + 1
        done = torch.zeros(*self.batch_size, 1, dtype=torch.bool)
        done[0] = self.steps[0] >= self.episode_length
        return TensorDict(
            task_id=self.task_id.clone(),
            reward=torch.zeros(*self.batch_size, 1),
            done=done,
            terminated=done.clone(),
            batch_size=self.batch_size,
        )

    def _set_seed(self, seed):
        self.seeds.append(seed)


def test_sample_draws_with_the_given_frequencies():
    sampler = MicroDuckTaskSampler([1.0, 3.0, 0.0], seed=0)
    ids = sampler.sample((20_000,))
    assert ids.shape == (20_000, 1) and ids.dtype == torch.int64
    frequencies = torch.bincount(ids.flatten(), minlength=3) / ids.numel()
    # weights 1:3:0 normalize to 0.25, 0.75, 0; 3 sigma of a 20k-draw frequency is about 0.01
    assert torch.allclose(frequencies, torch.tensor([0.25, 0.75, 0.0]), atol=0.015)
    assert torch.allclose(sampler.probabilities, torch.tensor([0.25, 0.75, 0.0]))


def test_same_seed_same_draws():
    first = MicroDuckTaskSampler([1.0, 1.0, 1.0], seed=3).sample((64,))
    second = MicroDuckTaskSampler([1.0, 1.0, 1.0], seed=3).sample((64,))
    other = MicroDuckTaskSampler([1.0, 1.0, 1.0], seed=4).sample((64,))
    assert torch.equal(first, second)
    assert not torch.equal(first, other)


def test_probabilities_is_a_mutable_buffer():
    sampler = MicroDuckTaskSampler([1.0, 1.0], seed=0)
    assert "probabilities" in dict(sampler.named_buffers())
    sampler.probabilities.copy_(torch.tensor([0.0, 1.0]))
    assert torch.equal(sampler.sample((8,)), torch.ones(8, 1, dtype=torch.int64))


def test_fixed_ids_cover_the_batch_in_order():
    sampler = MicroDuckTaskSampler.fixed([1, 2, 0, 2])
    assert torch.equal(sampler.sample((4,))[:, 0], torch.tensor([1, 2, 0, 2]))
    assert torch.equal(MicroDuckTaskSampler(task_ids=[1, 0]).sample((2,))[:, 0], torch.tensor([1, 0]))
    with pytest.raises(ValueError, match="3 fixed task_ids cannot cover a batch of 4 envs"):
        MicroDuckTaskSampler.fixed([0, 1, 2]).sample((4,))


@pytest.mark.parametrize(
    ("weights", "message"),
    [
        ([], "non-empty"),
        ([1.0, -0.5], ">= 0"),
        ([1.0, float("nan")], "finite"),
        ([1.0, float("inf")], "finite"),
        ([0.0, 0.0], "must not all be zero"),
    ],
)
def test_bad_weights_are_refused(weights, message):
    with pytest.raises(ValueError, match=message):
        MicroDuckTaskSampler(weights)


def test_weights_and_task_ids_are_exclusive_and_ids_are_indices():
    with pytest.raises(ValueError, match="exactly one of weights"):
        MicroDuckTaskSampler()
    with pytest.raises(ValueError, match="exactly one of weights"):
        MicroDuckTaskSampler([1.0], task_ids=[0])
    with pytest.raises(ValueError, match="task indices >= 0"):
        MicroDuckTaskSampler.fixed([0, -1])
    with pytest.raises(ValueError, match="task indices >= 0"):
        MicroDuckTaskSampler.fixed([0.5])


def test_probabilities_broken_after_construction_are_refused_at_sampling():
    sampler = MicroDuckTaskSampler([1.0, 1.0])
    sampler.probabilities.zero_()
    with pytest.raises(ValueError, match="probabilities must not all be zero"):
        sampler.sample((2,))


def test_reset_writes_task_id_that_the_env_reads():
    env = TransformedEnv(EchoTaskEnv(num_envs=4), MicroDuckTaskSampler.fixed([2, 0, 1, 2]))
    td = env.reset()
    assert td["task_id"].dtype == torch.int64 and td["task_id"].shape == (4, 1)
    assert torch.equal(td["task_id"][:, 0], torch.tensor([2, 0, 1, 2]))
    assert torch.equal(env.base_env.reset_inputs[-1]["task_id"][:, 0], torch.tensor([2, 0, 1, 2]))


def test_partial_reset_replaces_only_the_resetting_envs():
    sampler = MicroDuckTaskSampler([1.0, 0.0, 0.0], seed=0)
    env = TransformedEnv(EchoTaskEnv(num_envs=4), sampler)
    assert torch.equal(env.reset()["task_id"], torch.zeros(4, 1, dtype=torch.int64))

    sampler.probabilities.copy_(torch.tensor([0.0, 0.0, 1.0]))
    mask = torch.tensor([[True], [False], [True], [False]])
    td = env.reset(TensorDict(_reset=mask, batch_size=[4]))
    assert torch.equal(td["task_id"][:, 0], torch.tensor([2, 0, 2, 0]))
    # What the env received: new ids for envs 0 and 2, the held ids for 1 and 3.
    assert torch.equal(env.base_env.reset_inputs[-1]["task_id"][:, 0], torch.tensor([2, 0, 2, 0]))

    # A reset input carrying task_id keeps it for the envs that are not reset.
    sampler.probabilities.copy_(torch.tensor([0.0, 1.0, 0.0]))
    held = torch.tensor([[2], [0], [2], [0]])
    td = env.reset(TensorDict(_reset=~mask, task_id=held, batch_size=[4]))
    assert torch.equal(td["task_id"][:, 0], torch.tensor([2, 1, 2, 1]))


def test_rollout_auto_resets_only_the_done_env():
    sampler = MicroDuckTaskSampler([1.0, 0.0, 0.0], seed=0)
    env = TransformedEnv(EchoTaskEnv(num_envs=3, episode_length=2), sampler)
    start = env.reset()
    sampler.probabilities.copy_(torch.tensor([0.0, 1.0, 0.0]))
    rollout = env.rollout(4, tensordict=start, auto_reset=False, break_when_any_done=False)
    task_ids = rollout["next", "task_id"][..., 0]  # (envs, steps)
    # Env 0 is done at step 2 and auto-reset onto task 1; envs 1 and 2 keep task 0 throughout.
    assert torch.equal(task_ids[0], torch.tensor([0, 0, 1, 1]))
    assert torch.equal(task_ids[1:], torch.zeros(2, 4, dtype=torch.int64))


def test_env_set_seed_seeds_the_sampler():
    env = TransformedEnv(EchoTaskEnv(num_envs=16), MicroDuckTaskSampler([1.0, 1.0, 1.0]))
    env.set_seed(7)
    first = env.reset()["task_id"].clone()
    env.set_seed(7)
    second = env.reset()["task_id"].clone()
    env.set_seed(8)
    third = env.reset()["task_id"].clone()
    assert torch.equal(first, second)
    assert not torch.equal(first, third)
    assert env.base_env.seeds == [7, 7, 8]  # the base env is still seeded


def test_env_set_seed_reaches_a_sampler_inside_compose():
    env = TransformedEnv(EchoTaskEnv(num_envs=16), Compose(StepCounter(), MicroDuckTaskSampler([1.0, 1.0, 1.0])))
    env.set_seed(7)
    first = env.reset()["task_id"].clone()
    env.set_seed(7)
    assert torch.equal(env.reset()["task_id"], first)


def test_deep_copied_env_seeds_its_own_sampler():
    env = TransformedEnv(EchoTaskEnv(num_envs=16), MicroDuckTaskSampler([1.0, 1.0, 1.0]))
    clone = copy.deepcopy(env)
    clone.set_seed(5)
    assert clone.transform.generator is not None
    assert env.transform.generator is None


def test_sampler_weights_must_match_the_library_size():
    env = EchoTaskEnv(num_envs=2)
    env.tasks = TensorDict(weight=torch.ones(3), batch_size=[3])  # a library of three tasks
    env = TransformedEnv(env, MicroDuckTaskSampler([1.0, 1.0]))
    with pytest.raises(ValueError, match="2 weights but the env's library has 3 tasks"):
        env.reset()
