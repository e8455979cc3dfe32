from __future__ import annotations

from typing import Any

import torch
from torch import nn

from course_lib.exercises.accumulation import (
    check_accumulate,
    check_micro_batch_weights,
    check_scaled_accumulation_step,
)


def test_micro_batch_weights() -> None:
    assert check_micro_batch_weights(lambda sizes: [n / sum(sizes) for n in sizes])
    assert check_micro_batch_weights(...).status == "not done yet"

    def blank(sizes: list[int]) -> list[float]:
        raise NotImplementedError

    assert check_micro_batch_weights(blank).status == "not done yet"
    r = check_micro_batch_weights(lambda sizes: [1 / len(sizes)] * len(sizes))
    assert r.status == "wrong" and "1/k" in r.message
    r = check_micro_batch_weights(lambda sizes: [1.0] * len(sizes))
    assert r.status == "wrong" and "mean over all samples" in r.message
    r = check_micro_batch_weights(lambda sizes: [1.0])
    assert r.status == "wrong" and "one per micro-batch" in r.message
    assert check_micro_batch_weights(lambda sizes: "abc").status == "wrong"


def _good_accumulate(model: nn.Module, micro: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    total = sum(len(y) for _, y in micro)
    for x, y in micro:
        (nn.functional.cross_entropy(model(x), y) * len(y) / total).backward()


def test_accumulate() -> None:
    assert check_accumulate(_good_accumulate)
    assert check_accumulate(...).status == "not done yet"

    def one_over_k(model: nn.Module, micro: Any) -> None:
        for x, y in micro:
            (nn.functional.cross_entropy(model(x), y) / len(micro)).backward()

    def no_scaling(model: nn.Module, micro: Any) -> None:
        for x, y in micro:
            nn.functional.cross_entropy(model(x), y).backward()

    def nothing(model: nn.Module, micro: Any) -> int:
        return 0

    r = check_accumulate(one_over_k)
    assert r.status == "wrong" and "n_i / N" in r.message
    r = check_accumulate(no_scaling)
    assert r.status == "wrong" and "k times too large" in r.message
    r = check_accumulate(nothing)
    assert r.status == "wrong" and "no .grad" in r.message


def _good_scaled(model: nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler, micro: Any) -> None:
    total = sum(len(y) for _, y in micro)
    for x, y in micro:
        scaler.scale(nn.functional.cross_entropy(model(x), y) * len(y) / total).backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()


def test_scaled_accumulation_step() -> None:
    assert check_scaled_accumulation_step(_good_scaled)
    assert check_scaled_accumulation_step(...).status == "not done yet"

    def plain_step(model: nn.Module, opt: Any, scaler: Any, micro: Any) -> None:
        total = sum(len(y) for _, y in micro)
        for x, y in micro:
            scaler.scale(nn.functional.cross_entropy(model(x), y) * len(y) / total).backward()
        opt.step()  # scaled gradients applied as they are
        scaler.update()

    def step_each_micro_batch(model: nn.Module, opt: Any, scaler: Any, micro: Any) -> None:
        total = sum(len(y) for _, y in micro)
        for x, y in micro:
            scaler.scale(nn.functional.cross_entropy(model(x), y) * len(y) / total).backward()
            scaler.step(opt)
            scaler.update()

    def update_without_step(model: nn.Module, opt: Any, scaler: Any, micro: Any) -> None:
        x, y = micro[0]
        scaler.scale(nn.functional.cross_entropy(model(x), y)).backward()
        scaler.update()

    r = check_scaled_accumulation_step(plain_step)
    assert r.status == "wrong"
    r = check_scaled_accumulation_step(step_each_micro_batch)
    assert r.status == "wrong" and "exactly once" in r.message
    r = check_scaled_accumulation_step(update_without_step)
    assert r.status == "wrong" and "raised" in r.message
