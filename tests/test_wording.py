"""Words the course has given one meaning, and words that are not about the subject: a failing check here names the
file and the line to fix.

- The four source posts are "posts", never "seeds" (a seed is what ``seed_everything`` sets).
- The notebooks speak about the subject only: no sentence about tests, CI, simulated CPUs, ``make`` targets, which
  machine recorded the outputs, benchmark files, load averages, issues to file or the course's own history
  (``META``; the learner's fourth read found all of these). Such notes belong in CONTRIBUTING.md or ``docs/``.
- Terms with two meanings say which one: mantissa bits are *stored* (the field) or *significant* (with the implicit
  leading 1), and every count of a format's bits agrees with ``course_lib.facts``; a count of all-reduces per
  "block" says which block (an MLP block has two, a transformer block four); there is no "Part N", only notebooks.
"""

from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

from course_lib.facts import format_bits

ROOT = Path(__file__).resolve().parents[1]

# The four source posts are "the Tensor post", "the single-machine post", "the multi-GPU post" and "the
# cluster post" (notebook 00, section 8). "Seed" means a random seed, and only that: calling a post a seed
# ("seed 002", "the seed's loop", "the seeds") collides with seed_everything in the same cells.
POST_AS_SEED = re.compile(
    r"\bseeds? ?_?0{1,2}[0-3]\b|\bseed_?00[0-3]|\bseed ?post|\bthe seeds?'s?\b(?! of\b)|\bthe seeds\b"
    r"|\b(?:as in|from|in) the seed\b(?!\s*(?:=|of\b|value|argument|number))",
    re.IGNORECASE,
)
POST_AS_SEED_NAME = re.compile(r"\bSeed[A-Z]\w*")  # a class named after a post (SeedSwish); case-sensitive
WHERE = [
    *sorted((ROOT / "sources").glob("*.py")),
    *sorted((ROOT / "course_lib").rglob("*.py")),
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
]


def post_as_seed(text: str) -> list[str]:
    """The phrases of ``text`` that call a source post a seed."""
    return [m.group(0) for pattern in (POST_AS_SEED, POST_AS_SEED_NAME) for m in pattern.finditer(text)]


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
        "# as in the seed: only rank 0 calls reduce",
        "class SeedSwish(torch.autograd.Function):",
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
        "seeded windows of the corpus",
        "the seed argument",
        "in the seed of the generator",
        "seed_everything(0) seeds the generators",
    ]:
        assert not post_as_seed(fine), fine


# What a learner reads as the course's words: the markdown cells and the code comments of the notebooks' text
# sources (the numbered notebooks; the labs have their own conventions).
NOTEBOOK_SOURCES = sorted((ROOT / "sources").glob("[0-9][0-9]_*.py"))


