"""Device selection and the one guard every GPU-only cell uses."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

import torch

from .validation import check_int

__all__ = [
    "MIN_TORCH",
    "require_torch",
    "backend_for",
    "best_device",
    "course_device",
    "course_ranks",
    "gpu_available",
    "gpu_count",
    "gpus_simulated",
    "requires_gpu",
    "environment_report",
    "EnvironmentReport",
]

SIMULATED_GPUS_VAR = "COURSE_SIMULATED_GPUS"

# The oldest PyTorch the notebooks run on: the version CI tests (requirements.lock). They use APIs of
# 2.9-2.13 (dist.reduce_scatter_single/all_gather_single, DDP's forward_sync_buffers, fp32_precision,
# ScheduleDualPipeV); tests/test_project.py keeps pyproject.toml, environment.yml and README in step.
MIN_TORCH = "2.13"


def require_torch(version: str | None = None) -> str:
    """Check that ``version`` (default: the installed PyTorch) is at least :data:`MIN_TORCH`; return it.

    >>> require_torch("2.13.0+cpu")
    '2.13.0+cpu'
    """
    from packaging.version import Version

    version = torch.__version__ if version is None else version
    if not isinstance(version, str):
        raise TypeError(f"version must be a string such as '2.13.0', got {type(version).__name__}")
    if Version(version.split("+")[0]) < Version(MIN_TORCH):
        raise RuntimeError(
            f"this course needs PyTorch >= {MIN_TORCH} (its notebooks use APIs new in 2.9-2.13), found {version}: "
            "install the pinned versions with `make lab` or `pip install -r requirements.lock`"
        )
    return version


def gpus_simulated() -> bool:
    """True when the GPUs this process sees are simulated (``make test-gpu-visible``).

    The simulation (``tests/gpu_visible/sitecustomize.py``) makes a CPU-only PyTorch *report*
    CUDA devices, so that code which picks CUDA by itself is caught; nothing can run on them.
    """
    value = os.environ.get(SIMULATED_GPUS_VAR, "")
    return value.isdigit() and int(value) > 0


def gpu_count() -> int:
    """How many CUDA GPUs this process can really use: 0 without CUDA, and 0 when they are simulated."""
    if gpus_simulated() or not torch.cuda.is_available():
        return 0
    return torch.cuda.device_count()


def gpu_available(min_count: int = 1) -> bool:
    """True when at least ``min_count`` CUDA GPUs are usable (simulated ones do not count)."""
    check_int("min_count", min_count, minimum=1)
    return gpu_count() >= min_count


def best_device() -> torch.device:
    """``cuda`` when a usable GPU is present, else ``cpu``: for a learner's own code and GPU cells.

    The course's own unguarded cells never call it (they must print the same on every machine);
    its scripts take their device from :func:`course_device`.
    """
    return torch.device("cuda" if gpu_available() else "cpu")


def requires_gpu(what: str, *, count: int = 1, capability: tuple[int, int] | None = None) -> bool:
    """The guard for GPU-only cells.

    Use it as ``if requires_gpu("tensor-core matmul throughput"): ...``. On a machine with
    ``count`` GPUs it returns True and the cell runs; otherwise it prints one line saying
    what was skipped and why, and returns False, so the notebook still runs top to bottom.
    ``capability=(8, 0)`` also asks that each of those GPUs have at least that CUDA compute capability
    (8.0: Ampere, what FlashAttention's kernels and fast bf16 need); an older GPU (a T4 is 7.5, a V100 7.0)
    is skipped with a line that names it.
    """
    if not isinstance(what, str) or not what.strip():
        raise ValueError("what must be a non-empty string describing the skipped demonstration")
    check_int("count", count, minimum=1)
    if capability is not None and (
        not isinstance(capability, tuple)
        or len(capability) != 2
        or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in capability)
    ):
        raise ValueError(f"capability must be (major, minor), such as (8, 0), got {capability!r}")
    if not gpu_available(count):
        have = gpu_count()
        need = "a CUDA GPU" if count == 1 else f"{count} CUDA GPUs"
        print(f"[GPU cell skipped] {what}: needs {need}, this machine has {have}.")
        return False
    if capability is not None:
        for i in range(count):
            got = tuple(torch.cuda.get_device_capability(i))
            if got < capability:
                print(
                    f"[GPU cell skipped] {what}: needs compute capability {capability[0]}.{capability[1]} or newer, "
                    f"GPU {i} ({torch.cuda.get_device_name(i)}) has {got[0]}.{got[1]}."
                )
                return False
    return True


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

    gpus = tuple(torch.cuda.get_device_name(i) for i in range(gpu_count()))
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


DEVICE_VAR = "COURSE_DEVICE"
_DEVICES = ("cpu", "cuda")


def course_device() -> str:
    """Where the course's training scripts run: ``"cpu"``, unless ``COURSE_DEVICE=cuda`` opts in.

    The one switch for the GPU path (notebook 00 and README name it): with ``COURSE_DEVICE=cuda``
    the distributed notebooks launch their scripts with ``--device cuda --backend nccl``, one GPU
    per rank. Without it everything runs on the CPU, also on a machine with GPUs, and prints what
    the committed notebooks show. Asking for ``cuda`` without a usable GPU is an error, not a
    silent fallback.

    >>> import os
    >>> os.environ.pop("COURSE_DEVICE", None) and None
    >>> course_device()
    'cpu'
    """
    value = os.environ.get(DEVICE_VAR, "cpu").strip().lower() or "cpu"
    if value not in _DEVICES:
        raise ValueError(f"{DEVICE_VAR} must be one of {_DEVICES}, got {os.environ[DEVICE_VAR]!r}")
    if value == "cuda" and not gpu_available():
        raise ValueError(
            f"{DEVICE_VAR}=cuda asks for the GPU path, but this machine has no usable CUDA GPU"
            f" ({'they are simulated' if gpus_simulated() else 'none visible'}): unset it to run on the CPU"
        )
    return value


def course_ranks(wanted: int) -> int:
    """How many processes a job that wants ``wanted`` ranks gets on :func:`course_device`.

    On the CPU, ``wanted``. On the GPU path, one process per GPU, at most ``wanted``: a 1-GPU
    machine runs the job as one process (NCCL refuses two ranks on one GPU).
    """
    check_int("wanted", wanted, minimum=1)
    return wanted if course_device() == "cpu" else min(wanted, gpu_count())


def backend_for(device: str) -> str:
    """The process-group backend for ``device``: ``"gloo"`` for ``"cpu"``, ``"nccl"`` for ``"cuda"``.

    >>> backend_for("cpu"), backend_for("cuda")
    ('gloo', 'nccl')
    """
    if device not in _DEVICES:
        raise ValueError(f"device must be one of {_DEVICES}, got {device!r}")
    return "gloo" if device == "cpu" else "nccl"
