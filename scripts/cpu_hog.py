"""Keep every core busy while a command runs: the course's outputs must not depend on an idle machine.

    python scripts/cpu_hog.py [--procs N] [--max-seconds S] -- COMMAND [ARGS...]

Starts ``N`` busy processes (default: one per core this process may use), each spinning in pure Python
at normal priority, runs ``COMMAND`` with them, stops them all, and exits with the command's exit code.
The hogs are bounded: each stops by itself after ``S`` seconds (default 3600) or as soon as its parent
is gone, so a killed run leaves nothing behind. ``make test-load`` runs nbval over every notebook this
way: a cloud CI runner or a classroom machine is loaded like this all the time.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import subprocess
import sys
import time


def _spin(parent: int, max_seconds: float) -> None:
    """Burn one core until the deadline, or until the parent process is gone."""
    deadline = time.monotonic() + max_seconds
    x = 0
    while time.monotonic() < deadline:
        for _ in range(200_000):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        if os.getppid() != parent:
            return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    parser.add_argument("--procs", type=int, default=cores, help=f"busy processes (default {cores}: one per core)")
    parser.add_argument("--max-seconds", type=float, default=3600.0, help="each hog stops by itself after this")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run under load (after --)")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    if args.procs < 1 or args.max_seconds <= 0:
        parser.error("--procs must be >= 1 and --max-seconds > 0")
    ctx = mp.get_context("fork" if sys.platform != "win32" else "spawn")
    hogs = [ctx.Process(target=_spin, args=(os.getpid(), args.max_seconds), daemon=True) for _ in range(args.procs)]
    for h in hogs:
        h.start()
    print(f"cpu_hog: {args.procs} busy process(es) while running: {' '.join(command)}", flush=True)
    try:
        return subprocess.call(command)
    finally:
        for h in hogs:
            h.terminate()
        for h in hogs:
            h.join(timeout=5)
            if h.is_alive():
                h.kill()


if __name__ == "__main__":
    sys.exit(main())
