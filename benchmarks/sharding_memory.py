"""Per-rank memory of DDP, ZeRO-1/2 (by hand and ``ZeroRedundancyOptimizer``) and FSDP2, against the model.

Runs the training code of notebook 14 (its ``_runs/model.py``, ``_runs/zero.py`` and
``_runs/zero_job.py`` cells, read from ``sources/14_sharded_data_parallel.py``, so the benchmark
measures exactly what the notebook teaches) on N = 1, 2 and 4 gloo processes: a 4-layer MLP of 263,168 parameters, fp32 Adam, 3 steps.
For each way of training and each rank it records

* the bytes of the parameters, gradients and optimizer state the rank holds (counted from its
  tensors, each storage once: exact), against ``course_lib.sharding.model_state_bytes``;
* the allocator's view from ``course_lib.memory.measure_peak`` around the 3 steps: the peak, and
  what was still allocated at the end ("retained"). On gloo the retained total can exceed what
  is held: frees made on gloo's worker threads are not recorded by the profiler (notebook 14, §2.1).

    python benchmarks/sharding_memory.py           # N = 1, 2, 4
    python benchmarks/sharding_memory.py --quick   # N = 1, 2

Last line: ``RESULT zero1_ratio=<f> zero2_ratio=<f> zero3_ratio=<f> model_error_max=<f>`` (each ratio:
bytes held per rank at N = 2 over DDP's; ``model_error_max``: the largest relative error of the
model against the held bytes, every kind, rank and N), plus ``allocator_excess_max``: the largest
relative excess of the allocator's retained total over the held bytes.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from course_lib.launch import run_ranks
from course_lib.manifest import written_file
from course_lib.sharding import model_state_bytes

KINDS = {"ddp": "ddp", "zero1": "zero1", "zero1_builtin": "zero1", "zero2": "zero2", "fsdp2": "zero3"}

# The scripts notebook 14 writes to _runs/, read from its text source: one copy.
SCRIPTS = {
    name: written_file("14_sharded_data_parallel", f"_runs/{name}") for name in ("model.py", "zero.py", "zero_job.py")
}

WORKER = """
import zero_job


def measure_all(rank, n, kinds):
    out = {}
    for kind in kinds:
        r = zero_job.measure_stage(rank, n, kind)
        out[kind] = {k: r[k] for k in ("held", "retained", "peak", "numel")}
    return out
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 1, 2 only")
    args = parser.parse_args()
    sizes = (1, 2) if args.quick else (1, 2, 4)
    rows = []
    with tempfile.TemporaryDirectory(prefix="sharding_bench_") as tmp:
        for name, text in SCRIPTS.items():
            Path(tmp, name).write_text(text)
        Path(tmp, "bench_worker.py").write_text(WORKER)
        for n in sizes:
            # cwd=tmp: the ranks start there, so bench_worker's `import zero_job` finds the notebook's scripts
            results = run_ranks(
                f"{tmp}/bench_worker.py:measure_all", nprocs=n, args=(list(KINDS),), timeout=300, echo="none", cwd=tmp
            )
            for rank, per_kind in enumerate(results):
                for kind, r in per_kind.items():
                    model = model_state_bytes(r["numel"], n, KINDS[kind], "fp32_adam").total
                    rows.append((n, kind, rank, sum(r["held"].values()), model, r["retained"], r["peak"]))
    print(f"{'N':>2} {'kind':<14}{'rank':>5}{'held':>12}{'model':>12}{'error':>8}{'retained':>12}{'peak':>12}")
    for n, kind, rank, held, model, retained, peak in rows:
        err = abs(held - model) / model
        print(f"{n:>2} {kind:<14}{rank:>5}{held:>12,}{model:>12,}{err:>8.1%}{retained:>12,}{peak:>12,}")
    held_at = {(n, kind): held for n, kind, rank, held, *_ in rows if rank == 0}
    ratios = {
        s: held_at[(2, k)] / held_at[(2, "ddp")]
        for s, k in (("zero1", "zero1"), ("zero2", "zero2"), ("zero3", "fsdp2"))
    }
    model_error = max(abs(held - model) / model for _, _, _, held, model, _, _ in rows)
    excess = max((retained - held) / held for _, _, _, held, _, retained, _ in rows)
    print(
        f"RESULT zero1_ratio={ratios['zero1']:.4f} zero2_ratio={ratios['zero2']:.4f} zero3_ratio={ratios['zero3']:.4f} "
        f"model_error_max={model_error:.4f} allocator_excess_max={excess:.4f}"
    )


if __name__ == "__main__":
    main()
