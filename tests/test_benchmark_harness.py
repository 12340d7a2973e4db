"""benchmarks/harness.py: the time, memory (MiB) and tables every benchmark script reports through."""

from __future__ import annotations

import importlib.util
import math
import sys
import time
from pathlib import Path

import pytest

HARNESS = Path(__file__).resolve().parents[1] / "benchmarks" / "harness.py"


@pytest.fixture(scope="module")
def harness():
    """The scripts' ``import harness``, from its file (benchmarks/ is no package)."""
    spec = importlib.util.spec_from_file_location("harness", HARNESS)
    module = importlib.util.module_from_spec(spec)
    sys.modules["harness"] = module  # dataclasses resolve their annotations through it
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        del sys.modules["harness"]


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise AssertionError(f"/proc/self/status has no {field}")


def test_memory_is_in_mib(harness):
    ballast = bytearray(64 * 2**20)  # touched, so resident
    ballast[::4096] = b"x" * (len(ballast) // 4096)
    assert harness.rss_mib() == pytest.approx(_status_kib("VmRSS") / 1024, abs=8)
    assert harness.peak_rss_mib() == pytest.approx(_status_kib("VmHWM") / 1024, abs=8)
    assert harness.peak_rss_mib() >= harness.rss_mib() - 1 >= 64
    del ballast


def test_timed_reports_wall_and_cpu_seconds(harness):
    with harness.timed() as idle:
        time.sleep(0.2)
    assert 0.2 <= idle.wall_s < 2.0 and idle.cpu_s < 0.1
    with harness.timed() as busy:
        # Spin until both clocks have passed 0.1 s: the CPU clock can run a
        # hair ahead of the wall clock, so waiting on one alone is not enough.
        cpu_deadline, wall_deadline = time.process_time() + 0.1, time.perf_counter() + 0.1
        while time.process_time() < cpu_deadline or time.perf_counter() < wall_deadline:
            pass
    assert busy.cpu_s >= 0.1 and busy.wall_s >= 0.1


def test_load_line_names_the_averages_and_the_cores(harness):
    line = harness.load_line("at the end")
    assert line.startswith("load average at the end: ") and line.endswith(f" on {harness.cores()} cores")
    assert len(line.split(": ")[1].split(" on ")[0].split(", ")) == 3


def test_median_and_interleaved_rounds(harness):
    assert harness.median([3.0, 1.0, 2.0]) == 2.0 and harness.median([4.0, 1.0, 2.0, 3.0]) == 2.5
    assert math.isnan(harness.median([]))
    calls = []
    first, times = harness.time_interleaved([lambda: calls.append("a"), lambda: calls.append("b")], 2)
    assert calls == ["a", "b", "a", "b", "a", "b"]
    assert len(first) == 2 and [len(t) for t in times] == [2, 2]


def test_tables_align_figures_right_text_left_and_show_missing_figures_as_a_dash(harness):
    table = harness.Table(
        [harness.Column("name", width=6, left=True), harness.Column("rate", ",.0f", 8), harness.Column("ratio", ".2f")]
    )
    assert table.header() == "name       rate ratio"
    assert table.row("ppo", 12345.6, 0.5) == "ppo      12,346  0.50"
    assert table.row("shac", float("nan"), None) == "shac          -     -"


def test_print_table_sizes_columns_to_their_cells(harness, capsys):
    harness.print_table(
        "t", [{"impl": "waddle", "iter_s": 0.0351}, {"impl": "torchrl", "iter_s": 123.4}], ["impl", "iter_s"]
    )
    assert capsys.readouterr().out.splitlines() == [
        "",
        "== t ==",
        "impl    iter_s",
        "------- ------",
        "waddle  0.0351",
        "torchrl    123",
    ]
