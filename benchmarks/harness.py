"""What the benchmark scripts measure with and print through: time, memory, the machine's load, tables.

The scripts run as ``python benchmarks/<script>.py``; Python puts their folder
first on ``sys.path``, so ``import harness`` finds this module. Memory is in
MiB everywhere, and a table's missing or NaN figure prints as ``-``.
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from numbers import Real
from typing import Any

# ------------------------------------------------------------------ the machine


def cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0))


def load_line(when: str = "") -> str:
    """``"load average at the end: 1.52, 1.31, 0.98 on 2 cores"``: other processes slow every figure."""
    averages = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    return f"load average{f' {when}' if when else ''}: {averages} on {cores()} cores"


# ------------------------------------------------------------------------- time


@dataclass
class Timing:
    """What :func:`timed` measured: filled in when its block ends."""

    wall_s: float = math.nan
    """Wall-clock seconds."""
    cpu_s: float = math.nan
    """CPU seconds of every thread of this process."""


@contextmanager
def timed() -> Iterator[Timing]:
    """Time the block: ``with timed() as t: ...`` leaves its wall and CPU seconds in ``t``."""
    timing = Timing()
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield timing
    finally:
        timing.wall_s = time.perf_counter() - wall
        timing.cpu_s = time.process_time() - cpu


def time_interleaved(fns: Sequence[Callable[[], object]], iters: int) -> tuple[list[float], list[list[float]]]:
    """Run each of ``fns`` once (compilation, warm-up), then ``iters`` rounds of all of them.

    Alternating the contenders round by round means that a change in machine
    load (other processes on a shared machine) hits all of them alike.
    Returns the first calls' wall seconds and each one's per-round wall seconds.
    """
    first = []
    for fn in fns:
        with timed() as timing:
            fn()
        first.append(timing.wall_s)
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(iters):
        for fn, out in zip(fns, times):
            with timed() as timing:
                fn()
            out.append(timing.wall_s)
    return first, times


def median(values: Sequence[float]) -> float:
    """The median of ``values`` (NaN when there are none)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


# ----------------------------------------------------------------------- memory


def peak_rss_mib() -> float:
    """The most resident memory this process has held so far, MiB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mib() -> float:
    """The resident memory of this process now, MiB."""
    with open("/proc/self/statm") as file:
        return int(file.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


# ----------------------------------------------------------------------- tables


def cell(value: Any, spec: str = "") -> str:
    """``value`` as a table shows it: by ``spec`` when it is a number, ``-`` when it is NaN or None.

    A number without ``spec`` keeps three significant digits, or none after the point from 100 up.
    """
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, Real) and not isinstance(value, bool):
        if spec:
            return format(value, spec)
        if isinstance(value, int):
            return str(value)
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


@dataclass(frozen=True)
class Column:
    """One column of a :class:`Table`."""

    name: str
    spec: str = ""
    """Format spec of its numbers, e.g. ``",.0f"`` (see :func:`cell`)."""
    width: int = 0
    """Characters it takes at least; its name's length when that is more."""
    left: bool = False
    """Align left (text), rather than right (figures)."""


class Table:
    """Rows of aligned columns, printable one at a time: a long benchmark shows each row as it is measured.

    Columns are :class:`Column` or plain names (a right-aligned column of
    figures as wide as its name).
    """

    def __init__(self, columns: Sequence[Column | str], *, indent: str = "") -> None:
        self.columns = [column if isinstance(column, Column) else Column(column) for column in columns]
        self.indent = indent

    def _line(self, texts: Sequence[str]) -> str:
        parts = []
        for column, text in zip(self.columns, texts, strict=True):
            width = max(column.width, len(column.name))
            parts.append(text.ljust(width) if column.left else text.rjust(width))
        return (self.indent + " ".join(parts)).rstrip()

    def header(self) -> str:
        """The column names, aligned as their figures."""
        return self._line([column.name for column in self.columns])

    def row(self, *values: Any) -> str:
        """One row, a value per column (a string is shown as it is)."""
        return self._line([cell(value, column.spec) for column, value in zip(self.columns, values, strict=True)])

    def print_header(self) -> None:
        print(self.header(), flush=True)

    def print_row(self, *values: Any) -> None:
        print(self.row(*values), flush=True)


def print_table(title: str, rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> None:
    """Print ``rows`` (dicts; a missing key is an empty cell) under ``title``, each column as wide as its widest cell."""
    cells = [[cell(row[name]) if name in row else "" for name in columns] for row in rows]
    table = Table(
        [
            Column(name, width=max((len(texts[i]) for texts in cells), default=0), left=_is_text(rows, name))
            for i, name in enumerate(columns)
        ]
    )
    print(f"\n== {title} ==")
    print(table.header())
    print(table._line(["-" * max(column.width, len(column.name)) for column in table.columns]))
    for texts in cells:
        print(table._line(texts))


def _is_text(rows: Sequence[Mapping[str, Any]], name: str) -> bool:
    """Whether column ``name`` holds anything but numbers (and so aligns left)."""
    values = [row[name] for row in rows if row.get(name) is not None]
    return any(isinstance(value, (str, bool)) or not isinstance(value, Real) for value in values)
