"""A pytest plugin: nbval's kernels talk over Unix sockets in a folder of their own, not over TCP ports.

nbval starts each notebook's kernel with jupyter_client's defaults: TCP on 127.0.0.1, with five ports that
jupyter_client finds free by binding and releasing them, and that the kernel binds again a moment later. In
between, any other process on the machine may take one: the other xdist worker's kernel, a gloo rank or a
TCPStore that a notebook launches, JupyterLab in the browser tests beside it. The kernel then exits at once
(ZMQError: Address already in use) and nbval reports every cell of that notebook as "Kernel died before
replying to kernel_info" (CI's extra pass, notebook 03, once in many runs).

Here every kernel gets `transport="ipc"` with its sockets in a fresh private folder, so no name can be taken by
anyone else. A kernel that still dies while starting is started again (twice at most), and the kernel's own
stderr is kept, so that a kernel that cannot start says why (in a warning, and in the error of the last try).

Loaded for every pytest run of the repository by `-p course_tools.nbval_kernels` (pyproject's addopts).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

ATTEMPTS = 3
_STDERR_TAIL = 4000

_folder: Path | None = None


def _sockets_folder() -> Path:
    """This process's folder for kernel sockets (a short path: a Unix socket's name is at most 107 bytes)."""
    global _folder
    if _folder is None:
        _folder = Path(tempfile.mkdtemp(prefix="nbk", dir="/tmp" if os.path.isdir("/tmp") else None))
    return _folder


def _tail(path: Path) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return text[-_STDERR_TAIL:]


def start_new_kernel(startup_timeout: float = 60, kernel_name: str = "python", **kwargs: Any):  # noqa: ANN201
    """nbval.kernel.start_new_kernel over Unix sockets, started again if the kernel dies while starting."""
    from jupyter_client.manager import KernelManager
    from nbval.kernel import NbvalKernelspecManager

    given_stderr = kwargs.pop("stderr", None)
    if given_stderr is not None and hasattr(given_stderr, "close"):
        given_stderr.close()  # nbval's open(os.devnull): the kernel's stderr goes to a file of ours instead
    last_error: BaseException | None = None
    for attempt in range(1, ATTEMPTS + 1):
        where = Path(tempfile.mkdtemp(prefix="k", dir=_sockets_folder()))
        log_path = where / "stderr.txt"
        km = KernelManager(
            kernel_name=kernel_name,
            kernel_spec_manager=NbvalKernelspecManager(),
            transport="ipc",
            ip=str(where / "s"),
        )
        with open(log_path, "w") as log:
            try:
                km.start_kernel(stderr=log, **kwargs)
            except Exception as error:  # the kernel process did not even start
                last_error = error
                shutil.rmtree(where, ignore_errors=True)
                continue
        kc = km.client()
        kc.start_channels()
        try:
            kc.wait_for_ready(timeout=startup_timeout)
        except RuntimeError as error:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
            said = _tail(log_path)
            shutil.rmtree(where, ignore_errors=True)
            last_error = RuntimeError(f"{error} (try {attempt} of {ATTEMPTS}); the kernel's stderr:\n{said}")
            logging.getLogger(__name__).warning("%s", last_error)
            warnings.warn(str(last_error), RuntimeWarning, stacklevel=2)
            continue
        return km, kc
    assert last_error is not None
    raise last_error


def pytest_configure(config: Any) -> None:
    try:
        import nbval.kernel
    except ImportError:  # a learner's install has no nbval: nothing to change
        return
    nbval.kernel.start_new_kernel = start_new_kernel


def pytest_unconfigure(config: Any) -> None:
    global _folder
    if _folder is not None:
        shutil.rmtree(_folder, ignore_errors=True)
        _folder = None
