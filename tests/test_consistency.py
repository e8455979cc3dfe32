"""A learner who sees two answers trusts neither: each check here fails on one kind of contradiction.

The learner's third read found eight contradictions; each test below fails when that kind comes back:

1. a comparison in the text ("faster", "slower", "halves", "no trend"...) that the section's own outputs do not
   print (13 §3's "bf16 ran faster" next to a table that printed it slower);
2. a Summary comparison the body never printed (04's "about half as much again" against a measured ~156 %);
3. a statement the course has corrected, said again (DDP's buffers broadcast "at training forwards": notebook 12
   §1 shows an eval forward broadcasts too), kept in ``course_lib.facts.CORRECTIONS``;
4. a derived number that disagrees with the printed numbers it derives from (α·β ≠ α × β in notebook 09);
5. a cross-reference to a section that does not exist ("section 7" in a notebook whose style section is 8; after a
   split, "§9" in a notebook with five sections);
6. a figure's reference line or label typed as a literal instead of the constant the text quotes (a zero line
   drawn at 2^-24 while the text says 2^-25);
7. a number in the prose that no cell prints and no source backs (``tests/test_claims.py``, extended there to
   "N of M" counts and durations);
8. a reference line whose value the notebook never prints next to it (a floor drawn at params + grads while the
   text says grads): every reference line's value is printed by its cell.

A sentence that names its source (a link, a paper, another notebook §, a benchmark) is exempt from 1, 2 and 7.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest

from course_lib.facts import CORRECTIONS
from course_lib.manifest import ROOT, course, notebook_paths

NOTEBOOKS = notebook_paths()
COMPARISONS = re.compile(r"\b(faster|slower|halves|halved|doubles|doubled|no trend|speed-?ups?)\b", re.I)
SOURCE = re.compile(
    r"\]\(https?:|et al\.|\bnotebooks? \d\d|specification|datasheet|benchmarks/|`make test-[\w-]+`"
    r"|\bthe \w+(-\w+)? post\b"
)
SENTENCE = re.compile(r"\n|(?<=[.!?]) (?=[A-Z*`(])")
REFERENCE_LINES = {"axvline", "axhline", "axvspan", "axhspan", "hlines", "vlines"}


def _outputs(cell: nbformat.NotebookNode) -> str:
    return "\n".join(
        out.get("text", "") if out.output_type == "stream" else str(out.get("data", {}).get("text/plain", ""))
        for out in cell.get("outputs", [])
    )


def sections(nb: nbformat.NotebookNode) -> list[tuple[str, list[str], str]]:
    """(heading, markdown texts, printed outputs) per ``##`` section; the part before the first is ``""``."""
    found: list[tuple[str, list[str], str]] = [("", [], "")]
    for cell in nb.cells:
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("## "):
            found.append((cell.source.lstrip().splitlines()[0][3:].strip(), [], ""))
        heading, texts, printed = found[-1]
        if cell.cell_type == "markdown":
            texts.append(cell.source)
        else:
            found[-1] = (heading, texts, printed + "\n" + _outputs(cell))
    return found


def unbacked_comparisons(nb: nbformat.NotebookNode) -> list[str]:
    """Comparative sentences whose word the section's outputs (the whole notebook's, for the Summary) never print."""
    parts = sections(nb)
    everything = "\n".join(printed for _, _, printed in parts).lower()
    found = []
    for heading, texts, printed in parts:
        shown = everything if heading.lower() == "summary" else printed.lower()
        for text in texts:
            for sentence in SENTENCE.split(text):
                if SOURCE.search(sentence):
                    continue
                for m in COMPARISONS.finditer(sentence):
                    if m.group(1).lower() not in shown:
                        found.append(f"§ {heading or '(head)'}: {m.group(1)!r} in: {sentence.strip()[:150]}")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_comparison_is_printed_in_its_section(path: Path) -> None:
    gaps = unbacked_comparisons(nbformat.read(path, as_version=4))
    assert not gaps, (
        "comparisons the section's outputs do not print (print the relation, e.g. 'bf16/fp32 ~1.7x: slower', "
        "or name the source):\n" + "\n".join(gaps)
    )


def said_again(text: str) -> list[str]:
    """The corrected statements (``course_lib.facts.CORRECTIONS``) that ``text`` makes again, with the right one."""
    return [f"{m.group(0)!r}: {c.right} ({c.shown})" for c in CORRECTIONS for m in re.finditer(c.wrong, text, re.I)]


