"""course_lib.facts holds each fact once; course_tools.generated builds every comparison table from them, and the
notebooks show the tables."""

from __future__ import annotations

from pathlib import Path

import pytest

from course_lib import facts
from course_tools import generated
from course_tools.generated import TABLES, table

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_table_renders_as_a_rectangular_markdown_table(name: str) -> None:
    lines = table(name).splitlines()
    spec = TABLES[name]
    widths = {line.count("|") for line in lines}
    assert len(widths) == 1, f"{name}: rows of different widths (a '|' inside a fact?)"
    assert len(lines) == 2 + (len(spec.techniques) if spec.by_row else len(spec.fields))
    assert set(lines[1]) == {"|", "-"}


def test_no_fact_breaks_a_table_or_is_empty() -> None:
    for technique, fields in facts.FACTS.items():
        for field, text in fields.items():
            assert text.strip() and "|" not in text and "\n" not in text, (technique, field)


def test_a_fact_is_stated_once_and_shared_by_the_tables_that_show_it() -> None:
    # DDP's communication appears in 13's map and (as its cost) in 16's guide, from the same entry
    assert facts.fact("ddp", "communicated") in table("parallelism")
    assert facts.fact("ddp", "gradient sync") in table("dp-vs-ddp")
    # the corrections the reviews asked for (notebook 09 is the one statement of what the backend does)
    assert "ring all-reduce" not in table("dp-vs-ddp")
    assert "the backend chooses" in facts.fact("ddp", "gradient sync")
    assert "parallel_apply" in facts.fact("dp", "mixed precision")
    remedies = table("remedies").splitlines()
    sharded = next(i for i, line in enumerate(remedies) if "FSDP" in line)
    pipeline = next(i for i, line in enumerate(remedies) if line.startswith("| sharding is not enough"))
    assert sharded < pipeline, "sharding comes before pipeline and tensor parallelism"


def test_the_notebooks_carry_the_generated_tables() -> None:
    blocks = generated.generated_blocks()
    carried = {name for path, names in blocks.items() if path.parent.name == "sources" for name in names}
    assert {"facts-dp-vs-ddp", "facts-parallelism", "facts-remedies"} <= carried
    for path, names in blocks.items():
        if path.parent.name == "sources":
            for name in names:
                assert table(name.removeprefix("facts-")) in path.read_text(encoding="utf-8")


def test_fact_and_table_refuse_unknown_names_clearly() -> None:
    with pytest.raises(KeyError, match="no technique 'zero'"):
        facts.fact("zero", "cost")
    with pytest.raises(KeyError, match="has no fact 'colour'"):
        facts.fact("ddp", "colour")
    with pytest.raises(TypeError, match="two strings"):
        facts.fact("ddp", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no table 'map'"):
        table("map")
    with pytest.raises(TypeError, match="must be a string"):
        table(None)  # type: ignore[arg-type]


def test_the_format_facts_are_torchs_and_name_both_counts() -> None:
    # notebooks 06, 07, 12 and 22 state these counts; tests/test_wording.py holds their text to these facts
    import torch

    from course_lib.float_formats import float_format

    for name, dtype in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        stored, significant = facts.format_bits(name)
        layout = float_format(dtype)
        assert (stored, significant) == (layout.mantissa_bits, layout.mantissa_bits + 1), name
        assert f"{layout.exponent_bits} exponent bits" in facts.fact("mixed precision", f"{name} bits"), name
    with pytest.raises(KeyError, match="no fact 'fp8 bits'"):
        facts.format_bits("fp8")
    with pytest.raises(TypeError, match="takes a string"):
        facts.format_bits(16)  # type: ignore[arg-type]
