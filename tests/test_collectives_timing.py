"""course_lib.collectives (the real ring) and course_lib.timing (matmul throughput)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from course_lib.allreduce_sim import ring_all_reduce as simulated_ring
from course_lib.collectives import parameter_server_all_reduce, ring_all_reduce, tree_all_reduce
from course_lib.launch import run_ranks
from course_lib.manifest import written_file
from course_lib.timing import matmul_tflops


@pytest.mark.slow  # launches a process tree
def test_ring_all_reduce_equals_dist_all_reduce_and_notebook_07s_ring(tmp_path: Path) -> None:
    """Notebook 09's worker (its _runs/ring.py, read from the text source) runs its hand-written ring,
    dist.all_reduce and course_lib's copy on every rank; all three must agree, bytes sent included."""
    worker = tmp_path / "ring.py"
    worker.write_text(written_file("09_data_parallel_and_all_reduce", "_runs/ring.py"))
    rows = run_ranks(f"{worker}:check", nprocs=3, args=([3, 10, 1000],), timeout=90, echo="none")
    for rank, rank_rows in enumerate(rows):
        for row in rank_rows:
            assert row["close"] and row["exact"] and row["library"], (rank, row)
            assert row["sent"] == simulated_ring([torch.zeros(row["numel"]) for _ in range(3)]).sent_bytes[rank]


_TREE_PS_WORKER = """
import torch
import torch.distributed as dist
from course_lib.collectives import parameter_server_all_reduce, tree_all_reduce


def check(rank, world_size):
    rows = []
    for fn in (tree_all_reduce, parameter_server_all_reduce):
        x = torch.arange(10, dtype=torch.float32) * (rank + 1)   # integers: exact in any order
        reference = x.clone()
        dist.all_reduce(reference)
        sent = fn(x)
        rows.append((fn.__name__, bool(torch.equal(x, reference)), sent))
    return rows
"""


@pytest.mark.slow  # launches a process tree
def test_tree_and_parameter_server_equal_dist_all_reduce(tmp_path: Path) -> None:
    worker = tmp_path / "tree_ps.py"
    worker.write_text(_TREE_PS_WORKER)
    n = 3
    rows = run_ranks(f"{worker}:check", nprocs=n, timeout=90, echo="none")
    for rank, rank_rows in enumerate(rows):
        (tree_name, tree_equal, tree_sent), (ps_name, ps_equal, ps_sent) = rank_rows
        assert tree_equal and ps_equal, (rank, rank_rows)
        assert ps_sent == (40 * (n - 1) if rank == 0 else 40)
        # binomial tree over 3 ranks: 1 and 2 each send once to reduce onto 0; 0 sends the sum back to both
        assert tree_sent == {0: 80, 1: 40, 2: 40}[rank]


def test_ring_all_reduce_refuses_what_it_cannot_do() -> None:
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        ring_all_reduce([1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="needs a process group"):
        ring_all_reduce(torch.zeros(4))
    for fn in (tree_all_reduce, parameter_server_all_reduce):
        with pytest.raises(RuntimeError, match="needs a process group"):
            fn(torch.zeros(4))
        with pytest.raises(TypeError, match="must be a torch.Tensor"):
            fn([1.0])  # type: ignore[arg-type]


def test_matmul_tflops_on_cpu_and_its_checks() -> None:
    assert matmul_tflops(32, torch.float32, device="cpu", repeats=2) > 0
    with pytest.raises(ValueError, match=r"n must be in \[1, 32768\]"):
        matmul_tflops(0, torch.float32, device="cpu")
    with pytest.raises(TypeError, match="n must be an int"):
        matmul_tflops(8.0, torch.float32, device="cpu")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"repeats must be in \[1, 10000\]"):
        matmul_tflops(8, torch.float32, device="cpu", repeats=0)
    with pytest.raises(TypeError, match="floating-point"):
        matmul_tflops(8, torch.int64, device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
            matmul_tflops(8, torch.float32)
    with pytest.raises(TypeError, match="tf32 must be a bool"):
        matmul_tflops(8, torch.float32, device="cpu", tf32=1)  # type: ignore[arg-type]


def test_matmul_tflops_switches_tf32_with_the_fp32_precision_api_and_restores_it() -> None:
    matmul = torch.backends.cuda.matmul
    before = (matmul.fp32_precision, torch.get_float32_matmul_precision())
    seen = []
    original = torch.Tensor.__matmul__

    def spy(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        seen.append(matmul.fp32_precision)
        return original(a, b)

    try:
        torch.Tensor.__matmul__ = spy  # type: ignore[method-assign]
        for tf32, want in ((True, "tf32"), (False, "ieee")):
            seen.clear()
            matmul_tflops(8, torch.float32, device="cpu", tf32=tf32, repeats=2)
            assert seen and set(seen) == {want}
            # restored, and the legacy and new APIs were not mixed (PyTorch would refuse to report the precision)
            assert (matmul.fp32_precision, torch.get_float32_matmul_precision()) == before
    finally:
        torch.Tensor.__matmul__ = original  # type: ignore[method-assign]
