"""Every measured number in a notebook's text is shown by the notebook, or the sentence names its source.

The learner's read found text that disagreed with its own outputs ("not reliably faster" next to x0.83, "near 1x"
next to 0.42x) and numbers nothing in the course showed ("about 100x slower"). This test reads every markdown
sentence for a percentage or a ratio (``39%``, ``1.5x``, ``x0.83``, ``2×``) and accepts it when the same number, with
its unit, appears in the notebook's code or committed outputs (within 15 %: the text may round a printed
``~0.9%`` to "about 1 %"), or when the sentence names where the number comes
from: a link, a paper (``et al.``), a vendor's specification or datasheet, another notebook, a seed post, or a
benchmark script. Shapes such as ``3×32×32`` are not claims and are skipped.

The learner's fourth read found three more kinds, each checked below on the prose as its text source now reads
(markdown and code from ``sources/``, outputs from the executed notebook's unchanged cells):

- a duration bound that no cell prints ("well under a minute" over a cell that printed ~87.7 s);
- a number given as the true or exact answer that the cells do not print ("true answer 409.6" next to a printed
  409.5, the exact sum of the fp16 inputs);
- a measured number in a code comment ("# ~2.8x here" over an output of ~2.9x): a comment is not re-run, so it
  goes stale; the cell's output is where a measurement belongs.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import nbformat
import pytest

from course_lib.manifest import course_map, notebook_paths
from course_tools import sync_notebooks

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


def current_notebook(path: Path) -> nbformat.NotebookNode:
    """The notebook as its text source now reads, with the outputs of its executed copy's unchanged code cells (a
    changed code cell has none until the notebook is executed again; its code still counts as shown)."""
    executed = nbformat.read(path, as_version=4)
    merged, _ = sync_notebooks.merge(executed, sync_notebooks.read_text(sync_notebooks.source_path(path)))
    return merged


# "well under a minute", "less than a second", "about an hour": a duration claimed in words is a claim too.
_VAGUE_DURATION = re.compile(
    r"\b(?:well |just |far )?(?:under|less than|within|about|over|more than) (?:a|an|one|half an?) "
    r"(?:minute|second|hour)s?\b",
    re.I,
)
_EXACT = re.compile(r"\b(?:true|exact|correct|expected) (?:answer|value|sum|result)s?\b", re.I)
_NUMBER = re.compile(r"(?<![\w^§.])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?![\w^])")


def _numbers(text: str) -> list[tuple[float, int]]:
    """Every number of ``text`` with its count of decimals; ``4,096`` is 4096."""
    return [
        (float(m.group(1).replace(",", "") + "." + (m.group(2) or "0")), len(m.group(2) or ""))
        for m in _NUMBER.finditer(text)
    ]


def unprinted_prose_numbers(nb: nbformat.NotebookNode) -> list[str]:
    """Duration bounds in words, and numbers given as the true or exact answer, that no cell prints or computes.

    A prose number matches a printed one when it is that number rounded to the decimals the prose gives (0.0999756
    matches a printed 0.09997558594; 409.6 does not match 409.5). A sentence that names its source is exempt."""
    shown = _shown(nb)
    printed = [v for v, _ in _numbers(shown)]
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for sentence in _SENTENCE.split(cell.source):
            if _SOURCE.search(sentence):
                continue
            for m in _VAGUE_DURATION.finditer(sentence):
                found.append(f"cell {i}: {m.group(0)!r} (print the time, after a `~`) in: {sentence.strip()[:160]}")
            if _EXACT.search(sentence):
                for value, decimals in _numbers(sentence):
                    if not any(abs(v - value) <= 0.5 * 10.0**-decimals + 1e-12 for v in printed):
                        found.append(f"cell {i}: {value:g} is not printed in: {sentence.strip()[:160]}")
    return found


_MEASURED_IN_COMMENT = re.compile(
    r"~\s?\d+(?:\.\d+)?\s?(?:x|×|%|ms|µs|us|s|GFLOP/s|MiB|GiB)(?![\w/])|\b\d+(?:\.\d+)?\s?(?:x|×) (?:here|on this)\b"
)


def measured_numbers_in_comments(nb: nbformat.NotebookNode) -> list[str]:
    """Code comments that carry a measurement (``# ~2.8x here``, ``# costs ~20 s on 2 cores``)."""
    found = []
    for i, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        code = "\n".join("" if line.lstrip().startswith("%") else line for line in cell.source.splitlines())
        try:
            tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
        except (tokenize.TokenError, IndentationError, SyntaxError):
            continue
        comments = [t.string for t in tokens if t.type == tokenize.COMMENT]
        found += [f"cell {i}: {c.strip()!r}" for c in comments if _MEASURED_IN_COMMENT.search(c)]
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_numbers_and_durations_are_printed(path: Path) -> None:
    found = unprinted_prose_numbers(current_notebook(path))
    assert not found, "numbers and durations the prose states and no cell prints:\n" + "\n".join(found)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_measurement_lives_in_a_code_comment(path: Path) -> None:
    found = measured_numbers_in_comments(current_notebook(path))
    assert not found, (
        "measurements in code comments go stale when the cell runs again: print them (after a `~`), or say what "
        "the assert checks:\n" + "\n".join(found)
    )


def test_the_course_map_fits_what_a_viewer_shows() -> None:
    # notebook 00 prints it; some notebook viewers cut a cell's output at 4,000 characters (the learner's read saw
    # notebook 19's line cut mid-word and 17 and 18 missing)
    text = course_map()
    assert len(text) < 4000 and max(len(line) for line in text.splitlines()) < 160


def test_the_new_checks_catch_each_old_form_and_accept_the_fixed_one() -> None:
    old = nbformat.v4.new_notebook()
    old.cells = [
        nbformat.v4.new_markdown_cell("Summing 0.1 four thousand times (true answer 409.6):"),
        nbformat.v4.new_code_cell(
            "values = torch.full((4096,), 0.1)\nassert cpu_ratio > 1  # ~2.8x here, ~1.9x with portable kernels",
            outputs=[nbformat.v4.new_output("stream", text="fp32 accumulator: 409.5\n")],
        ),
        nbformat.v4.new_markdown_cell("On an idle core it takes well under a minute; the cell prints its time:"),
        nbformat.v4.new_code_cell(
            "if compile:  # aot_eager (Inductor costs ~20 s on 2 cores)\n    pass",
            outputs=[nbformat.v4.new_output("stream", text="300 steps in ~87.7 s\n")],
        ),
    ]
    assert len(unprinted_prose_numbers(old)) == 2 and len(measured_numbers_in_comments(old)) == 2
    fixed = nbformat.v4.new_notebook()
    fixed.cells = [
        nbformat.v4.new_markdown_cell(
            "0.1 is stored as 0.0999756 (§1 decoded its bits), so the exact sum of these inputs is "
            "4,096 × 0.0999756 = 409.5:"
        ),
        nbformat.v4.new_code_cell(
            "values = torch.full((4096,), 0.1)\nassert cpu_ratio > 1  # the lesson: the tiles are slower than SDPA",
            outputs=[nbformat.v4.new_output("stream", text="0.1 in fp16 is 0.09997558594; sum 409.5\n")],
        ),
        nbformat.v4.new_markdown_cell("It is a real training run: the cell prints how long it took (after a `~`)."),
        nbformat.v4.new_code_cell("x = 64 * 2  # a 64 x 2 product, 4x per 4x batch"),
    ]
    assert unprinted_prose_numbers(fixed) == [] and measured_numbers_in_comments(fixed) == []
