from __future__ import annotations

import pytest

from course_lib.errors import expect_error


def test_expected_error_is_shown_and_swallowed(capsys: pytest.CaptureFixture[str]) -> None:
    with expect_error(ZeroDivisionError, match="division") as caught:
        1 / 0  # noqa: B018 (evaluated for the error it raises)
    assert isinstance(caught.error, ZeroDivisionError)
    assert capsys.readouterr().out == "Raised as expected -> ZeroDivisionError: division by zero\n"


def test_quiet_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with expect_error(KeyError, quiet=True):
        {}["x"]
    assert capsys.readouterr().out == ""


def test_no_error_fails_the_run() -> None:
    with pytest.raises(AssertionError, match="ran without error"):
        with expect_error(RuntimeError):
            pass


def test_message_that_does_not_match_fails_the_run() -> None:
    with pytest.raises(AssertionError, match="does not match"):
        with expect_error(ValueError, match="second time"):
            raise ValueError("something else")


def test_an_unexpected_error_type_propagates() -> None:
    with pytest.raises(KeyError):
        with expect_error(ValueError):
            raise KeyError("k")


def test_a_tuple_of_types_is_accepted() -> None:
    with expect_error((KeyError, IndexError), quiet=True) as caught:
        [][1]
    assert isinstance(caught.error, IndexError)


@pytest.mark.parametrize("bad", [ValueError("x"), "ValueError", int, ()])
def test_bad_exception_type_is_rejected(bad: object) -> None:
    with pytest.raises(TypeError, match="exception class"):
        expect_error(bad)  # type: ignore[arg-type]


def test_bad_match_is_rejected() -> None:
    with pytest.raises(ValueError, match="regular expression"):
        expect_error(ValueError, match="(")
    with pytest.raises(TypeError):
        expect_error(ValueError, match=3)  # type: ignore[arg-type]
