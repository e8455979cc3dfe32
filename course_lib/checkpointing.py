"""Gradient checkpointing helpers reused across the course.

* :func:`deep_chain` builds the deep, narrow model used to measure how activation memory grows
  with depth: ``depth`` blocks (``Linear`` + activation) as the *direct children* of one
  ``nn.Sequential``, so ``checkpoint_sequential`` counts blocks, not ``Linear`` and ``Tanh``
  separately.
* :func:`frozen_bn_stats`, :func:`bn_safe_context_fn` and :func:`checkpoint_bn_safe` fix the
  BatchNorm pitfall. A checkpointed block runs its forward twice in an eager training step (once
  in forward, once to recompute during backward), and a ``BatchNorm`` layer in training mode
  updates its running statistics each time. The robust fix leaves the statistics alone while the
  block is *recomputed*: ``checkpoint(..., context_fn=...)`` runs the recomputation inside
  :func:`frozen_bn_stats`, so the statistics see exactly one update per step, as without
  checkpointing, and the module is never changed for good. Under ``torch.compile`` the
  recomputation is decided by AOTAutograd, which updates the statistics once already, and
  ``context_fn`` must return dispatch modes: :func:`checkpoint_bn_safe` passes no guard there.
* :func:`checkpoint_momentum` is the eager-mode algebra behind an older fix (change the momentum so
  that two updates equal one): exact only when the block is recomputed exactly once per step, in
  eager mode; kept to explain the problem, not to fix it.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .torch_private import TorchDispatchMode
from .validation import check_bool, check_int, check_number

__all__ = [
    "deep_chain",
    "checkpoint_momentum",
    "frozen_bn_stats",
    "bn_safe_context_fn",
    "checkpoint_bn_safe",
    "OpCounter",
]

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}


MAX_CHAIN_PARAMETERS = 2**31  # 8 GiB of fp32 weights: past it, a chain is a typo, not a lesson


def deep_chain(
    depth: int, width: int, *, activation: str = "tanh", bias: bool = True, seed: int | None = 0
) -> nn.Sequential:
    """``depth`` blocks ``Sequential(Linear(width, width), activation)`` in one ``nn.Sequential``.

    Each block keeps one ``batch x width`` activation for backward (the activation's output,
    which is also the next ``Linear``'s input), so without checkpointing the activation memory
    of a step grows by exactly one such tensor per block. ``seed`` (``None``: do not seed)
    makes the weights reproducible without touching the global random generator.

    >>> m = deep_chain(4, 8)
    >>> len(m), type(m[0][1]).__name__
    (4, 'Tanh')
    """
    check_int("depth", depth, minimum=1)
    check_int("width", width, minimum=1)
    if depth * width * (width + 1) > MAX_CHAIN_PARAMETERS:
        raise ValueError(
            f"depth x width^2 must stay under {MAX_CHAIN_PARAMETERS:,} parameters (a model for one CPU), "
            f"got depth={depth}, width={width}"
        )
    if activation not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {activation!r}")
    check_bool("bias", bias)
    if seed is not None:
        check_int("seed", seed, minimum=0, what="an int or None")
    state = torch.random.get_rng_state()
    try:
        if seed is not None:
            torch.manual_seed(seed)
        return nn.Sequential(
            *[nn.Sequential(nn.Linear(width, width, bias=bias), _ACTIVATIONS[activation]()) for _ in range(depth)]
        )
    finally:
        if seed is not None:
            torch.random.set_rng_state(state)


def checkpoint_momentum(momentum: float, *, convention: str = "pytorch") -> float:
    """The momentum that makes two running-statistics updates equal one update with ``momentum``.

    Eager mode only, and only when the block is recomputed exactly once per step: the algebra
    that explains the BatchNorm pitfall. To fix it, use :func:`checkpoint_bn_safe`.

    ``convention="pytorch"``: ``momentum`` weighs the *new* batch statistic
    (``running = (1 - m) * running + m * x``, PyTorch's ``BatchNorm(momentum=0.1)``);
    the answer is ``1 - sqrt(1 - m)`` (0.0513 for 0.1).
    ``convention="old-weight"``: ``momentum`` weighs the *old* running value
    (``running = m * running + (1 - m) * x``, as in the Tensor post and Keras, 0.9); the answer is
    ``sqrt(m)`` (0.9487 for 0.9). Both describe the same update: ``0.1`` in one is ``0.9`` in the other.

    >>> round(checkpoint_momentum(0.1), 4), round(checkpoint_momentum(0.9, convention="old-weight"), 4)
    (0.0513, 0.9487)
    """
    check_number("momentum", momentum)
    if not 0.0 <= momentum <= 1.0:
        raise ValueError(f"momentum must be in [0, 1], got {momentum}")
    if convention == "pytorch":
        return 1.0 - math.sqrt(1.0 - momentum)
    if convention == "old-weight":
        return math.sqrt(momentum)
    raise ValueError(f"convention must be 'pytorch' or 'old-weight', got {convention!r}")


def _check_module(module: Any) -> None:
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")


def _tracking_norm_layers(module: nn.Module) -> list[nn.Module]:
    """Layers of ``module`` that keep running statistics: BatchNorm (any dimension, lazy or
    synchronised) and InstanceNorm with ``track_running_stats=True``; found by what they hold, not
    by a private base class."""
    return [
        m
        for m in module.modules()
        if getattr(m, "track_running_stats", False)
        and isinstance(getattr(m, "running_mean", None), torch.Tensor)
        and hasattr(m, "momentum")
    ]


def frozen_bn_stats(module: nn.Module) -> contextlib.AbstractContextManager[int]:
    """While inside, ``module``'s BatchNorm layers normalise as usual but update no running statistic.

    Each layer that tracks running statistics gets ``momentum = 0`` (the update
    ``running = (1 - 0) * running + 0 * batch_stat`` leaves ``running_mean`` and ``running_var``
    bit for bit unchanged) and no ``num_batches_tracked`` counter (set to ``None``, so it is not
    incremented); both are restored on exit, even after an exception. The output is unchanged: in
    training mode BatchNorm normalises with the batch's own statistics anyway. Yields the number
    of layers frozen. Meant as the *recompute* context of a checkpoint (:func:`bn_safe_context_fn`).

    >>> bn = nn.BatchNorm1d(3)
    >>> with frozen_bn_stats(bn) as n:
    ...     _ = bn(torch.randn(4, 3))
    >>> n, int(bn.num_batches_tracked), bn.running_mean.tolist(), bn.momentum
    (1, 0, [0.0, 0.0, 0.0], 0.1)
    """
    _check_module(module)
    return _frozen(module)


@contextlib.contextmanager
def _frozen(module: nn.Module) -> Iterator[int]:
    layers = _tracking_norm_layers(module)
    saved = [(m.momentum, m.num_batches_tracked) for m in layers]
    try:
        for m in layers:
            setattr(m, "momentum", 0.0)  # noqa: B010 (an attribute nn.Module does not declare)
            setattr(m, "num_batches_tracked", None)  # noqa: B010
        yield len(layers)
    finally:
        for m, (momentum, counter) in zip(layers, saved):
            setattr(m, "momentum", momentum)  # noqa: B010
            setattr(m, "num_batches_tracked", counter)  # noqa: B010


def _guard_contexts(
    module: nn.Module,
) -> tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]:
    return contextlib.nullcontext(), frozen_bn_stats(module)


def bn_safe_context_fn(
    module: nn.Module,
) -> Callable[[], tuple[contextlib.AbstractContextManager[Any], contextlib.AbstractContextManager[Any]]]:
    """A ``context_fn`` for ``torch.utils.checkpoint.checkpoint``: nothing around the forward, and
    :func:`frozen_bn_stats` (``module``) around the recomputation.

    ``checkpoint(block, x, use_reentrant=False, context_fn=bn_safe_context_fn(block))`` then updates
    the running statistics once per step, in the forward, exactly as ``block(x)`` does. Eager mode
    only: under ``torch.compile`` ``context_fn`` must return two ``TorchDispatchMode`` objects
    (use :func:`checkpoint_bn_safe`, which handles both).
    """
    _check_module(module)
    return functools.partial(_guard_contexts, module)


def checkpoint_bn_safe(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``checkpoint(module, *args, use_reentrant=False)`` whose running statistics match ``module(*args)``.

    In eager mode the recomputation runs inside :func:`frozen_bn_stats`; under ``torch.compile``
    (``torch.compiler.is_compiling()``) AOTAutograd recomputes only what backward needs and never
    replays the statistics update, so no guard is needed (and a ``context_fn`` that is not a pair
    of dispatch modes would fail). Other keyword arguments (``preserve_rng_state``, ``determinism_check``)
    go to ``checkpoint``; ``use_reentrant=True`` and a ``context_fn`` of your own are refused: the
    reentrant form has no ``context_fn`` hook.
    """
    _check_module(module)
    if kwargs.pop("use_reentrant", False) is not False:
        raise ValueError("checkpoint_bn_safe needs use_reentrant=False: the reentrant form has no context_fn hook")
    if "context_fn" in kwargs:
        raise ValueError("checkpoint_bn_safe sets context_fn itself; pass no context_fn")
    if torch.compiler.is_compiling():
        return checkpoint(module, *args, use_reentrant=False, **kwargs)
    return checkpoint(module, *args, use_reentrant=False, context_fn=bn_safe_context_fn(module), **kwargs)


class OpCounter(TorchDispatchMode):
    """Counts the ATen operations that really run while it is active (``counts["aten.addmm"]``).

    A ``TorchDispatchMode`` sees every operation after autograd, so inside a backward it sees the
    recomputation of a checkpoint as well as the backward's own operations. Unlike the profiler,
    it does not count an operation that a selective checkpoint answers from its cache: that one
    never reaches the modes below it. Overload names are dropped (``aten.addmm.default`` counts as
    ``aten.addmm``).

    >>> with OpCounter() as ops:
    ...     _ = torch.ones(2, 2) @ torch.ones(2, 2)
    >>> ops.counts["aten.mm"]
    1
    """

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = str(func.overloadpacket)
        self.counts[name] = self.counts.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

    def count(self, *names: str) -> int:
        """Total count of the named operations (``"aten.mm"``, ``"aten.addmm"``, ...)."""
        return sum(self.counts.get(n, 0) for n in names)
