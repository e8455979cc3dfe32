from __future__ import annotations

import torch
from torch import nn

from checks import assert_check
from course_lib.exercises.tensors import (
    LEAF_QUESTION,
    check_freeze_for_finetuning,
    check_leaves,
    check_module_state,
    check_sgd_step,
)

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


def _freeze_good(model):
    model.requires_grad_(False)
    model[-1].requires_grad_(True)
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3, weight_decay=0.01)


def _freeze_all_in_optimizer(model):  # frozen right, but every parameter handed to AdamW: decay moves them
    model.requires_grad_(False)
    model[-1].requires_grad_(True)
    return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)


def _freeze_head_twice(model):  # the head's parameters listed twice
    model[:-1].requires_grad_(False)
    return torch.optim.AdamW([*model[-1].parameters(), model[-1].weight], lr=1e-3, weight_decay=0.01)


def _freeze_nothing(model):
    return torch.optim.AdamW(model[-1].parameters(), lr=1e-3, weight_decay=0.01)


def _freeze_everything(model):
    model.requires_grad_(False)
    return torch.optim.AdamW(model[-1].parameters(), lr=1e-3, weight_decay=0.01)


def _freeze_sgd(model):
    model[:-1].requires_grad_(False)
    return torch.optim.SGD(model[-1].parameters(), lr=1e-3)


def _freeze_wrong_lr(model):
    model[:-1].requires_grad_(False)
    return torch.optim.AdamW(model[-1].parameters(), lr=1e-2, weight_decay=0.01)


def _freeze_slice(model):  # the other idiom: freeze a slice, hand the optimizer the head
    model[:-1].requires_grad_(False)
    return torch.optim.AdamW(model[-1].parameters(), lr=1e-3, weight_decay=0.01)


def _freeze_blank(model):
    raise NotImplementedError


def test_freeze_for_finetuning() -> None:
    assert_check(
        check_freeze_for_finetuning,
        right=[_freeze_good, _freeze_slice],
        not_done=[_freeze_blank, ...],
        wrong=[
            (_freeze_all_in_optimizer, "weight decay changed it"),
            (_freeze_head_twice, "nothing else"),
            (_freeze_nothing, "freeze it"),
            (_freeze_everything, "train it"),
            (_freeze_sgd, "AdamW"),
            (_freeze_wrong_lr, "lr=1e-3"),
            (lambda m: 3, "AdamW"),
        ],
    )


def test_freeze_for_finetuning_catches_a_frozen_parameter_that_moves() -> None:
    """The drift check itself: a frozen parameter handed to AdamW with zeroed gradients moves."""
    model = torch.nn.Linear(3, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, weight_decay=0.1)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    model.requires_grad_(False)
    before = model.weight.detach().clone()
    opt.step()
    assert not torch.equal(model.weight, before)
