"""Start a new run from another run's weights (``waddle train --init-from CHECKPOINT``).

The new run has its own task library, outputs, optimiser state and counters;
from the source it takes the networks' weights and the observation
normaliser's statistics. The networks must have the same shape: same
algorithm, hidden sizes, observation and action widths (checked by
:func:`check_network_config` on the configs, then by :func:`load_weights` on
the weights, each naming what differs).

The task embedding is the one part that may change:

* source and new run both task-conditioned: the new table's row of a task is
  the source's row of the task with the same name; tasks the source did not
  have keep the new network's fresh rows;
* a one-task (unconditioned) source and a conditioned new run: every row is
  fresh, and the first layer of each network gets zero weights on the new
  embedding inputs, so the new run starts out acting exactly as the source
  did in every task and learns from there what tells its tasks apart;
* a conditioned source and an unconditioned new run: refused (the source's
  first layer reads an embedding the new network does not have).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from waddle.algorithms.presets import upgrade_config_fields
from waddle.algorithms.task_library import describe, saved_task_library
from waddle.modules.task_embedding import EMBEDDING_KEY

NETWORK_STATES: dict[str, tuple[str, ...]] = {
    "ppo": ("policy", "value"),
    "shac": ("actor", "critic", "target_critic"),
    "apg": ("actor",),
}
"""Per algorithm: the trainer attributes (and ``state_dict`` entries) holding its networks."""

NETWORK_FIELDS: dict[str, tuple[str, ...]] = {
    "ppo": ("actor_hidden_sizes", "critic_hidden_sizes", "actor_observation"),
    "shac": (
        "actor_hidden_sizes",
        "critic_hidden_sizes",
        "critic_layer_norm",
        "stochastic_policy",
        "normalize_observations",
    ),
    "apg": ("actor_hidden_sizes", "stochastic_policy", "normalize_observations"),
}
"""Per algorithm: the config fields that shape its networks; a run started from another must match them."""


class InitFromError(ValueError):
    """The source checkpoint's networks cannot start this run."""


@dataclass
class InitFromReport:
    """What :func:`load_weights` carried over, for the user."""

    kept_rows: list[str] = field(default_factory=list)
    """Tasks whose embedding rows came from the source."""
    fresh_rows: list[str] = field(default_factory=list)
    """Tasks whose embedding rows are freshly initialised."""
    widened: bool = False
    """Whether the source read no task id, so the first layers got zero weights on the embedding."""

    def summary(self) -> str:
        parts = ["weights and observation statistics kept, optimiser state fresh"]
        if self.widened:
            parts.append(f"the source reads no task id: fresh task embedding for {describe(self.fresh_rows)}")
        elif self.kept_rows or self.fresh_rows:
            parts.append(f"embedding rows kept for {describe(self.kept_rows)}, new for {describe(self.fresh_rows)}")
        return "; ".join(parts)


def source_algorithm_config(source: Mapping[str, Any]) -> dict[str, Any]:
    """The source checkpoint's algorithm config, with the field names and additions of today's configs."""
    return upgrade_config_fields(source["algo"], source["config"]["algorithm"])


def source_reads_task_id(source: Mapping[str, Any]) -> bool:
    """Whether the source's networks hold a task embedding."""
    first = source["trainer"][NETWORK_STATES[source["algo"]][0]]
    return any(key.endswith(EMBEDDING_KEY) for key in first)


def inherited_fields(source: Mapping[str, Any]) -> dict[str, Any]:
    """The network-shaping config fields a run started from ``source`` takes when not given.

    The embedding width is inherited only from a task-conditioned source; a
    one-task source leaves the new run its own.
    """
    config = source_algorithm_config(source)
    fields = {name: config[name] for name in NETWORK_FIELDS[source["algo"]] if name in config}
    if source_reads_task_id(source):
        fields["task_embedding_dim"] = config["task_embedding_dim"]
    return fields


def check_network_config(source: Mapping[str, Any], algo: str, config: Mapping[str, Any], *, path: str) -> None:
    """Refuse a run whose algorithm or network config differs from the source checkpoint's.

    Args:
        source: the loaded source checkpoint.
        algo: this run's algorithm.
        config: this run's algorithm config as a dictionary.
        path: the source's path, for messages.

    Raises:
        InitFromError: naming the first differing field and both values.
    """
    if source["algo"] != algo:
        raise InitFromError(
            f"--init-from {path} holds {source['algo']} networks but this run trains with --algo {algo}; "
            f"pass --algo {source['algo']} (or leave --algo out)."
        )
    saved = source_algorithm_config(source)
    names = list(NETWORK_FIELDS[algo])
    if source_reads_task_id(source) and config.get("task_embedding_dim", 0) > 0:
        names.append("task_embedding_dim")
    for name in names:
        old, new = _plain(saved.get(name)), _plain(config.get(name))
        if old != new:
            flag = "--" + name.replace("_", "-")
            raise InitFromError(
                f"--init-from {path}: the network differs in {name}: the source has {old!r}, this run asks for "
                f"{new!r}; leave {flag} out to take the source's."
            )


def network_widths(state: Mapping[str, torch.Tensor]) -> tuple[int, int]:
    """``(observation width, action width)`` a network's ``state_dict`` reads and writes.

    The first matrix (of the first linear layer) reads the observation and the
    task embedding; the last one writes the output.
    """
    matrices = [value for key, value in state.items() if value.ndim == 2 and not key.endswith(EMBEDDING_KEY)]
    embedding = next((value for key, value in state.items() if key.endswith(EMBEDDING_KEY)), None)
    width = 0 if embedding is None else embedding.shape[1]
    return matrices[0].shape[1] - width, matrices[-1].shape[0]