@pytest.mark.parametrize(
    "path",
    [*sorted((ROOT / "sources").glob("*.py")), ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))],
    ids=lambda p: p.name,
)
def test_no_corrected_statement_comes_back(path: Path) -> None:
    found = said_again(path.read_text(encoding="utf-8"))
    assert not found, f"{path.name} says again what the course corrected:\n" + "\n".join(found)


# 4. Derived numbers: (notebook, what, pattern with named groups, the relation they must satisfy).
DERIVED = [
    (
        "09_data_parallel_and_all_reduce",
        "the crossover size m = alpha * beta",
        re.compile(r"alpha ~(?P<alpha>[\d.]+) us, beta ~(?P<beta>[\d.]+) GB/s[\s\S]*?alpha \* beta ~(?P<m>[\d.]+) KiB"),
        lambda g: abs(g["alpha"] * 1e-6 * g["beta"] * 1e9 / 1024 - g["m"]) <= 0.1 * g["m"],
    ),
]


@pytest.mark.parametrize("stem, what, pattern, holds", DERIVED, ids=[d[0] for d in DERIVED])
def test_derived_numbers_agree_with_the_numbers_they_derive_from(stem, what, pattern, holds) -> None:  # noqa: ANN001
    nb = nbformat.read(ROOT / "notebooks" / f"{stem}.ipynb", as_version=4)
    printed = "\n".join(_outputs(c) for c in nb.cells if c.cell_type == "code")
    m = pattern.search(printed)
    assert m, f"{stem} no longer prints {what} in the expected form: update DERIVED"
    values = {k: float(v) for k, v in m.groupdict().items()}
    assert holds(values), f"{stem}: {what} disagrees with its inputs: {values}"


def _numbered_headings(nb: nbformat.NotebookNode) -> set[str]:
    numbers = set()
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                m = re.match(r"#{2,4} (\d+(?:\.\d+)*)[.\s]", line)
                if m:
                    numbers.add(m.group(1))
    return numbers


def dangling_references(stem: str, books: dict[str, nbformat.NotebookNode]) -> list[str]:
    """References to a section ("section 3", "§3.2", "notebook 09 §5") that no heading of that notebook has."""
    here = books[stem]
    found = []
    for cell in here.cells:
        if cell.cell_type != "markdown":
            continue
        text = cell.source
        for m in re.finditer(r"[Nn]otebooks? (\d\d) §\s?(\d+(?:\.\d+)?)|(?<![\w\d])(\d\d) §\s?(\d+(?:\.\d+)?)", text):
            number, section = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            target = next((s for s in books if s.startswith(number + "_")), None)
            if target is None or section not in _numbered_headings(books[target]):
                found.append(f"{m.group(0)!r}: notebook {number} has no section {section}")
        local = re.sub(r"[Nn]otebooks? \d\d §\s?\d+(?:\.\d+)?|(?<![\w\d])\d\d §\s?\d+(?:\.\d+)?", "", text)
        for m in re.finditer(r"\b[Ss]ections? (\d+(?:\.\d+)?)\b|(?<![\w\d])§\s?(\d+(?:\.\d+)?)", local):
            section = m.group(1) or m.group(2)
            if section not in _numbered_headings(here):
                found.append(f"{m.group(0)!r}: this notebook has no section {section}")
    return found


def test_every_section_reference_points_to_a_section() -> None:
    books = {n.stem: nbformat.read(n.path, as_version=4) for n in course()}
    found = {stem: dangling_references(stem, books) for stem in books}
    found = {k: v for k, v in found.items() if v}
    assert not found, "references to sections that do not exist:\n" + "\n".join(
        f"{k}: {line}" for k, v in found.items() for line in v
    )


