"""Gradient checkpointing on a deep chain: peak memory against depth, and the time it costs.

For a chain of N blocks (``course_lib.checkpointing.deep_chain``: Linear + Tanh, each keeping one
``batch x width`` activation for backward) this measures the peak memory of one forward +
backward step, from the allocator's events (``course_lib.memory.step_peak_memory``), without
checkpointing and with ``checkpoint_sequential`` in sqrt(N) segments (``use_reentrant=False``).
Fitting log(peak) against log(N) gives the growth exponent: about 1 without checkpointing and
about 0.5 with sqrt(N) segments (Chen et al. 2016). Then it times both steps on wider layers,
where arithmetic rather than per-call bookkeeping dominates, and reports the relative overhead.

Peaks are bytes and deterministic. Timings run on one torch thread (steadier on a shared
machine), interleave the two variants, and report the fastest of the repeats after a warm-up
(the least disturbed by other processes) alongside the median.

    python benchmarks/checkpoint_memory.py            # the full sweep, N up to 1024
    python benchmarks/checkpoint_memory.py --quick    # N up to 256, fewer repeats

Last line: ``RESULT slope_plain=<f> slope_sqrt=<f> ratio_256=<f> overhead=<f>``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint_sequential

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from course_lib.checkpointing import deep_chain  # noqa: E402
from course_lib.memory import step_peak_memory  # noqa: E402

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


def time_steps(depth: int, width: int, batch: int, repeats: int) -> tuple[float, float, float, float]:
    """(min plain, min checkpointed, median plain, median checkpointed) seconds per step."""
    model = deep_chain(depth, width)
    x = torch.randn(batch, width, generator=torch.Generator().manual_seed(1), requires_grad=True)

    def plain() -> None:
        model(x).sum().backward()

    def ckpt() -> None:
        sqrt_forward(model, x).sum().backward()

    plain(), ckpt()  # warm-up: the first checkpoint call imports and initialises a lot
    t_plain, t_ckpt = [], []
    for _ in range(repeats):  # interleaved, so that a busy machine slows both alike
        for fn, out in ((plain, t_plain), (ckpt, t_ckpt)):
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return min(t_plain), min(t_ckpt), statistics.median(t_plain), statistics.median(t_ckpt)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="depths up to 256 and fewer timing repeats")
    args = parser.parse_args(argv)
    depths = [16, 64, 256] if args.quick else [16, 64, 256, 1024]
    repeats = 3 if args.quick else 7
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
        f"\ntime (1 thread): chain of {TIME_DEPTH} blocks Linear({TIME_WIDTH},{TIME_WIDTH})+Tanh, batch {TIME_BATCH}, {k} segments,"
        f" fastest and median of {repeats}"
    )
    t_plain, t_ckpt, m_plain, m_ckpt = time_steps(TIME_DEPTH, TIME_WIDTH, TIME_BATCH, repeats)
    overhead = t_ckpt / t_plain - 1
    print(
        f"  step: plain {t_plain * 1e3:.1f} ms, checkpointed {t_ckpt * 1e3:.1f} ms, overhead {overhead:+.1%}"
        f"   (medians {m_plain * 1e3:.1f} / {m_ckpt * 1e3:.1f} ms, {m_ckpt / m_plain - 1:+.1%})"
    )
    print(
        f"  recomputed: {extra:.3f} of a forward pass; if backward = 2 forwards, expected arithmetic overhead {extra / 3:+.1%}"
    )
    tn_plain, tn_ckpt, _, _ = time_steps(TIME_DEPTH, MEM_WIDTH, 256, repeats)
    torch.set_num_threads(threads)
    print(
        f"  for contrast, narrow Linear({MEM_WIDTH},{MEM_WIDTH}) blocks, batch 256: plain {tn_plain * 1e3:.2f} ms,"
        f" checkpointed {tn_ckpt * 1e3:.2f} ms, overhead {tn_ckpt / tn_plain - 1:+.0%} (per-call bookkeeping dominates)"
    )
    print(
        f"RESULT slope_plain={slope_plain:.3f} slope_sqrt={slope_sqrt:.3f} ratio_256={ratio_256:.2f} overhead={overhead:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
