"""Words the course has given one meaning: a failing check here names the file and the line to fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# The four source posts are "the Tensor post", "the single-machine post", "the multi-GPU post" and "the
# cluster post" (notebook 00, section 8). "Seed" means a random seed, and only that: calling a post a seed
# ("seed 002", "the seed's loop", "the seeds") collides with seed_everything in the same cells.
POST_AS_SEED = re.compile(
    r"\bseeds? ?_?0{1,2}[0-3]\b|\bseed_?00[0-3]|\bseed ?post|\bthe seeds?'s?\b(?! of\b)|\bthe seeds\b",
    re.IGNORECASE,
)
WHERE = [
    *sorted((ROOT / "sources").glob("*.py")),
    *sorted((ROOT / "course_lib").rglob("*.py")),
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]


def post_as_seed(text: str) -> list[str]:
    """The phrases of ``text`` that call a source post a seed."""
    return [m.group(0) for m in POST_AS_SEED.finditer(text)]


@pytest.mark.parametrize("path", WHERE, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_source_post_is_called_a_seed(path: Path) -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{n}: {found}"
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        for found in post_as_seed(line)
    ]
    assert not bad, "say 'the Tensor post', 'the cluster post', ... (notebook 00 §8), not 'seed':\n" + "\n".join(bad)


def test_the_rule_catches_each_old_form_and_allows_random_seeds() -> None:
    for old in [
        "Seed 002's loader",
        "seed 003",
        "the seed's Swish",
        "The seeds' scripts",
        "the seed post",
        "cluster run of seed_003_loop",
        "_runs/seed002_second.py",
    ]:
        assert post_as_seed(old), old
    for fine in [
        "seed_everything(0)",
        "the same seed on every rank",
        "a random seed",
        "sampler seed 0",
        "the seed of the sampler",
        "torch.manual_seed(3)",
        "seed=0",
        "global seed 1234",
    ]:
        assert not post_as_seed(fine), fine
