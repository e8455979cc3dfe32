"""How a job's output reaches the cell: streamed as it comes, then grouped by rank when the job ends.

Internal API of :mod:`course_lib.launch`: the engine prints every line through :class:`Echo`.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from .checks import check_echo
from .results import LaunchResult

__all__ = ["Echo"]


def _in_kernel() -> bool:
    shell = sys.modules.get("IPython")
    if shell is None:
        return False
    try:
        ip = shell.get_ipython()
    except Exception:  # noqa: BLE001
        return False
    return ip is not None and type(ip).__name__ == "ZMQInteractiveShell"


class Echo:
    """Prints lines as they come; in a notebook, a live view that is replaced by the output grouped by rank.

    The live view is an ``ipywidgets.Output`` fed through the widget's comm channel, so what a
    notebook stores (and what nbval compares) is only the final, rank-ordered text printed to
    stdout when the job ends, whatever order the processes printed in.
    """

    def __init__(self, mode: str) -> None:
        check_echo(mode, "mode")
        self.mode = "kernel" if mode == "auto" and _in_kernel() else ("live" if mode == "auto" else mode)
        self.pending: list[str] = []
        self.view: Any = None
        self.last = 0.0
        if self.mode == "kernel":
            try:
                import ipywidgets  # noqa: F401
            except ImportError:  # pragma: no cover - ipywidgets is a course dependency
                self.mode = "grouped"

    def line(self, label: str, text: str) -> None:
        if label.startswith("agent"):
            return  # launcher agents' own logs are kept in the result, not echoed
        if self.mode == "live":
            print(f"[{label}] {text}", flush=True)
        elif self.mode == "kernel":
            self.pending.append(f"[{label}] {text}")
            now = time.monotonic()
            if now - self.last > 0.25:
                self._flush()
                self.last = now

    def _flush(self) -> None:
        if not self.pending:
            return
        if self.view is None:
            import ipywidgets
            from IPython.display import display

            self.view = ipywidgets.Output()
            display(self.view)
        self.view.append_stdout("\n".join(self.pending) + "\n")
        self.pending = []

    def finish(self, result: LaunchResult) -> None:
        if self.mode not in ("grouped", "kernel"):
            return
        if self.view is not None:  # the live view has served; the grouped text replaces it
            self.view.outputs = ()
            self.view.layout.display = "none"
        text = result.grouped()
        if text:
            print(text, flush=True)
