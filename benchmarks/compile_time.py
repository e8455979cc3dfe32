"""The first call of a compiled, checkpointed training step: how long `torch.compile` takes, per backend.

Notebook 05 section 3 compiles with ``backend="aot_eager"`` (Dynamo's capture, AOTAutograd's joint
graph and partitioner, then eager kernels) and only quotes what Inductor, the default backend,
costs on first use. This measures it. Each backend runs in a fresh Python process with an empty
Inductor cache (``TORCHINDUCTOR_CACHE_DIR`` in a new temporary folder, the FX-graph and AOTAutograd
caches off), so nothing is reused from an earlier run. The step is a small one: 4 blocks
``Linear(64, 64)`` + GELU, each under ``checkpoint(..., use_reentrant=False)``, batch 32, forward and
backward. Reported per backend: the first call (capture + compile + run), the second call (run only),
and that the gradients equal the eager step's.

Two clocks. Wall-clock seconds of the first call are what a learner waits, and they grow on a busy
machine (the load average is printed with them). CPU seconds do not: the CPU time of the whole fresh
process, from ``import torch`` to exit, with the C++ compiler it runs (read with
``resource.getrusage(RUSAGE_CHILDREN)``; ``TORCHINDUCTOR_COMPILE_THREADS=1`` keeps Inductor's
compilation in that process, so nothing escapes the count). Eager's CPU seconds are the cost of
starting Python and importing torch; the difference is what compiling costs.

    python benchmarks/compile_time.py

Last line: ``RESULT eager_first_s=<f> aot_eager_first_s=<f> inductor_first_s=<f> inductor_second_ms=<f>
eager_cpu_s=<f> aot_eager_cpu_s=<f> inductor_cpu_s=<f>``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile

PROBE = r"""
import json, sys, time
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

backend = sys.argv[1]
torch.manual_seed(0)
blocks = nn.ModuleList(nn.Sequential(nn.Linear(64, 64), nn.GELU()) for _ in range(4))
x = torch.randn(32, 64, requires_grad=True)


def step(t):
    for block in blocks:
        t = checkpoint(block, t, use_reentrant=False)
    return t.sum()


def grads(fn):
    blocks.zero_grad(set_to_none=True)
    x.grad = None
    fn(x).backward()
    return [x.grad.clone()] + [p.grad.clone() for p in blocks.parameters()]


reference = grads(step)
fn = step if backend == "eager" else torch.compile(step, backend=backend)
t0 = time.perf_counter()
got = grads(fn)
t1 = time.perf_counter()
grads(fn)
t2 = time.perf_counter()
same = all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got, reference))
print(json.dumps({"first_s": t1 - t0, "second_s": t2 - t1, "same_grads": same}))
"""

BACKENDS = ("eager", "aot_eager", "inductor")


def run_backend(backend: str) -> dict[str, float]:
    """First and second call of the step under ``backend``, in a fresh process with an empty cache."""
    with tempfile.TemporaryDirectory(prefix="compile_time_") as cache:
        env = dict(
            os.environ,
            TORCHINDUCTOR_CACHE_DIR=cache,
            TORCHINDUCTOR_FX_GRAPH_CACHE="0",
            TORCHINDUCTOR_AUTOGRAD_CACHE="0",
            TORCHINDUCTOR_COMPILE_THREADS="1",  # compile in the process, so its CPU time is counted
            CUDA_VISIBLE_DEVICES="",  # a CPU measurement, on any machine
        )
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(
            [sys.executable, "-c", PROBE, backend], env=env, capture_output=True, text=True, timeout=1800, check=False
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        raise RuntimeError(f"backend {backend} failed:\n{out.stderr[-2000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    result["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    import torch

    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
    print("step: 4 checkpointed blocks Linear(64, 64) + GELU, batch 32, forward + backward; fresh process, empty cache")
    print(f"{'backend':>10} {'first call':>12} {'second call':>12} {'process CPU':>12}  gradients equal eager")
    rows = {}
    for backend in BACKENDS:
        rows[backend] = run_backend(backend)
        r = rows[backend]
        print(
            f"{backend:>10} {r['first_s']:>10.2f} s {r['second_s'] * 1e3:>9.2f} ms {r['cpu_s']:>10.2f} s  {r['same_grads']}"
        )
        if not r["same_grads"]:
            raise SystemExit(f"{backend}: the compiled step's gradients differ from eager")
    print(f"load average {os.getloadavg()[0]:.1f} at the end")
    print(
        f"RESULT eager_first_s={rows['eager']['first_s']:.3f} aot_eager_first_s={rows['aot_eager']['first_s']:.3f}"
        f" inductor_first_s={rows['inductor']['first_s']:.3f} inductor_second_ms={rows['inductor']['second_s'] * 1e3:.3f}"
        f" eager_cpu_s={rows['eager']['cpu_s']:.3f} aot_eager_cpu_s={rows['aot_eager']['cpu_s']:.3f}"
        f" inductor_cpu_s={rows['inductor']['cpu_s']:.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
