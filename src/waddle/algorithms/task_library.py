"""The task library a trainer was built for: read from the env, recorded, checked on load.

A task-conditioned network holds one embedding row per task, by position in
the env's library, so a policy only means something against the library it was
trained on. Every trainer records the library's task names, in order, in its
``state_dict`` (under :data:`STATE_KEY`) and refuses, on load, a state recorded
for another library. A state without the record (one saved by a waddle that
did not record libraries) loads unchecked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torchrl.envs import EnvBase

from waddle.modules.task_embedding import TASK_ID_KEY

STATE_KEY = "task_library"
"""Entry of a trainer's ``state_dict`` holding its library's task names, in id order."""


class TaskLibraryError(ValueError):
    """A policy's recorded task library differs from the env's."""


def check_task_embedding_dim(config: Any) -> None:
    """``config.task_embedding_dim`` must be an integer >= 0 (PPO, SHAC and APG share the field)."""
    value = config.task_embedding_dim
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"{type(config).__name__}.task_embedding_dim must be an integer >= 0 (0: no task conditioning), "
            f"got {value!r}."
        )


def task_library(env: EnvBase) -> tuple[str, ...]:
    """The names of ``env``'s tasks in id order.

    A MicroDuck env (or a transformed one) lists them in ``env.tasks.name``.
    Another env with a bounded ``"task_id"`` observation gets ``task0``,
    ``task1``, ... up to its bound; an env without a task id has an empty
    library (one implicit task).
    """
    tasks = getattr(env, "tasks", None)
    names = getattr(tasks, "name", None)
    if names is not None:
        return (names,) if isinstance(names, str) else tuple(str(name) for name in names)
    spec = env.observation_spec.get(TASK_ID_KEY, None)
    if spec is None:
        return ()
    high = getattr(getattr(spec, "space", None), "high", None)
    if high is None:
        raise ValueError(
            f"env's '{TASK_ID_KEY}' observation must be bounded (e.g. torchrl.data.Bounded) so that its "
            f"library size is known; got {type(spec).__name__}."
        )
    return tuple(f"task{index}" for index in range(int(high.max()) + 1))


def describe(names: Sequence[str]) -> str:
    """``'3 tasks [standing, tracking+0.20, jump]'``, for messages."""
    names = list(names)
    return f"{len(names)} task{'s' if len(names) != 1 else ''} [{', '.join(names)}]"


def check_task_library(saved: Sequence[str] | None, current: Sequence[str], *, what: str = "checkpoint") -> None:
    """Refuse a ``saved`` library (names in id order) that differs from ``current``.

    ``saved=None`` (a state that carries no library) passes.

    Raises:
        TaskLibraryError: naming both libraries.

    Example:
        >>> check_task_library(["standing", "jump"], ["jump", "standing"])
        Traceback (most recent call last):
        ...
        waddle.algorithms.task_library.TaskLibraryError: the checkpoint was trained on 2 tasks [standing, jump] but this env's library is 2 tasks [jump, standing]; task ids index the library, so names, count and order must match.
    """
    if saved is None:
        return
    saved, current = [str(name) for name in saved], [str(name) for name in current]
    if saved != current:
        raise TaskLibraryError(
            f"the {what} was trained on {describe(saved)} but this env's library is {describe(current)}; "
            "task ids index the library, so names, count and order must match."
        )


def saved_task_library(state: Mapping[str, Any]) -> list[str] | None:
    """The library recorded in a trainer state, or ``None`` when it predates the record."""
    names = state.get(STATE_KEY)
    return None if names is None else [str(name) for name in names]
