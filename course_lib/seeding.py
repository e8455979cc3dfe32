"""Seeding, and determinism as an explicit opt-in: one call that makes a notebook print the same numbers twice."""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from .validation import check_bool, check_int

__all__ = ["seed_everything"]


def seed_everything(seed: int = 0, *, deterministic: bool = False) -> int:
    """Seed Python's, NumPy's and PyTorch's random generators (CPU and every GPU).

    Seeding is all it does by default: the course's CPU notebooks repeat their numbers with seeds
    alone. ``deterministic=True`` is the explicit opt-in to deterministic kernels, a global switch
    with a cost: it calls ``torch.use_deterministic_algorithms(True, warn_only=True)``, turns off
    the cuDNN autotuner and sets ``CUBLAS_WORKSPACE_CONFIG`` so that CUDA matmuls are reproducible;
    on a GPU every later timing then measures the (often slower) deterministic kernels. Notebook 00
    says when to ask for it.

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
