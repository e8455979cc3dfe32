from __future__ import annotations

import math

import pytest

from course_lib.validation import check_bool, check_int, check_number, is_int, is_number


def test_bools_are_neither_ints_nor_numbers() -> None:
    assert is_int(0) and is_int(-3) and not is_int(True) and not is_int(1.0) and not is_int("1")
    assert is_number(0) and is_number(0.5) and not is_number(False) and not is_number(None)


def test_check_int_returns_the_value_and_names_what_is_wrong() -> None:
    assert check_int("n", 5) == 5
    assert check_int("n", 1, minimum=1, maximum=1) == 1
    with pytest.raises(TypeError, match="^n must be an int, got bool$"):
        check_int("n", True)
    with pytest.raises(TypeError, match="^seed must be an int or None, got float$"):
        check_int("seed", 1.0, what="an int or None")
    with pytest.raises(ValueError, match="^n must be >= 1, got 0$"):
        check_int("n", 0, minimum=1)
    with pytest.raises(ValueError, match="^n must be <= 3, got 4$"):
        check_int("n", 4, maximum=3)
    with pytest.raises(ValueError, match=r"^port must be in \[1, 65535\], got 0$"):
        check_int("port", 0, minimum=1, maximum=65535)


def test_check_number() -> None:
    assert check_number("x", 2) == 2 and isinstance(check_number("x", 2), int)
    assert check_number("x", math.inf) == math.inf
    with pytest.raises(TypeError, match="^x must be a number, got bool$"):
        check_number("x", True)
    with pytest.raises(TypeError, match="^n must be a number of bytes, got str$"):
        check_number("n", "12", what="a number of bytes")
    with pytest.raises(ValueError, match="^x must be finite, got nan$"):
        check_number("x", math.nan, finite=True)


def test_check_bool() -> None:
    assert check_bool("flag", False) is False
    with pytest.raises(TypeError, match="^flag must be a bool, got int$"):
        check_bool("flag", 1)
