"""Device selection and the one guard every GPU-only cell uses."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

import torch

from .validation import check_int

__all__ = ["best_device", "gpu_available", "requires_gpu", "environment_report", "EnvironmentReport"]


def gpu_available(min_count: int = 1) -> bool:
    """True when at least ``min_count`` CUDA devices are visible."""
    check_int("min_count", min_count, minimum=1)
    return torch.cuda.is_available() and torch.cuda.device_count() >= min_count


def best_device() -> torch.device:
    """``cuda`` when a GPU is visible, else ``cpu``. (The course never needs more.)"""
    return torch.device("cuda" if gpu_available() else "cpu")


def requires_gpu(what: str, *, count: int = 1) -> bool:
    """The guard for GPU-only cells.

    Use it as ``if requires_gpu("tensor-core matmul throughput"): ...``. On a machine with
    ``count`` GPUs it returns True and the cell runs; otherwise it prints one line saying
    what was skipped and why, and returns False, so the notebook still runs top to bottom.
    """
    if not isinstance(what, str) or not what.strip():
        raise ValueError("what must be a non-empty string describing the skipped demonstration")
    if gpu_available(count):
        return True
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    need = "a CUDA GPU" if count == 1 else f"{count} CUDA GPUs"
    print(f"[GPU cell skipped] {what}: needs {need}, this machine has {have}.")
    return False


@dataclass(frozen=True)
class EnvironmentReport:
    """What the environment check of notebook 00 prints."""

    python: str
    torch: str
    cpu_cores: int
    cpu_kernels: str
    torch_threads: int
    cuda_devices: tuple[str, ...]
    distributed: bool
    gloo: bool

    def lines(self) -> list[str]:
        gpus = ", ".join(self.cuda_devices) if self.cuda_devices else "none (GPU cells will be skipped)"
        return [
            f"Python           : {self.python}",
            f"PyTorch          : {self.torch}",
            f"CPU cores        : {self.cpu_cores}",
            f"CPU kernels      : {self.cpu_kernels} (what PyTorch dispatches to on this CPU)",
            f"torch threads    : {self.torch_threads}",
            f"CUDA GPUs        : {gpus}",
            f"torch.distributed: {'available' if self.distributed else 'missing'}"
            f" (gloo backend {'available' if self.gloo else 'missing'})",
        ]


def environment_report() -> EnvironmentReport:
    """Collect the facts about this machine that the course depends on."""
    import torch.distributed as dist

    gpus: tuple[str, ...] = ()
    if torch.cuda.is_available():
        gpus = tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    available = dist.is_available()
    return EnvironmentReport(
        python=platform.python_version(),
        torch=torch.__version__,
        cpu_cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
        cpu_kernels=torch.backends.cpu.get_cpu_capability(),
        torch_threads=torch.get_num_threads(),
        cuda_devices=gpus,
        distributed=available,
        gloo=bool(available and dist.is_gloo_available()),
    )
