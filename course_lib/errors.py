"""``expect_error``: show an error on purpose, and fail loudly if it does not happen.

nbval's ``NBVAL_RAISES_EXCEPTION`` marker passes a cell that raises nothing, so a notebook
that demonstrates an error with it can silently stop demonstrating anything. This context
manager prints the error for the learner and raises ``AssertionError`` when no error (or
the wrong one) occurs, which fails the notebook run.
"""

from __future__ import annotations

import re
from types import TracebackType

from .validation import check_bool

__all__ = ["expect_error", "ExpectedError"]


class ExpectedError:
    """The context manager returned by :func:`expect_error`; ``.error`` holds what was caught."""

    def __init__(self, exc_type: type[BaseException] | tuple[type[BaseException], ...], match: str | None, quiet: bool):
        types_ = exc_type if isinstance(exc_type, tuple) else (exc_type,)
        if not types_ or not all(isinstance(t, type) and issubclass(t, BaseException) for t in types_):
            raise TypeError(f"exc_type must be an exception class or a tuple of them, got {exc_type!r}")
        if match is not None and not isinstance(match, str):
            raise TypeError(f"match must be a regular expression string or None, got {type(match).__name__}")
        if match is not None:
            try:
                re.compile(match)
            except re.error as e:
                raise ValueError(f"match is not a valid regular expression: {e}") from e
        check_bool("quiet", quiet)
        self.exc_type = exc_type
        self.match = match
        self.quiet = quiet
        self.error: BaseException | None = None

    def __enter__(self) -> ExpectedError:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        names = (
            " or ".join(t.__name__ for t in self.exc_type)
            if isinstance(self.exc_type, tuple)
            else self.exc_type.__name__
        )
        if exc is None:
            raise AssertionError(f"expected {names} to be raised, but the code ran without error")
        if not isinstance(exc, self.exc_type):
            return False  # an unexpected error propagates unchanged, with its traceback
        message = str(exc)
        if self.match is not None and re.search(self.match, message) is None:
            raise AssertionError(
                f"{type(exc).__name__} was raised, but its message does not match {self.match!r}:\n{message}"
            ) from exc
        self.error = exc
        if not self.quiet:
            first = message.strip().splitlines()[0] if message.strip() else ""
            print(f"Raised as expected -> {type(exc).__name__}: {first}")
        return True  # swallow the expected error


def expect_error(
    exc_type: type[BaseException] | tuple[type[BaseException], ...],
    match: str | None = None,
    *,
    quiet: bool = False,
) -> ExpectedError:
    """Context manager for a cell that demonstrates an error.

    >>> with expect_error(ZeroDivisionError, match="division"):
    ...     1 / 0
    Raised as expected -> ZeroDivisionError: division by zero

    The first line of the message is printed (``quiet=True`` prints nothing). If nothing is
    raised, or the message does not match the regular expression ``match``, an
    ``AssertionError`` fails the run. An error of another type propagates unchanged.
    """
    return ExpectedError(exc_type, match, quiet)  # which checks the arguments
