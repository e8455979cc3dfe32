"""Restart a two-rank gloo job under ``torchrun --max-restarts=1`` many times; count the restarts that fail.

    python benchmarks/elastic_restart.py [--launches 8] [--rdzv static,c10d] [--prefix off,on]

What it measures: notebook 12 §5's workaround. In the first attempt the last rank dies (``os._exit(1)``) after
one all-reduce; the agent restarts both workers, and the second attempt initialises gloo again and all-reduces.
A launch fails when that second attempt cannot form its group. With ``--prefix off`` the workers call
``init_process_group("gloo")`` as usual (``env://``: the store the agent hands them); with ``--prefix on`` they
wrap it in ``PrefixStore(f"attempt{TORCHELASTIC_RESTART_COUNT}", ...)`` as notebook 12's ``elastic_train.py``
does. Both rendezvous kinds are tried: ``static`` (``--master_addr/--master_port``, what the notebook uses) and
``c10d`` (``--rdzv-backend=c10d``). The failure is a race between the new workers and the addresses the dead
attempt left in the store, so its rate depends on timing and load: a clean series is weaker evidence than a
failure.

Prints a table (one row per rendezvous and prefix setting), then:
RESULT <rdzv>_<prefix>=<failed>/<launches> ... wall_s=<s>
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from course_lib.launch import LaunchError, run_torchrun

WORKER = """
import os, sys
import torch
import torch.distributed as dist

attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
if sys.argv[1] == "on":  # notebook 12's workaround: a fresh key prefix per attempt
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
    dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store),
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
else:
    dist.init_process_group("gloo")
t = torch.ones(4)
dist.all_reduce(t)
if attempt == "0" and dist.get_rank() == dist.get_world_size() - 1:
    os._exit(1)  # as a killed process dies
dist.barrier()
print(f"attempt {attempt}: all_reduce ok", flush=True)
dist.destroy_process_group()
"""


def one_launch(script: Path, rdzv: str, prefix: str, timeout: float) -> tuple[bool, str]:
    """One job; return (the restarted attempt failed, the first error line)."""
    try:
        result = run_torchrun(
            script.name,
            args=[prefix],
            launcher_args=["--max-restarts=1"],
            rdzv=rdzv,
            timeout=timeout,
            cwd=script.parent,
            echo="none",
        )
        text, failed = result.output(), False
    except LaunchError as e:
        text, failed = (e.result.output() if e.result is not None else "") + "\n" + str(e), True
    if not failed and text.count("attempt 1: all_reduce ok") < 2:
        failed = True
    lines = text.splitlines()
    mesh = next((ln[ln.index("Gloo connectFullMesh") :] for ln in lines if "Gloo connectFullMesh" in ln), "")
    first = mesh or next((ln for ln in lines if "Error:" in ln), "")
    return failed, first.strip()[:100] if failed else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=8, help="launches per rendezvous and prefix setting")
    parser.add_argument("--rdzv", default="static,c10d", help="comma-separated subset of static,c10d")
    parser.add_argument("--prefix", default="off,on", help="comma-separated subset of off,on")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per launch")
    parser.add_argument("--verbose", action="store_true", help="print one line per failed launch as it happens")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.rdzv.split(",") if k.strip()]
    prefixes = [p.strip() for p in args.prefix.split(",") if p.strip()]
    if args.launches < 1 or not set(kinds) <= {"static", "c10d"} or not set(prefixes) <= {"off", "on"}:
        parser.error("--launches >= 1, --rdzv a subset of static,c10d, --prefix a subset of off,on")
    start = time.perf_counter()
    rows = {}
    with tempfile.TemporaryDirectory(prefix="elastic_restart_") as tmp:
        script = Path(tmp) / "restart_worker.py"
        script.write_text(WORKER)
        for i in range(args.launches):  # interleaved: every setting sees the same load over time
            for rdzv in kinds:
                for prefix in prefixes:
                    row = rows.setdefault((rdzv, prefix), {"launches": 0, "failed": 0, "seconds": 0.0, "first": ""})
                    t0 = time.perf_counter()
                    failed, first = one_launch(script, rdzv, prefix, args.timeout)
                    row["seconds"] += time.perf_counter() - t0
                    row["launches"] += 1
                    row["failed"] += failed
                    if failed and not row["first"]:
                        row["first"] = first
                    if failed and args.verbose:
                        print(f"launch {i + 1} ({rdzv}, prefix {prefix}): {first}", flush=True)
    wall = time.perf_counter() - start
    print(f"torch restarts with --max-restarts=1; {os.cpu_count()} CPU cores")
    print(f"{'rendezvous':<11} {'prefix':<7} {'launches':>9} {'restart failed':>15} {'s/launch':>9}   first error")
    for (rdzv, prefix), row in rows.items():
        print(
            f"{rdzv:<11} {prefix:<7} {row['launches']:>9} {row['failed']:>15} "
            f"{row['seconds'] / row['launches']:>9.1f}   {row['first']}"
        )
    print(
        "RESULT "
        + " ".join(f"{rdzv}_{prefix}={row['failed']}/{row['launches']}" for (rdzv, prefix), row in rows.items())
        + f" wall_s={wall:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
