"""Notebook 12's exercise checks accept right answers and reject wrong ones with a useful hint."""

from __future__ import annotations

from typing import Any

from checks import assert_check
from course_lib.exercises.ddp_knobs import KNOBS, check_bucket_sizes, check_knob_choices, check_resume


def right_buckets(sizes: list[int], cap: int, first_cap: int) -> list[int]:
    out, current, limit = [], 0, first_cap
    for nbytes in sizes:
        current += nbytes
        if current >= limit:
            out.append(current)
            current, limit = 0, cap
    return out + ([current] if current else [])


def no_first_cap(sizes: list[int], cap: int, first_cap: int) -> list[int]:
    return right_buckets(sizes, cap, cap)


def never_over_the_cap(sizes: list[int], cap: int, first_cap: int) -> list[int]:
    out, current, limit = [], 0, first_cap  # closes a bucket *before* it would exceed: DDP does not
    for nbytes in sizes:
        if current and current + nbytes > limit:
            out.append(current)
            current, limit = 0, cap
        current += nbytes
    return out + [current]


def naive_count(sizes: list[int], cap: int, first_cap: int) -> list[int]:
    return [cap] * -(-sum(sizes) // cap)


def blank(sizes: list[int], cap: int, first_cap: int) -> list[int]:
    raise NotImplementedError


def test_bucket_sizes() -> None:
    assert_check(
        check_bucket_sizes,
        right=[right_buckets],
        right_says="as DDP does",
        not_done=[..., blank],
        wrong=[
            (no_first_cap, "first bucket"),
            (never_over_the_cap, "reaches its cap"),
            (naive_count, "add up"),
            (lambda s, c, f: "four", "list of ints"),
        ],
    )


RIGHT_KNOBS = {
    "a model with an auxiliary head used only every other step": "find_unused_parameters",
    "the same unused head on every step, and the flag's graph walk is too slow": "static_graph",
    "rank 0 has 10 batches and rank 1 has 12": "join",
    "the gradients' second copy does not fit in memory": "gradient_as_bucket_view",
    "slow Ethernet between nodes, and gradients tolerate rounding to 16 bits": "comm_hook",
    "each rank must keep its own BatchNorm statistics": "forward_sync_buffers=False",
}
UNEVEN = "rank 0 has 10 batches and rank 1 has 12"


def test_knob_choices() -> None:
    assert set(RIGHT_KNOBS.values()) == set(KNOBS)
    swapped = dict(RIGHT_KNOBS)
    swapped["a model with an auxiliary head used only every other step"] = "static_graph"
    assert_check(
        check_knob_choices,
        right=[RIGHT_KNOBS],
        not_done=[..., dict.fromkeys(RIGHT_KNOBS, ...), {**RIGHT_KNOBS, UNEVEN: ...}],
        wrong=[
            (swapped, "not static"),
            ({**RIGHT_KNOBS, UNEVEN: "no_sync"}, "is not one of"),
            ({k: v for k, v in RIGHT_KNOBS.items() if k != UNEVEN}, "no answer for"),
            (list(RIGHT_KNOBS.values()), "should be a dict"),
        ],
    )


def resume(answer: tuple[Any, Any]) -> Any:
    return check_resume(*answer)


def test_resume() -> None:
    def right(step: int, n: int) -> tuple[int, int]:
        return divmod(step, n)

    needed = {"model", "optimizer", "step", "rng of every rank"}
    rank0_only = (needed - {"rng of every rank"}) | {"rng of rank 0"}
    assert_check(
        resume,
        right=[(right, needed), (right, needed | {"rng of rank 0"}), (right, list(needed))],
        not_done=[(right, ...), (..., ...), (..., needed)],
        wrong=[
            ((lambda step, n: (step // n, step % n + 1), needed), "expected"),
            ((lambda step, n: step, needed), "pair of ints"),
            ((right, needed - {"optimizer"}), "momentum"),
            ((right, rank0_only), "every rank"),
            ((right, needed - {"step"}), "also needed"),
            ((right, needed | {"loss"}), "not needed"),
            ((right, needed | {"weights"}), "unknown"),
            ((right, 3), "set of names"),
        ],
    )
