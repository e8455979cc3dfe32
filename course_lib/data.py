"""Small real datasets that ship with installed packages: no downloads, ever.

The course trains on scikit-learn's handwritten digits (1,797 greyscale 8x8 images, 10 classes),
which are inside the scikit-learn wheel. :func:`digits` returns them as tensors with a fixed,
seeded train/test split, so every notebook and every process sees the same data.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from .validation import check_int, check_number

__all__ = ["Split", "digits", "digits_datasets"]


@dataclass(frozen=True)
class Split:
    """Images ``x`` (float32, ``N x 1 x 8 x 8``, scaled to mean 0 / std 1) and labels ``y`` (int64)."""

    x: torch.Tensor
    y: torch.Tensor

    def __len__(self) -> int:
        return len(self.y)

    def flat(self) -> torch.Tensor:
        """The images as ``N x 64`` vectors, for MLPs."""
        return self.x.reshape(len(self.y), -1)


@lru_cache(maxsize=4)
def _load(test_fraction: float, seed: int) -> tuple[Split, Split]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.tensor(bunch.images, dtype=torch.float32).unsqueeze(1)  # N x 1 x 8 x 8, values 0..16
    y = torch.tensor(bunch.target, dtype=torch.int64)
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(y), generator=g)
    n_test = int(round(len(y) * test_fraction))
    test_idx, train_idx = order[:n_test], order[n_test:]
    mean, std = x[train_idx].mean(), x[train_idx].std()  # statistics of the training split only
    x = (x - mean) / std
    return Split(x[train_idx].contiguous(), y[train_idx].contiguous()), Split(
        x[test_idx].contiguous(), y[test_idx].contiguous()
    )


def digits(test_fraction: float = 0.2, seed: int = 0) -> tuple[Split, Split]:
    """The digits dataset as ``(train, test)`` splits, identical on every call with the same arguments.

    >>> train, test = digits()
    >>> len(train), len(test), tuple(train.x.shape[1:])
    (1438, 359, (1, 8, 8))
    """
    check_number("test_fraction", test_fraction)
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be strictly between 0 and 1, got {test_fraction}")
    check_int("seed", seed, minimum=0)
    train, test = _load(float(test_fraction), seed)
    # Return fresh tensors so that a caller modifying them in place cannot corrupt the cache.
    return Split(train.x.clone(), train.y.clone()), Split(test.x.clone(), test.y.clone())


def digits_datasets(
    test_fraction: float = 0.2, seed: int = 0
) -> tuple[torch.utils.data.TensorDataset, torch.utils.data.TensorDataset]:
    """:func:`digits` wrapped as ``TensorDataset``s, ready for a ``DataLoader`` or a ``DistributedSampler``."""
    train, test = digits(test_fraction, seed)
    return torch.utils.data.TensorDataset(train.x, train.y), torch.utils.data.TensorDataset(test.x, test.y)
