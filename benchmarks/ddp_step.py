"""DDP step time on CPU/gloo: 1 process versus 2 processes, and the effect of bucket_cap_mb.

    python benchmarks/ddp_step.py [--steps 30] [--global-batch 512]

The global batch is fixed (512 samples of the 64-feature digits shape) so that every row does
the same training work: one process takes the whole batch, two DDP processes take half each.
Single-process rows run without DDP with 1 and with 2 intra-op threads; DDP rows use one thread
per process (what torchrun sets). Each row is a fresh job started by course_lib.launch.run_ranks;
the step (zero_grad, forward, backward with its all-reduce, SGD) is timed on rank 0 after a
barrier, over --steps after 5 warm-up steps; the table shows the median and the best step (the
best is the least disturbed by other work on the machine; the RESULT ratios use it). A DDP communication hook counts the buckets
(all-reduces) of the last step; it wraps the default all-reduce, so every DDP row pays it alike.

What 2 cores allow: two DDP processes (1 thread each) use the same two cores that one process
with 2 intra-op threads uses, and add an all-reduce per step, so on an otherwise idle machine the
2-thread single process is about as fast as DDP or faster (and much slower when other processes
compete for the cores: OpenMP threads spin while they wait); DDP's gain needs separate devices (GPUs, or machines), where
each rank brings its own compute. Timings move by tens of percent when other work shares the
cores: read the table as orders of magnitude, rerun before trusting a 20% difference.

Its model (an MLP, here 512 wide instead of the notebook's 256) and its bucket-counting communication
hook are those of notebook 11's _runs/ddp_internals.py: the benchmark reads that script from the
notebook's text source (``course_lib.manifest.written_file``), writes it to a temporary folder and
imports it in each rank, so there is one copy.

Prints a table, then:
RESULT speedup_2proc_vs_1proc=<best DDP row over 1 process, 1 thread> best_bucket_mb=<f> buckets_at_best=<n>
       threads2_vs_1proc=<1 process with 2 threads over 1 thread>
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from course_lib.launch import run_ranks
from course_lib.manifest import written_file

WIDTH = 512  # the notebook's MLP is 256 wide; wider here, so that a step is long enough to time


def worker(rank: int, world_size: int, threads: int, bucket_mb: float | None, global_batch: int, steps: int) -> dict:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    # notebook 11's script, written by main() into the ranks' working directory
    from ddp_internals import counting_hook, mlp  # type: ignore[import-not-found]

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model: torch.nn.Module = mlp(width=WIDTH)
    seen: list[int] = []  # bucket sizes all-reduced in the current step, noted by the notebook's comm hook
    if dist.is_initialized():
        model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_mb)
        model.register_comm_hook(seen, counting_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    local = global_batch // world_size
    x, y = torch.randn(local, 64, generator=g), torch.randint(0, 10, (local,), generator=g)
    times = []
    for _step in range(steps + 5):
        seen.clear()  # keeps the last step's buckets (DDP rebuilds its buckets after the first step)
        if dist.is_initialized():
            dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    n_buckets = len(seen)
    params_mb = sum(p.numel() * 4 for p in model.parameters()) / 2**20
    return {
        "ms": 1000 * statistics.median(times[5:]),
        "min_ms": 1000 * min(times[5:]),
        "buckets": n_buckets,
        "params_mb": params_mb,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--global-batch", type=int, default=512)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.global_batch < 2 or args.global_batch % 2:
        parser.error("--steps must be >= 1 and --global-batch an even number >= 2")
    target = f"{os.path.abspath(__file__)}:worker"
    rows = []
    with tempfile.TemporaryDirectory(prefix="ddp_step_") as tmp:
        # the script notebook 11 writes to _runs/ddp_internals.py (its mlp and counting_hook), from its text source
        Path(tmp, "ddp_internals.py").write_text(written_file("11_ddp_in_practice", "_runs/ddp_internals.py"))
        launch = {"echo": "none", "timeout": 300, "cwd": tmp}  # the ranks start in tmp: `import ddp_internals`
        for threads in (1, 2):
            r = run_ranks(target, 1, (threads, None, args.global_batch, args.steps), init_method="none", **launch)[0]
            rows.append((f"1 process, no DDP, {threads} thread{'s' if threads > 1 else ''}", "-", r))
        for bucket in (0.05, 2.5, 25.0):
            r = run_ranks(target, 2, (1, bucket, args.global_batch, args.steps), **launch)[0]
            rows.append(("2 processes, DDP, 1 thread each", f"{bucket:g}", r))
    print(
        f"model: {rows[0][2]['params_mb']:.2f} MB of float32 parameters; global batch {args.global_batch}; "
        f"{os.cpu_count()} CPU cores; {args.steps} timed steps per row"
    )
    print(
        f"{'configuration':<36} {'bucket_cap_mb':>13} {'buckets':>8} {'median ms':>10} {'best ms':>8} {'samples/s (best)':>17}"
    )
    for name, bucket, r in rows:
        print(
            f"{name:<36} {bucket:>13} {r['buckets'] or '-':>8} {r['ms']:>10.2f} {r['min_ms']:>8.2f} "
            f"{args.global_batch / r['min_ms'] * 1000:>17.0f}"
        )
    base = rows[0][2]["min_ms"]
    ddp_rows = rows[2:]
    best = min(ddp_rows, key=lambda row: row[2]["min_ms"])
    print(
        f"RESULT speedup_2proc_vs_1proc={base / best[2]['min_ms']:.2f} best_bucket_mb={best[1]} "
        f"buckets_at_best={best[2]['buckets']} threads2_vs_1proc={base / rows[1][2]['min_ms']:.2f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
