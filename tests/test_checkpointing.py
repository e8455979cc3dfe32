from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from course_lib.checkpointing import (
    bn_safe_context_fn,
    checkpoint_bn_safe,
    checkpoint_momentum,
    deep_chain,
    frozen_bn_stats,
)


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


def _state(block: nn.Module) -> list[torch.Tensor]:
    return [b.clone() for b in block.buffers()]


def _same_state(a: nn.Module, b: nn.Module) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a.buffers(), b.buffers()))


def test_plain_checkpoint_updates_the_statistics_twice() -> None:
    ref, ck = _block(), _block()
    _train(ref, 3, ckpt=False)
    _train(ck, 3, ckpt=True)
    assert int(ck[1].num_batches_tracked) == 6 and int(ref[1].num_batches_tracked) == 3
    assert not torch.allclose(ref[1].running_mean, ck[1].running_mean)


@pytest.mark.parametrize("momentum", [0.1, None])
def test_the_guard_matches_the_uncheckpointed_block_exactly(momentum: float | None) -> None:
    ref, by_hand, lib = _block(momentum), _block(momentum), _block(momentum)
    g = torch.Generator().manual_seed(1)
    for _ in range(10):
        x = torch.randn(16, 4, generator=g, requires_grad=True)
        ref(x).square().sum().backward()
        checkpoint(by_hand, x, use_reentrant=False, context_fn=bn_safe_context_fn(by_hand)).square().sum().backward()
        checkpoint_bn_safe(lib, x).square().sum().backward()
    assert _same_state(ref, by_hand) and _same_state(ref, lib)  # running mean, var and counters, bit for bit
    assert int(lib[1].num_batches_tracked) == 10
    for a, b in zip(ref.parameters(), lib.parameters()):
        assert torch.allclose(a.grad, b.grad, atol=1e-6)
    assert lib[1].momentum == momentum  # the module is left as it was


@pytest.mark.slow  # torch.compile: seconds of tracing and compiling
def test_the_guard_is_exact_under_torch_compile() -> None:
    ref, ck = _block(), _block()
    step = torch.compile(lambda t: checkpoint_bn_safe(ck, t), backend="aot_eager")
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(16, 4, generator=g, requires_grad=True)
        ref(x).square().sum().backward()
        step(x).square().sum().backward()
    assert int(ck[1].num_batches_tracked) == 4
    assert torch.allclose(ref[1].running_mean, ck[1].running_mean, atol=1e-6)
    assert torch.allclose(ref[1].running_var, ck[1].running_var, atol=1e-6)


def test_frozen_bn_stats_freezes_and_restores() -> None:
    block = nn.Sequential(
        nn.BatchNorm1d(3), nn.InstanceNorm1d(3, track_running_stats=True), nn.BatchNorm1d(3, track_running_stats=False)
    )
    before = _state(block)
    x = torch.randn(4, 3, 5)
    with frozen_bn_stats(nn.Sequential(block[0])) as n0:
        block[0](x)
    with frozen_bn_stats(block) as n:
        block[1](x)
        assert block[0].momentum == 0.0 and block[0].num_batches_tracked is None
    assert (n0, n) == (1, 2)  # the untracked layer is left out
    assert all(torch.equal(a, b) for a, b in zip(before, _state(block)))
    assert block[0].momentum == 0.1 and int(block[0].num_batches_tracked) == 0
    with pytest.raises(ZeroDivisionError), frozen_bn_stats(block):
        raise ZeroDivisionError
    assert block[0].momentum == 0.1 and block[0].num_batches_tracked is not None  # restored after an error


def test_the_guard_does_not_change_the_output_or_eval_mode() -> None:
    block = _block().eval()
    x = torch.randn(8, 4)
    with frozen_bn_stats(block):
        frozen = block(x)
    assert torch.equal(frozen, block(x))


def test_the_helpers_reject_bad_arguments() -> None:
    for fn in (frozen_bn_stats, bn_safe_context_fn, checkpoint_bn_safe):
        with pytest.raises(TypeError, match="nn.Module"):
            fn("bn")  # type: ignore[operator]
    block, x = _block(), torch.randn(4, 4, requires_grad=True)
    with pytest.raises(ValueError, match="use_reentrant=False"):
        checkpoint_bn_safe(block, x, use_reentrant=True)
    with pytest.raises(ValueError, match="context_fn"):
        checkpoint_bn_safe(block, x, context_fn=bn_safe_context_fn(block))
    assert int(block[1].num_batches_tracked) == 0  # nothing ran
