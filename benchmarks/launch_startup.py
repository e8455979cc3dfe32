"""What a rank costs before it works: ``run_ranks`` with fresh interpreters against forks of the fork server.

    python benchmarks/launch_startup.py [--ranks 2] [--launches 5]

Each launch runs a tiny DDP step on ``--ranks`` CPU ranks (``DistributedDataParallel`` imports ``torch._dynamo``,
as every DDP, DTensor and FSDP2 job of the course does). ``fresh``: every rank is a new interpreter
(``COURSE_LIB_FORKSERVER=0``, what macOS and Windows get). ``forked``: every rank is a fork of the fork server
(``course_lib.launch.forkserver``), which imported torch once; the server's own start is timed apart (``server_s``),
since a notebook pays it once. The figures are wall seconds per launch (median) and the CPU seconds that all the
processes used per launch (from ``/proc``'s accounting of this process's children and the server's).

Prints one line per mode, then:
RESULT fresh_s=<median> forked_s=<median> server_s=<s> fresh_cpu_s=<s> forked_cpu_s=<s> ranks=<n> launches=<n>
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from course_lib.launch import run_ranks
from course_lib.launch.forkserver import forkserver_pid, stop_forkserver

WORKER = """
import torch
from torch.nn.parallel import DistributedDataParallel


def step(rank, world_size):
    model = DistributedDataParallel(torch.nn.Linear(8, 8))
    model(torch.randn(4, 8)).sum().backward()
    return rank
"""


def _children_cpu() -> float:
    use = resource.getrusage(resource.RUSAGE_CHILDREN)
    return use.ru_utime + use.ru_stime


def _proc_cpu(pid: int) -> float:
    """User + system seconds of a live process and its waited-for children (``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
    return ticks / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--launches", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        worker = Path(tmp) / "startup_worker.py"
        worker.write_text(WORKER)
        target = f"{worker}:step"

        os.environ["COURSE_LIB_FORKSERVER"] = "0"
        fresh, cpu0 = [], _children_cpu()
        for _ in range(args.launches):
            t = time.perf_counter()
            assert run_ranks(target, nprocs=args.ranks, echo="none") == list(range(args.ranks))
            fresh.append(time.perf_counter() - t)
        fresh_cpu = (_children_cpu() - cpu0) / args.launches

        del os.environ["COURSE_LIB_FORKSERVER"]
        t = time.perf_counter()
        run_ranks(target, nprocs=args.ranks, echo="none")  # starts the server (and forks its first ranks)
        server_s = time.perf_counter() - t
        server = forkserver_pid()
        assert server is not None, "the fork server did not start (not Linux, or COURSE_LIB_FORKSERVER=0?)"
        forked, cpu0 = [], _proc_cpu(server)
        for _ in range(args.launches):
            t = time.perf_counter()
            assert run_ranks(target, nprocs=args.ranks, echo="none") == list(range(args.ranks))
            forked.append(time.perf_counter() - t)
        forked_cpu = (_proc_cpu(server) - cpu0) / args.launches
        stop_forkserver()

    for name, times, cpu in (("fresh", fresh, fresh_cpu), ("forked", forked, forked_cpu)):
        print(
            f"{name:>6}: {statistics.median(times):.2f} s per launch (min {min(times):.2f}), {cpu:.2f} CPU-s per launch"
        )
    print(
        f"RESULT fresh_s={statistics.median(fresh):.2f} forked_s={statistics.median(forked):.2f} server_s={server_s:.2f}"
        f" fresh_cpu_s={fresh_cpu:.2f} forked_cpu_s={forked_cpu:.2f} ranks={args.ranks} launches={args.launches}"
    )


if __name__ == "__main__":
    main()
