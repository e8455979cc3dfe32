"""Gradient checkpointing helpers reused across the course.

* :func:`deep_chain` builds the deep, narrow model used to measure how activation memory grows
  with depth: ``depth`` blocks (``Linear`` + activation) as the *direct children* of one
  ``nn.Sequential``, so ``checkpoint_sequential`` counts blocks, not ``Linear`` and ``Tanh``
  separately.
* :func:`checkpoint_momentum` and :func:`prepare_batchnorm_for_checkpointing` fix the BatchNorm
  pitfall: a checkpointed block runs its forward twice in a training step (once in forward,
  once to recompute during backward), and a ``BatchNorm`` layer in training mode updates its
  running statistics each time. With PyTorch's convention
  ``running = (1 - momentum) * running + momentum * batch_stat`` two updates with momentum
  ``m'`` equal one update with ``m`` when ``(1 - m')**2 == 1 - m``, i.e. ``m' = 1 - sqrt(1 - m)``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .validation import check_bool, check_int, check_number

__all__ = ["deep_chain", "checkpoint_momentum", "prepare_batchnorm_for_checkpointing", "PREPARED_ATTR"]

_ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU, "sigmoid": nn.Sigmoid}

#: attribute set on a BatchNorm layer once its momentum has been corrected (guards against doing it twice)
PREPARED_ATTR = "_course_checkpoint_momentum_from"


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

    ``convention="pytorch"``: ``momentum`` weighs the *new* batch statistic
    (``running = (1 - m) * running + m * x``, PyTorch's ``BatchNorm(momentum=0.1)``);
    the answer is ``1 - sqrt(1 - m)`` (0.0513 for 0.1).
    ``convention="old-weight"``: ``momentum`` weighs the *old* running value
    (``running = m * running + (1 - m) * x``, as in the seed post and Keras, 0.9); the answer is
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


def prepare_batchnorm_for_checkpointing(module: nn.Module) -> dict[str, tuple[float, float]]:
    """Correct the momentum of every BatchNorm layer in ``module`` (in place) for checkpointing.

    Call it on the module (block) you wrap in ``torch.utils.checkpoint``: each of its
    BatchNorm layers will then see two updates per training step that together equal the
    single update of the layer without checkpointing. Returns ``{name: (old, new)}`` for the
    layers changed. Layers with ``momentum=None`` (a cumulative average) are left unchanged: a
    batch counted twice leaves that average the same; only ``num_batches_tracked`` doubles.
    Layers without running statistics are skipped. Preparing a layer twice raises ``ValueError``.

    The fix assumes the block is recomputed exactly once per step: a forward that is not
    followed by a backward through the block (e.g. in evaluation with ``model.train()`` still
    on) gives the layer only the smaller update.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    layers = [(n, m) for n, m in module.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    already = [n or type(m).__name__ for n, m in layers if hasattr(m, PREPARED_ATTR)]
    if already:
        raise ValueError(
            f"BatchNorm layer(s) {already} were already prepared for checkpointing; "
            "preparing twice would correct the momentum twice"
        )
    changed: dict[str, tuple[float, float]] = {}
    for name, bn in layers:
        if not bn.track_running_stats or bn.momentum is None:
            continue
        old = float(bn.momentum)
        bn.momentum = checkpoint_momentum(old)
        setattr(bn, PREPARED_ATTR, old)
        changed[name or type(bn).__name__] = (old, bn.momentum)
    return changed
