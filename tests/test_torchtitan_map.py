"""The map from the course's scripts to torchtitan's options: every flag has a row, unknown flags are refused."""

from __future__ import annotations

import re

import pytest

from course_lib.manifest import ROOT
from course_lib.torchtitan_map import (
    TORCHTITAN_EXTRAS,
    TORCHTITAN_FLAGS,
    script_flags,
    torchtitan_rows,
    torchtitan_table,
)

SCRIPTS = {"fsdp_train.py": "19_fsdp2_in_practice", "capstone_train.py": "22_capstone"}


def _flags_of(stem: str, script: str) -> list[str]:
    """The options the script's argparse defines, read from the cell that writes it."""
    text = (ROOT / "sources" / f"{stem}.py").read_text(encoding="utf-8")
    start = text.index(f"# %%writefile _runs/{script}")
    cell = text[start : text.index("\n# %%", start + 1)]
    return script_flags(cell)


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_every_flag_of_the_script_has_a_row_and_every_row_a_flag(script: str) -> None:
    flags = _flags_of(SCRIPTS[script], script)
    assert len(flags) >= 10
    assert sorted(flags) == sorted(TORCHTITAN_FLAGS[script])
    assert len(torchtitan_rows(script, flags)) == len(flags)


def test_rows_name_the_option_and_its_line() -> None:
    rows = dict((f, note) for f, _, note in torchtitan_rows("fsdp_train.py", ["--steps", "--no-prefetch"]))
    assert rows["--steps"] == "`--training.steps` (torchtitan/config/job_config.py:267)"
    assert rows["--no-prefetch"].startswith("none; ")
    table = torchtitan_table("capstone_train.py", ["--tp"])
    assert table.splitlines()[0] == "| `capstone_train.py` | torchtitan (238fa995) |"
    assert "`--parallelism.tensor_parallel_degree` (torchtitan/config/job_config.py:351)" in table


def test_every_option_is_spelled_as_torchtitan_spells_it() -> None:
    rows = [r for table in TORCHTITAN_FLAGS.values() for r in table.values()] + list(TORCHTITAN_EXTRAS.values())
    for option, line, note in rows:
        assert (option is None) == (line is None), (option, line)
        assert option is None or re.fullmatch(r"--[a-z_]+\.[a-z_.0-9]+( [a-z_.0-9]+)?", option), option
        assert option is not None or note, "a flag without an option says why"


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="one of"):
        torchtitan_rows("train.py", ["--steps"])
    with pytest.raises(TypeError, match="script must be a str"):
        torchtitan_rows(16, ["--steps"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no torchtitan row for fsdp_train.py's --warmup"):
        torchtitan_rows("fsdp_train.py", ["--steps", "--warmup"])
    with pytest.raises(TypeError, match="iterable"):
        torchtitan_rows("fsdp_train.py", "--steps")
    with pytest.raises(TypeError, match="strings"):
        torchtitan_rows("fsdp_train.py", [3])
    with pytest.raises(ValueError, match="at least one"):
        torchtitan_rows("fsdp_train.py", [])


def test_script_flags_reads_the_options_and_refuses_text_without_any() -> None:
    text = 'p.add_argument("--steps", type=int)\np.add_argument("--no-prefetch", action="store_true")\np.parse_args()'
    assert script_flags(text) == ["--steps", "--no-prefetch"]
    with pytest.raises(ValueError, match="no option"):
        script_flags("print('hello')")
    with pytest.raises(TypeError, match="str"):
        script_flags(b'add_argument("--steps")')  # type: ignore[arg-type]
