"""Seeding and determinism: one call that makes a notebook print the same numbers twice."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from .validation import check_bool, check_int

__all__ = ["seed_everything"]


def seed_everything(seed: int = 0, *, deterministic: bool = True) -> int:
    """Seed Python's, NumPy's and PyTorch's random generators (CPU and every GPU).

    With ``deterministic=True`` it also asks PyTorch for deterministic kernels
    (``torch.use_deterministic_algorithms(True, warn_only=True)``), turns off the cuDNN
    autotuner and sets ``CUBLAS_WORKSPACE_CONFIG`` so that CUDA matmuls are reproducible.

    Returns the seed, so a cell can print what it used.

    >>> seed_everything(1234)
    1234
    """
    check_int("seed", seed)
    if not 0 <= seed < 2**32:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    check_bool("deterministic", deterministic)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    return seed
