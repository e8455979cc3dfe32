from __future__ import annotations

from checks import assert_check
from course_lib.exercises.capstone import (
    BOTTLENECKS,
    TECHNIQUES,
    check_effective_batch,
    check_technique_choice,
)

RIGHT = {
    "activations do not fit, the model does": "checkpointing",
    "the wanted batch does not fit on the one device you have": "accumulation",
    "the model fits but an epoch takes too long, several devices": "ddp",
    "the parameters and optimizer state do not fit on one device": "sharding",
    "even sharded, one layer's parameters and activations do not fit on one device": "tensor parallel",
    "matmuls are slow on a GPU with tensor cores": "mixed precision",
}


def test_effective_batch_check() -> None:
    assert_check(
        check_effective_batch,
        right=[lambda m, a, w: m * a * w],
        not_done=[...],
        wrong=[
            (lambda m, a, w: m * a, "every DDP rank"),
            (lambda m, a, w: m * w, "accum micro-batches"),
            (lambda m, a, w: float(m * a * w), ""),
        ],
    )


def test_technique_choice_check() -> None:
    assert set(RIGHT) == set(BOTTLENECKS) and all(v in TECHNIQUES for v in RIGHT.values())
    model_too_big = "the parameters and optimizer state do not fit on one device"
    slow_matmuls = "matmuls are slow on a GPU with tensor cores"
    assert_check(
        check_technique_choice,
        right=[
            RIGHT,
            {**RIGHT, "activations do not fit, the model does": "Mixed Precision"},
            {**RIGHT, model_too_big: " Sharding "},
        ],
        not_done=[{b: ... for b in BOTTLENECKS}],
        wrong=[
            ({**RIGHT, model_too_big: "ddp"}, "shard the model state"),
            ({**RIGHT, model_too_big: "pipeline"}, "come later"),
            (
                {**RIGHT, "even sharded, one layer's parameters and activations do not fit on one device": "sharding"},
                "inside the layer",
            ),
            ({**RIGHT, slow_matmuls: "magic"}, ""),
            ({b: t for b, t in RIGHT.items() if b != slow_matmuls}, ""),
            ({**RIGHT, "the wanted batch does not fit on the one device you have": None}, ""),
            (["ddp"], ""),
        ],
    )
