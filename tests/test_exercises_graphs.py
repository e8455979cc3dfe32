from __future__ import annotations

import torch

from checks import assert_check
from course_lib.exercises.graphs import check_fresh_grad, check_mul_saves, check_two_backwards


def test_mul_saves() -> None:
    assert_check(
        check_mul_saves,
        right=[{"self"}, ["self"]],
        not_done=[...],
        wrong=[
            ({"self", "other"}, "only if both required grad"),
            ({"other"}, "`other` is w"),
            (set(), "something must be kept"),
            ({"x"}, "names its inputs"),
            ("self", "set of names"),
            ({1}, "set of names"),
        ],
    )


def test_fresh_grad() -> None:
    def good(w, loss_fn):
        w.grad = None
        loss_fn(w).backward()
        return w.grad

    def accumulates(w, loss_fn):
        loss_fn(w).backward()
        return w.grad

    def stale(w, loss_fn):
        return w.grad

    def returns_elsewhere(w, loss_fn):
        (g,) = torch.autograd.grad(loss_fn(w), w)
        return g

    def wrong_value(w, loss_fn):
        w.grad = None
        (2 * loss_fn(w)).backward()
        return w.grad

    def blank(w, loss_fn):
        raise NotImplementedError

    assert_check(
        check_fresh_grad,
        right=[good],
        not_done=[blank, ...],
        wrong=[
            (accumulates, "accumulates"),
            (stale, "stale gradient"),
            (returns_elsewhere, "leave it in w.grad"),
            (wrong_value, "not d loss / d w"),
            (lambda w, f: 3.0, "return a tensor"),
            (lambda w, f: torch.zeros(2), "shape"),
        ],
    )


def test_two_backwards() -> None:
    def good(w):
        y = torch.sin(w).sum()
        y.backward(retain_graph=True)
        y.backward()
        return w.grad

    def no_retain(w):
        y = torch.sin(w).sum()
        y.backward()
        y.backward()
        return w.grad

    def once(w):
        torch.sin(w).sum().backward()
        return w.grad

    def blank(w):
        raise NotImplementedError

    assert_check(
        check_two_backwards,
        right=[good],
        not_done=[blank, ...],
        wrong=[
            (no_retain, "retain_graph=True"),
            (once, "one backward"),
            (lambda w: 2 * torch.sin(w), "2 * cos(w)"),
            (lambda w: "grad", "a tensor"),
            (lambda w: torch.zeros(1), "shape"),
        ],
    )
