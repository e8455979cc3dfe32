"""Make a CPU-only PyTorch report CUDA GPUs, to test the course on "a machine with a GPU" without one.

Put this folder first on ``PYTHONPATH`` and set ``COURSE_SIMULATED_GPUS=N`` (``make
test-gpu-visible`` does both): every Python process started with that environment (pytest, the
notebook kernels, the ranks a cell launches) then sees ``N`` CUDA devices through the calls code
uses to *choose* a device, exactly as on a GPU workstation:

* ``torch.cuda.is_available()``, ``torch.cuda.device_count()``, ``torch.cuda.get_device_name()``;
* ``torch.accelerator.is_available()``, ``device_count()``, ``current_accelerator()``;
* ``torch._C._get_accelerator()``, which ``init_process_group()`` without a backend, FSDP2's default
  mesh and ``dist.barrier`` consult.

``CUDA_VISIBLE_DEVICES`` is honoured as CUDA honours it (``""`` hides every device, ``"0"`` leaves
one), so a process that hides the GPUs from its children sees them hidden there too. Nothing can
*run* on the simulated devices: a CUDA tensor still fails with "Torch not compiled with CUDA
enabled". So code that silently picks CUDA when it sees a GPU fails loudly here, as it would have
misbehaved on a real GPU machine, while guarded GPU cells still skip: ``course_lib.device`` reads
``COURSE_SIMULATED_GPUS`` and knows the devices are not real.

PyTorch's own bookkeeping is told the truth. Where a GPU exists, some internals do extra work for it
on their own (Dynamo saves the CUDA RNG state around a compile, optimizers ask the current CUDA
stream whether a graph is being captured, ``save_on_cpu`` pins its buffers); on a real GPU machine
that work succeeds, here it would fail for want of CUDA and hide what the test is for. So callers in
the packages of :data:`_TOLD_THE_TRUTH` see the real answer (no GPU); every other caller (the
course's code, the notebooks, and the parts of PyTorch that choose a device *for* the user, such as
``DataParallel``, ``init_process_group()`` and FSDP2's default mesh) sees the simulated GPUs.

The patch is applied when ``torch`` is first imported (an import hook), so processes that never
import torch pay nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys

_VAR = "COURSE_SIMULATED_GPUS"

# Callers whose GPU checks are PyTorch's own bookkeeping (see the module docstring).
_TOLD_THE_TRUTH = (
    "torch._dynamo",
    "torch._inductor",
    "torch._functorch",
    "torch.optim",
    "torch.autograd",
    "torch.random",
    "torch.testing",
    "torch.utils.checkpoint",
    "torch.cuda",
    "torch.accelerator",
)


def _simulated_for_caller(depth: int = 2) -> bool:
    """False when the function that called the patched one belongs to PyTorch's bookkeeping."""
    caller = sys._getframe(depth).f_globals.get("__name__", "")
    return not any(caller == p or caller.startswith(p + ".") for p in _TOLD_THE_TRUTH)


def _visible(total: int) -> int:
    """How many of ``total`` devices CUDA would show under ``CUDA_VISIBLE_DEVICES``."""
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return total
    count = 0
    for item in spec.split(","):
        item = item.strip()
        if not item.isdigit() or int(item) >= total:
            break  # CUDA stops at the first invalid entry
        count += 1
    return count


def _patch(torch) -> None:  # type: ignore[no-untyped-def]
    total = int(os.environ[_VAR])
    cuda = torch.device("cuda")
    cpu = torch.device("cpu")

    def count() -> int:
        return _visible(total) if _simulated_for_caller(3) else 0

    def device_count() -> int:
        return count()

    def is_available() -> bool:
        return count() > 0

    def get_device_name(device=None) -> str:  # type: ignore[no-untyped-def]
        return "Simulated GPU (CPU-only torch)"

    def get_accelerator(*_args) -> object:  # type: ignore[no-untyped-def]
        return cuda if count() > 0 else cpu

    def current_accelerator(check_available: bool = False) -> object:
        return cuda if count() > 0 else None

    def get_accelerator_or_none() -> object:
        return cuda if count() > 0 else None

    torch.cuda.is_available = is_available
    torch.cuda.device_count = device_count
    torch.cuda.get_device_name = get_device_name
    torch.accelerator.is_available = is_available
    torch.accelerator.device_count = device_count
    torch.accelerator.current_accelerator = current_accelerator
    torch._C._get_accelerator = get_accelerator
    torch._C._accelerator_getAccelerator = get_accelerator_or_none


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != "torch":
            return None
        sys.meta_path.remove(self)  # once: find torch the ordinary way, then wrap its loader
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if os.environ.get(_VAR, "").isdigit() and int(os.environ[_VAR]) > 0 and "torch" not in sys.modules:
    sys.meta_path.insert(0, _Finder())
