from __future__ import annotations

import math

from checks import assert_check
from course_lib.exercises.ddp import check_global_rank, check_shard_indices, check_sync_schedule


def test_global_rank() -> None:
    def blank(node: int, local: int, per_node: int) -> int:
        raise NotImplementedError

    assert_check(
        check_global_rank,
        right=[lambda node, local, per_node: node * per_node + local],
        not_done=[..., blank],
        wrong=[
            (lambda node, local, per_node: local, "not the local rank"),  # seed 002's rank = gpu
            (lambda node, local, per_node: node + local, "expected"),
            (lambda node, local, per_node: float(node * per_node + local), "int"),
        ],
    )


def test_shard_indices() -> None:
    def shard(n: int, world: int, rank: int) -> list[int]:
        per = math.ceil(n / world)
        idx = list(range(n))
        idx += (idx * math.ceil(per * world / n))[: per * world - n]
        return idx[rank::world]

    assert_check(
        check_shard_indices,
        right=[shard],
        not_done=[...],
        wrong=[
            (lambda n, world, rank: list(range(n))[rank::world], "padded"),  # no padding
            (lambda n, world, rank: list(range(rank * (n // world), (rank + 1) * (n // world))), ""),
            (lambda n, world, rank: "abc", "list of ints"),
            # right whenever there are at least as many samples as ranks, empty for the ranks beyond them
            (lambda n, world, rank: [] if rank >= n else shard(n, world, rank), "never gets an empty shard"),
        ],
    )


def test_sync_schedule() -> None:
    assert_check(
        check_sync_schedule,
        right=[lambda n, k: [(i + 1) % k == 0 or i == n - 1 for i in range(n)]],
        not_done=[...],
        wrong=[
            (lambda n, k: [(i + 1) % k == 0 for i in range(n)], "last one"),  # forgets the last group
            (lambda n, k: [True] * n, ""),
            (lambda n, k: [True], "list of"),
        ],
    )
