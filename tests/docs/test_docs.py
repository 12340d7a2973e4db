"""Every example in docs/ runs, and prints what the page says it prints."""

import doctest
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"


RENDERING_PAGES = ("microduck.md",)
"""Pages whose examples draw pixels."""


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(page, marks=pytest.mark.rendering) if page.name in RENDERING_PAGES else page
        for page in sorted(DOCS.glob("*.md"))
    ],
    ids=lambda path: path.name,
)
def test_examples_in_docs(page, tmp_path, monkeypatch, restore_reward_registry):
    # the examples register reward terms
    monkeypatch.chdir(tmp_path)  # the video example writes rollout.mp4 here
    monkeypatch.delenv("MICRODUCK_RL_ROOT", raising=False)
    result = doctest.testfile(
        str(page),
        module_relative=False,
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE,
        verbose=False,
    )
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} example(s) in {page.name} failed; see the output above"
