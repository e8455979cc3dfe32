"""Every measured number in a notebook's text is shown by the notebook, or the sentence names its source.

The learner's read found text that disagreed with its own outputs ("not reliably faster" next to x0.83, "near 1x"
next to 0.42x) and numbers nothing in the course showed ("about 100x slower"). This test reads every markdown
sentence for a percentage or a ratio (``39%``, ``1.5x``, ``x0.83``, ``2×``) and accepts it when the same number, with
its unit, appears in the notebook's code or committed outputs (within 15 %: the text may round a printed
``~0.9%`` to "about 1 %"), or when the sentence names where the number comes
from: a link, a paper (``et al.``), a vendor's specification or datasheet, another notebook, a seed post, or a
benchmark script. Shapes such as ``3×32×32`` are not claims and are skipped.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from course_lib.manifest import notebook_paths

NOTEBOOKS = notebook_paths()
# a percentage or a ratio; not a shape (3×32×32, 256×8), a product (0.05 × 2²⁰), part of a word, a version or a power
_CLAIM = re.compile(
    r"(?<![\w.^/×-])(\d+(?:\.\d+)?)\s?(%|x(?![\w×])|×(?!\s?[\d(]))|(?<![\w`×])[x×]~?(\d+(?:\.\d+)?)(?![\d×])"
)
_SOURCE = re.compile(
    r"\]\(https?:|et al\.|\bnotebooks? \d\d|\bthe \w+(-\w+)? post\b|specification|datasheet|benchmarks/"
    r"|`make test-[\w-]+`"
)
_PERCENT = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s?%()")
_RATIO = re.compile(r"(?<![\d.])(\d+(?:\.\d+)?)\s?[x×]|[x×]~?(\d+(?:\.\d+)?)")
_SENTENCE = re.compile(r"\n|(?<=[.!?]) (?=[A-Z*`(])")


def _shown(nb: nbformat.NotebookNode) -> str:
    texts = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            texts.append(cell.source)
            for out in cell.get("outputs", []):
                texts.append(
                    out.get("text", "")
                    if out.output_type == "stream"
                    else str(out.get("data", {}).get("text/plain", ""))
                )
    return "\n".join(texts)


def unshown_claims(path: Path) -> list[str]:
    """The sentences of a notebook's text with a percentage or ratio that nothing in the notebook shows."""
    nb = nbformat.read(path, as_version=4)
    shown = _shown(nb)
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for sentence in _SENTENCE.split(cell.source):
            if _SOURCE.search(sentence):
                continue
            for m in _CLAIM.finditer(sentence):
                value = float(m.group(1) or m.group(3))
                printed = _PERCENT if m.group(2) == "%" else _RATIO
                values = [float(v) for group in printed.findall(shown) for v in group if v]
                if not any(abs(v - value) <= max(0.15 * value, 0.05) for v in values):  # "about 1 %" for ~0.9%
                    found.append(f"cell {i}: {m.group(0)!r} in: {sentence.strip()[:160]}")
    return found


# "3 of 102 launches", "11 of 23 restarts"; "about 21 s", "1.5 ms": counts and durations are claims too.
_COUNT = re.compile(r"(?<![\w.])(\d+) of (\d+)\b(?! (?:the|its|them|which|each|these|those)\b)")
_DURATION = re.compile(r"(?<![\w.^/-])(\d+(?:\.\d+)?)(?:\s?(ms|µs|us|min|minutes|seconds)|\s(s))\b(?![\w(])")
_PRINTED_DURATION = re.compile(r"(\d+(?:\.\d+)?)\s?(ms|µs|us|s|min|minutes|seconds)\b")


def unshown_counts_and_durations(path: Path) -> list[str]:
    """Sentences with "N of M" or a duration that nothing in the notebook prints, and that name no source."""
    nb = nbformat.read(path, as_version=4)
    shown = _shown(nb)
    durations = [(float(v), unit) for v, unit in _PRINTED_DURATION.findall(shown)]
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for sentence in _SENTENCE.split(cell.source):
            if _SOURCE.search(sentence):
                continue
            for m in _COUNT.finditer(sentence):
                n, total = m.groups()
                if not re.search(rf"(?<!\d){n}\s?(?:of|/)\s?{total}(?!\d)", shown):
                    found.append(f"cell {i}: {m.group(0)!r} in: {sentence.strip()[:160]}")
            for m in _DURATION.finditer(sentence):
                value, unit = float(m.group(1)), m.group(2) or m.group(3)
                if not any(u == unit and abs(v - value) <= max(0.15 * value, 0.05) for v, u in durations):
                    found.append(f"cell {i}: {m.group(0)!r} in: {sentence.strip()[:160]}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_count_and_duration_in_the_text_is_shown_or_sourced(path: Path) -> None:
    claims = unshown_counts_and_durations(path)
    assert not claims, (
        "counts ('3 of 102') and durations ('about 21 s') that no cell prints and no source backs:\n"
        + "\n".join(claims)
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_number_in_the_text_is_shown_or_sourced(path: Path) -> None:
    claims = unshown_claims(path)
    assert not claims, (
        "numbers in the text that no cell shows and no source backs (show them with a cell, or name the source):\n"
        + "\n".join(claims)
    )


def test_the_check_catches_an_unshown_number_and_accepts_a_shown_or_cited_one(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("It is about 100x slower. Shapes like 3×32×32 are fine."),
        nbformat.v4.new_markdown_cell("Per the vendor's specification it moves 900 GB/s, 2x the last one."),
        nbformat.v4.new_markdown_cell("The step got 35% faster."),
        nbformat.v4.new_code_cell("print('faster by 35 %')", outputs=[nbformat.v4.new_output("stream", text="35 %\n")]),
    ]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    claims = unshown_claims(path)
    assert len(claims) == 1 and "'100x'" in claims[0]


def test_the_check_catches_unshown_counts_and_durations(tmp_path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("11 of 23 restarts failed. The first compile takes about 21 s."),
        nbformat.v4.new_markdown_cell("3 of 102 launches crashed; a step takes 1.5 ms."),
        nbformat.v4.new_code_cell("print(...)", outputs=[nbformat.v4.new_output("stream", text="3/102, ~1.4 ms\n")]),
    ]
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    claims = unshown_counts_and_durations(path)
    assert len(claims) == 2 and "'11 of 23'" in claims[0] and "'21 s'" in claims[1]