def prose(text: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every markdown line and every code comment of a jupytext percent source.

    Cell markers (``# %% ...``) and escaped magics (``# %%writefile``) are left out; strings in code are code."""
    found: list[tuple[int, str]] = []
    markdown_next = False
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            if tok.string.startswith("# %%"):
                markdown_next = "[markdown]" in tok.string
            elif not tok.string.startswith("# %"):
                found.append((tok.start[0], tok.string))
        elif tok.type == tokenize.STRING and markdown_next:
            found.extend((tok.start[0] + i, line) for i, line in enumerate(tok.string.splitlines()))
            markdown_next = False
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING):
            markdown_next = False
    return found


# Meta-talk: (pattern, what to write instead). Case-insensitive unless the pattern says otherwise.
META: list[tuple[str, str]] = [
    (
        r"\bmake (?:test|check|execute|sync|static|generated|footprint|lab|html|slides)[\w-]*|`make [a-z]",
        "a make target is tooling: say what the learner runs (`jupyter lab`), or move it to CONTRIBUTING.md",
    ),
    (
        r"\btest[ -]suite\b|\bthe tests\b|\bour tests?\b|\btest machines?\b|tests/test_\w+|\bnbval\b",
        "the course's tests are not the subject: give the subject's reason (rounding, summation order, kernels)",
    ),
    (r"(?-i:\bCI\b)", "CI is tooling: say what holds on the learner's machine"),
    (
        r"\bsimulated CPUs?\b|\btest-portable\b",
        "name the kernels (PyTorch's portable `DEFAULT` kernels, AVX2), not the test setup",
    ),
    (
        r"benchmarks/|\bload averages?\b|this course's \d-core|\bthe machine that recorded\b"
        r"|\brecorded (?:these|the) outputs\b",
        "a number the notebook does not print, or which machine recorded it: print it, or say what the learner can run",
    ),
    (
        r"\b(?:issue|report|one) to file\b|\bwe found no\b|\bwhile writing this notebook\b|\bwhat we found\b",
        "the course's history and upstream reports belong in docs/ (docs/upstream/README.md)",
    ),
    (
        r"\bdeliberate copy\b|\bcanonical copy\b|\bkept equal (?:to|by)\b|\bcannot drift apart\b",
        "say what the learner gains (the library's version, used later, agrees), not how the course is maintained",
    ),
    (r"\bfixture\b", "a test fixture is tooling: describe the cluster itself"),
]


def meta_talk(text: str) -> list[str]:
    """The phrases of ``text`` that talk about how the course is built, tested or recorded, with what to do."""
    return [f"{m.group(0)!r}: {advice}" for pattern, advice in META for m in re.finditer(pattern, text, re.I)]


@pytest.mark.parametrize("path", NOTEBOOK_SOURCES, ids=lambda p: p.stem)
def test_the_notebooks_speak_about_the_subject_only(path: Path) -> None:
    found = [f"{path.name}:{n}: {x}" for n, line in prose(path.read_text(encoding="utf-8")) for x in meta_talk(line)]
    assert not found, "text about the course's tooling, not the subject:\n" + "\n".join(found)


def test_the_meta_talk_rule_catches_each_form_and_allows_the_subject() -> None:
    for old in [
        "the test suite checks every notebook again under PyTorch's portable kernels",
        "one of the CPUs `make test-portable` simulates",
        "(CI checks this: it runs every notebook)",
        "so the tests do not compare these two cells",
        "`benchmarks/compile_time.py` compiled a small step on this course's 2-core machine",
        "at load averages 2.5-7.6",
        "a fixed bound of 1e-5 held on one of our test machines and failed on another",
        "We found no upstream report of this crash; the report to file is:",
        "the course's second, deliberate copy of the same algorithm, kept equal to ours by this test",
        "`tests/test_slurm.py::test_the_capstone_job_trains`; `make test-slurm` runs it",
        "An observation about PyTorch 2.13, made while writing this notebook",
        "(this is what we found on gloo)",
        "recorded on the course's Slurm fixture",
        "such as the one that recorded these outputs",
    ]:
        assert meta_talk(old), old
    for fine in [
        "`torch.library.opcheck` tests the registration",
        "the held-out test images",
        "a Python tensor accepts any new attribute",
        "PyTorch's portable kernels (the `DEFAULT` kernels of notebook 00 §1)",
        "the times after `~` are this machine's",
        "the circuit of the ring",
        "Related upstream reports: [pytorch/pytorch#107298](https://github.com/pytorch/pytorch/issues/107298)",
        "N independent trainings of the same architecture that drift apart",
        "the library's version of these stages",
        "`COURSE_DEVICE=cuda jupyter lab notebooks/`",
    ]:
        assert not meta_talk(fine), fine
    assert prose('# %% [markdown]\n"""\nText, `make test`.\n"""\n\n# %%\nx = "benchmarks/"  # a comment\n') == [
        (2, '"""'),
        (3, "Text, `make test`."),
        (4, '"""'),
        (7, "# a comment"),
    ]


# "mantissa" alone is ambiguous: the stored field (7 bits in bf16) or the significant bits (8, with the implicit 1).
MANTISSA_QUALIFIED = re.compile(
    r"stored mantissa|\bmantissa\*{0,2} (?:\(fraction\) )?field|\"mantissa\""
    r"|\bbits of mantissa \((?:stored|\d+ signif)",
    re.I,
)
FORMAT_NAMES = {
    "fp32": "fp32",
    "float32": "fp32",
    "torch.float32": "fp32",
    "fp16": "fp16",
    "float16": "fp16",
    "torch.float16": "fp16",
    "half": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "torch.bfloat16": "bf16",
    "tf32": None,
    "e4m3": None,
    "e5m2": None,
    "fp8": None,
    "mxfp8": None,  # formats without a course fact
}
_FORMAT = re.compile(
    r"(?<![\w.])(" + "|".join(sorted(map(re.escape, FORMAT_NAMES), key=len, reverse=True)) + r")\b"
    r"(?!'s)",
    re.I,
)
_BITS = re.compile(r"\b(\d+) (stored mantissa|significant) bits?\b|\((\d+) (significant)\)", re.I)
_SENTENCES = re.compile(r"(?<=[.!?])\s+(?=[A-Z*`(])|;\s")


def unqualified_mantissa(line: str) -> list[str]:
    """Each "mantissa" of ``line`` that says neither "stored" nor "significant" (nor names the field)."""
    qualified = [m.span() for m in MANTISSA_QUALIFIED.finditer(line)]
    return [
        line[max(0, m.start() - 30) : m.end() + 20].strip()
        for m in re.finditer(r"mantissa", line, re.I)
        if not any(a <= m.start() < b for a, b in qualified)
    ]


def bit_counts_against_facts(line: str) -> list[str]:
    """Counts of stored or significant bits that disagree with ``course_lib.facts`` for the format they follow.

    A count belongs to the last format named before it in its sentence or clause; a possessive ("fp32's range")
    names a property, not the subject, and is skipped. A clause that names no format before the count is not
    checked."""
    found = []
    for sentence in _SENTENCES.split(line):
        for m in _BITS.finditer(sentence):
            named = [f for f in _FORMAT.finditer(sentence[: m.start()])]
            if not named:
                continue
            fmt = FORMAT_NAMES[named[-1].group(1).lower()]
            if fmt is None:
                continue
            count, kind = (int(m.group(1)), m.group(2).lower()) if m.group(1) else (int(m.group(3)), "significant")
            stored, significant = format_bits(fmt)
            right = stored if kind.startswith("stored") else significant
            if count != right:
                found.append(f"{fmt}: {m.group(0)!r}, the fact is {right} {kind} bits (course_lib.facts)")
    return found


PART = re.compile(r"\bPart \d+\b")  # the course has notebooks and sections, never parts
ALL_REDUCE_COUNT = re.compile(r"\b(?:\d+|one|two|three|four|five|six|eight)\*{0,2} all-reduces?\b", re.I)
QUALIFIED_BLOCK = re.compile(r"\b(?:MLP|attention|transformer) block\b")


def unqualified_blocks(line: str) -> list[str]:
    """Sentences that count all-reduces against a "block" without saying which block (MLP or transformer)."""
    found = []
    for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z*`(\"])", line):
        if not ALL_REDUCE_COUNT.search(sentence):
            continue
        bare = len(re.findall(r"\bblock\b", sentence)) - len(QUALIFIED_BLOCK.findall(sentence))
        if bare > 0:
            found.append(sentence.strip()[:160])
    return found


def glossary_problems(line: str) -> list[str]:
    return (
        [
            f"unqualified mantissa: {x!r} (say 'stored mantissa bits' or 'significant bits')"
            for x in unqualified_mantissa(line)
        ]
        + bit_counts_against_facts(line)
        + [f"{m.group(0)!r}: say which notebook" for m in PART.finditer(line)]
        + [f"which block? (MLP block or transformer block): {x!r}" for x in unqualified_blocks(line)]
    )


@pytest.mark.parametrize("path", NOTEBOOK_SOURCES, ids=lambda p: p.stem)
def test_terms_with_two_meanings_say_which(path: Path) -> None:
    lines = prose(path.read_text(encoding="utf-8"))
    found = [f"{path.name}:{n}: {x}" for n, line in lines for x in glossary_problems(line)]
    assert not found, "terms with two meanings in the course, used without saying which:\n" + "\n".join(found)


def test_the_glossary_rules_catch_each_old_form_and_allow_the_fixed_one() -> None:
    for old in [
        "| bf16 (`torch.bfloat16`) | 16 | 8 | 7 mantissa |",
        "bf16 keeps fp32's 8 exponent bits and keeps only 7 mantissa bits.",
        "bfloat16 (8 bits of mantissa, float32's range)",
        "bf16 keeps 8 bits of mantissa, so its products round at about 0.4%",
        "bf16 keeps 7 significant bits",
        "fp16 has 5 exponent and 11 stored mantissa bits",
        "one real training script for the Part 7 transformer",
        "Megatron's MLP block chains the two, and **one all-reduce** per block in forward.",
        "TP 8 inside a node pays its 4 all-reduces per block at NVLink's full bandwidth.",
    ]:
        assert glossary_problems(old), old
    for fine in [
        "bf16 keeps fp32's 8 exponent bits and only 7 stored mantissa bits (8 significant bits with the implicit 1).",
        "bfloat16 (8 significant bits, 7 of them stored; float32's range)",
        "fp16 has 5 exponent and 10 stored mantissa bits (11 significant): range [-65504, 65504]",
        "TF32: fp32's 8 exponent bits with 10 stored mantissa bits (fp16's)",
        "a **mantissa** (fraction) field *m*",
        'its "mantissa" is the stored field',
        "rounding every averaged gradient to 11 significant bits, as `fp16_compress_hook` casts to float16",
        "**one all-reduce** per MLP block in forward (one more in backward).",
        "every transformer block waits for four all-reduces of its activations",
        "the ring's point-to-point blocks stay in the innermost groups",
        "part of the communication is hidden",
    ]:
        assert not glossary_problems(fine), (fine, glossary_problems(fine))