def literal_reference_lines(source: str) -> list[str]:
    """Reference lines drawn at a typed-in number, labels with typed-in numbers, and lines whose value the cell
    never prints (kinds 6 and 8)."""
    try:
        tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith("%")))
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in REFERENCE_LINES or not node.args:
            continue
        value = node.args[0]
        bare = value.operand if isinstance(value, ast.UnaryOp) else value
        if isinstance(bare, ast.Constant) and isinstance(bare.value, (int, float)) and bare.value != 0:
            found.append(
                f"{node.func.attr}({ast.unparse(value)}, ...): a typed-in number; use the constant the text quotes"
            )
        for kw in node.keywords:
            if kw.arg == "label" and isinstance(kw.value, ast.Constant) and re.search(r"\d", str(kw.value.value)):
                found.append(f"label={kw.value.value!r}: a typed-in number; build the label from the constant")
        if not isinstance(bare, ast.Constant):
            names = {n.id for n in ast.walk(value) if isinstance(n, ast.Name)}
            printed = {
                n.id
                for call in ast.walk(tree)
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "print"
                for n in ast.walk(call)
                if isinstance(n, ast.Name)
            }
            if names and not names & printed:
                found.append(f"{node.func.attr}({ast.unparse(value)}, ...): the cell never prints this value")
    return found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_reference_lines_come_from_printed_constants(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    found = [
        f"cell {i}: {x}"
        for i, c in enumerate(nb.cells)
        if c.cell_type == "code"
        for x in literal_reference_lines(c.source)
    ]
    assert not found, "figure reference lines and labels must come from printed constants:\n" + "\n".join(found)


# The checks themselves, on small notebooks that contain each kind of contradiction.


def _nb(*cells: tuple[str, str, str]) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    for kind, source, printed in cells:
        if kind == "md":
            nb.cells.append(nbformat.v4.new_markdown_cell(source))
        else:
            cell = nbformat.v4.new_code_cell(source)
            cell.outputs = [nbformat.v4.new_output("stream", text=printed)] if printed else []
            nb.cells.append(cell)
    return nb


def test_each_check_catches_its_kind_of_contradiction() -> None:
    # 1. the text says faster, the section printed slower
    nb = _nb(
        ("md", "## 3. Speed\n\nOn this machine bf16 ran faster than fp32.", ""),
        ("code", "print(...)", "bf16/fp32 step time ~1.73x: bf16 slower\n"),
    )
    assert unbacked_comparisons(nb) and not unbacked_comparisons(
        _nb(
            ("md", "## 3. Speed\n\nOn this machine bf16 ran slower than fp32.", ""),
            ("code", "print(...)", "bf16/fp32 ~1.73x: bf16 slower\n"),
        )
    )
    # 2. a Summary comparison nothing printed; a sourced one passes
    nb = _nb(
        ("md", "## 1. Cost", ""),
        ("code", "print(...)", "overhead ~156 %\n"),
        ("md", "## Summary\n\n- It halves the time on small layers.\n- It doubles it (notebook 04 §4).", ""),
    )
    assert [g for g in unbacked_comparisons(nb) if "halves" in g] and not [
        g for g in unbacked_comparisons(nb) if "doubles" in g
    ]
    # 3. a corrected statement said again
    assert said_again("at every training forward it broadcasts rank 0's buffers")
    assert said_again("`join()` divides by the number of ranks still training")
    assert not said_again("DDP broadcasts rank 0's buffers at every forward that follows a forward with gradients")
    # 4. a derived number that disagrees with its inputs
    _, _, pattern, holds = DERIVED[0]
    good = pattern.search("alpha ~58 us, beta ~4.20 GB/s\n...\nalpha * beta ~238 KiB")
    bad = pattern.search("alpha ~58 us, beta ~4.20 GB/s\n...\nalpha * beta ~174 KiB")
    assert good and bad and holds({k: float(v) for k, v in good.groupdict().items()})
    assert not holds({k: float(v) for k, v in bad.groupdict().items()})
    # 5. a reference to a section that does not exist
    books = {
        "03_x": _nb(("md", "## 8. Style\n\nWritten in the style of section 9, see also 04 §2.", "")),
        "04_y": _nb(("md", "## 1. One", "")),
    }
    assert len(dangling_references("03_x", books)) == 2
    # 6 and 8. typed-in reference lines and labels; a line whose value is never printed
    assert literal_reference_lines('ax.axvline(-24, label="fp16: below 2^-24 becomes 0")') == [
        "axvline(-24, ...): a typed-in number; use the constant the text quotes",
        "label='fp16: below 2^-24 becomes 0': a typed-in number; build the label from the constant",
    ]
    assert literal_reference_lines("ax.axhline(2 * grad_bytes)") == [
        "axhline(2 * grad_bytes, ...): the cell never prints this value"
    ]
    assert not literal_reference_lines('print(floor)\nax.axhline(floor, label=f"floor {floor}")')
