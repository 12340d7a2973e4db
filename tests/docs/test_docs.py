"""Every example in docs/ runs, and prints what the page says it prints."""

import doctest
from pathlib import Path

import pytest

from waddle.envs.microduck import rewards

DOCS = Path(__file__).resolve().parents[2] / "docs"


@pytest.fixture
def isolated_registry():
    """The examples register reward terms; keep them out of other tests."""
    terms, params = dict(rewards.REWARD_TERMS), dict(rewards.REWARD_PARAMS)
    yield
    rewards.REWARD_TERMS.clear()
    rewards.REWARD_TERMS.update(terms)
    rewards.REWARD_PARAMS.clear()
    rewards.REWARD_PARAMS.update(params)


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
def test_examples_in_docs(page, tmp_path, monkeypatch, isolated_registry):
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
