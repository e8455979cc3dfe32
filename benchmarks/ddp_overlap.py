"""DDP by hand on a simulated compute device: the time overlap hides, measured on 2 gloo ranks.

    python benchmarks/ddp_overlap.py [--steps 16] [--width 1024] [--depth 4] [--forward-ms 5] [--backward-ms 30]
                                     [--bucket-mb 4]

The model is course_lib.simulated_compute.simulated_mlp: --depth layers Linear(width, width) whose
forward and backward each take a known time by sleeping (the real math is quick), so a step's
compute time is known: depth * (forward_ms + backward_ms). course_lib.hand_ddp.HandDDP averages the
gradients in buckets of --bucket-mb MiB (4 MiB: one bucket per 1024-wide layer), either started by
the gradient hooks during backward (overlap on) or all started after backward (overlap off, the
same buckets). The two settings alternate step by step in one job, so both see the same load; the
step (forward, backward, finish) is timed on rank 0 after a barrier. A Timeline records every
compute span and every all-reduce (from launch to the backend's completion), from which the
communication hidden behind compute is measured directly.

What it shows: with overlap, all but the last bucket's all-reduce run while earlier layers
compute their backward; without it, every all-reduce waits for the end of backward. The saving is
at most the communication time of all buckets but the last, and at most the backward time left
after the first bucket is ready. Timings move with the load on the machine: the table reports the
median and the spread (min to max) of the per-step saving over the paired steps. Two readings are
steadier than the step time: the communication hidden behind compute (exactly 0 without overlap,
by construction: nothing is launched before backward ends) and the "exposed" wait, from the end of
the last backward layer to the end of finish(), whose paired saving excludes the noise of the
compute phase (sleep overshoot, the real math slowed by the concurrent communication).

Prints a table, then:
RESULT saving_ms=<median paired saving> saving_min_ms=<f> saving_max_ms=<f> on_ms=<median> off_ms=<median>
       comm_ms=<median all-reduce busy time per step> hidden_on_ms=<median> hidden_off_ms=<median>
       exposed_saving_ms=<median paired saving of the wait after backward> exposed_saving_min_ms=<f>
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

from course_lib.hand_ddp import HandDDP
from course_lib.launch import run_ranks
from course_lib.simulated_compute import Timeline, busy_seconds, hidden_seconds, simulated_mlp


def worker(
    rank: int,
    world_size: int,
    steps: int,
    width: int,
    depth: int,
    forward_ms: float,
    backward_ms: float,
    bucket_mb: float,
) -> dict:
    torch.set_num_threads(1)
    timeline = Timeline(rank)
    model = simulated_mlp(width, depth, forward_ms, backward_ms, timeline)
    ddp = HandDDP(model, bucket_cap_mb=bucket_mb, timeline=timeline)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(2, width, generator=g)  # a small batch: the real math stays far below the simulated time
    rows: dict[bool, list[dict]] = {True: [], False: []}
    spans: dict[bool, list] = {}
    for step in range(2 * (steps + 1)):
        overlap = step % 2 == 0
        ddp.overlap = overlap
        model.zero_grad(set_to_none=False)
        dist.barrier()
        timeline.reset()
        t0 = time.perf_counter()
        ddp(x).square().mean().backward()
        ddp.finish()
        elapsed = time.perf_counter() - t0
        done = timeline.now()
        time.sleep(0.05)  # let the last completion callbacks land before reading the timeline
        s = timeline.spans
        if step >= 2:  # the first pair warms up
            last_compute = max(x.end for x in s if x.lane == "compute")
            rows[overlap].append(
                {
                    "ms": 1000 * elapsed,
                    "hidden": 1000 * hidden_seconds(s),
                    "comm": 1000 * busy_seconds(s, "comm"),
                    "exposed": 1000 * (done - last_compute),  # waiting for communication after backward
                }
            )
            spans[overlap] = s
    return {
        "rows": rows,
        "buckets": ddp.bucket_sizes,
        "spans": spans,
        "compute_ms": depth * (forward_ms + backward_ms),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=4)
    parser.add_argument("--forward-ms", type=float, default=5.0)
    parser.add_argument("--backward-ms", type=float, default=30.0)
    parser.add_argument("--bucket-mb", type=float, default=4.0)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.width < 1 or args.depth < 1:
        parser.error("--steps, --width and --depth must be >= 1")
    target = f"{os.path.abspath(__file__)}:worker"
    r = run_ranks(
        target,
        2,
        (args.steps, args.width, args.depth, args.forward_ms, args.backward_ms, args.bucket_mb),
        echo="none",
        timeout=300,
    )[0]
    on, off = r["rows"][True], r["rows"][False]
    savings = [b["ms"] - a["ms"] for a, b in zip(on, off)]
    med = statistics.median
    print(
        f"{args.depth} layers of {args.width}x{args.width}; compute per step {r['compute_ms']:.0f} ms (sleeping); "
        f"buckets {[round(b / 2**20, 2) for b in r['buckets']]} MiB; {len(on)} paired steps on rank 0; {os.cpu_count()} cores"
    )
    print(
        f"{'overlap':<8} {'step median ms':>15} {'min':>8} {'max':>8} {'comm busy ms':>13} {'comm hidden ms':>15}"
        f" {'exposed ms':>11}"
    )
    for name, rows in (("on", on), ("off", off)):
        ms = [row["ms"] for row in rows]
        print(
            f"{name:<8} {med(ms):>15.1f} {min(ms):>8.1f} {max(ms):>8.1f} {med([x['comm'] for x in rows]):>13.1f}"
            f" {med([x['hidden'] for x in rows]):>15.1f} {med([x['exposed'] for x in rows]):>11.1f}"
        )
    exposed = [b["exposed"] - a["exposed"] for a, b in zip(on, off)]
    print(f"paired saving (off - on): median {med(savings):.1f} ms, min {min(savings):.1f}, max {max(savings):.1f}")
    print(
        f"paired exposed-communication saving: median {med(exposed):.1f} ms, min {min(exposed):.1f}, "
        f"max {max(exposed):.1f}; steps where overlap was faster: {sum(x > 0 for x in savings)} of {len(savings)}"
    )
    print(
        f"RESULT saving_ms={med(savings):.1f} saving_min_ms={min(savings):.1f} saving_max_ms={max(savings):.1f} "
        f"on_ms={med([x['ms'] for x in on]):.1f} off_ms={med([x['ms'] for x in off]):.1f} "
        f"comm_ms={med([x['comm'] for x in off]):.1f} hidden_on_ms={med([x['hidden'] for x in on]):.1f} "
        f"hidden_off_ms={med([x['hidden'] for x in off]):.1f} exposed_saving_ms={med(exposed):.1f} "
        f"exposed_saving_min_ms={min(exposed):.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
