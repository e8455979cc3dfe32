"""Which rank failed first, and its traceback: causes told apart from their effects.

Internal API of :mod:`course_lib.launch`: the engine names the failing rank in a
:class:`~course_lib.launch.LaunchError` with :func:`failing_rank`; the package does not export it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..validation import check_instance, check_items

__all__ = ["PORT_BUSY", "failing_rank", "rank_number"]

_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+)", re.S)


_COLLATERAL = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|SIGTERM|Signal 15", re.I)


# What a process prints when its rendezvous port is taken: the engine then suggests a free port.
PORT_BUSY = re.compile(r"address already in use|EADDRINUSE|errno: 98|Errno 98", re.I)


def _last_traceback(text: str) -> str:
    idx = text.rfind("Traceback (most recent call last)")
    if idx < 0:
        tail = text.strip().splitlines()[-15:]
        return "\n".join(tail)
    return text[idx:].strip()


def failing_rank(
    lines: Sequence[tuple[str, str]], error_dir: Path | None, exits: Mapping[str, int | None] | None = None
) -> tuple[str | None, str]:
    """The label of the root-cause rank and its traceback.

    ``exits``: the processes that ended on their own (before the launcher killed the rest), label to exit code,
    in the order they ended. For a :func:`~course_lib.launch.run_ranks` job (``error_dir``: where each rank
    writes ``error_R.txt`` or ``result_R.pkl``), a rank that ended without either (``os._exit``, a signal, a
    crash of the interpreter) failed silently, and a silent failure comes before its peers' connection errors,
    which are its effects.
    """
    check_items("lines", lines, tuple, "a list of (label, line) pairs")
    check_instance("error_dir", error_dir, (Path, type(None)), "a Path or None")
    check_instance("exits", exits, (Mapping, type(None)), "a mapping of label to exit code, or None")
    if error_dir is not None:
        found = []
        for path in error_dir.glob("error_*.txt"):
            stamp, _, tb = path.read_text().partition("\n")
            # a rank whose peer died fails with a connection error: an effect, not the cause
            found.append((_COLLATERAL.search(tb) is not None, float(stamp), path.stem.split("_")[1], tb.strip()))
        causes = [f for f in found if not f[0]]
        if causes:
            _, _, rank, tb = min(causes)
            return f"rank {rank}", tb
        for label, code in (exits or {}).items():
            r = rank_number(label)
            if r is None or (error_dir / f"error_{r}.txt").exists():
                continue
            if code != 0 or not (error_dir / f"result_{r}.pkl").exists():
                how = f"exit code {code}" if code else "exit code 0, without returning a result"
                if code is not None and code < 0:
                    how = f"killed by signal {-code}"
                return label, f"{label} ended with no Python error ({how}): os._exit, a signal or a crashed process"
        if found:
            _, _, rank, tb = min(found)
            return f"rank {rank}", tb
    agent_text = "\n".join(t for lab, t in lines if lab.startswith("agent"))
    m = _ROOT_CAUSE.search(agent_text)
    if m:
        label = f"rank {m.group(1)}"
        return label, _last_traceback("\n".join(t for lab, t in lines if lab == label))
    candidates = []
    for i, (label, text) in enumerate(lines):  # first rank to print a traceback, causes before effects
        if text.startswith("Traceback (most recent call last)") and not label.startswith("agent"):
            tb = _last_traceback("\n".join(t for lab, t in lines if lab == label))
            candidates.append((_COLLATERAL.search(tb) is not None, i, label, tb))
    if candidates:
        _, _, label, tb = min(candidates)
        return label, tb
    return None, ""


def rank_number(label: str | None) -> int | None:
    """The rank in a label such as ``\"rank 3\"`` (``None`` for an agent, ``main`` or no label)."""
    if label is None:
        return None
    check_instance("label", label, str, "a string such as 'rank 3', or None")
    m = re.fullmatch(r"rank (\d+)", label)
    return int(m.group(1)) if m else None
