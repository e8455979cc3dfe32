from __future__ import annotations

import pytest

from course_lib.exercises.core import CheckResult, Wrong, call_learner, exercise, is_placeholder


@exercise("double", todo="write double(x) returning 2 * x")
def check_double(fn: object) -> str:
    if call_learner(fn, 3) != 6:
        raise Wrong("double(3) should be 6")
    return "double works"


def test_correct_answer() -> None:
    r = check_double(lambda x: 2 * x)
    assert r and r.status == "correct"
    assert repr(r) == "✅ Correct [double]: double works"


@pytest.mark.parametrize("blank", [..., None])
def test_placeholders_are_not_done_yet(blank: object) -> None:
    r = check_double(blank)
    assert not r and r.status == "not done yet"
    assert repr(r) == "⏳ Not done yet [double]: write double(x) returning 2 * x"


def test_a_function_raising_not_implemented_is_not_done_yet() -> None:
    def double(x: int) -> int:
        raise NotImplementedError

    assert check_double(double).status == "not done yet"


def test_a_function_returning_none_is_not_done_yet() -> None:
    def double(x: int) -> None:
        pass

    assert check_double(double).status == "not done yet"


def test_wrong_answer_gets_a_hint() -> None:
    r = check_double(lambda x: x + 2)
    assert r.status == "wrong" and "should be 6" in r.message


def test_learner_code_that_crashes_is_wrong_not_a_crash() -> None:
    r = check_double(lambda x: 1 / 0)
    assert r.status == "wrong" and "ZeroDivisionError" in r.message


def test_non_callable_is_wrong() -> None:
    assert check_double(42).status == "wrong"


def test_is_placeholder() -> None:
    assert is_placeholder(...) and is_placeholder(None) and not is_placeholder(0)


def test_exercise_needs_name_and_todo() -> None:
    with pytest.raises(ValueError):
        exercise("", todo="x")
    with pytest.raises(ValueError):
        exercise("x", todo=" ")


def test_check_result_is_a_value() -> None:
    assert CheckResult("a", "wrong", "m") == CheckResult("a", "wrong", "m")


def test_as_number_accepts_numbers_and_scalar_tensors() -> None:
    import torch

    from course_lib.exercises.core import as_number

    assert as_number(3, "f()") == 3.0 and as_number(torch.tensor(2.5), "f()") == 2.5
    for bad in ("0.5", [1, 2], torch.ones(2), True, None):
        with pytest.raises(Wrong, match=r"f\(1\) should return a number"):
            as_number(bad, "f(1)")
    with pytest.raises(Wrong, match="try 2.0"):
        as_number("x", "g()", hint="; try 2.0")


def test_dict_answer_checks_shape_only() -> None:
    from course_lib.exercises.core import NotDone, dict_answer

    keys = ["a", "b"]
    assert dict_answer({"a": 1, "b": 2}, keys, name="answer") == {"a": 1, "b": 2}
    for blank in (..., None, {"a": ..., "b": ...}):
        with pytest.raises(NotDone):
            dict_answer(blank, keys, name="answer")
    with pytest.raises(Wrong, match="`answer` should be a dict"):
        dict_answer([1, 2], keys, name="answer")
    with pytest.raises(Wrong, match="no answer for: 'b'"):
        dict_answer({"a": 1}, keys, name="answer")
