from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from course_lib.device import best_device, environment_report, gpu_available, requires_gpu
from course_lib.seeding import seed_everything


def _draw() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(()))


def test_seed_everything_makes_every_generator_repeat() -> None:
    assert seed_everything(7) == 7
    first = _draw()
    seed_everything(7)
    assert _draw() == first
    seed_everything(8)
    assert _draw() != first


def test_seed_everything_turns_on_deterministic_algorithms_only_when_asked() -> None:
    torch.use_deterministic_algorithms(False)
    seed_everything(0)
    assert not torch.are_deterministic_algorithms_enabled()  # seeding alone changes no global switch
    seed_everything(0, deterministic=True)
    assert torch.are_deterministic_algorithms_enabled()
    assert torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("bad", [1.5, "1", None, True])
def test_seed_everything_rejects_non_int(bad: object) -> None:
    with pytest.raises(TypeError, match="seed must be an int"):
        seed_everything(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [-1, 2**32])
def test_seed_everything_rejects_out_of_range(bad: int) -> None:
    with pytest.raises(ValueError, match=r"\[0, 2\*\*32\)"):
        seed_everything(bad)


def test_seed_everything_rejects_non_bool_deterministic() -> None:
    with pytest.raises(TypeError, match="deterministic"):
        seed_everything(1, deterministic="yes")  # type: ignore[arg-type]


def test_requires_gpu_matches_the_machine_and_prints_what_it_skipped(capsys: pytest.CaptureFixture[str]) -> None:
    ran = requires_gpu("a tensor-core matmul")
    assert ran == torch.cuda.is_available()
    out = capsys.readouterr().out
    if ran:
        assert out == ""
    else:
        assert out.startswith("[GPU cell skipped] a tensor-core matmul: needs a CUDA GPU")


def test_requires_gpu_with_more_gpus_than_exist_skips(capsys: pytest.CaptureFixture[str]) -> None:
    assert requires_gpu("model parallel on 2 devices", count=10_000) is False
    assert "needs 10000 CUDA GPUs" in capsys.readouterr().out


@pytest.mark.parametrize("bad", ["", "   ", None, 3])
def test_requires_gpu_needs_a_description(bad: object) -> None:
    with pytest.raises(ValueError, match="non-empty string"):
        requires_gpu(bad)  # type: ignore[arg-type]


def test_gpu_available_validates_count() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        gpu_available(0)
    with pytest.raises(TypeError):
        gpu_available(1.0)  # type: ignore[arg-type]


def test_best_device_is_cuda_exactly_when_a_gpu_is_visible() -> None:
    assert best_device().type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_environment_report_describes_this_machine() -> None:
    report = environment_report()
    assert report.torch == torch.__version__
    assert report.cpu_cores >= 1
    assert report.cpu_kernels == torch.backends.cpu.get_cpu_capability()
    assert report.gloo is True  # the course's distributed parts need gloo
    lines = report.lines()
    assert any(line.startswith("PyTorch") and torch.__version__ in line for line in lines)
    if not torch.cuda.is_available():
        assert any("GPU cells will be skipped" in line for line in lines)


def test_simulated_gpus_never_count_as_usable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from course_lib.device import gpu_count, gpus_simulated

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("COURSE_SIMULATED_GPUS", "2")
    assert gpus_simulated() and gpu_count() == 0 and not gpu_available()
    assert requires_gpu("a simulated GPU") is False
    assert "this machine has 0" in capsys.readouterr().out  # the same line as on a CPU-only machine
    assert best_device().type == "cpu"
    monkeypatch.delenv("COURSE_SIMULATED_GPUS")
    assert not gpus_simulated() and gpu_count() == 2 and gpu_available(2)


def test_course_device_is_cpu_unless_the_switch_asks_for_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    from course_lib.device import backend_for, course_device, course_ranks

    monkeypatch.delenv("COURSE_DEVICE", raising=False)
    assert course_device() == "cpu" and course_ranks(2) == 2
    monkeypatch.setenv("COURSE_DEVICE", " CPU ")
    assert course_device() == "cpu"
    monkeypatch.setenv("COURSE_DEVICE", "tpu")
    with pytest.raises(ValueError, match=r"COURSE_DEVICE must be one of \('cpu', 'cuda'\), got 'tpu'"):
        course_device()
    monkeypatch.setenv("COURSE_DEVICE", "cuda")
    if not gpu_available():
        with pytest.raises(ValueError, match="no usable CUDA GPU"):
            course_device()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("COURSE_SIMULATED_GPUS", raising=False)
    assert course_device() == "cuda"
    assert course_ranks(2) == 1  # one process per GPU: a 1-GPU machine runs the job as one process
    with pytest.raises(ValueError, match=">= 1"):
        course_ranks(0)
    assert backend_for("cpu") == "gloo" and backend_for("cuda") == "nccl"
    with pytest.raises(ValueError, match="device must be one of"):
        backend_for("gpu")


def test_cpu_hog_runs_the_command_under_load_and_leaves_nothing_behind() -> None:
    import subprocess
    import sys
    from pathlib import Path

    import psutil

    script = Path(__file__).resolve().parents[1] / "scripts" / "cpu_hog.py"
    cmd = [sys.executable, str(script), "--procs", "2", "--max-seconds", "30", "--", sys.executable, "-c"]
    ok = subprocess.run([*cmd, "import sys; sys.exit(3)"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 3 and "2 busy process(es)" in ok.stdout  # the command's exit code passes through
    me = psutil.Process()
    assert not [p for p in me.children(recursive=True) if "cpu_hog" in " ".join(p.cmdline())]
    bad = subprocess.run([sys.executable, str(script), "--procs", "0", "--", "true"], capture_output=True, text=True)
    assert bad.returncode == 2 and "--procs must be >= 1" in bad.stderr


def test_requires_gpu_skips_an_older_gpu_and_names_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A T4 (7.5) is skipped for a cell that needs 8.0; an A100 (8.0) runs it. The GPUs are stand-ins."""
    import course_lib.device as device

    monkeypatch.setattr(device, "gpu_available", lambda count=1: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (7, 5))
    assert requires_gpu("FlashAttention's kernel", capability=(8, 0)) is False
    assert "needs compute capability 8.0 or newer, GPU 0 (Tesla T4) has 7.5" in capsys.readouterr().out
    assert requires_gpu("a plain matmul") is True  # no capability asked: the T4 runs it
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (8, 0))
    assert requires_gpu("FlashAttention's kernel", capability=(8, 0)) is True


@pytest.mark.parametrize("bad", [(8,), [8, 0], (8, "0"), (8, -1), "8.0"])
def test_requires_gpu_refuses_a_malformed_capability(bad: object) -> None:
    with pytest.raises(ValueError, match="capability"):
        requires_gpu("x", capability=bad)  # type: ignore[arg-type]


def test_requires_gpu_names_its_own_count_argument() -> None:
    with pytest.raises(ValueError, match="count"):
        requires_gpu("x", count=0)
