"""Training checkpoints: atomic saves, validated loads, resume compatibility.

A checkpoint is one ``torch.save`` file holding a plain dictionary::

    {"format": "waddle-checkpoint", "version": 1,
     "algo": "ppo", "config": {...}, "env_steps": int, "iteration": int,
     "wall_time_s": float, "trainer": trainer.state_dict()}

``config`` is JSON-like (the run and algorithm dataclasses as dictionaries), so
checkpoints load with ``torch.load(weights_only=True)``: opening one never
runs pickled code.

A save goes through :func:`waddle.files.atomic_write`, so a crash or Ctrl-C
mid-write leaves the previous checkpoint whole. A load turns
every way a file can be unusable (missing, truncated, not a checkpoint, from
another version) into one :class:`CheckpointError` with a one-line message.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch

from waddle.files import atomic_write

FORMAT = "waddle-checkpoint"
"""The marker every waddle checkpoint carries under ``"format"``."""
VERSION = 1
"""The checkpoint layout version this module writes and reads."""
REQUIRED_KEYS = ("algo", "config", "env_steps", "iteration", "trainer")


class CheckpointError(Exception):
    """A checkpoint cannot be read, or does not fit the run it should continue."""


def save_checkpoint(
    path: str | Path,
    *,
    algo: str,
    config: Mapping[str, Any],
    trainer_state: Mapping[str, Any],
    env_steps: int,
    iteration: int,
    wall_time_s: float = 0.0,
) -> None:
    """Atomically write a checkpoint to ``path`` (see the module docstring for the layout)."""
    payload = {
        "format": FORMAT,
        "version": VERSION,
        "algo": str(algo),
        "config": dict(config),
        "env_steps": int(env_steps),
        "iteration": int(iteration),
        "wall_time_s": float(wall_time_s),
        "trainer": dict(trainer_state),
    }
    atomic_write(path, lambda file: torch.save(payload, file))


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read and validate a checkpoint written by :func:`save_checkpoint`.

    Raises:
        CheckpointError: the file is missing, unreadable, truncated, not a
            waddle checkpoint, or of another layout version.
    """
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist.")
    if path.is_dir():
        raise CheckpointError(f"checkpoint {path} is a directory; expected a checkpoint.pt file.")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # noqa: BLE001 - torch.load fails in many ways (zip, unpickler, EOF, key errors)
        reason = str(err).strip().splitlines()[0].split(". ")[0] if str(err).strip() else type(err).__name__
        raise CheckpointError(
            f"checkpoint {path} cannot be read, truncated or not a torch file ({reason[:160]})."
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a waddle checkpoint (no '{FORMAT}' marker).")
    if payload.get("version") != VERSION:
        raise CheckpointError(
            f"checkpoint {path} has layout version {payload.get('version')!r}; this waddle reads version {VERSION}."
        )
    missing = [key for key in REQUIRED_KEYS if key not in payload]
    if missing:
        raise CheckpointError(f"checkpoint {path} lacks {', '.join(missing)}.")
    return payload


def config_differences(
    saved: Mapping[str, Any], requested: Mapping[str, Any], *, ignore: Iterable[str] = (), prefix: str = ""
) -> list[tuple[str, Any, Any]]:
    """``(field, saved value, requested value)`` for every field that differs.

    Nested dictionaries are compared field by field and reported with dotted
    names (``"algorithm.actor_hidden_sizes"``); lists and tuples compare equal when their
    items do. Fields named in ``ignore`` (dotted names) are skipped.

    Example:
        >>> config_differences({"task": "walk", "algo": {"lr": 1}}, {"task": "standing", "algo": {"lr": 1}})
        [('task', 'walk', 'standing')]
    """
    ignore = set(ignore)
    differences = []
    for key in sorted(set(saved) | set(requested), key=str):
        name = f"{prefix}{key}"
        if name in ignore:
            continue
        old, new = saved.get(key, "<absent>"), requested.get(key, "<absent>")
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            differences += config_differences(old, new, ignore=ignore, prefix=f"{name}.")
        elif _normalised(old) != _normalised(new):
            differences.append((name, old, new))
    return differences


def _normalised(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return [_normalised(item) for item in value]
    return value


def check_compatible(saved: Mapping[str, Any], requested: Mapping[str, Any], *, ignore: Iterable[str] = ()) -> None:
    """Refuse to resume a run whose configuration differs from the checkpoint's.

    Raises:
        CheckpointError: naming the first differing field and both values.
    """
    differences = config_differences(saved, requested, ignore=ignore)
    if differences:
        name, old, new = differences[0]
        more = f" (and {len(differences) - 1} more)" if len(differences) > 1 else ""
        raise CheckpointError(
            f"cannot resume: {name} differs, checkpoint has {old!r}, this run asks for {new!r}{more}."
        )
