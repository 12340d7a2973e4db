"""MicroDuckTaskSampler: a TorchRL transform that picks each env's task at reset.

Without it, a :class:`~waddle.envs.microduck.MicroDuckEnv` draws the task of
every resetting env from its library's ``weight`` field. The sampler writes
``task_id`` into the reset TensorDict before the env sees it, from weights of
its own that can change during training (a curriculum), or pins one task per
env (evaluation, side-by-side videos).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey
from torchrl.envs import Compose, EnvBase, Transform

__all__ = ["MicroDuckTaskSampler"]

_SEED_SALT = 0x7A5C_5EED_D0C0
"""Mixed into a seed the sampler receives from ``env.set_seed``, so its draws don't mirror the env's."""


class MicroDuckTaskSampler(Transform):
    """Write a ``task_id`` per env at reset, drawn from weights or fixed.

    At every reset the sampler puts an int64 ``(num_envs, 1)`` index under
    ``task_id_key`` in the reset TensorDict, which the env reads to pick each
    resetting env's task row. On a partial reset only the resetting envs get a
    new index; the others keep the one they had (from the reset input when it
    carries it, else the last one this sampler wrote). A ``task_id`` passed in
    the reset input is replaced for the resetting envs: pin ids with
    :meth:`fixed` instead.

    Args:
        weights: one non-negative sampling weight per task of the env's
            library, in library order. Stored normalized in the
            ``probabilities`` buffer, which may be overwritten in place
            (``sampler.probabilities.copy_(...)``) to run a curriculum.
            Exactly one of ``weights`` and ``task_ids`` is given.
        task_ids: one fixed task index per env: env ``i`` runs
            ``task_ids[i]`` after every reset. See :meth:`fixed`.
        task_id_key: key written in the reset TensorDict.
        seed: seed of the sampler's own generator; ``None`` draws from the
            global torch generator.

    Inside a :class:`~torchrl.envs.TransformedEnv`, ``env.set_seed(seed)``
    seeds the sampler too (with a seed derived from ``seed``).
    ``TransformedEnv.set_seed`` only seeds the base env, so the sampler wraps
    the ``set_seed`` of the env it is attached to.

    Example:
        >>> sampler = MicroDuckTaskSampler([1.0, 2.0, 1.0], seed=0)
        >>> sampler.sample((4,)).shape
        torch.Size([4, 1])
        >>> MicroDuckTaskSampler.fixed([1, 2, 0, 2]).sample((4,))[:, 0]
        tensor([1, 2, 0, 2])
        >>> # env = TransformedEnv(MicroDuckEnv(num_envs=4, tasks=library), sampler)
    """

    probabilities: torch.Tensor | None
    task_ids: torch.Tensor | None

    def __init__(
        self,
        weights: Sequence[float] | torch.Tensor | None = None,
        *,
        task_ids: Sequence[int] | torch.Tensor | None = None,
        task_id_key: NestedKey = "task_id",
        seed: int | None = None,
    ) -> None:
        super().__init__(in_keys=[], out_keys=[])
        if (weights is None) == (task_ids is None):
            raise ValueError("MicroDuckTaskSampler takes exactly one of weights (a draw) and task_ids (fixed).")
        if weights is not None:
            weights = torch.as_tensor(weights, dtype=torch.float32).flatten()
            _check_weights(weights, "weights")
            self.register_buffer("probabilities", weights / weights.sum())
            self.register_buffer("task_ids", None)
        else:
            ids = torch.as_tensor(task_ids)
            if ids.numel() == 0 or ids.is_floating_point() or ids.dtype == torch.bool or (ids < 0).any():
                raise ValueError(f"task_ids must be a non-empty sequence of task indices >= 0, got {task_ids!r}.")
            self.register_buffer("probabilities", None)
            self.register_buffer("task_ids", ids.to(torch.int64).flatten())
        self.task_id_key = task_id_key
        self.generator: torch.Generator | None = None
        self._last_task_id: torch.Tensor | None = None
        self.set_seed(seed)

    @classmethod
    def fixed(
        cls, task_ids: Sequence[int] | torch.Tensor, *, task_id_key: NestedKey = "task_id"
    ) -> MicroDuckTaskSampler:
        """One fixed task per env: env ``i`` runs ``task_ids[i]`` after every reset."""
        return cls(task_ids=task_ids, task_id_key=task_id_key)

    def set_seed(self, seed: int | None) -> None:
        """Seed the sampler's generator; ``None`` falls back to the global torch generator."""
        if seed is None:
            self.generator = None
            return
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int or None, got {seed!r}.")
        self.generator = torch.Generator().manual_seed(seed % 2**64)

    _set_seed = set_seed

    def sample(self, batch_size: Sequence[int] | torch.Size) -> torch.Tensor:
        """One task index per env, int64 of shape ``(*batch_size, 1)``.

        Fixed ids are laid out over the batch in order and must cover it
        exactly; a weighted sampler draws with replacement.
        """
        batch_size = torch.Size(batch_size)
        count = batch_size.numel()
        if self.task_ids is not None:
            if self.task_ids.numel() != count:
                raise ValueError(
                    f"{self.task_ids.numel()} fixed task_ids cannot cover a batch of {count} envs "
                    f"(batch size {tuple(batch_size)}); give one id per env."
                )
            return self.task_ids.reshape(*batch_size, 1).clone()
        _check_weights(self.probabilities, "probabilities")
        ids = torch.multinomial(self.probabilities.detach().cpu(), count, replacement=True, generator=self.generator)
        return ids.to(self.probabilities.device).reshape(*batch_size, 1)

    # ------------------------------------------------------------------
    # Transform hooks
    # ------------------------------------------------------------------

    def _reset_env_preprocess(self, tensordict: TensorDictBase | None) -> TensorDictBase:
        parent = self.parent
        batch_size = parent.batch_size if parent is not None else torch.Size([])
        device = parent.device if parent is not None else None
        if tensordict is None:
            tensordict = TensorDict(batch_size=batch_size, device=device)
        self._check_library_size(parent)
        drawn = self.sample(tensordict.batch_size)
        if tensordict.device is not None:
            drawn = drawn.to(tensordict.device)
        mask = self._reset_mask(tensordict, parent)
        previous = self._previous_ids(tensordict, drawn) if mask is not None else None
        if previous is not None:
            drawn = torch.where(mask.reshape(drawn.shape), drawn, previous)
        self._last_task_id = drawn
        tensordict.set(self.task_id_key, drawn)
        return tensordict

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        return tensordict_reset

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        return tensordict

    def set_container(self, container: Transform | EnvBase) -> None:
        super().set_container(container)
        env = self._attached_env()
        if env is not None and not _SeedForwarder.installed(env, self):
            env.set_seed = _SeedForwarder(env, self)

    def _attached_env(self) -> EnvBase | None:
        """The env holding this transform, through any Compose; None while detached.

        (``Transform.container`` raises inside a Compose not yet attached to an env.)
        """
        reference = self.__dict__.get("_container")
        container = reference() if reference is not None else None
        while isinstance(container, Compose):
            reference = container.__dict__.get("_container")
            container = reference() if reference is not None else None
        return container if isinstance(container, EnvBase) else None

    def _reset_mask(self, tensordict: TensorDictBase, parent: EnvBase | None) -> torch.Tensor | None:
        reset_keys = parent.reset_keys if parent is not None else ["_reset"]
        for key in reset_keys:
            mask = tensordict.get(key, None)
            if mask is not None:
                return mask.to(torch.bool)
        return None

    def _previous_ids(self, tensordict: TensorDictBase, drawn: torch.Tensor) -> torch.Tensor | None:
        """The ids the envs hold now: from the reset input if it carries them, else the last ones written."""
        previous = tensordict.get(self.task_id_key, None)
        if previous is None or previous.numel() != drawn.numel():
            previous = self._last_task_id
        if previous is None or previous.numel() != drawn.numel():
            return None
        return previous.reshape(drawn.shape).to(device=drawn.device, dtype=torch.int64)

    def _check_library_size(self, parent: EnvBase | None) -> None:
        library = getattr(parent, "tasks", None) if parent is not None else None
        if self.probabilities is None or library is None or not hasattr(library, "shape"):
            return
        if self.probabilities.numel() != library.shape[0]:
            raise ValueError(
                f"MicroDuckTaskSampler has {self.probabilities.numel()} weights but the env's library has "
                f"{library.shape[0]} tasks; give one weight per task, in library order."
            )


