from __future__ import annotations

import torch

from checks import assert_check
from course_lib.exercises.sharding import FIT_SCENARIOS, check_bytes_sent, check_rank_bytes, check_stage_that_fits


def _blank(*args: object) -> object:
    raise NotImplementedError


def _right(params: int, n: int, stage: str) -> int:
    shard = -(-params // n)
    sharded = {"ddp": (0, 0, 0), "zero1": (0, 0, 1), "zero2": (0, 1, 1), "zero3": (1, 1, 1)}[stage]
    return sum(b * (shard if s else params) for b, s in zip((2, 2, 12), sharded))


def test_rank_bytes() -> None:
    assert_check(
        check_rank_bytes,
        right=[_right, lambda p, n, s: float(_right(p, n, s))],
        not_done=[_blank, ...],
        wrong=[
            (lambda p, n, s: 16 * p, "'ddp' keeps"),
            (lambda p, n, s: 16 * p / n, "divides everything by N"),
            (lambda p, n, s: _right(p, n, "zero1") if s == "zero2" else _right(p, n, s), "'zero1' keeps"),
            (lambda p, n, s: 3 * p, "count 2 bytes"),
            (lambda p, n, s: "16", "return a number"),
            (lambda p, n, s: 1 / 0, "ZeroDivisionError"),
        ],
    )


RIGHT = dict(zip(FIT_SCENARIOS, ["ddp", "zero1", "zero2", "zero3"]))


def test_stage_that_fits() -> None:
    assert_check(
        check_stage_that_fits,
        right=[RIGHT],
        not_done=[..., dict.fromkeys(FIT_SCENARIOS, ...)],
        wrong=[
            ({**RIGHT, list(FIT_SCENARIOS)[1]: "ddp"}, "GB per rank"),
            ({**RIGHT, list(FIT_SCENARIOS)[0]: "zero3"}, "not the first stage"),
            ({**RIGHT, list(FIT_SCENARIOS)[3]: "fsdp"}, "must be one of"),
            ({k: v for k, v in list(RIGHT.items())[:2]}, "no answer for"),
            (["ddp"], "should be a dict"),
        ],
    )


def _sent(params: int, n: int, stage: str) -> float:
    return (3 if stage == "zero3" else 2) * (n - 1) / n * 2 * params


def test_bytes_sent() -> None:
    assert_check(
        check_bytes_sent,
        right=[_sent, lambda p, n, s: torch.tensor(_sent(p, n, s), dtype=torch.float64)],
        not_done=[_blank, ...],
        wrong=[
            (lambda p, n, s: _sent(p, n, "ddp"), "all-gathers the parameters twice"),
            (lambda p, n, s: _sent(p, n, "zero3"), "only ZeRO-3 gathers"),
            (lambda p, n, s: 2 * _sent(p, n, s), "2 bytes each"),
            (lambda p, n, s: _sent(p, n, s) * n / max(n - 1, 1) if n > 1 else 0.0, "(N-1)/N"),
            (lambda p, n, s: _sent(p, n, s) if n > 1 else 5.0, "nobody to send to"),
            (lambda p, n, s: 7, "count each collective"),
            (lambda p, n, s: "1", "return a number"),
        ],
    )
