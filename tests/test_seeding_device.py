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


def test_seed_everything_turns_on_deterministic_algorithms() -> None:
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
