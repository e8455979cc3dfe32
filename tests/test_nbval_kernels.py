"""course_tools.nbval_kernels: nbval's kernels on private Unix sockets, started again if one dies while starting."""

from __future__ import annotations

import socket
import sys
import warnings
from pathlib import Path

import ipykernel.kernelspec
import nbval.kernel
import pytest
from jupyter_client.manager import KernelManager

from course_tools import nbval_kernels


def _run(kc, code: str) -> str:
    """What `code` prints in the kernel."""
    out: list[str] = []
    reply = kc.execute_interactive(
        code,
        timeout=60,
        output_hook=lambda m: out.append(m["content"].get("text", "")) if m["msg_type"] == "stream" else None,
    )
    assert reply["content"]["status"] == "ok", reply["content"]
    return "".join(out)


def test_the_plugin_is_loaded_for_every_run():
    """pyproject's addopts loads it, so nbval.kernel starts its kernels through it (make's and README's runs)."""
    assert nbval.kernel.start_new_kernel is nbval_kernels.start_new_kernel


@pytest.mark.slow
def test_a_kernel_uses_sockets_in_a_private_folder_and_removes_them():
    km, kc = nbval_kernels.start_new_kernel(kernel_name=nbval.kernel.CURRENT_ENV_KERNEL_NAME)
    try:
        info = km.get_connection_info()
        assert info["transport"] == "ipc"
        folder = Path(info["ip"]).parent
        assert folder.parent == nbval_kernels._sockets_folder()
        sockets = [Path(f"{info['ip']}-{info[p]}") for p in ("shell_port", "iopub_port", "hb_port")]
        assert all(s.is_socket() for s in sockets), sockets
        assert _run(kc, "print(6 * 7)").strip() == "42"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert not any(s.exists() for s in sockets)


@pytest.mark.slow
def test_the_failure_it_prevents_a_tcp_kernel_whose_port_is_taken_dies():
    """jupyter_client's default: ports found free, then bound by the kernel; one taken in between kills the kernel.

    (ZMQError: Address already in use, on the kernel's stderr; nbval then fails every cell of the notebook.)
    """
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        km = KernelManager(
            kernel_name=nbval.kernel.CURRENT_ENV_KERNEL_NAME,
            kernel_spec_manager=nbval.kernel.NbvalKernelspecManager(),
            shell_port=taken.getsockname()[1],
            cache_ports=False,  # keep the port given (else jupyter_client picks all five afresh)
        )
        km.start_kernel()
        kc = km.client()
        kc.start_channels()
        try:
            with pytest.raises(RuntimeError, match="Kernel died before replying to kernel_info"):
                kc.wait_for_ready(timeout=60)
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def _dying_first(monkeypatch, deaths: int) -> list[int]:
    """The kernel spec's command exits (saying why on stderr) for the first `deaths` starts."""
    real = ipykernel.kernelspec.get_kernel_dict
    calls = [0]

    def spec(*args, **kwargs):
        calls[0] += 1
        d = real(*args, **kwargs)
        if calls[0] <= deaths:
            d = dict(d, argv=[sys.executable, "-c", "import sys; sys.stderr.write('planted death'); sys.exit(3)"])
        return d

    monkeypatch.setattr(ipykernel.kernelspec, "get_kernel_dict", spec)
    return calls


@pytest.mark.slow
def test_a_kernel_that_dies_while_starting_is_started_again_and_says_why(monkeypatch):
    calls = _dying_first(monkeypatch, deaths=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        km, kc = nbval_kernels.start_new_kernel(kernel_name=nbval.kernel.CURRENT_ENV_KERNEL_NAME)
    try:
        assert _run(kc, "print('second try')").strip() == "second try"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert calls[0] == 2
    said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(said) == 1 and "try 1 of 3" in said[0] and "planted death" in said[0], said


@pytest.mark.slow
def test_a_kernel_that_never_starts_fails_with_its_stderr(monkeypatch):
    calls = _dying_first(monkeypatch, deaths=nbval_kernels.ATTEMPTS)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        with pytest.raises(RuntimeError, match=r"(?s)try 3 of 3.*planted death"):
            nbval_kernels.start_new_kernel(kernel_name=nbval.kernel.CURRENT_ENV_KERNEL_NAME)
    assert calls[0] == nbval_kernels.ATTEMPTS
