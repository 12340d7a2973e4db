"""Run a snippet in a fresh interpreter in which torch, tensordict, torchrl and waddle's envs cannot be imported."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

BLOCKED = ("torch", "waddle.envs", "tensordict", "torchrl")


def run_without_torch(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` (dedented) with :data:`BLOCKED` made unimportable and waddle's source on the path;
    return the finished process, its output captured as text."""
    blocker = "import sys\nfor name in " + repr(BLOCKED) + ":\n    sys.modules[name] = None\n"
    return subprocess.run(
        [sys.executable, "-c", blocker + textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"},
    )
