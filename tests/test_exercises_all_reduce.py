from __future__ import annotations

from course_lib.exercises.all_reduce import (
    COLLECTIVE_TASKS,
    check_collective_choice,
    check_ring_bytes,
    check_ring_schedule,
)


def test_ring_bytes() -> None:
    assert check_ring_bytes(lambda s, n: 2 * (n - 1) / n * s)
    assert check_ring_bytes(...).status == "not done yet"
    r = check_ring_bytes(lambda s, n: (n - 1) / n * s)
    assert r.status == "wrong" and "one phase" in r.message
    r = check_ring_bytes(lambda s, n: n * s)
    assert r.status == "wrong" and "parameter server" in r.message
    r = check_ring_bytes(lambda s, n: 3 * s)
    assert r.status == "wrong" and "count the steps" in r.message
    assert check_ring_bytes(lambda s, n: "many").status == "wrong"


def test_ring_schedule() -> None:
    assert check_ring_schedule(lambda i, s, n: (i - s) % n)
    assert check_ring_schedule(lambda i, s, n: (i - s + 2) % n)  # any fixed rotation works
    assert check_ring_schedule(...).status == "not done yet"

    def blank(i: int, s: int, n: int) -> int:
        raise NotImplementedError

    assert check_ring_schedule(blank).status == "not done yet"
    r = check_ring_schedule(lambda i, s, n: i)
    assert r.status == "wrong" and "same chunk" in r.message
    r = check_ring_schedule(lambda i, s, n: (i + s) % n)
    assert r.status == "wrong" and "not fully" in r.message
    r = check_ring_schedule(lambda i, s, n: n)
    assert r.status == "wrong" and "chunk index" in r.message


def test_collective_choice() -> None:
    assert check_collective_choice(dict(COLLECTIVE_TASKS))
    assert check_collective_choice({t: f"dist.{v}" for t, v in COLLECTIVE_TASKS.items()})
    assert check_collective_choice(...).status == "not done yet"
    assert check_collective_choice({t: ... for t in COLLECTIVE_TASKS}).status == "not done yet"
    assert check_collective_choice(["all_reduce"]).status == "wrong"
    tasks = list(COLLECTIVE_TASKS)
    partial = {tasks[0]: "all_reduce"}
    r = check_collective_choice(partial)
    assert r.status == "wrong" and "no answer" in r.message
    wrong = dict(COLLECTIVE_TASKS)
    wrong[tasks[1]] = "reduce"
    r = check_collective_choice(wrong)
    assert r.status == "wrong" and "best fit" in r.message
    wrong[tasks[1]] = "shout"
    r = check_collective_choice(wrong)
    assert r.status == "wrong" and "not one of" in r.message
