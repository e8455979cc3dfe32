"""Argument checks shared by every module: one wording for "must be an int", "must be a number".

Python counts ``True`` and ``False`` as the ints 1 and 0 (``isinstance(True, int)`` is True); the
course never accepts a bool where a count or a number is asked for, so every check here rejects
bools. The ``check_*`` functions raise what ``CONTRIBUTING.md`` asks of a public function: a
``TypeError`` naming the argument, what it must be and what it got, or a ``ValueError`` naming the
allowed range and the value. They return the value, so a caller can check and bind in one line.

>>> check_int("depth", 3, minimum=1)
3
>>> check_int("depth", True)
Traceback (most recent call last):
    ...
TypeError: depth must be an int, got bool
>>> check_int("depth", 0, minimum=1)
Traceback (most recent call last):
    ...
ValueError: depth must be >= 1, got 0
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeGuard

__all__ = ["is_int", "is_number", "check_int", "check_number", "check_bool", "check_instance", "check_items"]


def is_int(value: object) -> TypeGuard[int]:
    """True for an ``int`` that is not a ``bool``.

    >>> is_int(3), is_int(True), is_int(3.0)
    (True, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """True for an ``int`` or a ``float`` that is not a ``bool``.

    >>> is_number(2), is_number(0.5), is_number(False), is_number("1")
    (True, True, False, False)
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_int(
    name: str,
    value: object,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    what: str = "an int",
) -> int:
    """``value`` if it is an int (not a bool) in ``[minimum, maximum]`` (either bound optional).

    ``TypeError``: ``"<name> must be <what>, got <type>"``; ``ValueError``: ``"<name> must be >= 1,
    got 0"`` (or ``<= maximum``, or ``in [minimum, maximum]`` when both bounds are given).

    >>> check_int("port", 70000, minimum=1, maximum=65535)
    Traceback (most recent call last):
        ...
    ValueError: port must be in [1, 65535], got 70000
    >>> check_int("seed", "0", what="an int or None")
    Traceback (most recent call last):
        ...
    TypeError: seed must be an int or None, got str
    """
    if not is_int(value):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")
    too_small = minimum is not None and value < minimum
    too_large = maximum is not None and value > maximum
    if too_small or too_large:
        if minimum is not None and maximum is not None:
            raise ValueError(f"{name} must be in [{minimum}, {maximum}], got {value}")
        bound = f">= {minimum}" if too_small else f"<= {maximum}"
        raise ValueError(f"{name} must be {bound}, got {value}")
    return value


def check_number(name: str, value: object, *, finite: bool = False, what: str = "a number") -> float:
    """``value`` (unchanged: an int stays an int) if it is an int or a float, not a bool.

    ``finite=True`` also rejects inf and NaN (``ValueError``). Ranges differ too much between
    callers (open, closed, "positive", "a probability") to be a parameter: check them after this.

    >>> check_number("momentum", 0.9)
    0.9
    >>> check_number("momentum", "0.9")
    Traceback (most recent call last):
        ...
    TypeError: momentum must be a number, got str
    >>> check_number("init_scale", float("inf"), finite=True)
    Traceback (most recent call last):
        ...
    ValueError: init_scale must be finite, got inf
    """
    if not is_number(value):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")
    if finite and not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return value


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is ``True`` or ``False`` (not ``1``, ``0`` or ``None``).

    >>> check_bool("bias", 1)
    Traceback (most recent call last):
        ...
    TypeError: bias must be a bool, got int
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_instance(name: str, value: object, kind: type | tuple[type, ...], what: str | None = None) -> object:
    """``value`` if it is an instance of ``kind``; else a ``TypeError`` naming ``name`` and ``what`` it must be.

    >>> check_instance("label", 2.5, str, "a string")
    Traceback (most recent call last):
        ...
    TypeError: label must be a string, got float
    """
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise TypeError(f"{name} must be {what or _kind_name(kind)}, got bool")
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be {what or _kind_name(kind)}, got {type(value).__name__}")
    return value


def check_items(
    name: str, value: object, kind: type | tuple[type, ...], what: str, *, minimum: int | None = None
) -> list:
    """``value`` as a list if it is a sequence (not a string or a tensor) of ``kind``; else a ``TypeError``.

    Ints are checked as :func:`check_int` does (no bools). ``minimum``: a ``ValueError`` for an item below it.

    >>> check_items("numels", [3, 4], int, "a list of ints")
    [3, 4]
    >>> check_items("numels", [3, "4"], int, "a list of ints")
    Traceback (most recent call last):
        ...
    TypeError: numels must be a list of ints; item 1 is str
    >>> check_items("numels", [3, -4], int, "a list of ints", minimum=0)
    Traceback (most recent call last):
        ...
    ValueError: numels must be >= 0 each; item 1 is -4
    """
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise TypeError(f"{name} must be {what}, got {type(value).__name__}")
    kinds = kind if isinstance(kind, tuple) else (kind,)
    for i, item in enumerate(value):
        if not isinstance(item, kinds) or (isinstance(item, bool) and bool not in kinds):
            raise TypeError(f"{name} must be {what}; item {i} is {type(item).__name__}")
        if minimum is not None and isinstance(item, (int, float)) and item < minimum:
            raise ValueError(f"{name} must be >= {minimum} each; item {i} is {item}")
    return list(value)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    return " or ".join(f"a {k.__name__}" for k in kinds)
