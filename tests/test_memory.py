from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint_sequential

from course_lib.checkpointing import deep_chain
from course_lib.memory import (
    StateBytes,
    StepMemory,
    allocation_events,
    measure_peak,
    state_bytes,
    step_peak_memory,
    tensor_bytes,
)


def test_peak_and_retained_follow_allocations_and_frees() -> None:
    def work() -> torch.Tensor:
        a = torch.empty(1024)  # 4 KiB
        b = torch.empty(2048)  # 8 KiB -> 12 KiB live: the peak
        del a, b
        return torch.empty(512)  # 2 KiB still alive at the end

    m = measure_peak(work)
    assert (m.peak_bytes, m.retained_bytes, m.device) == (12288, 2048, "cpu")
    assert m.peak_bytes - m.retained_bytes == 10240  # needed only while work() ran
    assert tuple(m.result.shape) == (512,)


def test_memory_allocated_before_is_not_counted() -> None:
    big = torch.ones(100_000)
    m = measure_peak(lambda: big.sum())
    assert m.peak_bytes < 1024 and m.retained_bytes <= 4


def test_measurement_is_deterministic() -> None:
    model = deep_chain(8, 16)
    x = torch.randn(64, 16)
    first = step_peak_memory(model, x)
    second = step_peak_memory(model, x)
    assert first == second  # result (the loss) is not compared


def test_step_peak_grows_by_one_activation_per_block_and_retains_the_gradients() -> None:
    batch, width = 256, 8
    x = torch.randn(batch, width)
    unit = batch * width * 4
    peaks = {}
    for depth in (4, 8, 16):
        model = deep_chain(depth, width)
        m = step_peak_memory(model, x)
        # still allocated afterwards: the new .grad buffers and the returned 4-byte loss
        assert m.retained_bytes == state_bytes(model).gradients + 4
        peaks[depth] = m.peak_bytes
    # exactly one batch x width tensor more per block: the peak is reached as backward starts,
    # when every saved activation is alive and the (small) gradient buffers are not yet allocated
    assert peaks[8] - peaks[4] == 4 * unit
    assert peaks[16] - peaks[8] == 8 * unit


@pytest.mark.slow  # profiles training steps: over 10 s on a loaded machine
def test_checkpointing_lowers_the_measured_peak() -> None:
    model = deep_chain(64, 8)
    x = torch.randn(256, 8, requires_grad=True)
    plain = step_peak_memory(model, x)
    ckpt = step_peak_memory(model, x, forward=lambda m, t: checkpoint_sequential(m, 8, t, use_reentrant=False))
    assert ckpt.peak_bytes * 2 < plain.peak_bytes
    assert torch.allclose(plain.result, ckpt.result)


def test_custom_loss_is_used() -> None:
    model = torch.nn.Linear(4, 3)
    x = torch.randn(5, 4)
    target = torch.tensor([0, 1, 2, 0, 1])
    m = step_peak_memory(model, x, loss_fn=lambda out: torch.nn.functional.cross_entropy(out, target))
    assert torch.allclose(m.result, torch.nn.functional.cross_entropy(model(x), target))
    with pytest.raises(ValueError, match="single-element"):
        step_peak_memory(model, x, loss_fn=lambda out: out)


def test_state_bytes_for_sgd_momentum_and_adam() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 5))
    n_params = sum(p.numel() for p in model.parameters())
    x = torch.randn(3, 10)
    assert state_bytes(model) == StateBytes(n_params * 4, 0, 0)
    for opt, expected_state in [
        (torch.optim.SGD(model.parameters(), lr=0.1), 0),
        (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), n_params * 4),
        (torch.optim.Adam(model.parameters()), 2 * n_params * 4 + 4 * 4),  # exp_avg, exp_avg_sq, 4 step scalars
    ]:
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()
        opt.step()
        s = state_bytes(model, opt)
        assert (s.parameters, s.gradients, s.optimizer_state) == (n_params * 4, n_params * 4, expected_state)
        assert s.total == s.parameters + s.gradients + s.optimizer_state


