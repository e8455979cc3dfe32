"""A worker for tests/test_collectives_timing.py: course_lib's ring against dist.all_reduce, on one rank."""

from __future__ import annotations

import torch
import torch.distributed as dist

from course_lib.collectives import ring_all_reduce


def ring_vs_all_reduce(rank: int, world_size: int, sizes: list[int]) -> list[tuple[int, int, bool, bool]]:
    rows = []
    for numel in sizes:
        x = torch.randn(numel, generator=torch.Generator().manual_seed(100 + rank))
        mine, reference = x.clone(), x.clone()
        sent = ring_all_reduce(mine)
        dist.all_reduce(reference)
        ints = torch.arange(numel, dtype=torch.float32) * (rank + 1)  # integers: exact in any order
        ints_ref = ints.clone()
        ring_all_reduce(ints)
        dist.all_reduce(ints_ref)
        rows.append((numel, sent, torch.allclose(mine, reference, rtol=1e-5, atol=1e-6), torch.equal(ints, ints_ref)))
    return rows
