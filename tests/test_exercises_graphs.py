from __future__ import annotations

import torch

from checks import assert_check
from course_lib.exercises.graphs import check_fresh_grad, check_grad_norm_logger, check_mul_saves, check_two_backwards


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


def _logger_good(model):
    norms, handles = {}, []
    for name, p in model.named_parameters():
        if p.requires_grad:

            def hook(p, name=name):
                norms[name] = p.grad.norm().item()

            handles.append(p.register_post_accumulate_grad_hook(hook))
    return norms, handles


def _logger_tensor_hook(model):  # sees one micro-batch's gradient, before accumulation
    norms, handles = {}, []
    for name, p in model.named_parameters():
        if p.requires_grad:
            handles.append(p.register_hook(lambda g, name=name: norms.__setitem__(name, g.norm().item())))
    return norms, handles


def _logger_first_only(model):  # keeps the first value it sees
    norms, handles = {}, []
    for name, p in model.named_parameters():
        if p.requires_grad:
            handles.append(
                p.register_post_accumulate_grad_hook(lambda p, name=name: norms.setdefault(name, p.grad.norm().item()))
            )
    return norms, handles


def _logger_first_only_quiet(model):  # the same, written so that the hook returns None
    norms, handles = {}, []
    for name, p in model.named_parameters():
        if p.requires_grad:

            def hook(p, name=name):
                if name not in norms:
                    norms[name] = p.grad.norm().item()

            handles.append(p.register_post_accumulate_grad_hook(hook))
    return norms, handles


def _logger_drops_handles(model):
    norms, handles = _logger_good(model)
    return norms, handles[:1]


def _logger_hooks_frozen(model):  # registering on a frozen parameter raises
    norms = {}
    handles = [
        p.register_post_accumulate_grad_hook(lambda p, name=name: norms.__setitem__(name, p.grad.norm().item()))
        for name, p in model.named_parameters()
    ]
    return norms, handles


def _logger_late_binding(model):  # every hook reads `name` when it runs: the last parameter's name
    norms, handles = {}, []
    for name, p in model.named_parameters():
        if p.requires_grad:
            handles.append(
                p.register_post_accumulate_grad_hook(lambda p: norms.__setitem__(name, p.grad.norm().item()))  # noqa: B023
            )
    return norms, handles


def _logger_blank(model):
    raise NotImplementedError


def test_grad_norm_logger() -> None:
    assert_check(
        check_grad_norm_logger,
        right=[_logger_good],
        not_done=[_logger_blank, ...],
        wrong=[
            (_logger_tensor_hook, "register_post_accumulate_grad_hook sees the sum"),
            (_logger_first_only, "a hook should return None"),
            (_logger_first_only_quiet, "first micro-batch"),
            (_logger_drops_handles, "still ran"),
            (_logger_hooks_frozen, "skip the parameters with requires_grad=False"),
            (_logger_late_binding, "bind it as a default"),
            (lambda m: ({}, []), "handles should hold"),
            (lambda m: {}, "pair"),
        ],
    )
