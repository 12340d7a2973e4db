"""Actor and critic networks for on-policy RL, and the deterministic policy that gets exported.

Both networks read the raw observation and normalise it with one shared
:class:`~waddle.modules.normalizer.RunningNormalizer`, so a saved policy
carries its own statistics and an exported graph needs no preprocessing.

The actor is a Gaussian with a state-independent log standard deviation (the
usual choice for locomotion PPO). Samples are *not* squashed: the MicroDuck env
clips actions to ``[-1, 1]`` itself, which keeps the log-probability and the
entropy exact and cheap, and the deterministic policy clamps its mean the same
way.

With a library of several tasks (``num_tasks > 1`` and ``task_embedding_dim >
0``) each network also reads ``"task_id"``: its own embedding row for the task
is appended to the normalised observation (see
:mod:`waddle.modules.task_embedding`). With one task they read the
observation only and have no embedding parameters.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from tensordict import TensorDictBase
from tensordict.nn import InteractionType, TensorDictModule
from torch import nn
from torchrl.modules import IndependentNormal, ProbabilisticActor, ValueOperator

from waddle.modules.heading_memory import HeadingMemory
from waddle.modules.mlp import mlp
from waddle.modules.normalizer import RunningNormalizer
from waddle.modules.task_embedding import TASK_ID_KEY, append_task_embedding, conditioned

OBSERVATION_KEY = "observation"
"""The entry of the env's TensorDict both networks read by default."""

SENSOR_OBSERVATION_KEY = "sensor_observation"
ROBOT_OBSERVATION_KEY = "robot_observation"
"""The entry holding what the robot measures on board (an actor trained for deployment reads it)."""

HEADING_ERROR_KEY = "heading_error"
"""The entry holding the trunk's yaw off its commanded heading: the critic of a robot actor reads it."""

LOG_STD_BOUNDS = (-5.0, 1.0)
"""The log standard deviation is clamped to this range before use."""


