from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from course_lib.checkpointing import PREPARED_ATTR, checkpoint_momentum, deep_chain, prepare_batchnorm_for_checkpointing


def test_deep_chain_shape_and_children() -> None:
    m = deep_chain(5, 7, activation="relu", bias=False)
    assert len(m) == 5 and len(list(m.children())) == 5
    assert all(isinstance(b[0], nn.Linear) and isinstance(b[1], nn.ReLU) and b[0].bias is None for b in m)
    assert m(torch.randn(3, 7)).shape == (3, 7)


def test_deep_chain_is_reproducible_and_leaves_the_global_generator_alone() -> None:
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    a, b = deep_chain(3, 4, seed=1), deep_chain(3, 4, seed=1)
    assert torch.equal(torch.random.get_rng_state(), before)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    c = deep_chain(3, 4, seed=2)
    assert not torch.equal(a[0][0].weight, c[0][0].weight)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"depth": 0, "width": 3}, ValueError, "depth must be >= 1"),
        ({"depth": 2, "width": 2.5}, TypeError, "width must be an int"),
        ({"depth": True, "width": 2}, TypeError, "depth must be an int"),
        ({"depth": 2, "width": 2, "activation": "swish"}, ValueError, "activation must be one of"),
        ({"depth": 2, "width": 2, "bias": 1}, TypeError, "bias must be a bool"),
        ({"depth": 2, "width": 2, "seed": -1}, ValueError, "seed"),
    ],
)
def test_deep_chain_rejects_bad_arguments(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        deep_chain(**kwargs)


def test_checkpoint_momentum_in_both_conventions() -> None:
    assert checkpoint_momentum(0.1) == pytest.approx(1 - math.sqrt(0.9))
    assert checkpoint_momentum(0.9, convention="old-weight") == pytest.approx(math.sqrt(0.9))
    # the same update written in the two conventions: 0.1 on the new value == 0.9 on the old one
    for m in (0.01, 0.1, 0.5):
        assert checkpoint_momentum(m) == pytest.approx(1 - checkpoint_momentum(1 - m, convention="old-weight"))
        twice = (1 - checkpoint_momentum(m)) ** 2
        assert twice == pytest.approx(1 - m)
    assert checkpoint_momentum(0.0) == 0.0 and checkpoint_momentum(1.0) == 1.0


def test_checkpoint_momentum_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        checkpoint_momentum(1.5)
    with pytest.raises(TypeError, match="number"):
        checkpoint_momentum("0.1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="convention"):
        checkpoint_momentum(0.1, convention="keras")


def _block(momentum: float | None = 0.1) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(4, 6),
        nn.BatchNorm1d(6, momentum=momentum),
        nn.ReLU(),
        nn.Linear(6, 6),
        nn.BatchNorm1d(6, momentum=momentum),
    )


def _train(block: nn.Module, steps: int, *, ckpt: bool) -> None:
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(16, 4, generator=g, requires_grad=True)
        out = checkpoint(block, x, use_reentrant=False) if ckpt else block(x)
        out.square().sum().backward()


@pytest.mark.parametrize("use_fix", [False, True])
def test_prepared_block_matches_the_uncheckpointed_running_stats(use_fix: bool) -> None:
    ref, ck = _block(), _block()
    if use_fix:
        changed = prepare_batchnorm_for_checkpointing(ck)
        assert set(changed) == {"1", "4"} and changed["1"] == (0.1, pytest.approx(1 - math.sqrt(0.9)))
    _train(ref, 5, ckpt=False)
    _train(ck, 5, ckpt=True)
    for i in (1, 4):
        same = torch.allclose(ref[i].running_mean, ck[i].running_mean, atol=1e-6) and torch.allclose(
            ref[i].running_var, ck[i].running_var, atol=1e-6
        )
        assert same is use_fix
        assert int(ck[i].num_batches_tracked) == 10  # counted twice either way
        assert int(ref[i].num_batches_tracked) == 5


def test_momentum_none_needs_no_fix_and_is_left_alone() -> None:
    ref, ck = _block(None), _block(None)
    assert prepare_batchnorm_for_checkpointing(ck) == {}
    _train(ref, 4, ckpt=False)
    _train(ck, 4, ckpt=True)
    assert torch.allclose(ref[1].running_mean, ck[1].running_mean, atol=1e-6)
    assert torch.allclose(ref[1].running_var, ck[1].running_var, atol=1e-6)


def test_preparing_twice_is_refused_and_untracked_layers_are_skipped() -> None:
    block = nn.Sequential(nn.BatchNorm2d(3), nn.BatchNorm1d(3, track_running_stats=False))
    assert list(prepare_batchnorm_for_checkpointing(block)) == ["0"]
    assert getattr(block[0], PREPARED_ATTR) == 0.1
    with pytest.raises(ValueError, match="already prepared"):
        prepare_batchnorm_for_checkpointing(block)
    bn = nn.BatchNorm1d(2)
    assert list(prepare_batchnorm_for_checkpointing(bn)) == ["BatchNorm1d"]  # a bare layer works too
    with pytest.raises(TypeError, match="nn.Module"):
        prepare_batchnorm_for_checkpointing("bn")  # type: ignore[arg-type]
