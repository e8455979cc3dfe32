from __future__ import annotations

import pytest
import torch

from course_lib.saved_tensors import SavedTensorMeter, format_bytes, saved_cast_copy_bytes


def test_a_tensor_saved_twice_is_counted_once() -> None:
    x = torch.ones(1000, requires_grad=True)
    with SavedTensorMeter() as m:
        (x * x).sum()
    assert m.count == 2  # MulBackward0 saves self and other
    assert m.bytes == 4000  # ...which share one storage
    assert sum(r.nbytes for r in m.records) == 8000  # what counting each saved tensor as a copy would say


def test_views_of_one_storage_are_counted_once_at_storage_size() -> None:
    x = torch.ones(10, 10, requires_grad=True)
    with SavedTensorMeter() as m:
        a = x[:5]
        b = x[5:]
        (a * b).sum()
    assert m.bytes == 400


def test_parameters_are_reported_apart_from_activations() -> None:
    torch.manual_seed(0)
    lin = torch.nn.Linear(100, 50)
    x = torch.randn(8, 100, requires_grad=True)
    with SavedTensorMeter() as m:
        lin(x).relu().sum()
    # activations: the input (8x100) and relu's result (8x50); parameters: the weight (50x100)
    assert m.bytes == (8 * 100 + 8 * 50) * 4
    assert m.excluded_bytes == 50 * 100 * 4
    assert m.bytes + m.excluded_bytes == sum(r.storage_nbytes for r in m.records if r.new_storage)


def test_exclude_leaves_out_given_tensors() -> None:
    w = torch.randn(100, requires_grad=True)  # a plain leaf, not an nn.Parameter
    x = torch.randn(100, requires_grad=True)
    with SavedTensorMeter(exclude=[w]) as m:
        (w * x).sum()
    assert m.bytes == 400 and m.excluded_bytes == 400


def test_nothing_is_saved_under_no_grad() -> None:
    x = torch.ones(100, requires_grad=True)
    with torch.no_grad(), SavedTensorMeter() as m:
        (x * x).sum()
    assert m.count == 0 and m.bytes == 0


def test_backward_still_works_inside_the_meter() -> None:
    x = torch.arange(4.0, requires_grad=True)
    with SavedTensorMeter():
        (x * x).sum().backward()
    assert torch.equal(x.grad, 2 * torch.arange(4.0))


def test_summary_is_text_with_both_numbers() -> None:
    x = torch.ones(256, requires_grad=True)
    with SavedTensorMeter() as m:
        (x * 2).exp().sum()
    assert (
        m.summary() == "1 tensors saved for backward: 1.00 KiB of activations"
        " (+ 0 B of saved parameters, shared storage counted once)"
    )


def test_a_meter_cannot_be_entered_twice_at_once() -> None:
    m = SavedTensorMeter()
    with m:
        with pytest.raises(RuntimeError, match="already in use"):
            m.__enter__()


def test_exclude_must_hold_tensors() -> None:
    with pytest.raises(TypeError, match="iterable of tensors"):
        SavedTensorMeter(exclude=torch.ones(3))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tensors only"):
        SavedTensorMeter(exclude=[1, 2])  # type: ignore[list-item]


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (200 * 1024**2, "200 MiB"),
        (3 * 1024**3, "3.00 GiB"),
    ],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_format_bytes_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="negative"):
        format_bytes(-1)
    with pytest.raises(TypeError):
        format_bytes("12")  # type: ignore[arg-type]


def test_saved_cast_copy_bytes_counts_autocast_weight_copies() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(5, 8)

    def forward_bf16() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            model(x).sum()

    # the first layer's input needs no grad, so only the second weight (16x4 in bf16) is saved
    assert saved_cast_copy_bytes(forward_bf16, model.parameters()) == 16 * 4 * 2
    assert saved_cast_copy_bytes(lambda: model(x).sum(), model.parameters()) == 0
    x.requires_grad_(True)
    assert saved_cast_copy_bytes(forward_bf16, model.parameters()) == (16 * 8 + 16 * 4) * 2
    assert saved_cast_copy_bytes(forward_bf16, []) == 0  # only casts of the given tensors count


def test_saved_cast_copy_bytes_validates() -> None:
    with pytest.raises(TypeError, match="callable"):
        saved_cast_copy_bytes(1, [])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="iterable"):
        saved_cast_copy_bytes(lambda: None, torch.ones(2))
    with pytest.raises(TypeError, match="tensors only"):
        saved_cast_copy_bytes(lambda: None, [1.0])  # type: ignore[list-item]
