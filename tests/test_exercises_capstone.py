from __future__ import annotations

from course_lib.exercises.capstone import BOTTLENECKS, TECHNIQUES, check_effective_batch, check_technique_choice

RIGHT = {
    "activations do not fit, the model does": "checkpointing",
    "the wanted batch does not fit on the one device you have": "accumulation",
    "the model fits but an epoch takes too long, several devices": "ddp",
    "the parameters and optimizer state do not fit on one device": "pipeline",
    "matmuls are slow on a GPU with tensor cores": "mixed precision",
}


def test_effective_batch_check() -> None:
    assert check_effective_batch(lambda m, a, w: m * a * w).status == "correct"
    r = check_effective_batch(lambda m, a, w: m * a)
    assert r.status == "wrong" and "every DDP rank" in r.message
    r = check_effective_batch(lambda m, a, w: m * w)
    assert r.status == "wrong" and "accum micro-batches" in r.message
    assert check_effective_batch(lambda m, a, w: float(m * a * w)).status == "wrong"
    assert check_effective_batch(...).status == "not done yet"


def test_technique_choice_check() -> None:
    assert set(RIGHT) == set(BOTTLENECKS) and all(v in TECHNIQUES for v in RIGHT.values())
    assert check_technique_choice(RIGHT).status == "correct"
    assert check_technique_choice({**RIGHT, "activations do not fit, the model does": "Mixed Precision"}).status == "correct"
    assert check_technique_choice({**RIGHT, "the parameters and optimizer state do not fit on one device": "tensor parallel"}).status == "correct"
    assert check_technique_choice({b: ... for b in BOTTLENECKS}).status == "not done yet"
    wrong = check_technique_choice({**RIGHT, "the parameters and optimizer state do not fit on one device": "ddp"})
    assert wrong.status == "wrong" and "splitting the model" in wrong.message
    assert check_technique_choice({**RIGHT, "matmuls are slow on a GPU with tensor cores": "magic"}).status == "wrong"
    partial = dict(RIGHT)
    partial.pop("matmuls are slow on a GPU with tensor cores")
    assert check_technique_choice(partial).status == "wrong"
    assert check_technique_choice({**RIGHT, "the wanted batch does not fit on the one device you have": None}).status == "wrong"
    assert check_technique_choice(["ddp"]).status == "wrong"
