from __future__ import annotations

import torch

from checks import assert_check
from course_lib.exercises.start import check_gpu_guard, check_leaf_tensor, check_same_numbers
from course_lib.seeding import seed_everything


def test_leaf_tensor() -> None:
    assert_check(
        check_leaf_tensor,
        right=[torch.ones(2, 3, requires_grad=True)],
        not_done=[...],
        wrong=[
            (torch.ones(2, 3), "requires_grad"),
            (torch.ones(3, 2, requires_grad=True), "shape"),
            (torch.zeros(2, 3, requires_grad=True), "should be 1"),
            (torch.ones(2, 3, dtype=torch.int64), "floating-point"),
            ([[1, 1, 1], [1, 1, 1]], "torch.Tensor"),
        ],
    )


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

    assert_check(
        check_same_numbers,
        right=[good],
        not_done=[blank],
        wrong=[(unseeded, "different numbers"), (other_seed, "not torch.rand(3)")],
    )
    torch.use_deterministic_algorithms(False)


def test_gpu_guard() -> None:
    assert_check(
        check_gpu_guard,
        right=[torch.cuda.is_available()],
        not_done=[...],
        wrong=[(not torch.cuda.is_available(), ""), ("yes", "")],
    )
