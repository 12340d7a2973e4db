"""Every ``>>>`` example in waddle's source modules runs, and prints what its docstring shows."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

import waddle

PACKAGE = Path(waddle.__file__).parent

RENDERING_MODULES = ("waddle.physics.render", "waddle.video")
"""Modules whose examples draw pixels."""


def _modules_with_examples() -> list[str]:
    """Names of the modules under ``waddle/`` whose source holds a ``>>>`` example (read, not imported)."""
    names = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "__main__.py" and ">>>" in path.read_text(encoding="utf-8"):
            parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.rendering) if name in RENDERING_MODULES else name
        for name in _modules_with_examples()
    ],
)
def test_examples_in_source(name, tmp_path, monkeypatch, restore_reward_registry):
    monkeypatch.chdir(tmp_path)  # an example may write a file (a video) where it runs
    docstrings = [test for test in doctest.DocTestFinder().find(importlib.import_module(name)) if test.examples]
    assert docstrings, f"{name} shows >>> examples but doctest found none in its docstrings"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in docstrings:
        runner.run(test)  # prints each failing example
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} example(s) in {name} failed; see the output above"


def test_the_example_finder_sees_the_modules_it_must():
    names = _modules_with_examples()
    assert {"waddle.envs.brax", "waddle.collectors.rollout", "waddle.algorithms.runner"} <= set(names)
    assert "waddle.__main__" not in names
