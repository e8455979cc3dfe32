"""Checks for notebook 11 (DDP in practice)."""

from __future__ import annotations

from typing import Any

from torch.utils.data import DistributedSampler

from ..validation import is_int
from .core import Wrong, call_learner, exercise

__all__ = ["check_global_rank", "check_shard_indices", "check_sync_schedule"]


@exercise(
    "global rank",
    todo="write global_rank(node_rank, local_rank, nproc_per_node) returning the process's rank in the world",
)
def check_global_rank(global_rank: Any) -> str:
    for nodes, per_node in [(1, 2), (2, 1), (2, 4), (3, 8)]:
        seen = set()
        for node in range(nodes):
            for local in range(per_node):
                got = call_learner(global_rank, node, local, per_node)
                if not is_int(got):
                    raise Wrong(f"global_rank should return an int, got {type(got).__name__}")
                want = node * per_node + local
                if got != want:
                    hint = " (the rank is not the local rank once there are several nodes)" if got == local else ""
                    raise Wrong(
                        f"node {node}, local rank {local}, {per_node} per node: got {got}, expected {want}{hint}"
                    )
                seen.add(got)
        assert seen == set(range(nodes * per_node))
    return "node_rank * nproc_per_node + local_rank: every process gets a distinct rank 0..world_size-1"


@exercise(
    "shard indices",
    todo="write shard(n, world_size, rank) returning the indices DistributedSampler(shuffle=False) gives that rank",
)
def check_shard_indices(shard: Any) -> str:
    for n, world in [(10, 2), (10, 3), (7, 4), (3, 4), (2, 5), (1, 3), (12, 3)]:
        for rank in range(world):
            dataset: Any = range(n)  # the sampler needs only len() of its dataset: a range will do
            want: list[int] = list(DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=False))
            got = call_learner(shard, n, world, rank)
            try:
                got = [int(i) for i in got]
            except (TypeError, ValueError):
                raise Wrong(f"shard should return a list of ints, got {got!r}") from None
            if got != want:
                hint = ""
                if not got:
                    hint = (
                        " - a rank never gets an empty shard: with fewer samples than ranks, the padding "
                        "repeats samples so that every rank still runs the same number of steps"
                    )
                elif len(got) != len(want):
                    hint = (
                        f" - each rank gets ceil(n / world_size) = {len(want)} indices; "
                        "the short ones are padded by repeating from the start"
                    )
                raise Wrong(f"n={n}, world_size={world}, rank={rank}: got {got}, expected {want}{hint}")
    return "pad to a multiple of world_size by repeating from the start, then take every world_size-th index from rank"


@exercise(
    "no_sync schedule",
    todo="write syncs(n_micro, k) returning, for each micro-batch, True when its backward must all-reduce",
)
def check_sync_schedule(syncs: Any) -> str:
    for n, k in [(8, 4), (6, 3), (5, 2), (4, 1), (3, 5)]:
        want = [(i + 1) % k == 0 or i == n - 1 for i in range(n)]
        got = call_learner(syncs, n, k)
        if not isinstance(got, (list, tuple)) or len(got) != n:
            raise Wrong(f"syncs({n}, {k}) should return a list of {n} booleans")
        got = [bool(g) for g in got]
        if got != want:
            raise Wrong(
                f"syncs({n}, {k}) = {got}, expected {want}: sync on the k-th micro-batch of each group "
                "(and on the last one, so no gradient is left unsynchronised)"
            )
    return "only the backward before optimizer.step() all-reduces; the others run inside no_sync()"
