from __future__ import annotations

import torch
from torch import nn

from checks import assert_check
from course_lib.exercises.tensors import LEAF_QUESTION, check_leaves, check_module_state, check_sgd_step

RIGHT = {"x": True, "w": True, "x2": True, "h": False, "loss": False}


def test_leaf_question_runs() -> None:
    scope: dict = {"torch": torch}
    exec(LEAF_QUESTION, scope)
    assert scope["h"].grad_fn is not None and scope["x2"].grad_fn is None


def test_leaves() -> None:
    assert_check(
        check_leaves,
        right=[RIGHT],
        not_done=[..., {**RIGHT, "x": None}],
        wrong=[
            ({**RIGHT, "x": False}, "even without requires_grad"),
            ({**RIGHT, "x2": False}, "recorded nothing"),
            ({**RIGHT, "h": True}, "MulBackward0"),
            ({**RIGHT, "w": False}, "it is a leaf"),
            ({**RIGHT, "loss": True}, "SumBackward0"),
            ({k: v for k, v in RIGHT.items() if k != "h"}, "missing: h"),
            ({**RIGHT, "y": True}, "remove: y"),
            ({**RIGHT, "x": "yes"}, "True or False"),
            ([True] * 5, "dict"),
        ],
    )


class Good(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.register_buffer("calls", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.calls += 1
        return x * self.scale


class PlainScale(Good):
    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.scale = torch.ones(1, requires_grad=True)
        self.register_buffer("calls", torch.zeros(1))


class ParamCalls(Good):
    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.scale = nn.Parameter(torch.ones(1))
        self.calls = nn.Parameter(torch.zeros(1))


class PlainCalls(Good):
    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.scale = nn.Parameter(torch.ones(1))
        self.calls = torch.zeros(1)


class NonPersistent(Good):
    def __init__(self) -> None:
        nn.Module.__init__(self)
        self.scale = nn.Parameter(torch.ones(1))
        self.register_buffer("calls", torch.zeros(1), persistent=False)


class NoCount(Good):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class Detached(Good):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.calls += 1
            return x * self.scale


class Blank(nn.Module):
    def __init__(self) -> None:
        raise NotImplementedError


def test_module_state() -> None:
    assert_check(
        check_module_state,
        right=[Good],
        not_done=[..., Blank],
        wrong=[
            (PlainScale, "plain tensor attribute"),
            (ParamCalls, "only `scale` should be a parameter"),
            (PlainCalls, "register_buffer"),
            (NonPersistent, "state_dict"),
            (NoCount, "after two forward calls"),
            (Detached, "depend on `scale`"),
            (int, "subclasses torch.nn.Module"),
        ],
    )


def test_sgd_step() -> None:
    def good(params, lr):
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad
                p.grad = None

    def rebinds(params, lr):
        for p in params:
            p = p - lr * p.grad  # noqa: F841

    def no_no_grad(params, lr):
        for p in params:
            p -= lr * p.grad

    def keeps_grad(params, lr):
        with torch.no_grad():
            for p in params:
                p -= lr * p.grad

    def wrong_sign(params, lr):
        with torch.no_grad():
            for p in params:
                p += lr * p.grad
                p.grad = None

    def replaces(params, lr):
        for i, p in enumerate(params):
            params[i] = (p - lr * p.grad).detach().requires_grad_()

    def blank(params, lr):
        raise NotImplementedError

    assert_check(
        check_sgd_step,
        right=[good],
        not_done=[blank, ...],
        wrong=[
            (rebinds, "only rebinds a name"),
            (no_no_grad, "in-place operation"),
            (keeps_grad, "p.grad = None"),
            (wrong_sign, "p - lr * p.grad"),
            (replaces, "in place"),
            ("sgd", "expected a function"),
        ],
    )
