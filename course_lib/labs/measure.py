"""Small measurements the labs' checks share: bytes held by tensors, and the largest difference between two runs."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["largest_difference", "storage_bytes"]


def storage_bytes(tensors: Iterable[Any]) -> int:
    """Bytes of the distinct storages behind the tensors among ``tensors`` (0 for a freed one; others skipped)."""
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() and t.untyped_storage().data_ptr() not in seen:
            seen.add(t.untyped_storage().data_ptr())
            total += t.untyped_storage().nbytes()
    return total


def largest_difference(got: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> tuple[float, str]:
    """The largest absolute difference between two sets of named tensors, and the name where it is."""
    if not isinstance(got, dict) or not isinstance(expected, dict) or not expected:
        raise TypeError("got and expected must be dicts of named tensors, expected non-empty")
    if set(got) != set(expected):
        return float("inf"), f"names {sorted(set(got) ^ set(expected))}"
    diffs = {n: (got[n].double() - expected[n].double()).abs().max().item() for n in expected}
    name = max(diffs, key=lambda n: diffs[n])
    return diffs[name], name
