"""DDP's bucket rule: which gradients go into which all-reduce, and the caps DDP uses.

:func:`bucket_assignment` groups tensors, in the order their gradients become ready, into buckets closed once they
reach a cap (DDP's rule, its 1 MiB first bucket included); :func:`ddp_bucket_caps` turns ``bucket_cap_mb`` into the
caps DDP applies. :class:`~course_lib.hand_ddp.HandDDP` buckets its gradients with them; the tests check the rule
against ``torch.distributed``'s own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .validation import check_int, check_number

__all__ = ["DEFAULT_BUCKET_CAP_MB", "FIRST_BUCKET_BYTES", "bucket_assignment", "ddp_bucket_caps"]

MiB = 2**20
DEFAULT_BUCKET_CAP_MB = 25.0
FIRST_BUCKET_BYTES = MiB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


def bucket_assignment(
    sizes: Sequence[int],
    cap_bytes: int,
    first_cap_bytes: int | None = None,
    keys: Sequence[Any] | None = None,
) -> list[list[int]]:
    """Split tensors into buckets by DDP's rule; return the buckets as lists of indices into ``sizes``.

    ``sizes``: the bytes of each gradient, in the order the gradients become ready (for DDP,
    reverse registration order). Tensors go into a bucket **whole**, and a bucket is closed as soon
    as its size **reaches** its cap, so it can exceed the cap by up to one tensor. The first bucket
    closed has cap ``first_cap_bytes`` (default: ``cap_bytes``), the others ``cap_bytes``. With
    ``keys`` (e.g. the dtypes) each key fills buckets of its own, with its own first cap; the
    buckets are then ordered by their first tensor, as ``torch.distributed._compute_bucket_assignment_by_size``
    does (the tests check that they agree). A cap of 0 gives one bucket per tensor.

    >>> bucket_assignment([40, 40, 40, 40, 40], cap_bytes=100)
    [[0, 1, 2], [3, 4]]
    >>> bucket_assignment([40, 40, 40, 40, 40], cap_bytes=100, first_cap_bytes=50)
    [[0, 1], [2, 3, 4]]
    >>> bucket_assignment([10, 300, 10], cap_bytes=100)       # a big tensor joins the open bucket
    [[0, 1], [2]]
    >>> bucket_assignment([8, 8, 8], cap_bytes=0)
    [[0], [1], [2]]
    """
    if isinstance(sizes, (str, bytes)) or not isinstance(sizes, Sequence):
        raise TypeError(f"sizes must be a sequence of ints (bytes), got {type(sizes).__name__}")
    sizes = [check_int("each size", s, minimum=0) for s in sizes]
    cap = check_int("cap_bytes", cap_bytes, minimum=0)
    first = cap if first_cap_bytes is None else check_int("first_cap_bytes", first_cap_bytes, minimum=0)
    if keys is None:
        keys = [None] * len(sizes)
    elif isinstance(keys, (str, bytes)) or not isinstance(keys, Sequence) or len(keys) != len(sizes):
        raise ValueError("keys must be a sequence with one key per size")
    open_buckets: dict[Any, tuple[list[int], int]] = {}
    closed_count: dict[Any, int] = {}
    result: list[list[int]] = []
    for i, (nbytes, key) in enumerate(zip(sizes, keys)):
        indices, total = open_buckets.get(key, ([], 0))
        indices.append(i)
        total += nbytes
        limit = first if closed_count.get(key, 0) == 0 else cap
        if total >= limit:
            result.append(indices)
            open_buckets[key] = ([], 0)
            closed_count[key] = closed_count.get(key, 0) + 1
        else:
            open_buckets[key] = (indices, total)
    result += [indices for indices, _ in open_buckets.values() if indices]
    return sorted(result, key=min)


def ddp_bucket_caps(bucket_cap_mb: float | None) -> tuple[int, int]:
    """``(cap_bytes, first_cap_bytes)`` that DDP uses for a ``bucket_cap_mb`` argument.

    Left at the default (``None``: 25 MiB) the first bucket is capped at 1 MiB so that the last
    layers' gradients, ready first, leave early; a cap given explicitly applies to every bucket.

    >>> ddp_bucket_caps(None), ddp_bucket_caps(0.5)
    ((26214400, 1048576), (524288, 524288))
    """
    if bucket_cap_mb is None:
        return int(DEFAULT_BUCKET_CAP_MB * MiB), FIRST_BUCKET_BYTES
    mb = check_number("bucket_cap_mb", bucket_cap_mb, finite=True, what="a number (MiB) or None")
    if mb < 0:
        raise ValueError(f"bucket_cap_mb must be >= 0, got {bucket_cap_mb}")
    cap = int(mb * MiB)
    return cap, cap