@torch.no_grad()
def load_weights(trainer: Any, algo: str, source: Mapping[str, Any], *, path: str) -> InitFromReport:
    """Load the source checkpoint's networks and observation statistics into a new ``trainer``.

    The trainer's optimisers, counters and learning rate are left as built
    (fresh); the networks' parameters are overwritten in place, so the
    optimisers keep pointing at them.

    Raises:
        InitFromError: the networks differ in observation or action width, or
            in a layer's shape, or the source reads a task id this run's networks do not.
    """
    source_state = source["trainer"]
    target_state = trainer.state_dict()
    source_names = saved_task_library(source_state)
    target_names = list(trainer.task_library)
    first = NETWORK_STATES[algo][0]
    (source_obs, source_act), (obs, act) = network_widths(source_state[first]), network_widths(target_state[first])
    if source_obs != obs:
        raise InitFromError(
            f"--init-from {path}: the source's {first} reads {source_obs} observation values, this env gives {obs}."
        )
    if source_act != act:
        raise InitFromError(
            f"--init-from {path}: the source's {first} writes {source_act} actions, this env takes {act}."
        )
    for name in NETWORK_STATES[algo][1:]:
        (source_in, _), (target_in, _) = network_widths(source_state[name]), network_widths(target_state[name])
        if source_in != target_in:
            # PPO's critic reads the drawn randomization values beside the observation when the env reports them.
            raise InitFromError(
                f"--init-from {path}: the source's {name} reads {source_in} values, this run's reads {target_in}; "
                "a critic reads the randomization values when the env draws them, so train with the source's "
                "--randomization."
            )
    report = InitFromReport()
    for name in NETWORK_STATES[algo]:
        state = _transfer(source_state[name], target_state[name], source_names, target_names, f"{name}", path, report)
        getattr(trainer, name).load_state_dict(state)
    normalizer = source_state.get("normalizer")
    if normalizer is not None and getattr(trainer, "normalizer", None) is not None:
        trainer.normalizer.load_state_dict(normalizer)
    # Every network has its own table; the report lists each task once.
    report.kept_rows = list(dict.fromkeys(report.kept_rows))
    report.fresh_rows = list(dict.fromkeys(report.fresh_rows))
    return report


def _transfer(
    source: Mapping[str, torch.Tensor],
    target: Mapping[str, torch.Tensor],
    source_names: Sequence[str] | None,
    target_names: Sequence[str],
    where: str,
    path: str,
    report: InitFromReport,
) -> dict[str, torch.Tensor]:
    source_embedding = next((key for key in source if key.endswith(EMBEDDING_KEY)), None)
    target_embedding = next((key for key in target if key.endswith(EMBEDDING_KEY)), None)
    if source_embedding is not None and target_embedding is None:
        library = describe(source_names or [])
        raise InitFromError(
            f"--init-from {path}: the source's {where} reads a task embedding (a library of {library}) but this "
            f"run's does not ({describe(target_names)}, or --task-embedding-dim 0); start it on a library of "
            "several tasks."
        )
    out: dict[str, torch.Tensor] = {}
    widened = False
    for key, value in target.items():
        if key.endswith(EMBEDDING_KEY):
            out[key] = _embedding_rows(
                source.get(key), value, source_names, target_names, f"{where}.{key}", path, report
            )
            continue
        if key not in source:
            raise InitFromError(f"--init-from {path}: the source's {where} has no {key}; the networks differ.")
        old = source[key]
        if old.shape == value.shape:
            out[key] = old.clone()
        elif (
            source_embedding is None
            and target_embedding is not None
            and not widened
            and old.ndim == value.ndim == 2
            and old.shape[0] == value.shape[0]
            and value.shape[1] - old.shape[1] == target[target_embedding].shape[1]
        ):
            # The first layer now also reads the embedding: zero weights there keep the source's function.
            out[key] = torch.cat([old, old.new_zeros(old.shape[0], value.shape[1] - old.shape[1])], dim=1)
            widened = True
            report.widened = True
        else:
            raise InitFromError(
                f"--init-from {path}: {where}.{key} has shape {tuple(old.shape)} in the source but "
                f"{tuple(value.shape)} in this run; the networks differ."
            )
    extra = sorted(set(source) - set(target))
    if extra:
        raise InitFromError(
            f"--init-from {path}: the source's {where} has {extra} this run's lacks; the networks differ."
        )
    return out


def _embedding_rows(
    source: torch.Tensor | None,
    target: torch.Tensor,
    source_names: Sequence[str] | None,
    target_names: Sequence[str],
    where: str,
    path: str,
    report: InitFromReport,
) -> torch.Tensor:
    """The new table: the source's row of each task it shares by name, the new table's own row elsewhere."""
    rows = target.clone()
    if source is None:
        report.fresh_rows.extend(target_names)
        return rows
    if source.shape[1] != target.shape[1]:
        raise InitFromError(
            f"--init-from {path}: {where} is {source.shape[1]} wide in the source, {target.shape[1]} in this run; "
            "leave --task-embedding-dim out to take the source's."
        )
    if source_names is None or len(source_names) != source.shape[0]:
        raise InitFromError(f"--init-from {path}: the source records no task library matching its {where}.")
    by_name: dict[str, int] = {}
    for index, name in enumerate(source_names):
        by_name.setdefault(name, index)
    for index, name in enumerate(target_names):
        if name in by_name:
            rows[index] = source[by_name[name]]
            report.kept_rows.append(name)
        else:
            report.fresh_rows.append(name)
    return rows


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value
