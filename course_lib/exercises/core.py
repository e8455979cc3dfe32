"""The exercise-check API shared by every notebook.

A check function (``check_<something>``) takes the learner's answer and returns a
:class:`CheckResult`, which a notebook cell displays as one line:

* ``✅ Correct: ...`` when the answer is right,
* ``⏳ Not done yet: ...`` when the learner has not started (``...``, ``None``, or a function
  that raises ``NotImplementedError``) — never a crash of the notebook run,
* ``❌ Not quite: <hint>`` when the answer is wrong, with a hint that helps.

Write a check with the :func:`exercise` decorator: inside it, ``raise NotDone`` for "not done
yet" and ``raise Wrong("hint")`` for a wrong answer; returning a string means correct.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

__all__ = [
    "CheckResult",
    "NotDone",
    "Wrong",
    "as_number",
    "call_learner",
    "dict_answer",
    "exercise",
    "grads_of",
    "is_placeholder",
]

Status = Literal["correct", "not done yet", "wrong"]
_ICONS = {"correct": "✅ Correct", "not done yet": "⏳ Not done yet", "wrong": "❌ Not quite"}


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one exercise check. Truthy only when correct."""

    exercise: str
    status: Status
    message: str

    def __bool__(self) -> bool:
        return self.status == "correct"

    def __repr__(self) -> str:
        return f"{_ICONS[self.status]} [{self.exercise}]: {self.message}"

    __str__ = __repr__


class NotDone(Exception):
    """Raised inside a check when the learner has not attempted the exercise yet."""


class Wrong(Exception):
    """Raised inside a check with a hint when the answer is wrong."""


def is_placeholder(value: Any) -> bool:
    """True for the values a notebook hands out as blanks: ``...`` and ``None``."""
    return value is ... or value is None


def call_learner(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a learner's function, turning a placeholder or an exception into a friendly result.

    ``NotImplementedError`` (the blank a notebook gives out) and a ``None``/``...`` return value
    become :class:`NotDone`; any other exception becomes :class:`Wrong` with its message.
    """
    if is_placeholder(fn):
        raise NotDone
    if not callable(fn):
        raise Wrong(f"expected a function, got {type(fn).__name__}")
    try:
        result = fn(*args, **kwargs)
    except NotImplementedError:
        raise NotDone from None
    except Exception as e:  # the learner's code failed: explain, do not crash the notebook
        raise Wrong(f"your code raised {type(e).__name__}: {e}") from None
    if is_placeholder(result):
        raise NotDone
    return result


def as_number(value: Any, call: str, hint: str = "") -> float:
    """A learner's return value as a float (a 0-d tensor counts), or :class:`Wrong` naming the call.

    >>> import torch
    >>> as_number(torch.tensor(2.5), "f(1)")
    2.5
    """
    if isinstance(value, (bool, str, bytes)):  # float("0.5") works, but a string is not an answer
        raise Wrong(f"{call} should return a number, got {value!r}{hint}")
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError):  # RuntimeError: a tensor with more than one element
        raise Wrong(f"{call} should return a number, got {value!r}{hint}") from None


def dict_answer(answer: Any, keys: Iterable[Any], *, name: str) -> dict:
    """A learner's ``{key: answer}`` dict, checked for shape: :class:`NotDone` while it is blank
    (``...``, or every value still ``...``), :class:`Wrong` when it is not a dict or misses a key."""
    keys = list(keys)
    if is_placeholder(answer):
        raise NotDone
    if not isinstance(answer, dict):
        raise Wrong(
            f"`{name}` should be a dict with one answer for each of {', '.join(map(repr, keys))}; "
            f"got {type(answer).__name__}"
        )
    if answer and all(is_placeholder(v) for v in answer.values()):
        raise NotDone
    missing = [k for k in keys if k not in answer]
    if missing:
        raise Wrong(f"no answer for: {', '.join(map(repr, missing))} (keep the keys as given)")
    return answer


def grads_of(params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of the ``.grad`` of ``params``, after a backward the check ran itself (so each one exists)."""
    grads = []
    for p in params:
        if p.grad is None:
            raise RuntimeError("the check's own backward left a tensor without .grad: a bug in the check")
        grads.append(p.grad.clone())
    return grads


def exercise(name: str, todo: str) -> Callable[[Callable[..., str]], Callable[..., CheckResult]]:
    """Decorator turning a check body into a function that always returns a :class:`CheckResult`.

    ``name`` labels the exercise; ``todo`` is what "not done yet" tells the learner to do.
    The body returns the success message, raises :class:`NotDone` or :class:`Wrong`.
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError("exercise name must be a non-empty string")
    if not isinstance(todo, str) or not todo.strip():
        raise ValueError("todo must be a non-empty string saying what the learner should do")

    def decorate(body: Callable[..., str]) -> Callable[..., CheckResult]:
        @functools.wraps(body)
        def check(*args: Any, **kwargs: Any) -> CheckResult:
            if args and all(is_placeholder(a) for a in args):
                return CheckResult(name, "not done yet", todo)
            try:
                message = body(*args, **kwargs)
            except NotDone:
                return CheckResult(name, "not done yet", todo)
            except Wrong as w:
                return CheckResult(name, "wrong", str(w))
            return CheckResult(name, "correct", message)

        return check

    return decorate
