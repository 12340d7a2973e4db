"""``waddle train --logger``: the TorchRL logger a run also writes its scalars to.

``metrics.csv`` (the runner's own file) is always written; a logger is an extra
sink for the same rows, one ``log_scalar(name, value, step=env_steps)`` per
column, made by :func:`make_logger` from TorchRL's
:mod:`torchrl.record.loggers`:

* ``csv``: :class:`~torchrl.record.loggers.CSVLogger`, one ``<out>/csv/scalars/<name>.csv``
  file of ``step,value`` lines per scalar (no extra package);
* ``tensorboard``: :class:`~torchrl.record.loggers.TensorboardLogger`, event files
  under ``<out>/tensorboard`` (needs ``pip install tensorboard``);
* ``wandb``: :class:`~torchrl.record.loggers.WandbLogger`, a Weights & Biases run in
  project ``waddle`` with its files under ``<out>/wandb`` (needs ``pip install
  wandb``; ``WANDB_MODE=offline`` keeps it on disk).

A resumed run keeps logging to the same place; rows the stopped run logged
after its last checkpoint stay there (``metrics.csv`` drops them).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torchrl.record.loggers import Logger

LOGGERS: tuple[str, ...] = ("none", "csv", "tensorboard", "wandb")
"""``--logger`` names; ``none`` writes ``metrics.csv`` only."""
PACKAGES: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "pip install tensorboard  (or: pip install 'waddle[tensorboard]')"),
    "wandb": ("wandb", "pip install wandb  (or: pip install 'waddle[wandb]')"),
}
"""Logger name -> (the package it imports, the command that installs it)."""
WANDB_PROJECT = "waddle"


def require_package(name: str) -> None:
    """Raise an ImportError saying what to install when logger ``name`` lacks its package."""
    if name not in PACKAGES:
        return
    package, install = PACKAGES[name]
    try:
        importlib.import_module(package)
    except ImportError:
        raise ImportError(f"--logger {name} needs the {package} package, which is not installed: {install}") from None


def make_logger(
    name: str, out_dir: str | Path, *, run_name: str | None = None, config: Mapping[str, Any] | None = None
) -> Logger | None:
    """The TorchRL logger ``--logger name`` writes to under ``out_dir`` (``None`` for ``"none"``).

    Args:
        name: one of :data:`LOGGERS`.
        out_dir: the run's output directory; the logger writes under ``out_dir/<name>``.
        run_name: the W&B run name (the output directory's name by default).
        config: the run configuration, stored as the W&B run's config.

    Raises:
        ValueError: ``name`` is not in :data:`LOGGERS`.
        ImportError: the logger's package is not installed (the message says how to install it).
    """
    if name not in LOGGERS:
        raise ValueError(f"logger must be one of {', '.join(LOGGERS)}; got {name!r}.")
    if name == "none":
        return None
    require_package(name)
    out_dir = Path(out_dir)
    if name == "csv":
        from torchrl.record.loggers import CSVLogger

        return CSVLogger(exp_name="csv", log_dir=str(out_dir))
    if name == "tensorboard":
        from torchrl.record.loggers import TensorboardLogger

        return TensorboardLogger(exp_name="tensorboard", log_dir=str(out_dir))
    from torchrl.record.loggers import WandbLogger

    return WandbLogger(
        exp_name=run_name or out_dir.resolve().name,
        save_dir=str(out_dir),
        project=WANDB_PROJECT,
        config=dict(config or {}),
        log_env_packages=False,
    )
