"""course_lib.collectives (the real ring) and course_lib.timing (matmul throughput)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from course_lib.allreduce_sim import ring_all_reduce as simulated_ring
from course_lib.collectives import ring_all_reduce
from course_lib.launch import spawn
from course_lib.manifest import written_file
from course_lib.timing import matmul_tflops


def test_ring_all_reduce_equals_dist_all_reduce_and_notebook_07s_ring(tmp_path: Path) -> None:
    """Notebook 07's worker (its _runs/ring.py, read from the text source) runs its hand-written ring,
    dist.all_reduce and course_lib's copy on every rank; all three must agree, bytes sent included."""
    worker = tmp_path / "ring.py"
    worker.write_text(written_file("07_data_parallel_and_all_reduce", "_runs/ring.py"))
    rows = spawn(f"{worker}:check", nprocs=3, args=([3, 10, 1000],), timeout=90, echo="none")
    for rank, rank_rows in enumerate(rows):
        for row in rank_rows:
            assert row["close"] and row["exact"] and row["library"], (rank, row)
            assert row["sent"] == simulated_ring([torch.zeros(row["numel"]) for _ in range(3)]).sent_bytes[rank]


def test_ring_all_reduce_refuses_what_it_cannot_do() -> None:
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        ring_all_reduce([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="needs a process group"):
        ring_all_reduce(torch.zeros(4))


def test_matmul_tflops_on_cpu_and_its_checks() -> None:
    assert matmul_tflops(32, torch.float32, device="cpu", repeats=2) > 0
    with pytest.raises(ValueError, match="n must be >= 1"):
        matmul_tflops(0, torch.float32, device="cpu")
    with pytest.raises(TypeError, match="n must be an int"):
        matmul_tflops(8.0, torch.float32, device="cpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        matmul_tflops(8, torch.float32, device="cpu", repeats=0)
    with pytest.raises(TypeError, match="floating-point"):
        matmul_tflops(8, torch.int64, device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            matmul_tflops(8, torch.float32)
