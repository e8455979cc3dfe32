"""Collect what child processes write to the inherited stderr (file descriptor 2)."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator

__all__ = ["child_stderr"]


@contextlib.contextmanager
def child_stderr() -> Iterator[list[str]]:
    """Collect what child processes write to their inherited stderr (file descriptor 2).

    ``torch.multiprocessing`` children write their dying words to the parent's file
    descriptor 2, which in a notebook is the kernel's log, not the cell. Inside this block
    descriptor 2 points to a temporary file; on exit it is restored and the list yielded
    receives the collected text (one string)::

        with child_stderr() as err:
            ...  # start processes
        print(err[0])
    """
    collected: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield collected
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            collected.append(tmp.read().decode("utf-8", "replace"))
