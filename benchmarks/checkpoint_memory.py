"""Gradient checkpointing on a deep chain: peak memory against depth, and the time it costs, modelled.

For a chain of N blocks (``course_lib.checkpointing.deep_chain``: Linear + Tanh, each keeping one
``batch x width`` activation for backward) this measures the peak memory of one forward +
backward step, from the allocator's events (``course_lib.memory.step_peak_memory``), without
checkpointing and with ``checkpoint_sequential`` in sqrt(N) segments (``use_reentrant=False``).
Fitting log(peak) against log(N) gives the growth exponent: about 1 without checkpointing and
about 0.5 with sqrt(N) segments (Chen et al. 2016). Peaks are bytes and deterministic.

Then it times the step on wider layers (64 blocks of 128, batch 1024, 8 segments) and explains the
overhead. Counting FLOPs, a backward is 2 forwards, so recomputing 7/8 of the forward should add
0.875 / 3 = +29 %; the step measured +51 % when this was first written. Three causes, each
measured apart from the checkpointed step:

1. time is not FLOPs: here a backward takes about 1.5 forwards, not 2 (``tanh`` is dear in the
   forward and its derivative ``1 - y**2`` cheap), so the recomputed forwards are ``0.875 x
   forward / step``, about +34 %;
2. every tensor a checkpointed block saves goes through Python saved-tensor hooks three times
   (packed in forward, packed again when recomputed, unpacked in backward): the cost of a pair of
   *identity* hooks on the same step, measured, scaled from its 2 passes per tensor to those 3 (and
   to the checkpointed blocks only): about +10 %;
3. the fixed cost of each checkpoint call (RNG state, frames, early stop), measured on the same
   chain with 8-wide layers, where arithmetic is negligible: about +5 %.

Their sum is ``overhead_predicted``. Timings are CPU time of this thread with one torch thread
(the backward runs on it too), so other processes on a shared machine do not inflate them; the
variants run interleaved, and each number is the median over rounds of a within-round ratio.
On a busy machine the two still differ by up to about 10 %.

    python benchmarks/checkpoint_memory.py            # the full sweep, N up to 1024
    python benchmarks/checkpoint_memory.py --quick    # N up to 256, fewer rounds

Last line: ``RESULT slope_plain=<f> slope_sqrt=<f> ratio_256=<f> overhead=<f> overhead_predicted=<f>``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import numpy as np
import torch
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import checkpoint_sequential

from course_lib.checkpointing import deep_chain
from course_lib.memory import step_peak_memory

# memory sweep: narrow, long activations, so that one activation (64 KiB) dwarfs a block's
# parameters (288 B) and the 5 KiB RNG state each checkpoint call stores
MEM_BATCH, MEM_WIDTH = 2048, 8
# timing: layers wide enough that the matrix products, not Python, dominate a step
TIME_BATCH, TIME_WIDTH, TIME_DEPTH = 1024, 128, 64


def sqrt_forward(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return checkpoint_sequential(model, math.isqrt(len(model)), x, use_reentrant=False)


def memory_sweep(depths: list[int]) -> list[tuple[int, int, int]]:
    x = torch.randn(MEM_BATCH, MEM_WIDTH, generator=torch.Generator().manual_seed(0), requires_grad=True)
    rows = []
    for n in depths:
        model = deep_chain(n, MEM_WIDTH)
        plain = step_peak_memory(model, x).peak_bytes
        ckpt = step_peak_memory(model, x, forward=sqrt_forward).peak_bytes
        rows.append((n, plain, ckpt))
    return rows


def _ident(t: torch.Tensor) -> torch.Tensor:
    return t


def time_steps(depth: int, width: int, batch: int, repeats: int) -> dict[str, list[tuple[float, float]]]:
    """(forward, whole step) CPU seconds of this thread, per round, for three variants of one step.

    ``plain``: no checkpointing; ``hooked``: no checkpointing, but every saved tensor passes through
    a pair of identity saved-tensor hooks (Python functions that return their argument: the
    mechanism of the non-reentrant checkpoint, doing nothing); ``ckpt``: sqrt(depth) segments.
    The variants run interleaved, one round after another, after a warm-up (the first checkpoint
    call imports and initialises a lot); compare within a round, where the machine was equally busy. Thread CPU time, not wall time: with one torch thread the whole step, the
    backward included, runs on this thread, and other processes on a shared machine do not
    inflate it.
    """
    model = deep_chain(depth, width)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(1), requires_grad=True)

    def plain() -> torch.Tensor:
        return model(x).sum()

    def hooked() -> torch.Tensor:
        with saved_tensors_hooks(_ident, _ident):
            return model(x).sum()

    def ckpt() -> torch.Tensor:
        return sqrt_forward(model, x).sum()

    variants = {"plain": plain, "hooked": hooked, "ckpt": ckpt}
    for fn in variants.values():
        fn().backward()
        fn().backward()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    for _ in range(repeats):  # interleaved, so that a busy machine slows all alike
        for name, fn in variants.items():
            model.zero_grad(set_to_none=True)
            t0 = time.thread_time()
            loss = fn()
            t1 = time.thread_time()
            loss.backward()
            times[name].append((t1 - t0, time.thread_time() - t0))
    return times


def hook_passes(depth: int, segments: int) -> tuple[int, int]:
    """(saved-tensor hook calls in a checkpointed step, in a ``hooked`` plain step), counted.

    A block ``Linear`` + ``Tanh`` saves 3 tensors (the input, the weight's transpose, the
    ``tanh`` output). The hooked plain step packs and unpacks each once: 2 x 3 x depth calls. The
    non-reentrant checkpoint packs each tensor of a checkpointed block in forward, packs it again
    when the block is recomputed, and unpacks it once in backward: 3 x 3 per checkpointed block;
    ``checkpoint_sequential`` leaves the last segment plain.
    """
    model = deep_chain(depth, 4)
    x = torch.randn(2, 4, requires_grad=True)
    packs = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal packs
        packs += 1
        return t

    with saved_tensors_hooks(pack, _ident):
        model(x).sum()
    per_block = packs // depth
    checkpointed = depth - depth // segments
    return 3 * per_block * checkpointed, 2 * per_block * depth


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="depths up to 256 and fewer timing repeats")
    args = parser.parse_args(argv)
    depths = [16, 64, 256] if args.quick else [16, 64, 256, 1024]
    repeats = 9 if args.quick else 15
    torch.manual_seed(0)
    unit = MEM_BATCH * MEM_WIDTH * 4
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(
        f"memory: chain of N blocks Linear({MEM_WIDTH},{MEM_WIDTH})+Tanh, batch {MEM_BATCH}: one activation = {unit // 1024} KiB"
    )
    print()
    print(
        f"{'N':>6} {'segments':>8} {'plain peak':>12} {'sqrt(N) peak':>13} {'plain/act':>10} {'sqrt/act':>9} {'ratio':>6}"
    )
    rows = memory_sweep(depths)
    for n, plain, ckpt in rows:
        print(
            f"{n:>6} {math.isqrt(n):>8} {plain / 2**20:>9.2f} MiB {ckpt / 2**20:>9.2f} MiB {plain / unit:>10.1f} {ckpt / unit:>9.1f} {plain / ckpt:>6.2f}"
        )
    logn = np.log([r[0] for r in rows])
    slope_plain = float(np.polyfit(logn, np.log([r[1] for r in rows]), 1)[0])
    slope_sqrt = float(np.polyfit(logn, np.log([r[2] for r in rows]), 1)[0])
    ratio_256 = next(p / c for n, p, c in rows if n == 256)
    print(
        f"\nlog-log slope of peak vs N: plain {slope_plain:.3f} (target 1.0 +- 0.1), sqrt(N) segments {slope_sqrt:.3f} (target 0.5 +- 0.1)"
    )
    print(f"ratio at N = 256: {ratio_256:.2f} (target >= 6)")

    k = math.isqrt(TIME_DEPTH)
    extra = (TIME_DEPTH - TIME_DEPTH // k) / TIME_DEPTH
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    print(
        f"\ntime (1 thread, CPU time of this thread): chain of {TIME_DEPTH} blocks Linear({TIME_WIDTH},{TIME_WIDTH})+Tanh,"
        f" batch {TIME_BATCH}, {k} segments, medians of {repeats} rounds"
    )
    wide = time_steps(TIME_DEPTH, TIME_WIDTH, TIME_BATCH, repeats)
    narrow = time_steps(TIME_DEPTH, MEM_WIDTH, 256, repeats)
    torch.set_num_threads(threads)
    med = statistics.median
    print(f"  {'':34s} {'plain':>14s} {'hooked':>14s} {'ckpt':>14s}   (median step ms, forward ms in brackets)")
    for label, t in (
        (f"wide Linear({TIME_WIDTH},{TIME_WIDTH}), batch {TIME_BATCH}", wide),
        (f"narrow Linear({MEM_WIDTH},{MEM_WIDTH}), batch 256", narrow),
    ):
        cells = "".join(
            f" {med(s for _, s in t[v]) * 1e3:>7.2f} ({med(f for f, _ in t[v]) * 1e3:5.2f})"
            for v in ("plain", "hooked", "ckpt")
        )
        print(f"  {label:34s}{cells}")
    n_ckpt, n_hooked = hook_passes(TIME_DEPTH, k)
    scale = n_ckpt / n_hooked
    rounds = list(zip(wide["plain"], wide["hooked"], wide["ckpt"], narrow["plain"], narrow["hooked"], narrow["ckpt"]))
    # Per round (the variants ran back to back), each share of the plain step:
    overhead = med(c[1] / p[1] - 1 for p, _, c, *_ in rounds)
    bwd_ratio = med((p[1] - p[0]) / p[0] for p, *_ in rounds)
    # The model, term by term, each measured apart from the checkpointed step it predicts:
    # (1) the recomputed forwards, at the speed of the plain forward
    recompute = med(extra * p[0] / p[1] for p, *_ in rounds)
    # (2) every saved tensor of a checkpointed block passes through Python hooks 3 times (pack,
    #     pack again when recomputed, unpack): the identity hooks' cost on these tensors, scaled
    hooks = med((h[1] - p[1]) * scale / p[1] for p, h, *_ in rounds)
    # (3) per-call bookkeeping (RNG state, frames, early stop), from the narrow chain, where the
    #     arithmetic is negligible: its overhead minus its own recompute and hook terms
    calls = med(
        ((nc[1] - np_[1]) - extra * np_[0] - (nh[1] - np_[1]) * scale) / p[1] for p, _, _, np_, nh, nc in rounds
    )
    overhead_predicted = recompute + hooks + calls
    print(f"\n  measured overhead {overhead:+.1%}; the old prediction, backward = 2 forwards: {extra / 3:+.1%}")
    print(f"  backward / forward measured: {bwd_ratio:.2f} (not 2: tanh is dear in forward, its backward cheap)")
    print("  model, each term measured apart, as a share of the plain step:")
    print(f"    (1) recomputed forwards, {extra:.3f} of the plain forward          {recompute:+.1%}")
    print(f"    (2) saved-tensor hooks, {n_ckpt} passes (identity hooks: {n_hooked})     {hooks:+.1%}")
    print(f"    (3) per-call bookkeeping (narrow chain: RNG state, frames)    {calls:+.1%}")
    print(f"    predicted                                                     {overhead_predicted:+.1%}")
    narrow_overhead = med(c[1] / p[1] - 1 for *_, p, _, c in rounds)
    print(f"  for contrast, the narrow chain: overhead {narrow_overhead:+.0%} (per-call bookkeeping dominates)")
    print(
        f"RESULT slope_plain={slope_plain:.3f} slope_sqrt={slope_sqrt:.3f} ratio_256={ratio_256:.2f}"
        f" overhead={overhead:.3f} overhead_predicted={overhead_predicted:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
