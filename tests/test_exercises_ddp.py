from __future__ import annotations

import math

from course_lib.exercises.ddp import check_global_rank, check_shard_indices, check_sync_schedule


def test_global_rank() -> None:
    assert check_global_rank(lambda node, local, per_node: node * per_node + local)
    assert check_global_rank(...).status == "not done yet"
    r = check_global_rank(lambda node, local, per_node: local)  # seed 002's rank = gpu
    assert r.status == "wrong" and "not the local rank" in r.message
    r = check_global_rank(lambda node, local, per_node: node + local)
    assert r.status == "wrong" and "expected" in r.message
    r = check_global_rank(lambda node, local, per_node: float(node * per_node + local))
    assert r.status == "wrong" and "int" in r.message

    def blank(node: int, local: int, per_node: int) -> int:
        raise NotImplementedError

    assert check_global_rank(blank).status == "not done yet"


def test_shard_indices() -> None:
    def shard(n: int, world: int, rank: int) -> list[int]:
        per = math.ceil(n / world)
        idx = list(range(n))
        idx += (idx * math.ceil(per * world / n))[: per * world - n]
        return idx[rank::world]

    assert check_shard_indices(shard)
    assert check_shard_indices(...).status == "not done yet"
    r = check_shard_indices(lambda n, world, rank: list(range(n))[rank::world])  # no padding
    assert r.status == "wrong" and "padded" in r.message
    r = check_shard_indices(lambda n, world, rank: list(range(rank * (n // world), (rank + 1) * (n // world))))
    assert r.status == "wrong"
    r = check_shard_indices(lambda n, world, rank: "abc")
    assert r.status == "wrong" and "list of ints" in r.message


def test_sync_schedule() -> None:
    assert check_sync_schedule(lambda n, k: [(i + 1) % k == 0 or i == n - 1 for i in range(n)])
    assert check_sync_schedule(...).status == "not done yet"
    r = check_sync_schedule(lambda n, k: [(i + 1) % k == 0 for i in range(n)])  # forgets the last group
    assert r.status == "wrong" and "last one" in r.message
    r = check_sync_schedule(lambda n, k: [True] * n)
    assert r.status == "wrong"
    r = check_sync_schedule(lambda n, k: [True])
    assert r.status == "wrong" and "list of" in r.message
