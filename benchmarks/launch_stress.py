"""Launch the DDP training script of notebook 10 many times and count the runs that crash at exit.

    python benchmarks/launch_stress.py [--launches 102] [--epochs 1] [--portable] [--script FILE]

The bug this guards against: a gloo job that did all its work, printed its results, and then
aborted in interpreter shutdown ("terminate called without an active exception", SIGABRT, exit
code 1 through the launcher). It is a race (a gloo worker thread still dropping a finished
collective while Python shuts down; see docs/crash_at_exit.md and notebook 10, section 10), so one
launch proves nothing: this script
starts the training script ``--launches`` times in total, round-robin under ``torchrun``, the legacy
``python -m torch.distributed.launch`` and ``course_lib.launch.run_ranks`` (2 processes each), and
counts a launch as a crash when it exits nonzero or any process printed "terminate called".

The training script is the one notebook 10 writes to ``_runs/ddp_train.py``, read from the
notebook's text source (sources/10_ddp_in_practice.py); it is written to a temporary folder, and
``run_ranks`` calls its ``train`` function. ``--script FILE`` launches another file instead (to measure
an old teardown: its ``train`` is the run_ranks target). ``--portable`` gives the children the
portable-kernel environment the crash was first seen with (ATEN_CPU_CAPABILITY=default
ONEDNN_MAX_CPU_ISA=SSE41 MKL_ENABLE_INSTRUCTIONS=SSE4_2 OMP_NUM_THREADS=1). The race needs a gloo
thread to lose the CPU at the wrong moment, so its rate depends on how busy the machine is: a
clean run on an idle machine is weaker evidence than one under load.

Prints a table (one row per launcher), then:
RESULT launches=<n> crashes=<n> terminate=<launches with 'terminate called'> nonzero=<launches that exited nonzero> wall_s=<s>
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

from course_lib.launch import LaunchError, run_ranks, run_torchrun
from course_lib.manifest import written_file

PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "default",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    "OMP_NUM_THREADS": "1",
}
LAUNCHERS = ("torchrun", "launch", "run_ranks")

# The script notebook 10 writes to _runs/ddp_train.py, read from its text source: one copy.
TRAIN_SCRIPT = written_file("10_ddp_in_practice", "_runs/ddp_train.py")


def one_launch(
    launcher: str, script: Path, epochs: int, out: Path, env: dict[str, str], timeout: float
) -> tuple[bool, bool, str]:
    """Run the script once; return (exited nonzero, printed 'terminate called', first error line)."""
    text, nonzero = "", False
    try:
        if launcher == "run_ranks":
            # run_ranks initialises the group, calls train(rank, world_size, epochs, batch_size, lr, out), tears down
            run_ranks(
                f"{script}:train",
                2,
                (epochs, 32, 0.1, str(out)),
                timeout=timeout,
                env=env,
                cwd=script.parent,
                echo="none",
            )
        else:
            result = run_torchrun(
                script.name,
                args=["--epochs", epochs, "--out", str(out)],
                module=launcher,
                timeout=timeout,
                env=env,
                cwd=script.parent,
                echo="none",
            )
            text = result.output()
    except LaunchError as e:
        nonzero = True
        text = (e.result.output() if e.result is not None else "") + "\n" + str(e)
    terminate = "terminate called" in text
    first = next((line for line in text.splitlines() if "terminate called" in line or "Error" in line), "")
    return nonzero, terminate, first.strip()[:120]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--launches", type=int, default=102, help="launches in total, shared round-robin by the 3 launchers"
    )
    parser.add_argument("--epochs", type=int, default=1, help="epochs per launch (the bug is at exit: 1 is enough)")
    parser.add_argument(
        "--portable", action="store_true", help="children use the portable (default-capability) kernels"
    )
    parser.add_argument(
        "--script", type=Path, default=None, help="launch this training script instead of notebook 10's"
    )
    parser.add_argument(
        "--launchers", default=",".join(LAUNCHERS), help="comma-separated subset of torchrun,launch,run_ranks"
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per launch")
    parser.add_argument("--verbose", action="store_true", help="print one line per crash as it happens")
    args = parser.parse_args(argv)
    launchers = [name.strip() for name in args.launchers.split(",") if name.strip()]
    if args.launches < 1 or args.epochs < 1 or not launchers or any(name not in LAUNCHERS for name in launchers):
        parser.error("--launches and --epochs must be >= 1, --launchers a subset of torchrun,launch,run_ranks")
    env = dict(PORTABLE_ENV) if args.portable else {}
    counts = {name: {"launches": 0, "nonzero": 0, "terminate": 0, "crashes": 0, "seconds": 0.0} for name in launchers}
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="launch_stress_") as tmp:
        if args.script is None:
            script = Path(tmp) / "ddp_train.py"
            script.write_text(TRAIN_SCRIPT)
        else:
            script = args.script.resolve()
            if not script.is_file():
                parser.error(f"--script: no such file {args.script}")
        out = Path(tmp) / "out"
        for i in range(args.launches):
            launcher = launchers[i % len(launchers)]
            t0 = time.perf_counter()
            nonzero, terminate, first = one_launch(launcher, script, args.epochs, out, env, args.timeout)
            row = counts[launcher]
            row["seconds"] += time.perf_counter() - t0
            row["launches"] += 1
            row["nonzero"] += nonzero
            row["terminate"] += terminate
            row["crashes"] += nonzero or terminate
            if args.verbose and (nonzero or terminate):
                print(f"launch {i + 1} ({launcher}): crash: {first}", flush=True)
    wall = time.perf_counter() - start
    total = {key: sum(row[key] for row in counts.values()) for key in ("launches", "nonzero", "terminate", "crashes")}
    print(
        f"script: {'notebook 10 _runs/ddp_train.py' if args.script is None else args.script}; --epochs {args.epochs}; "
        f"portable kernels: {'yes' if args.portable else 'no'}; {os.cpu_count()} CPU cores"
    )
    print(
        f"{'launcher':<10} {'launches':>9} {'crashes':>8} {'nonzero exit':>13} {'terminate called':>17} {'s/launch':>9}"
    )
    for name, row in counts.items():
        print(
            f"{name:<10} {row['launches']:>9} {row['crashes']:>8} {row['nonzero']:>13} {row['terminate']:>17} "
            f"{row['seconds'] / max(row['launches'], 1):>9.2f}"
        )
    print(
        f"RESULT launches={total['launches']} crashes={total['crashes']} terminate={total['terminate']} "
        f"nonzero={total['nonzero']} wall_s={wall:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
