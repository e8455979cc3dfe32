"""Checks for notebook 22 (capstone)."""

from __future__ import annotations

from typing import Any

from ..validation import is_int
from .core import Wrong, call_learner, dict_answer, exercise, is_placeholder

__all__ = ["check_effective_batch", "check_technique_choice", "TECHNIQUES", "BOTTLENECKS"]

TECHNIQUES = ("checkpointing", "mixed precision", "accumulation", "ddp", "sharding", "pipeline", "tensor parallel")

# each bottleneck -> the techniques that address it first (the notebook's decision guide)
_GUIDE: dict[str, tuple[set[str], str]] = {
    "activations do not fit, the model does": (
        {"checkpointing", "accumulation", "mixed precision"},
        "activation memory shrinks with recomputation, smaller micro-batches or 16-bit activations",
    ),
    "the wanted batch does not fit on the one device you have": (
        {"accumulation"},
        "one device, bigger batch: add up the gradients of micro-batches",
    ),
    "the model fits but an epoch takes too long, several devices": (
        {"ddp"},
        "more devices on a model that fits: data parallelism",
    ),
    "the parameters and optimizer state do not fit on one device": (
        {"sharding"},
        "shard the model state over the data-parallel ranks first (ZeRO, FSDP: notebook 14); pipeline and tensor"
        " parallelism split the model too, but come later: for layers too big or slow links",
    ),
    "even sharded, one layer's parameters and activations do not fit on one device": (
        {"tensor parallel"},
        "split inside the layer: each device holds a slice of its weight matrices (notebook 13)",
    ),
    "matmuls are slow on a GPU with tensor cores": ({"mixed precision"}, "16-bit matmuls run on tensor cores"),
}
BOTTLENECKS = tuple(_GUIDE)


@exercise(
    "effective batch", todo="write effective_batch(micro, accum, world) returning the samples behind one optimizer step"
)
def check_effective_batch(effective_batch: Any) -> str:
    for micro, accum, world in [(32, 1, 1), (16, 4, 1), (32, 1, 2), (8, 4, 2), (4, 8, 16)]:
        got = call_learner(effective_batch, micro, accum, world)
        if not is_int(got):
            raise Wrong(f"effective_batch should return an int, got {got!r}")
        want = micro * accum * world
        if got != want:
            hint = ""
            if got == micro * accum:
                hint = " - every DDP rank contributes its own micro-batches"
            elif got == micro * world:
                hint = " - each rank adds up accum micro-batches before the step"
            raise Wrong(f"micro={micro}, accum={accum}, world={world}: got {got}, expected {want}{hint}")
    return "micro-batch x accumulation steps x world size: the three multiply"


@exercise("technique choice", todo="fill in choice: for each bottleneck, one of TECHNIQUES")
def check_technique_choice(choice: Any) -> str:
    dict_answer(choice, BOTTLENECKS, name="choice")
    for bottleneck, (good, why) in _GUIDE.items():
        answer = choice[bottleneck]
        if is_placeholder(answer):
            raise Wrong(f"still blank: {bottleneck!r}")
        if not isinstance(answer, str) or answer.strip().lower() not in TECHNIQUES:
            raise Wrong(f"{bottleneck!r}: answer with one of {TECHNIQUES}, got {answer!r}")
        if answer.strip().lower() not in good:
            raise Wrong(f"{bottleneck!r}: {answer!r} does not address it ({why})")
    return "memory of activations, of the batch, of the model, and time: each has its own first remedy"