def test_measured_and_modelled_state_bytes_are_one_type_and_agree() -> None:
    """What state_bytes counts from the tensors is what sharding.model_state_bytes models, field by field."""
    from course_lib import sharding

    assert StateBytes is sharding.StateBytes
    model = torch.nn.Sequential(torch.nn.Linear(10, 20), torch.nn.Linear(20, 5))
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(3, 10)).sum().backward()
    opt.step()
    measured = state_bytes(model, opt)
    modelled = sharding.model_state_bytes(n_params, 1, "ddp", "fp32_sgd_momentum")
    assert measured == modelled
    assert not hasattr(modelled, "optimizer")  # one name for the optimizer's bytes: optimizer_state


def test_tensor_bytes_counts_shared_storage_once() -> None:
    t = torch.ones(10, 10)
    assert tensor_bytes([t, t[:5], t.t()]) == 400
    assert tensor_bytes([torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.int8)]) == 27
    with pytest.raises(TypeError, match="iterable"):
        tensor_bytes(t)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tensors only"):
        tensor_bytes([t, 3])  # type: ignore[list-item]


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(TypeError, match="callable"):
        measure_peak(3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="only 'cpu' and 'cuda'"):
        measure_peak(lambda: None, device="meta")
    with pytest.raises(ValueError, match="not a valid torch device"):
        measure_peak(lambda: None, device="gpu7")
    with pytest.raises(TypeError, match="torch.device"):
        measure_peak(lambda: None, device=0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="nn.Module"):
        step_peak_memory(lambda t: t, torch.ones(2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tensor"):
        step_peak_memory(torch.nn.Linear(2, 2), [1.0, 2.0])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="forward must be callable"):
        step_peak_memory(torch.nn.Linear(2, 2), torch.ones(1, 2), forward=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="nn.Module"):
        state_bytes("model")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="Optimizer"):
        state_bytes(torch.nn.Linear(2, 2), optimizer="adam")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="peak_bytes must be >= 0"):
        StepMemory(-1, 0, "cpu")
    with pytest.raises(TypeError, match="device must be a device name"):
        StepMemory(1, 0, 0)  # type: ignore[arg-type]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown on a machine without a GPU")
def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no CUDA GPU"):
        measure_peak(lambda: None, device="cuda")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_peak_and_retained() -> None:
    def work() -> torch.Tensor:
        a = torch.empty(1024 * 1024, device="cuda")  # 4 MiB
        b = torch.empty(2 * 1024 * 1024, device="cuda")  # 8 MiB
        del a, b
        return torch.empty(512 * 1024, device="cuda")  # 2 MiB

    m = measure_peak(work, device="cuda")
    assert (m.peak_bytes, m.retained_bytes) == (12 * 2**20, 2 * 2**20)
    assert m.device.startswith("cuda:")
    model = deep_chain(16, 64).cuda()
    x = torch.randn(1024, 64, device="cuda")
    plain = step_peak_memory(model, x)
    ckpt = step_peak_memory(
        model, x, forward=lambda m_, t: checkpoint_sequential(m_, 4, t.requires_grad_(), use_reentrant=False)
    )
    assert ckpt.peak_bytes < plain.peak_bytes


def test_the_private_profiler_record_is_still_there() -> None:
    """allocation_events reads torch.profiler's private kineto_results; if a torch upgrade renames
    it, this test fails first and names the function to update."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        a = torch.empty(1024)
        del a
    assert hasattr(prof.profiler, "kineto_results"), (
        "torch.profiler no longer has profiler.kineto_results: update course_lib.memory.allocation_events"
    )
    for method in ("name", "device_type", "start_ns", "nbytes"):
        assert all(hasattr(e, method) for e in prof.profiler.kineto_results.events()), (
            f"kineto events lost {method}(): update course_lib.memory.allocation_events"
        )
    assert [n for _, n in allocation_events(prof)] == [4096, -4096]


def test_allocation_events_says_what_to_update_when_the_record_is_missing() -> None:
    from torch.profiler import profile

    renamed = profile()
    renamed.profiler = object()  # a record without kineto_results, as a renamed private attribute would look

    with pytest.raises(RuntimeError, match="update that function"):
        allocation_events(renamed)
