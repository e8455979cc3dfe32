"""Saved-tensor accounting: how many bytes autograd keeps alive for the backward pass.

Every tensor that an operation saves for backward (``ctx.save_for_backward`` in a custom
``autograd.Function``, or the inputs ``MulBackward0`` needs) passes through
``torch.autograd.graph.saved_tensors_hooks``. :class:`SavedTensorMeter` listens there and adds
up the bytes, counting each underlying storage once: a tensor saved twice, or two views
of one storage, cost memory once.

:func:`saved_cast_copy_bytes` listens at the same place for one kind of saved tensor: the
low-precision copies of the weights that ``torch.autocast`` makes (notebook 07).
:func:`format_bytes` prints a byte count for a person.

One storage is one ``(device, address)`` key (:func:`_storage_key`); :mod:`course_lib.memory`
counts parameters, gradients and optimizer state with the same key.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import torch
from torch.autograd.graph import saved_tensors_hooks

from .validation import check_number

__all__ = ["SavedTensorMeter", "SavedRecord", "saved_cast_copy_bytes", "format_bytes"]


@dataclass(frozen=True)
class SavedRecord:
    """One tensor that autograd packed for backward."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    nbytes: int  # bytes of this tensor's elements (numel * element_size)
    storage_nbytes: int  # bytes of the whole storage it views
    is_parameter: bool  # an nn.Parameter or a tensor listed in ``exclude``
    new_storage: bool  # first time this storage was seen by the meter


def _storage_key(t: torch.Tensor) -> tuple[str, int]:
    """The memory behind ``t``: its device and its storage's address (every view of a storage shares it)."""
    return (str(t.device), t.untyped_storage().data_ptr())


def _is_parameter(t: torch.Tensor) -> bool:
    # autograd often saves a view of a weight (``weight.t()`` for a Linear layer): follow ``_base``.
    base = t._base if t._base is not None else t
    return isinstance(t, torch.nn.Parameter) or isinstance(base, torch.nn.Parameter)


@dataclass
class SavedTensorMeter:
    """Context manager that records every tensor autograd saves for backward.

    >>> x = torch.ones(1000, requires_grad=True)
    >>> with SavedTensorMeter() as m:
    ...     y = (x * x).sum()
    >>> m.bytes            # x is saved twice for MulBackward0, but counted once
    4000

    Parameters
    ----------
    exclude:
        Tensors (typically ``model.parameters()``) whose storage is not counted in
        :attr:`bytes`, so that :attr:`bytes` measures activations only. Their bytes are still
        reported in :attr:`excluded_bytes`.
    """

    exclude: Iterable[torch.Tensor] | None = None
    records: list[SavedRecord] = field(default_factory=list, init=False)
    _seen: set[tuple[str, int]] = field(default_factory=set, init=False, repr=False)
    _excluded: set[tuple[str, int]] = field(default_factory=set, init=False, repr=False)
    _hooks: Any = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.exclude is not None:
            if isinstance(self.exclude, torch.Tensor):
                raise TypeError("exclude takes an iterable of tensors, e.g. model.parameters(), not one tensor")
            tensors = list(self.exclude)
            for t in tensors:
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"exclude must contain tensors only, got {type(t).__name__}")
            self._excluded = {_storage_key(t) for t in tensors}

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        key = _storage_key(t)
        new = key not in self._seen
        self._seen.add(key)
        self.records.append(
            SavedRecord(
                shape=tuple(t.shape),
                dtype=t.dtype,
                nbytes=t.numel() * t.element_size(),
                storage_nbytes=t.untyped_storage().nbytes(),
                is_parameter=_is_parameter(t) or key in self._excluded,
                new_storage=new,
            )
        )
        return t

    @staticmethod
    def _unpack(t: torch.Tensor) -> torch.Tensor:
        return t

    def __enter__(self) -> SavedTensorMeter:
        if self._hooks is not None:
            raise RuntimeError("this SavedTensorMeter is already in use; create a new one")
        self.records.clear()
        self._seen.clear()
        self._hooks = saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._hooks.__exit__(exc_type, exc, tb)
        self._hooks = None

    # ---- results -------------------------------------------------------------------------
    @property
    def count(self) -> int:
        """How many times autograd packed a tensor (a tensor saved twice counts twice)."""
        return len(self.records)

    @property
    def bytes(self) -> int:
        """Bytes kept for backward, each storage counted once, parameters/``exclude`` left out."""
        return sum(r.storage_nbytes for r in self.records if r.new_storage and not r.is_parameter)

    @property
    def excluded_bytes(self) -> int:
        """Bytes of saved parameters (and ``exclude`` tensors), each storage counted once."""
        return sum(r.storage_nbytes for r in self.records if r.new_storage and r.is_parameter)

    def summary(self) -> str:
        """A short, deterministic text report for a notebook cell."""
        return (
            f"{self.count} tensors saved for backward: {format_bytes(self.bytes)} of activations"
            f" (+ {format_bytes(self.excluded_bytes)} of saved parameters, shared storage counted once)"
        )


def saved_cast_copy_bytes(run: Callable[[], Any], params: Iterable[torch.Tensor]) -> int:
    """Call ``run()`` and return the bytes autograd saves for backward that are dtype-cast copies of ``params``.

    Under ``torch.autocast`` a matmul casts its fp32 weight to the low-precision dtype; that copy is
    a new tensor (not the parameter), and autograd saves it for backward. A saved-tensor count that
    leaves out the parameters (:class:`SavedTensorMeter` with ``exclude``) still includes these
    copies; this function measures them, each storage once, so they can be reported apart from the
    activations.
    """
    if not callable(run):
        raise TypeError(f"run must be a callable that runs the forward pass, got {type(run).__name__}")
    if isinstance(params, torch.Tensor):
        raise TypeError("params takes an iterable of tensors, e.g. model.parameters(), not one tensor")
    wanted = set()
    for p in params:
        if not isinstance(p, torch.Tensor):
            raise TypeError(f"params must contain tensors only, got {type(p).__name__}")
        wanted.add(id(p))
    seen: set[tuple[str, int]] = set()
    total = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        base = t._base if t._base is not None else t
        fn = base.grad_fn  # a cast copy is made by ToCopyBackward0 from the parameter (an AccumulateGrad leaf)
        if fn is not None and type(fn).__name__ == "ToCopyBackward0" and fn.next_functions:
            source = getattr(fn.next_functions[0][0], "variable", None)
            key = _storage_key(t)
            if source is not None and id(source) in wanted and key not in seen:
                seen.add(key)
                total += t.untyped_storage().nbytes()
        return t

    with saved_tensors_hooks(pack, lambda t: t):
        run()
    return total


def format_bytes(n: int | float) -> str:
    """``1536 -> '1.50 KiB'``: binary units, 3 significant digits, exact below 1 KiB."""
    check_number("n", n, what="a number of bytes")
    if n < 0:
        raise ValueError(f"a number of bytes cannot be negative, got {n}")
    if n < 1024:
        return f"{int(n)} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        n /= 1024
        if n < 1024 or unit == "TiB":
            break
    return f"{n:.3g} {unit}" if n >= 100 else f"{n:.2f} {unit}"
