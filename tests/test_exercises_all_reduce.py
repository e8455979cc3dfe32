from __future__ import annotations

from checks import assert_check
from course_lib.exercises.all_reduce import (
    COLLECTIVE_TASKS,
    check_collective_choice,
    check_ring_bytes,
    check_ring_schedule,
    check_ring_time,
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


def test_ring_time() -> None:
    def blank(s: float, n: int, a: float, b: float) -> float:
        raise NotImplementedError

    assert_check(
        check_ring_time,
        right=[
            lambda s, n, a, b: 2 * (n - 1) * (a + s / n / b),
            lambda s, n, a, b: 2 * (n - 1) * a + 2 * (n - 1) / n * s / b,
        ],
        right_says="latency grows with N",
        not_done=[..., blank],
        wrong=[
            (lambda s, n, a, b: 2 * (n - 1) / n * s / b, "bandwidth term alone"),
            (lambda s, n, a, b: (n - 1) * (a + s / n / b), "one phase only"),
            (lambda s, n, a, b: 2 * (n - 1) * (a + s / b), "chunk of S/N"),
            (lambda s, n, a, b: a + s / b, "one message of S bytes"),
            (lambda s, n, a, b: 2 * n * (a + s / n / b), "add up 2(N-1) steps"),
            (lambda s, n, a, b: "fast", ""),
        ],
    )


# -- DDP by hand: the overlap hook and the bucket boundaries ------------------------------------
