from __future__ import annotations

from checks import assert_check
from course_lib.exercises.all_reduce import (
    COLLECTIVE_TASKS,
    check_collective_choice,
    check_ring_bytes,
    check_ring_schedule,
)


def test_ring_bytes() -> None:
    assert_check(
        check_ring_bytes,
        right=[lambda s, n: 2 * (n - 1) / n * s],
        not_done=[...],
        wrong=[
            (lambda s, n: (n - 1) / n * s, "one phase"),
            (lambda s, n: n * s, "parameter server"),
            (lambda s, n: 3 * s, "count the steps"),
            (lambda s, n: "many", ""),
        ],
    )


def test_ring_schedule() -> None:
    def blank(i: int, s: int, n: int) -> int:
        raise NotImplementedError

    assert_check(
        check_ring_schedule,
        right=[lambda i, s, n: (i - s) % n, lambda i, s, n: (i - s + 2) % n],  # any fixed rotation works
        not_done=[..., blank],
        wrong=[
            (lambda i, s, n: i, "same chunk"),
            (lambda i, s, n: (i + s) % n, "not fully"),
            (lambda i, s, n: n, "chunk index"),
        ],
    )


def test_collective_choice() -> None:
    tasks = list(COLLECTIVE_TASKS)
    assert_check(
        check_collective_choice,
        right=[dict(COLLECTIVE_TASKS), {t: f"dist.{v}" for t, v in COLLECTIVE_TASKS.items()}],
        not_done=[..., {t: ... for t in COLLECTIVE_TASKS}],
        wrong=[
            (["all_reduce"], ""),
            ({tasks[0]: "all_reduce"}, "no answer"),
            ({**COLLECTIVE_TASKS, tasks[1]: "reduce"}, "best fit"),
            ({**COLLECTIVE_TASKS, tasks[1]: "shout"}, "not one of"),
        ],
    )
