from __future__ import annotations

from typing import Any

import torch
from torch import nn

from checks import assert_check
from course_lib.exercises.accumulation import (
    check_accumulate,
    check_accumulate_tokens,
    check_micro_batch_weights,
    check_scaled_accumulation_step,
)


def test_micro_batch_weights() -> None:
    def blank(sizes: list[int]) -> list[float]:
        raise NotImplementedError

    assert_check(
        check_micro_batch_weights,
        right=[lambda sizes: [n / sum(sizes) for n in sizes]],
        not_done=[..., blank],
        wrong=[
            (lambda sizes: [1 / len(sizes)] * len(sizes), "1/k"),
            (lambda sizes: [1.0] * len(sizes), "mean over all samples"),
            (lambda sizes: [1.0], "one per micro-batch"),
            (lambda sizes: "abc", ""),
        ],
    )


def _good_accumulate(model: nn.Module, micro: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    total = sum(len(y) for _, y in micro)
    for x, y in micro:
        (nn.functional.cross_entropy(model(x), y) * len(y) / total).backward()


def test_accumulate() -> None:
    def one_over_k(model: nn.Module, micro: Any) -> None:
        for x, y in micro:
            (nn.functional.cross_entropy(model(x), y) / len(micro)).backward()

    def no_scaling(model: nn.Module, micro: Any) -> None:
        for x, y in micro:
            nn.functional.cross_entropy(model(x), y).backward()

    def nothing(model: nn.Module, micro: Any) -> int:
        return 0

    assert_check(
        check_accumulate,
        right=[_good_accumulate],
        not_done=[...],
        wrong=[(one_over_k, "n_i / N"), (no_scaling, "k times too large"), (nothing, "no .grad")],
    )


def _good_scaled(model: nn.Module, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler, micro: Any) -> None:
    total = sum(len(y) for _, y in micro)
    for x, y in micro:
        scaler.scale(nn.functional.cross_entropy(model(x), y) * len(y) / total).backward()
    scaler.unscale_(opt)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()


def test_scaled_accumulation_step() -> None:
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

    assert_check(
        check_scaled_accumulation_step,
        right=[_good_scaled],
        not_done=[...],
        wrong=[(plain_step, ""), (step_each_micro_batch, "exactly once"), (update_without_step, "raised")],
    )


def _token_loss(model: nn.Module, x: torch.Tensor, t: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    logits = model(x)
    return nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), t.reshape(-1), ignore_index=-100, reduction=reduction
    )


def test_accumulate_tokens() -> None:
    def right(model: nn.Module, micro: Any) -> None:
        n = sum(int((t != -100).sum()) for _, t in micro)
        for x, t in micro:
            (_token_loss(model, x, t, "sum") / n).backward()

    def mean_over_k(model: nn.Module, micro: Any) -> None:
        for x, t in micro:
            (_token_loss(model, x, t) / len(micro)).backward()

    def by_sequences(model: nn.Module, micro: Any) -> None:
        total = sum(len(x) for x, _ in micro)
        for x, t in micro:
            (_token_loss(model, x, t) * len(x) / total).backward()

    def counts_padding(model: nn.Module, micro: Any) -> None:
        n = sum(t.numel() for _, t in micro)
        for x, t in micro:
            (_token_loss(model, x, t, "sum") / n).backward()

    def blank(model: nn.Module, micro: Any) -> None:
        raise NotImplementedError

    def nothing(model: nn.Module, micro: Any) -> None:
        return None

    def crashes(model: nn.Module, micro: Any) -> None:
        raise ValueError("boom")

    assert_check(
        check_accumulate_tokens,
        right=[right],
        right_says="token",
        not_done=[..., blank],
        wrong=[
            (mean_over_k, "averaged per micro-batch"),
            (by_sequences, "weighted by sequences"),
            (counts_padding, "count the tokens"),
            (nothing, "no .grad"),
            (crashes, "boom"),
        ],
    )