class PinnedNormal(IndependentNormal):
    """:class:`~torchrl.modules.IndependentNormal` over the action entries, with the ``pinned`` ones not drawn.

    A pinned entry is its mean in every sample and adds nothing to the log-probability or the entropy:
    it is a function of the observation that the actor computes (a
    :class:`~waddle.modules.heading_memory.HeadingMemory`), not a choice PPO explores or reweights.

    Args:
        loc: mean, ``(..., action_dim)``.
        scale: standard deviation, same shape (its pinned entries are not used).
        pinned: ``(action_dim,)`` bool, true at the entries that are not drawn.

    Example:
        >>> dist = PinnedNormal(torch.zeros(2, 3), torch.ones(2, 3), pinned=torch.tensor([False, True, False]))
        >>> dist.sample()[:, 1].tolist(), round(float(dist.log_prob(torch.zeros(2, 3))[0]), 4)
        ([0.0, 0.0], -1.8379)
    """

    def __init__(self, loc: torch.Tensor, scale: torch.Tensor, *, pinned: torch.Tensor, **kwargs) -> None:
        self.pinned = pinned.to(loc.device)
        super().__init__(loc, torch.where(self.pinned, torch.ones_like(scale), scale), **kwargs)

    def rsample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008 (torch's default)
        drawn = super().rsample(sample_shape)
        return torch.where(self.pinned, self.base_dist.loc.expand_as(drawn), drawn)

    def sample(self, sample_shape: torch.Size = torch.Size()) -> torch.Tensor:  # noqa: B008
        with torch.no_grad():
            return self.rsample(sample_shape)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        return self.base_dist.log_prob(value).masked_fill(self.pinned, 0.0).sum(-1)

    def entropy(self) -> torch.Tensor:
        return self.base_dist.entropy().masked_fill(self.pinned, 0.0).sum(-1)


class GaussianPolicy(nn.Module):
    """``observation -> (loc, scale)``: an MLP mean and a learned, state-independent scale.

    Args:
        normalizer: the observation normaliser applied first (shared with the critic).
        action_dim: number of action entries.
        hidden_sizes: widths of the hidden layers.
        init_std: initial standard deviation of every action entry.
        activation: hidden activation class.
        num_tasks: size of the env's task library.
        task_embedding_dim: width of the task embedding read when
            ``num_tasks > 1`` (0: never read the task id).
        observation_key: the env entry the policy reads (``"observation"``,
            or ``"sensor_observation"`` for a policy that runs on the robot).
        memory: a :class:`~waddle.modules.heading_memory.HeadingMemory` whose entry
            replaces the MLP's (and is pinned: not sampled), or ``None``.

    Example:
        >>> policy = GaussianPolicy(RunningNormalizer(3), 2, (16,), init_std=0.5)
        >>> loc, scale = policy(torch.zeros(4, 3))
        >>> loc.shape, scale[0, 0].item()
        (torch.Size([4, 2]), 0.5)
    """

    def __init__(
        self,
        normalizer: RunningNormalizer,
        action_dim: int,
        hidden_sizes: Sequence[int],
        *,
        init_std: float = 0.5,
        activation: type[nn.Module] = nn.ELU,
        num_tasks: int = 1,
        task_embedding_dim: int = 0,
        observation_key: str = OBSERVATION_KEY,
        memory: HeadingMemory | None = None,
    ) -> None:
        super().__init__()
        if init_std <= 0:
            raise ValueError(f"init_std must be > 0, got {init_std}.")
        self.observation_key = observation_key
        (observation_dim,) = normalizer.shape
        embedding_dim = task_embedding_dim if conditioned(num_tasks, task_embedding_dim) else 0
        self.normalizer = normalizer
        self.net = mlp(observation_dim + embedding_dim, hidden_sizes, action_dim, activation=activation)
        # A small last layer starts the policy near the STAND pose (action 0).
        nn.init.uniform_(self.net[-1].weight, -1e-2, 1e-2)
        nn.init.zeros_(self.net[-1].bias)
        self.log_std = nn.Parameter(torch.full((action_dim,), math.log(init_std)))
        # Made after the MLP, so the MLP's weights are the seed's first draws whether or not it reads a task id.
        self.task_embedding = nn.Embedding(num_tasks, embedding_dim) if embedding_dim else None
        self.memory = memory
        if memory is not None and not 0 <= memory.channel < action_dim:
            raise ValueError(f"memory: channel {memory.channel} is not an action entry (action_dim {action_dim}).")
        pinned = torch.zeros(action_dim, dtype=torch.bool) if memory is None else memory.pinned(action_dim)
        self.register_buffer("pinned", pinned, persistent=False)

    @property
    def reads_task_id(self) -> bool:
        return self.task_embedding is not None

    def distribution_kwargs(self) -> dict[str, torch.Tensor]:
        """What :class:`PinnedNormal` needs beyond ``loc`` and ``scale`` (nothing without a memory)."""
        return {} if self.memory is None else {"pinned": self.pinned}

    def distribution(self, loc: torch.Tensor, scale: torch.Tensor) -> IndependentNormal:
        """The action distribution at ``(loc, scale)``: a :class:`PinnedNormal` when the policy has a memory."""
        if self.memory is None:
            return IndependentNormal(loc, scale)
        return PinnedNormal(loc, scale, **self.distribution_kwargs())

    def features(self, observation: torch.Tensor, task_id: torch.Tensor | None = None) -> torch.Tensor:
        """What the MLP reads: the normalised observation, and the task's embedding row when conditioned."""
        features = self.normalizer(observation)
        if self.task_embedding is None:
            return features
        return append_task_embedding(features, self.task_embedding, task_id)

    def forward(
        self, observation: torch.Tensor, task_id: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        loc = self.net(self.features(observation, task_id))
        scale = self.log_std.clamp(*LOG_STD_BOUNDS).exp().expand_as(loc)
        if self.memory is not None:
            loc = self.memory.insert(loc, observation)
            scale = torch.where(self.pinned, torch.ones_like(scale), scale)
        return loc, scale


class ValueNetwork(nn.Module):
    """``observation -> value`` of shape ``[..., 1]``, on normalised observations.

    Args:
        normalizer: the observation normaliser applied first (shared with the actor).
        hidden_sizes: widths of the hidden layers.
        activation: hidden activation class.
        num_tasks: size of the env's task library.
        task_embedding_dim: width of the critic's own task embedding, read
            when ``num_tasks > 1`` (0: never read the task id).
    """

    def __init__(
        self,
        normalizer: RunningNormalizer,
        hidden_sizes: Sequence[int],
        *,
        activation: type[nn.Module] = nn.ELU,
        num_tasks: int = 1,
        task_embedding_dim: int = 0,
    ) -> None:
        super().__init__()
        (observation_dim,) = normalizer.shape
        embedding_dim = task_embedding_dim if conditioned(num_tasks, task_embedding_dim) else 0
        self.normalizer = normalizer
        self.net = mlp(observation_dim + embedding_dim, hidden_sizes, 1, activation=activation)
        self.task_embedding = nn.Embedding(num_tasks, embedding_dim) if embedding_dim else None

    @property
    def reads_task_id(self) -> bool:
        return self.task_embedding is not None

    def forward(self, observation: torch.Tensor, task_id: torch.Tensor | None = None) -> torch.Tensor:
        features = self.normalizer(observation)
        if self.task_embedding is not None:
            features = append_task_embedding(features, self.task_embedding, task_id)
        return self.net(features)


class PolicyMean(nn.Module):
    """The deterministic policy ``observation -> clamp(mean, low, high)``, normaliser included.

    This is what ``waddle eval`` runs and ``waddle export`` writes to ONNX: one
    plain tensor-in, tensor-out module with no TensorDict and no sampling. A
    task-conditioned policy (``reads_task_id``) takes ``(observation, task_id)``.

    Given ``mirrors`` (the reflections of the observation and of the action), the
    mean is averaged with its mirror image, ``(mu(o) + M_a mu(M_o o)) / 2``: the
    exactly left-right equivariant part of the actor. A mirror loss leaves a small
    asymmetry, and on a biped a small asymmetry is a steady turn.

    Args:
        policy: the Gaussian policy whose mean is used.
        low: lower action bound.
        high: upper action bound.
        mirrors: ``(observation_mirror, action_mirror)``, or ``None`` for the plain mean.

    Example:
        >>> mean = PolicyMean(GaussianPolicy(RunningNormalizer(3), 2, (16,)))
        >>> mean(torch.zeros(1, 3)).shape
        torch.Size([1, 2])
    """

    def __init__(
        self,
        policy: GaussianPolicy,
        low: float = -1.0,
        high: float = 1.0,
        mirrors: tuple[Callable[[torch.Tensor], torch.Tensor], Callable[[torch.Tensor], torch.Tensor]] | None = None,
    ) -> None:
        super().__init__()
        self.policy = policy
        self.low = float(low)
        self.high = float(high)
        self.mirrors = mirrors

    @property
    def symmetric(self) -> bool:
        """Whether the mean is averaged with its mirror image."""
        return self.mirrors is not None

    @property
    def reads_task_id(self) -> bool:
        return self.policy.reads_task_id

    @property
    def observation_key(self) -> str:
        """The env entry this policy reads."""
        return self.policy.observation_key

    def forward(self, observation: torch.Tensor, task_id: torch.Tensor | None = None) -> torch.Tensor:
        loc = self.policy.net(self.policy.features(observation, task_id))
        if self.mirrors is not None:
            observation_mirror, action_mirror = self.mirrors
            reflected = self.policy.net(self.policy.features(observation_mirror(observation), task_id))
            loc = 0.5 * (loc + action_mirror(reflected))
        if self.policy.memory is not None:
            loc = self.policy.memory.insert(loc, observation)
        return loc.clamp(self.low, self.high)


class ConcatenatedInputs(nn.Module):
    """Feeds ``network`` the concatenation of its first ``num_inputs`` arguments, each flattened
    after the batch dimension; the arguments after them (the task id) are passed on as they are.

    A TorchRL module hands a network one argument per input key; this is how the critic reads
    the observation and the drawn randomization values, stored under separate keys, as one vector.

    Example:
        >>> net = ConcatenatedInputs(nn.Identity(), 2)
        >>> net(torch.zeros(4, 3), torch.ones(4, 2)).shape
        torch.Size([4, 5])
    """

    def __init__(self, network: nn.Module, num_inputs: int) -> None:
        super().__init__()
        self.network = network
        self.num_inputs = int(num_inputs)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        values, rest = inputs[: self.num_inputs], inputs[self.num_inputs :]
        batch_dims = values[0].dim() - 1
        return self.network(torch.cat([value.flatten(batch_dims) for value in values], dim=-1), *rest)


def network_in_keys(
    network: GaussianPolicy | ValueNetwork, observation_keys: Sequence[str | tuple[str, ...]] | None = None
) -> list[str | tuple[str, ...]]:
    """``observation_keys`` (the network's own ``observation_key`` by default, else ``["observation"]``),
    and ``"task_id"`` after them when ``network`` is task-conditioned."""
    if observation_keys is None:
        observation_keys = [getattr(network, "observation_key", OBSERVATION_KEY)]
    keys = list(observation_keys)
    return [*keys, TASK_ID_KEY] if network.reads_task_id else keys


def make_actor(policy: GaussianPolicy) -> ProbabilisticActor:
    """Wrap ``policy`` as a TorchRL actor reading its ``observation_key`` (and ``"task_id"``
    when conditioned) and writing ``"loc"``, ``"scale"``, a sampled ``"action"`` and its
    log-probability.

    The actor samples unless an exploration context (``set_exploration_type``)
    says otherwise; for the deterministic policy use :class:`PolicyMean`.
    """
    module = TensorDictModule(policy, in_keys=network_in_keys(policy), out_keys=["loc", "scale"])
    kwargs = policy.distribution_kwargs()
    return ProbabilisticActor(
        module,
        in_keys=["loc", "scale"],
        distribution_class=PinnedNormal if kwargs else IndependentNormal,
        distribution_kwargs=kwargs or None,
        return_log_prob=True,
        default_interaction_type=InteractionType.RANDOM,
    )


class GeneratorActor(nn.Module):
    """``policy`` as a sampling actor that draws from its own generator, whatever the exploration context.

    It writes what :func:`make_actor`'s actor writes in sampling mode:
    ``"loc"``, ``"scale"``, an ``"action"`` drawn from ``Normal(loc, scale)``
    (its pinned entries at their mean) and its ``"action_log_prob"`` (summed
    over the drawn entries). It is for
    a thread that acts while another computes TorchRL losses: those switch the
    process-wide exploration type to deterministic while they run, and the
    other thread's draws must not depend on that or on its global generator.
    """

    def __init__(self, policy: GaussianPolicy, generator: torch.Generator) -> None:
        super().__init__()
        self.policy = policy
        self.generator = generator
        self.in_keys = network_in_keys(policy)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        inputs = [td[key] for key in self.in_keys]
        loc, scale = self.policy(*inputs)
        noise = torch.randn(loc.shape, generator=self.generator, dtype=loc.dtype, device=loc.device)
        action = torch.where(self.policy.pinned, loc, loc + scale * noise)
        td.update(
            {
                "loc": loc,
                "scale": scale,
                "action": action,
                "action_log_prob": self.policy.distribution(loc, scale).log_prob(action),
            }
        )
        return td


def make_critic(value: ValueNetwork, observation_keys: Sequence[str | tuple[str, ...]] | None = None) -> ValueOperator:
    """Wrap ``value`` as a TorchRL value operator reading ``observation_keys`` (``["observation"]``
    by default; several are flattened and concatenated in order), and ``"task_id"`` when
    conditioned, and writing ``"state_value"``."""
    keys = [OBSERVATION_KEY] if observation_keys is None else list(observation_keys)
    module = value if len(keys) == 1 else ConcatenatedInputs(value, len(keys))
    return ValueOperator(module, in_keys=network_in_keys(value, keys))