def _check_weights(weights: torch.Tensor, argument: str) -> None:
    if weights.numel() == 0 or not bool(torch.isfinite(weights).all()) or bool((weights < 0).any()):
        raise ValueError(f"{argument} must be a non-empty sequence of finite values >= 0, got {weights.tolist()}.")
    if not bool(weights.sum() > 0):
        raise ValueError(f"{argument} must not all be zero, got {weights.tolist()}: no task could be drawn.")


class _SeedForwarder:
    """Stands in for an env's ``set_seed``: seeds the env with its own ``set_seed``, then the sampler.

    It holds the env and the sampler as plain attributes, so a deep copy of
    the env forwards to the copied sampler.
    """

    def __init__(self, env: EnvBase, sampler: MicroDuckTaskSampler) -> None:
        self.env = env
        self.sampler = sampler
        self.previous = env.__dict__.get("set_seed")

    def __call__(self, seed: int | None = None, static_seed: bool = False) -> int | None:
        if self.previous is not None:
            result = self.previous(seed, static_seed=static_seed)
        else:
            result = type(self.env).set_seed(self.env, seed, static_seed=static_seed)
        self.sampler.set_seed(None if seed is None else int(seed) ^ _SEED_SALT)
        return result

    @staticmethod
    def installed(env: EnvBase, sampler: MicroDuckTaskSampler) -> bool:
        forwarder = env.__dict__.get("set_seed")
        while isinstance(forwarder, _SeedForwarder):
            if forwarder.sampler is sampler:
                return True
            forwarder = forwarder.previous
        return False
