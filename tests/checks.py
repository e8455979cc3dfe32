"""One assertion for the exercise-check tests: a check accepts right answers, reports blanks, and
rejects wrong answers with a hint::

    assert_check(check_leaf_tensor, right=[good], not_done=[...], wrong=[(torch.ones(2, 3), "requires_grad")])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from course_lib.exercises.core import CheckResult


def assert_check(
    check: Callable[[Any], CheckResult],
    *,
    right: Iterable[Any] = (),
    right_says: str = "",
    not_done: Iterable[Any] = (),
    wrong: Iterable[tuple[Any, str]] = (),
) -> None:
    """Run ``check`` on every answer given and assert its outcome.

    * each of ``right`` is correct (and its message contains ``right_says``);
    * each of ``not_done`` is "not done yet" (the blanks a notebook hands out);
    * each ``(answer, hint)`` of ``wrong`` is wrong with ``hint`` in the message (``""``: any hint).
    """
    for answer in right:
        r = check(answer)
        assert r and r.status == "correct" and right_says in r.message, (answer, r)
    for answer in not_done:
        r = check(answer)
        assert r.status == "not done yet", (answer, r)
    for answer, hint in wrong:
        r = check(answer)
        assert r.status == "wrong" and hint in r.message, (answer, r)
