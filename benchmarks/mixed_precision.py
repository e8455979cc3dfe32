"""Mixed precision, measured: saved-activation bytes and training-step time, fp32 vs bf16 autocast.

    .venv/bin/python benchmarks/mixed_precision.py [--steps N]

One model (an MLP on 64-pixel digit-sized inputs, width 512, three hidden layers) at two batch
sizes. For each: the bytes autograd saves for backward (``SavedTensorMeter``, parameters left out)
(the bf16 weight copies that autocast saves are measured with ``saved_cast_copy_bytes`` and
reported apart) and the median time of a full training step (forward, backward, SGD step), in fp32 and under
``torch.autocast(<device>, dtype=torch.bfloat16)``. On a CUDA machine the same runs on the GPU,
plus matmul throughput (TFLOP/s) for fp32, TF32, fp16 and bf16.

Prints a table, then ``RESULT saved_bytes_ratio=<bf16/fp32> step_time_ratio=<bf16/fp32>`` for the
larger batch on the CPU. Whether bf16 is faster depends on the CPU: with AVX512-BF16/AMX it can be;
on an AVX2-only CPU bf16 arithmetic is emulated and much slower.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from course_lib.saved_tensors import SavedTensorMeter, format_bytes, saved_cast_copy_bytes
from course_lib.timing import matmul_tflops

BATCHES = (64, 512)
WIDTH = 512


def make_model(device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(64, WIDTH),
        nn.ReLU(),
        nn.Linear(WIDTH, WIDTH),
        nn.ReLU(),
        nn.Linear(WIDTH, WIDTH),
        nn.ReLU(),
        nn.Linear(WIDTH, 10),
    ).to(device)


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(device: str, batch: int, low: bool, steps: int) -> tuple[int, int, float]:
    """(saved activation bytes, saved bf16 weight-copy bytes, median step time in seconds)."""
    model = make_model(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(batch, 64, device=device)
    y = torch.randint(0, 10, (batch,), device=device)

    def forward() -> torch.Tensor:
        with torch.autocast(device, dtype=torch.bfloat16, enabled=low):
            return F.cross_entropy(model(x), y)

    with SavedTensorMeter(exclude=model.parameters()) as meter:
        loss = forward()
    del loss
    copies = saved_cast_copy_bytes(forward, model.parameters())  # autocast's low-precision weight copies
    times = []
    for i in range(steps + 2):
        _sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        forward().backward()
        opt.step()
        _sync(device)
        if i >= 2:  # two warm-up steps
            times.append(time.perf_counter() - t0)
    return meter.bytes - copies, copies, statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed training steps per configuration (default 10)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads for torch (default 1: steady timings on a shared 2-core machine)",
    )
    args = parser.parse_args(argv)
    if args.steps < 1:
        parser.error("--steps must be >= 1")
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    torch.set_num_threads(args.threads)

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    print(
        f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
        f"threads {torch.get_num_threads()}, devices {devices}"
    )
    print(f"model: MLP 64-{WIDTH}-{WIDTH}-{WIDTH}-10, SGD; bf16 = torch.autocast(device, dtype=torch.bfloat16)")
    print("act = activation bytes autograd keeps for backward (parameters and autocast's bf16 weight copies left out);")
    print("copies = those bf16 weight copies; ratio = bf16 / fp32 activations; step = median forward+backward+SGD step")
    header = (
        f"{'device':<6} {'batch':>5} | {'act fp32':>9} {'act bf16':>9} {'copies':>9} {'ratio':>6} | "
        f"{'step fp32':>10} {'step bf16':>10} {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    result: tuple[float, float] | None = None
    for device in devices:
        for batch in BATCHES:
            b32, _, t32 = measure(device, batch, low=False, steps=args.steps)
            b16, c16, t16 = measure(device, batch, low=True, steps=args.steps)
            print(
                f"{device:<6} {batch:>5} | {format_bytes(b32):>9} {format_bytes(b16):>9} {format_bytes(c16):>9} "
                f"{b16 / b32:>6.3f} | {t32 * 1e3:>8.2f}ms {t16 * 1e3:>8.2f}ms {t16 / t32:>6.2f}"
            )
            if device == "cpu" and batch == max(BATCHES):
                result = (b16 / b32, t16 / t32)
    if "cuda" in devices:
        print(f"\nGPU matmul 4096^3 on {torch.cuda.get_device_name()}:")
        for name, dtype, tf32 in (
            ("fp32", torch.float32, False),
            ("tf32", torch.float32, True),
            ("fp16", torch.float16, False),
            ("bf16", torch.bfloat16, False),
        ):
            print(f"  {name}: {matmul_tflops(4096, dtype, tf32=tf32, repeats=20):8.1f} TFLOP/s")
    assert result is not None
    print(f"RESULT saved_bytes_ratio={result[0]:.3f} step_time_ratio={result[1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
