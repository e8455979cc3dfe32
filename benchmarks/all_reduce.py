"""A ring all-reduce written with point-to-point messages against ``dist.all_reduce``, on gloo.

    .venv/bin/python benchmarks/all_reduce.py [--sizes 1024 65536 ...] [--world-sizes 2 4] [--repeats 10]

For each world size (processes on this machine, started with ``course_lib.launch.run_ranks``) and
each tensor size (float32): the median time of one all-reduce (the slowest rank's time, each
repetition), the bytes each rank sent in the hand-written ring (counted in the code), the ring's
formula ``2 (N-1)/N * S``, and whether the results equal ``dist.all_reduce``'s (``allclose`` on
random data, bit-identical on integer-valued data). The ring is course_lib.collectives.ring_all_reduce,
the copy that notebook 09 writes by hand and checks against it.

It also times one message (half a send/recv ping-pong between ranks 0 and 1) at each size, fits
the alpha-beta model to those times (``course_lib.comm_model.fit_alpha_beta``, as notebook 09 does)
and prints the ring's predicted time, ``2(N-1) (alpha + S/(N beta))``, next to the measured one.

Prints a table, then one line::

    RESULT ring_equal=<1|0> bytes_ratio_vs_formula=<f> time_ratio_vs_gloo=<f> ring_time_vs_model=<f>

``bytes_ratio_vs_formula``: the largest (bytes sent by one rank) / (2(N-1)/N * S) over every
run (1.0 when N divides the size; sizes here are powers of two). ``time_ratio_vs_gloo``: the
geometric mean over every run of (ring time) / (dist.all_reduce time). ``ring_time_vs_model``: the
geometric mean of (ring time) / (alpha-beta prediction); the model assumes full-duplex links, which
processes sharing a machine's cores are not (notebook 09, section 5), so expect it above 1 here; with
more processes than cores (4 on 2 cores) each of the ring's 2(N-1) dependent steps also waits for
its receiver to be scheduled, and the ratio grows far above 1.

What the times mean depends on the machine: processes on one machine talk over loopback TCP
and, with fewer cores than processes, take turns on the CPUs; gloo's own algorithm is not
visible, so its bytes are not counted.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from course_lib.collectives import ring_all_reduce  # the ring notebook 09 writes by hand
from course_lib.comm_model import fit_alpha_beta, predict_all_reduce
from course_lib.launch import run_ranks
from course_lib.saved_tensors import format_bytes

DEFAULT_SIZES = (1024, 16384, 262144, 1048576)  # float32 elements: 4 KiB .. 4 MiB


def _timed(fn, t: torch.Tensor) -> float:
    """Seconds of the slowest rank for one call, after a barrier."""
    dist.barrier()
    t0 = time.perf_counter()
    fn(t)
    elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return float(elapsed)


def _message_s(t: torch.Tensor, reps: int) -> float:
    """Median seconds of one message between ranks 0 and 1 (half a ping-pong); other ranks wait."""
    rank, times = dist.get_rank(), []
    dist.barrier()
    for _ in range(reps):
        t0 = time.perf_counter()
        if rank == 0:
            dist.send(t, dst=1)
            dist.recv(t, src=1)
        elif rank == 1:
            dist.recv(t, src=0)
            dist.send(t, dst=0)
        times.append((time.perf_counter() - t0) / 2)
    return statistics.median(times)


def worker(rank: int, world_size: int, sizes: list[int], repeats: int) -> list[dict]:
    torch.set_num_threads(1)
    rows = []
    for numel in sizes:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(1000 + rank))
        mine, reference = x.clone(), x.clone()
        sent = ring_all_reduce(mine)
        dist.all_reduce(reference)
        ints = torch.arange(numel, dtype=torch.float32).remainder_(1000) * (rank + 1)
        ints_ref = ints.clone()
        ring_all_reduce(ints)
        dist.all_reduce(ints_ref)
        equal = bool(torch.allclose(mine, reference, rtol=1e-5, atol=1e-5) and torch.equal(ints, ints_ref))
        reps = max(3, min(repeats, (repeats * 65536) // max(numel, 1) + 3))
        buf = x.clone()
        for _ in range(2):  # warm-up: connections, allocations
            ring_all_reduce(buf)
            dist.all_reduce(buf)
        message_s = _message_s(buf, reps)
        ring_t = [_timed(ring_all_reduce, buf) for _ in range(reps)]
        gloo_t = [_timed(dist.all_reduce, buf) for _ in range(reps)]
        rows.append(
            {
                "numel": numel,
                "rank": rank,
                "sent": sent,
                "equal": equal,
                "reps": reps,
                "ring_s": statistics.median(ring_t),
                "gloo_s": statistics.median(gloo_t),
                "message_s": message_s,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES), help="float32 elements")
    parser.add_argument("--world-sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=10, help="timed repetitions (more for small tensors)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per world size")
    args = parser.parse_args(argv)
    if any(s < 1 for s in args.sizes) or any(w < 2 for w in args.world_sizes) or args.repeats < 1:
        parser.error("sizes and repeats must be >= 1, world sizes >= 2")

    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(f"torch {torch.__version__}, gloo on {cores} CPU cores; times: median over repetitions of the slowest rank")
    header = (
        f"{'N':>2} {'elements':>9} {'S':>9} | {'ring B/rank (max)':>17} {'formula':>11} {'ratio':>6} | "
        f"{'ring ms':>8} {'model ms':>8} {'gloo ms':>8} {'ring/gloo':>9} | equal"
    )
    print(header)
    print("-" * len(header))
    all_equal, byte_ratios, time_ratios, model_ratios = True, [], [], []
    for n in args.world_sizes:
        per_rank = run_ranks(
            f"{Path(__file__).resolve()}:worker",
            nprocs=n,
            args=(args.sizes, args.repeats),
            timeout=args.timeout,
            echo="none",
        )
        link = fit_alpha_beta([4 * numel for numel in args.sizes], [row["message_s"] for row in per_rank[0]])
        print(f"N={n}: one message ~ {link.alpha * 1e6:.1f} us + bytes / {link.beta / 1e9:.2f} GB/s (fitted)")
        for i, numel in enumerate(args.sizes):
            rows = [per_rank[r][i] for r in range(n)]
            s = numel * 4
            sent = max(r["sent"] for r in rows)
            formula = 2 * (n - 1) / n * s
            equal = all(r["equal"] for r in rows)
            ring_ms, gloo_ms = rows[0]["ring_s"] * 1e3, rows[0]["gloo_s"] * 1e3
            model_ms = predict_all_reduce(link, s, n, "ring") * 1e3
            model_ratios.append(ring_ms / model_ms)
            all_equal &= equal
            byte_ratios.append(sent / formula)
            time_ratios.append(ring_ms / gloo_ms)
            print(
                f"{n:>2} {numel:>9} {format_bytes(s):>9} | {sent:>17} {formula:>11.0f} {sent / formula:>6.3f} | "
                f"{ring_ms:>8.3f} {model_ms:>8.3f} {gloo_ms:>8.3f} {ring_ms / gloo_ms:>9.2f} | {int(equal)}"
            )
    geo = math.exp(sum(math.log(r) for r in time_ratios) / len(time_ratios))
    geo_model = math.exp(sum(math.log(r) for r in model_ratios) / len(model_ratios))
    print(
        f"RESULT ring_equal={int(all_equal)} bytes_ratio_vs_formula={max(byte_ratios):.4f} time_ratio_vs_gloo={geo:.3f} "
        f"ring_time_vs_model={geo_model:.3f}"
    )
    return 0 if all_equal else 1


if __name__ == "__main__":
    sys.exit(main())
