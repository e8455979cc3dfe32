"""Timing of matrix-multiply throughput, on a GPU (CUDA events) or a CPU (wall clock).

Notebook 07's GPU cell and ``benchmarks/mixed_precision.py`` both report TFLOP/s with this function. TF32 is
switched with the ``fp32_precision`` API, not the legacy ``allow_tf32`` flag (notebook 07 §5).
"""

from __future__ import annotations

import time

import torch

from .validation import check_bool, check_int

__all__ = ["matmul_tflops"]


def matmul_tflops(n: int, dtype: torch.dtype, *, device: str = "cuda", tf32: bool = False, repeats: int = 10) -> float:
    """TFLOP/s of ``repeats`` products of two random ``n x n`` matrices (``2 n^3`` flops each).

    Three warm-up products run first. On CUDA the time comes from CUDA events around the products; on the CPU
    from the wall clock. For the duration, ``torch.backends.cuda.matmul.fp32_precision`` is ``"tf32"`` when
    ``tf32=True`` (float32 products may use TF32 tensor cores) and ``"ieee"`` otherwise (full fp32), then it is
    restored. This is the per-backend setting of PyTorch 2.9 and later; the legacy
    ``torch.backends.cuda.matmul.allow_tf32`` is left alone, since mixing the two APIs makes PyTorch refuse to
    report the matmul precision.

    >>> matmul_tflops(64, torch.float32, device="cpu", repeats=2) > 0
    True
    """
    check_int("n", n, minimum=1, maximum=2**15)
    check_int("repeats", repeats, minimum=1, maximum=10_000)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    on_cuda = torch.device(device).type == "cuda"
    if on_cuda and not torch.cuda.is_available():
        raise RuntimeError("device='cuda' needs a CUDA GPU; pass device='cpu' here")
    check_bool("tf32", tf32)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    matmul = torch.backends.cuda.matmul
    previous = matmul.fp32_precision
    matmul.fp32_precision = "tf32" if tf32 else "ieee"
    try:
        for _ in range(3):
            a @ b
        if on_cuda:
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(repeats):
                a @ b
            end.record()
            torch.cuda.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(repeats):
                a @ b
            seconds = time.perf_counter() - t0
    finally:
        matmul.fp32_precision = previous
    return 2 * n**3 * repeats / seconds / 1e12
