from __future__ import annotations

import torch

from course_lib.exercises.start import check_gpu_guard, check_leaf_tensor, check_same_numbers
from course_lib.seeding import seed_everything


def test_leaf_tensor() -> None:
    assert check_leaf_tensor(torch.ones(2, 3, requires_grad=True))
    assert check_leaf_tensor(...).status == "not done yet"
    for wrong, hint in [
        (torch.ones(2, 3), "requires_grad"),
        (torch.ones(3, 2, requires_grad=True), "shape"),
        (torch.zeros(2, 3, requires_grad=True), "should be 1"),
        (torch.ones(2, 3, dtype=torch.int64), "floating-point"),
        ([[1, 1, 1], [1, 1, 1]], "torch.Tensor"),
    ]:
        r = check_leaf_tensor(wrong)
        assert r.status == "wrong" and hint in r.message, (wrong, r)


def test_same_numbers() -> None:
    def good() -> torch.Tensor:
        seed_everything(42)
        return torch.rand(3)

    def unseeded() -> torch.Tensor:
        return torch.rand(3)

    def other_seed() -> torch.Tensor:
        seed_everything(1)
        return torch.rand(3)

    def blank() -> torch.Tensor:
        raise NotImplementedError

    assert check_same_numbers(good)
    assert check_same_numbers(blank).status == "not done yet"
    assert "different numbers" in check_same_numbers(unseeded).message
    assert "not torch.rand(3)" in check_same_numbers(other_seed).message
    torch.use_deterministic_algorithms(False)


def test_gpu_guard() -> None:
    assert check_gpu_guard(torch.cuda.is_available())
    assert check_gpu_guard(not torch.cuda.is_available()).status == "wrong"
    assert check_gpu_guard("yes").status == "wrong"
    assert check_gpu_guard(...).status == "not done yet"
