"""The course's comparison facts and corrections, stated once: each fact about a training technique lives here.

Notebook 11's "DataParallel vs DDP", notebook 13's map of parallelism and notebook 22's decision guide all restate
facts taught earlier. Written out by hand three times, they drifted apart (08 said "ring all-reduce" where 07 shows
the backend chooses; 10 said data parallelism needs the whole model state on one device, which sharding answers).
Here a fact is written once, under the technique it belongs to, with the notebook section that shows it.

The tables are views that pick rows and columns; the repository's tooling renders them as markdown into the text
sources (``course_tools.generated``, run by ``python -m course_tools.manifest --write``) between
``<!-- BEGIN generated: facts-NAME -->`` and ``<!-- END generated -->``; tests/test_manifest.py fails when one is
stale, tests/test_sources.py when a notebook does not match its source (``make sync``). :data:`CORRECTIONS` lists
what the course corrected, so that no text source says it again (tests/test_consistency.py).

>>> fact("ddp", "launch")
'`torchrun` / `mp.spawn`'
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CORRECTIONS", "Correction", "FACTS", "fact", "format_bits"]

# FACTS[technique][field]: one sentence each, in the words every table uses. "shown" is where the course shows it.
FACTS: dict[str, dict[str, str]] = {
    "dp": {
        "name": "`nn.DataParallel`",
        "processes": "1, a thread per GPU (GIL-bound, notebook 09 §1)",
        "machines": "one",
        "per step": "scatter the input, replicate the model, gather the outputs",
        "gradient sync": "summed onto GPU 0 after backward, with no overlap; GPU 0 also holds the optimizer state and "
        "the outputs, so it fills first",
        "optimizer": "runs once, on GPU 0",
        "data": "one DataLoader; the batch is split in `forward`",
        "batchnorm": "batch statistics per GPU; running statistics kept from GPU 0's replica only (the others are "
        "discarded after each forward: `DataParallel` documentation)",
        "mixed precision": "`torch.autocast` around the call: `parallel_apply` carries only its on/off flag into the "
        "replicas' threads, each of which uses its device's default dtype, so bf16 autocast runs the replicas in "
        "fp16 on CUDA; enter `torch.autocast(..., dtype=...)` inside `forward` (notebook 09 §1)",
        "launch": "`python train.py`",
        "status": "not recommended in the PyTorch docs",
    },
    "ddp": {
        "name": "`DistributedDataParallel`",
        "processes": "1 per device (GPU or CPU worker)",
        "machines": "one or many (`torchrun --nnodes`)",
        "per step": "rank 0's buffers broadcast before every forward that follows a grad-enabled one "
        "(`forward_sync_buffers`, notebook 12 §1); parameters stay in sync",
        "gradient sync": "the backend's `all_reduce` (ring or tree: the backend chooses, notebook 09 §2), in buckets, "
        "overlapped with backward (written by hand in notebook 10 §1)",
        "optimizer": "runs on every rank, on identical gradients",
        "data": "a `DistributedSampler` shard per rank",
        "batchnorm": "batch statistics per rank; running statistics rank 0's, broadcast before forwards "
        "(notebook 12 §1); or `SyncBatchNorm` (GPU) for global batch statistics",
        "mixed precision": "`torch.autocast` and `torch.amp.GradScaler`, as in one process "
        "(Apex `amp` of the single-machine post is retired)",
        "launch": "`torchrun` / `mp.spawn`",
        "status": "the recommended way",
        "split": "the batch; each device holds the whole model, its gradients and optimizer state",
        "communicated": "all gradients, once per step (all-reduce, 2(N-1)/N of their bytes per rank)",
        "idle": "little: the last bucket's all-reduce and the optimizer step are exposed; stragglers make "
        "every rank wait",
        "needs": "the model, its gradients and optimizer state fit on one device",
        "use when": "the model state fits: the first choice",
        "bottleneck": "the model fits, training takes too long, you have several devices",
        "remedy": "DDP (`torchrun`)",
        "cost": "one all-reduce of the gradients per step, mostly overlapped",
        "shown": "per-rank batch halved; notebooks 11, 12; section 2 above",
    },
    "sharded": {
        "name": "sharded data parallel (ZeRO, FSDP)",
        "split": "the batch, and the model state: each of N ranks keeps 1/N of the optimizer state (ZeRO-1), "
        "gradients (ZeRO-2) and parameters (ZeRO-3, FSDP)",
        "communicated": "reduce-scatter of gradients + all-gather of parameters: DDP's bytes for ZeRO-1/2, "
        "1.5x for ZeRO-3 (parameters gathered again for backward; notebook 14)",
        "idle": "little: FSDP prefetches the next all-gather during compute",
        "needs": "one layer's full parameters (ZeRO-3) and the activations fit on one device",
        "use when": "the model state does not fit one device: the first remedy for that",
        "bottleneck": "the parameters + gradients + optimizer state do not fit one device",
        "remedy": "sharded data parallel: ZeRO-1/2 (optimizer state, gradients), then FSDP (`fully_shard`, ZeRO-3)",
        "cost": "more communication (ZeRO-3: 1.5x DDP's bytes); a sharded checkpoint format",
        "shown": "notebooks 14 and 15",
    },
    "pipeline": {
        "name": "pipeline parallel",
        "split": "the layers, in consecutive stages",
        "communicated": "activations at the cuts, forward and back (point-to-point)",
        "idle": "the bubble, `(p-1)/(m+p-1)` of the step (`(p-1)/m` of the ideal compute)",
        "needs": "a batch big enough for `m ≫ p` micro-batches; balanced stages",
        "use when": "sharding is not enough: across nodes with slow links; very deep models",
        "bottleneck": "sharding is not enough: one layer's parameters or activations do not fit, or links "
        "between nodes are slow",
        "remedy": "pipeline (between layers, across nodes) and tensor parallel (inside layers, within a node)",
        "cost": "the bubble; communication inside every layer",
        "shown": "notebook 13",
    },
    "tensor": {
        "name": "tensor parallel",
        "split": "each layer's weight matrices",
        "communicated": "activations inside every layer (all-reduce / all-gather)",
        "idle": "none, but communication on the critical path of every layer",
        "needs": "very fast links: one node, NVLink",
        "use when": "single layers too big, or activations per layer; within a node",
        "shown": "notebook 13 §6 (one layer), notebook 17 §1 (a whole block)",
    },
    "sequence": {
        "name": "sequence parallel",
        "split": "the tokens of the norm and dropout regions between tensor-parallel layers (with tensor parallelism)",
        "communicated": "tensor parallelism's all-reduces become reduce-scatter + all-gather along the sequence: "
        "the same bytes; plus an all-reduce of the norms' weight gradients",
        "idle": "as tensor parallelism",
        "needs": "tensor parallelism (the same group, the same fast links)",
        "use when": "always with tensor parallelism: the norms' activations are otherwise replicated",
        "shown": "notebook 17 §2",
    },
    "context": {
        "name": "context parallel (ring attention)",
        "split": "the sequence, through attention: each rank keeps the queries, keys and values of its positions",
        "communicated": "key/value blocks around a ring, point-to-point: `2 (n-1)` blocks forward, `4n - 2` "
        "backward per attention; or all-gathered (PyTorch's default), or two all-to-alls over heads (Ulysses); the "
        "gradients all-reduced over the group",
        "idle": "with a causal mask, uneven unless the sequence is split zig-zag; a ring's transfer hides behind a "
        "block's compute when posted first and the compute lasts at least as long",
        "needs": "a sequence long enough that one block's attention outweighs passing its keys and values",
        "use when": "long context: the activations of one sequence do not fit one device",
        "shown": "notebook 18 §1",
    },
    "expert": {
        "name": "expert parallel",
        "split": "the experts of mixture-of-experts layers; each rank routes its own tokens",
        "communicated": "two all-to-alls per MoE layer forward (dispatch, combine) and two backward, sizes set by "
        "the router",
        "idle": "load imbalance: the busiest expert's rank sets the pace; capacity drops the excess",
        "needs": "a balanced router (auxiliary loss or bias) and fast all-to-all",
        "use when": "mixture-of-experts models: more experts than fit one device",
        "shown": "notebook 18 §2",
    },
    "checkpointing": {
        "bottleneck": "activations do not fit (deep or wide model, long sequences)",
        "remedy": "activation checkpointing (selective: recompute the cheap ops)",
        "cost": "up to one extra forward per step (about +30% compute at scale; more for small layers, notebook 04)",
        "shown": "peak down, step slower (notebooks 04, 05); section 2 above",
    },
    "accumulation": {
        "bottleneck": "the wanted batch does not fit on your one device",
        "remedy": "gradient accumulation",
        "cost": "more, smaller steps; BatchNorm and batch-coupled losses see micro-batches",
        "shown": "peak down in proportion (notebook 08); section 2 above",
    },
    "mixed precision": {
        "bottleneck": "memory and speed on a device with bf16/fp16 matrix units",
        "remedy": "mixed precision: bf16 autocast (fp16 + `GradScaler` where bf16 is missing)",
        "cost": "rounding; loss scaling for fp16",
        "shown": "activations halved (notebook 07); section 2 above",
        # A format's precision in the two counts the course uses (notebook 06 §1): the stored mantissa bits (the
        # field's width) and the significant bits (those and the implicit leading 1 of a normal number).
        "fp32 bits": "8 exponent bits and 23 stored mantissa bits: 24 significant bits (notebook 06 §1)",
        "fp16 bits": "5 exponent bits and 10 stored mantissa bits: 11 significant bits (notebook 06 §1)",
        "bf16 bits": "8 exponent bits, fp32's range, and 7 stored mantissa bits: 8 significant bits (notebook 06 §1)",
    },
}


def fact(technique: str, field: str) -> str:
    """One fact, by technique and field (``fact("ddp", "gradient sync")``); raises ``KeyError`` naming what exists."""
    if not isinstance(technique, str) or not isinstance(field, str):
        raise TypeError("fact(technique, field) takes two strings")
    if technique not in FACTS:
        raise KeyError(f"no technique {technique!r}; known: {sorted(FACTS)}")
    if field not in FACTS[technique]:
        raise KeyError(f"{technique!r} has no fact {field!r}; it has: {sorted(FACTS[technique])}")
    return FACTS[technique][field]


def format_bits(name: str) -> tuple[int, int]:
    """``(stored mantissa bits, significant bits)`` of ``"fp32"``, ``"fp16"`` or ``"bf16"``, read from its fact.

    >>> format_bits("bf16")
    (7, 8)
    """
    if not isinstance(name, str):
        raise TypeError(f"format_bits(name) takes a string, got {type(name).__name__}")
    text = fact("mixed precision", f"{name} bits")
    stored = re.search(r"(\d+) stored mantissa bits", text)
    significant = re.search(r"(\d+) significant bits", text)
    if stored is None or significant is None:
        raise ValueError(f"the fact {name!r} bits does not state both counts: {text!r}")
    return int(stored.group(1)), int(significant.group(1))


@dataclass(frozen=True)
class Correction:
    """A statement the course once made (or its sources make) that is false for the PyTorch it runs.

    ``wrong`` is a regular expression for the old wording; ``right`` says what is true; ``shown`` is where a
    notebook shows it. ``tests/test_consistency.py`` fails when any text source says it again.
    """

    wrong: str
    right: str
    shown: str


CORRECTIONS: tuple[Correction, ...] = (
    Correction(
        r"(broadcast|sync)\w*[^.]{0,60}buffers[^.]{0,60}(training forward|forward \(in training\)|in training mode)"
        r"|training forwards?[^.]{0,40}broadcast|forward\**\s*\(in training\)[^.]{0,40}broadcasts?[^.]{0,30}buffers",
        "DDP broadcasts rank 0's buffers at the start of every forward that follows a forward run with gradients "
        "enabled, in training and in eval mode alike",
        "notebook 12 §1",
    ),
    Correction(
        r"divides? by the number of ranks still training",
        "`join()` divides by the initial world size by default (`divide_by_initial_world_size=True`)",
        "notebook 12 §4",
    ),
    Correction(
        r"multiples? of 8[^.]{0,80}tensor cores|tensor cores[^.]{0,80}multiples? of 8",
        "since cuBLAS 11 tensor cores are used whatever the dimensions; alignment and tile/wave quantization "
        "decide their efficiency",
        "notebook 07 §5",
    ),
    Correction(
        r"the default `foreach` implementation of Adam",
        "`foreach` is Adam's default on CUDA, XPU and MTIA; on the CPU the default is the per-tensor loop",
        "notebook 04 §1",
    ),
    Correction(
        r"copies can overlap with (GPU )?(work|compute)",
        "`save_on_cpu` copies on the current stream: asynchronous for the host, not overlapped with GPU compute",
        "notebook 05 §2.2",
    ),
    Correction(
        r"autocast state is carried into|state is carried into the worker threads|carries it into each thread"
        r"|re-enters the caller's autocast state|DataParallel \+ autocast works",
        "`parallel_apply` carries only autocast's on/off flag into DataParallel's threads; the dtype is per thread, so "
        "bf16 autocast around DataParallel runs the replicas in fp16 on CUDA",
        "notebook 09 §1",
    ),
    Correction(
        r"every number is measured on your machine",
        "every number in the text is printed by a cell you run, or names its source",
        "notebook 00",
    ),
    Correction(
        r"the same files serve both",
        "CPU jobs stay on the CPU on a GPU machine; the GPU path is the explicit switch COURSE_DEVICE=cuda",
        "notebook 00 §4",
    ),
)
