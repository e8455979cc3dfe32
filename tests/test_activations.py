from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib.activations import Swish, SwishModule, swish
from course_lib.saved_tensors import SavedTensorMeter


def swish_derivative(x: torch.Tensor) -> torch.Tensor:
    """Notebook 03's formula: ``d/dx [x * sigmoid(x)] = s * (1 + x * (1 - s))`` with ``s = sigmoid(x)``."""
    s = torch.sigmoid(x)
    return s * (1 + x * (1 - s))


@pytest.fixture
def x64() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return torch.randn(5, 4, generator=g, dtype=torch.float64).mul(3).requires_grad_()


def test_forward_matches_silu_and_formula(x64: torch.Tensor) -> None:
    x = x64.detach()
    torch.testing.assert_close(swish(x), F.silu(x))
    torch.testing.assert_close(Swish.apply(x), x * torch.sigmoid(x))
    assert swish(torch.tensor([0.0])).item() == 0.0


def test_backward_passes_gradcheck_and_gradgradcheck(x64: torch.Tensor) -> None:
    assert torch.autograd.gradcheck(swish, (x64,), check_forward_ad=True)
    assert torch.autograd.gradgradcheck(swish, (x64,))


def test_gradient_matches_autograd_of_silu(x64: torch.Tensor) -> None:
    (mine,) = torch.autograd.grad(swish(x64).sum(), x64)
    (ref,) = torch.autograd.grad(F.silu(x64).sum(), x64)
    torch.testing.assert_close(mine, ref)
    torch.testing.assert_close(swish_derivative(x64.detach()), ref)


def test_known_derivative_values() -> None:
    # swish'(0) = sigmoid(0) = 1/2; far left the slope tends to 0, far right to 1
    x = torch.tensor([0.0, -40.0, 40.0], dtype=torch.float64, requires_grad=True)
    (d,) = torch.autograd.grad(swish(x).sum(), x)
    torch.testing.assert_close(d, torch.tensor([0.5, 0.0, 1.0], dtype=torch.float64))
    torch.testing.assert_close(swish_derivative(x.detach()), d)


def test_saves_only_the_input() -> None:
    x = torch.randn(1000, requires_grad=True)
    with SavedTensorMeter() as m:
        y = swish(x)
    assert m.count == 1 and m.bytes == 4000
    assert y.grad_fn.saved_tensors[0].data_ptr() == x.data_ptr()  # x itself, not a copy


def test_no_grad_needed_returns_none_and_does_not_fail() -> None:
    w = torch.randn(3, requires_grad=True)
    x = torch.randn(3)  # constant input
    out = swish(x) * w
    out.sum().backward()
    torch.testing.assert_close(w.grad, F.silu(x))


def test_torch_func_transforms(x64: torch.Tensor) -> None:
    x = x64.detach()
    torch.testing.assert_close(torch.func.vmap(swish)(x), F.silu(x))
    row = x[0]
    torch.testing.assert_close(
        torch.func.hessian(lambda t: swish(t).sum())(row),
        torch.func.hessian(lambda t: F.silu(t).sum())(row),
    )


def test_module_in_sequential_trains() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), SwishModule(), nn.Linear(8, 1))
    ref = nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 1))
    ref.load_state_dict(model.state_dict())
    x = torch.randn(16, 4)
    model(x).pow(2).mean().backward()
    ref(x).pow(2).mean().backward()
    assert list(dict(SwishModule().named_parameters())) == []
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad)


@pytest.mark.parametrize("bad", [[1.0, 2.0], 3.0, None])
def test_rejects_non_tensors(bad: object) -> None:
    with pytest.raises(TypeError, match="torch.Tensor"):
        swish(bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="torch.Tensor"):
        SwishModule()(bad)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64])
def test_rejects_non_real_float_dtypes(dtype: torch.dtype) -> None:
    with pytest.raises(TypeError, match="floating-point"):
        swish(torch.zeros(3, dtype=dtype))
    with pytest.raises(TypeError, match="floating-point"):
        SwishModule()(torch.zeros(3, dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_low_precision_dtypes_work(dtype: torch.dtype) -> None:
    x = torch.linspace(-3, 3, 7, dtype=dtype, requires_grad=True)
    swish(x).sum().backward()
    assert x.grad is not None and x.grad.dtype == dtype
    torch.testing.assert_close(x.grad.float(), swish_derivative(x.detach().float()), atol=1e-2, rtol=1e-2)
