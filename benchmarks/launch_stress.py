"""Launch the course's distributed scripts many times and count the runs that crash at exit.

    python benchmarks/launch_stress.py [--launches 102] [--epochs 1] [--portable] [--script FILE]
    python benchmarks/launch_stress.py --all-scripts [--launches 300] [--ci-conditions] [--only SUBSTRING]
                                       [--replace NOTEBOOK_FILE=PATH]

The bug this guards against: a gloo job that did all its work, printed its results, and then
aborted in interpreter shutdown ("terminate called without an active exception", SIGABRT, exit
code 1 through the launcher). It is a race (a gloo worker thread still dropping a finished
collective while Python shuts down, because something kept the process group alive past
``destroy_process_group()``; see docs/crash_at_exit.md and notebook 11, section 10.2), so one
launch proves nothing.

Default mode: notebook 11's ``_runs/ddp_train.py`` (read from the notebook's text source), ``--launches``
times in total, round-robin under ``torchrun``, the legacy ``python -m torch.distributed.launch`` and
``course_lib.launch.run_ranks`` (2 processes each). ``--script FILE`` launches another file instead.

``--all-scripts``: every script a notebook launches that runs a process group (:data:`CATALOG`: the
``torchrun`` scripts of 11, 12, 19 and 22, ``mp.spawn``'s script of 11, and the ``run_ranks`` jobs of 10
(HandDDP and the hook cells), 14 (ZeRO, FSDP by hand), 15 (FSDP2), 17 (TP, SP) and 18 (ring attention, experts)), each
with the launcher its notebook uses, round-robin until ``--launches``. Every ``%%writefile`` file of
notebooks 09-22 is written to a temporary folder first, as the notebooks write them. ``--replace
_runs/fsdp_train.py=OLD.py`` launches OLD.py in that file's place (to measure an old version).
``--ci-conditions`` runs the whole benchmark as CI's extra pass runs the notebooks: the portable CPU (one
thread), 2 simulated GPUs visible (tests/gpu_visible) and ``scripts/cpu_hog.py`` keeping every core busy.

A launch counts as a crash when it exits nonzero or any process printed "terminate called". The race
needs a gloo thread to lose the CPU at the wrong moment, so its rate depends on how busy the machine is and on the
CPU: a clean run on an idle machine is weaker evidence than one under load. ``--count-exposed`` measures the
precondition instead, which does not depend on timing: every rank that runs Python's interpreter shutdown (torchrun's
and mp.spawn's workers; ``run_ranks``'s forks leave without it) reports, from an ``atexit`` handler, how many threads
it still has; a launch counts as *exposed* when a rank enters shutdown with more than one (gloo's threads alive).

Prints a table (one row per script or launcher), then:
RESULT launches=<n> crashes=<n> terminate=<launches with 'terminate called'> nonzero=<launches that exited nonzero> exposed=<launches with a rank exposed, or - without --count-exposed> wall_s=<s>
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jupytext

from course_lib.launch import LaunchError, run_ranks, run_script, run_torchrun
from course_lib.manifest import ROOT, written_file

PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "default",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    "OMP_NUM_THREADS": "1",
}
GPU_ENV = {"PYTHONPATH": str(ROOT / "tests" / "gpu_visible"), "COURSE_SIMULATED_GPUS": "2"}
LAUNCHERS = ("torchrun", "launch", "run_ranks")

# The script notebook 11 writes to _runs/ddp_train.py, read from its text source: one copy.
TRAIN_SCRIPT = written_file("11_ddp_in_practice", "_runs/ddp_train.py")


@dataclass
class Job:
    """One kind of launch: a notebook's script (or run_ranks target), its launcher, its arguments."""

    label: str
    launcher: str  # torchrun, launch, run_ranks, run_script
    target: str  # a script (torchrun, launch), 'file.py:function' (run_ranks), or the command (run_script)
    nproc: int = 2
    args: list[Any] = field(default_factory=list)
    launcher_args: list[str] = field(default_factory=list)


# What the notebooks launch, with the smallest arguments that run the whole script (OUT: a scratch folder).
CATALOG = [
    Job("11 ddp_train.py", "torchrun", "_runs/ddp_train.py", args=["--epochs", "1", "--out", "OUT"]),
    Job("11 ddp_train.py", "launch", "_runs/ddp_train.py", args=["--epochs", "1", "--out", "OUT"]),
    Job("11 ddp_train.py:train", "run_ranks", "_runs/ddp_train.py:train", args=[1, 32, 0.1, "OUT"]),
    Job("11 spawn_train.py (mp.spawn)", "run_script", "python _runs/spawn_train.py OUT cpu 2"),
    Job(
        "12 elastic_train.py (a restart)",
        "torchrun",
        "_runs/elastic_train.py",
        args=["--out", "OUT", "--crash-at", "9"],
        launcher_args=["--max-restarts=1"],
    ),
    Job("12 device_generic.py", "run_script", "python _runs/device_generic.py"),
    Job("19 fsdp_train.py", "torchrun", "_runs/fsdp_train.py", args=["--out", "OUT", "--save-at", "2"]),
    Job(
        "19 fsdp_train.py --defer-grad-sync",
        "torchrun",
        "_runs/fsdp_train.py",
        args=["--out", "OUT", "--defer-grad-sync"],
    ),
    Job(
        "19 fsdp_train.py --bf16 --checkpointing",
        "torchrun",
        "_runs/fsdp_train.py",
        args=["--out", "OUT", "--bf16", "--checkpointing"],
    ),
    Job(
        "19 fsdp_train.py HSDP --cpu-offload",
        "torchrun",
        "_runs/fsdp_train.py",
        nproc=4,
        args=["--out", "OUT", "--replicate", "2", "--cpu-offload"],
    ),
    Job(
        "19 fsdp_train.py --async-save",
        "torchrun",
        "_runs/fsdp_train.py",
        args=["--out", "OUT", "--save-at", "2", "--async-save"],
    ),
    # torch.profiler starts a C++ thread of its own (Kineto's) that lives until exit: --count-exposed counts it here,
    # though no process group is left (the script's teardown checks that)
    Job("19 fsdp_train.py --profile", "torchrun", "_runs/fsdp_train.py", args=["--out", "OUT", "--profile", "OUT"]),
    Job("19 fsdp_memory.py (a fake 8-rank world)", "run_script", "python _runs/fsdp_memory.py 8 1024 OUT"),
    Job(
        "22 capstone_train.py",
        "torchrun",
        "_runs/capstone_train.py",
        args=["--out", "OUT", "--runs", "ddp:--dp ddp --accum 2 --steps 2;fsdp:--dp fsdp2 --tp 2 --bf16 --steps 2"],
    ),
    Job(
        "22 capstone_train.py --pp (1F1B, interleaved, GPipe)",
        "torchrun",
        "_runs/capstone_train.py",
        args=[
            "--out",
            "OUT",
            "--runs",
            "1f1b:--layers 4 --pp 2 --accum 4 --steps 2;interleaved:--layers 4 --pp 2 --accum 4 --schedule interleaved"
            " --steps 2;gpipe:--layers 4 --pp 2 --accum 4 --schedule gpipe --steps 2",
        ],
    ),
    Job(
        "22 capstone_train.py --cp and DP x PP",
        "torchrun",
        "_runs/capstone_train.py",
        nproc=4,
        args=[
            "--out",
            "OUT",
            "--runs",
            "cp:--cp 2 --checkpointing full --steps 2;pp:--layers 4 --pp 2 --accum 4 --steps 2",
        ],
    ),
    Job("10 hand_ddp.py:compare (HandDDP, hooks)", "run_ranks", "_runs/hand_ddp.py:compare", args=[0.002]),
    Job("14 zero_job.py:report", "run_ranks", "_runs/zero_job.py:report", args=["cpu"]),
    Job("14 fsdp_job.py:report", "run_ranks", "_runs/fsdp_job.py:report", args=["cpu"]),
    Job("15 fsdp2_demo.py:report", "run_ranks", "_runs/n15/fsdp2_demo.py:report", args=["cpu"]),
    Job("17 tp_api.py:section1", "run_ranks", "_runs/n17/tp_api.py:section1"),
    Job("17 sp.py:section2", "run_ranks", "_runs/n17/sp.py:section2"),
    Job("18 ring.py:section1", "run_ranks", "_runs/n18/ring.py:section1", nproc=4),
    Job("18 ep.py:section2", "run_ranks", "_runs/n18/ep.py:section2"),
    Job("18 mesh.py:section3", "run_ranks", "_runs/n18/mesh.py:section3", nproc=8),
    Job("11 loader_job.py:pipeline (DataLoader workers)", "run_ranks", "_runs/loader_job.py:pipeline"),
    Job(
        "20 traced_step.py:train (DDP, profiled)",
        "run_ranks",
        "_runs/traced_step.py:train",
        args=["ddp", "baseline", "OUT"],
    ),
    Job(
        "20 traced_step.py:train (FSDP2, profiled)",
        "run_ranks",
        "_runs/traced_step.py:train",
        args=["fsdp", "baseline", "OUT"],
    ),
]


def write_notebook_files(folder: Path, first: int = 9, last: int = 22) -> list[str]:
    """Every file notebooks ``first``..``last`` write with %%writefile, at its path under ``folder``."""
    written = []
    for source in sorted((ROOT / "sources").glob("*.py")):
        if not source.name[:2].isdigit() or not first <= int(source.name[:2]) <= last:
            continue
        notebook = jupytext.read(source, fmt="py:percent")
        for cell in notebook.cells:
            head, _, body = cell.source.partition("\n")
            if cell.cell_type == "code" and head.startswith("%%writefile"):
                path = folder / head.split()[1]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(body + "\n")
                written.append(head.split()[1])
    return written


EXPOSED = "launch_stress: threads alive at interpreter shutdown:"
# Installed with --count-exposed as sitecustomize.py on every process's path: a rank that enters interpreter shutdown
# with threads besides the main one (gloo's, when its group was never freed) says so on stderr.
SITECUSTOMIZE = f"""import atexit, os, sys


def _report():
    if "RANK" in os.environ and "torch.distributed" in sys.modules:
        threads = len(os.listdir("/proc/self/task"))
        if threads > 1:
            sys.stderr.write("{EXPOSED} " + str(threads) + "\\n")
            sys.stderr.flush()


atexit.register(_report)
"""


def launch(job: Job, folder: Path, out: Path, env: dict[str, str] | None, timeout: float) -> tuple[bool, bool, str]:
    """Run one job; return (exited nonzero, printed 'terminate called', first error line)."""
    args = [str(out) if a == "OUT" else a for a in job.args]
    text, nonzero = "", False
    try:
        if job.launcher == "run_ranks":
            target = f"{folder / job.target}"  # run_ranks reads the file from this process's directory
            run_ranks(target, job.nproc, tuple(args), timeout=timeout, env=env, cwd=folder, echo="none")
        elif job.launcher == "run_script":
            command = [str(out) if a == "OUT" else a for a in job.target.split()]
            text = run_script(command, timeout=timeout, env=env, cwd=folder, echo="none").output()
        else:
            result = run_torchrun(
                job.target,
                nproc_per_node=job.nproc,
                args=args,
                module=job.launcher,
                launcher_args=job.launcher_args,
                timeout=timeout,
                env=env,
                cwd=folder,
                echo="none",
            )
            text = result.output()
    except LaunchError as e:
        nonzero = True
        text = (e.result.output() if e.result is not None else "") + "\n" + str(e)
    terminate = "terminate called" in text
    first = next((line for line in text.splitlines() if "terminate called" in line or "Error" in line), "")
    LAST_OUTPUT[0] = text
    return nonzero, terminate, first.strip()[:160]


LAST_OUTPUT = [""]  # the last launch's output, for --count-exposed


def ci_conditions_command(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """This benchmark again, as CI's extra pass runs the notebooks: portable CPU, simulated GPUs, a CPU hog."""
    env = dict(os.environ, **PORTABLE_ENV)
    env["PYTHONPATH"] = GPU_ENV["PYTHONPATH"] + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["COURSE_SIMULATED_GPUS"] = GPU_ENV["COURSE_SIMULATED_GPUS"]
    rest = [a for a in argv if a != "--ci-conditions"]
    hog = [sys.executable, str(ROOT / "scripts" / "cpu_hog.py"), "--"]
    return [*hog, sys.executable, str(Path(__file__).resolve()), *rest], env


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=None, help="launches in total (102; --all-scripts: 300)")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per launch of ddp_train.py (default mode)")
    parser.add_argument(
        "--portable", action="store_true", help="children use the portable (default-capability) kernels"
    )
    parser.add_argument(
        "--script", type=Path, default=None, help="launch this training script instead of notebook 11's"
    )
    parser.add_argument("--launchers", default=",".join(LAUNCHERS), help="subset of torchrun,launch,run_ranks")
    parser.add_argument("--all-scripts", action="store_true", help="every script the notebooks launch (CATALOG)")
    parser.add_argument("--only", default="", help="--all-scripts: only the jobs whose label contains this")
    parser.add_argument("--replace", action="append", default=[], help="--all-scripts: NOTEBOOK_FILE=PATH")
    parser.add_argument("--ci-conditions", action="store_true", help="portable CPU + simulated GPUs + cpu_hog")
    parser.add_argument("--count-exposed", action="store_true", help="count ranks that shut down with threads alive")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per launch")
    parser.add_argument("--verbose", action="store_true", help="print one line per crash as it happens")
    args = parser.parse_args(argv)
    if args.ci_conditions:
        command, env = ci_conditions_command(argv)
        return subprocess.call(command, env=env)
    launchers = [name.strip() for name in args.launchers.split(",") if name.strip()]
    launches = args.launches if args.launches is not None else (300 if args.all_scripts else 102)
    if launches < 1 or args.epochs < 1 or not launchers or any(name not in LAUNCHERS for name in launchers):
        parser.error("--launches and --epochs must be >= 1, --launchers a subset of torchrun,launch,run_ranks")
    env = dict(PORTABLE_ENV) if args.portable else None
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="launch_stress_") as tmp:
        folder = Path(tmp)
        if args.count_exposed:
            (folder / "site").mkdir()
            (folder / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
            path = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = str(folder / "site") + (os.pathsep + path if path else "")
        if args.all_scripts:
            write_notebook_files(folder)
            for item in args.replace:
                name, _, path = item.partition("=")
                if not (folder / name).is_file() or not Path(path).is_file():
                    parser.error(f"--replace {item}: need NOTEBOOK_FILE=PATH, both existing files")
                shutil.copy(path, folder / name)
            jobs = [job for job in CATALOG if args.only in job.label]
            if not jobs:
                parser.error(f"--only {args.only!r} matches no job")
            # the jobs import their siblings (the notebooks put _runs on the kernel's path): every process gets it
            path = os.environ.get("PYTHONPATH")
            # 17's and 18's jobs live in their own folders
            runs = os.pathsep.join(str(folder / d) for d in ("_runs", "_runs/n17", "_runs/n18"))
            os.environ["PYTHONPATH"] = runs + (os.pathsep + path if path else "")
        else:
            script = folder / "_runs" / "ddp_train.py"
            script.parent.mkdir()
            script.write_text(TRAIN_SCRIPT if args.script is None else args.script.read_text())
            jobs = [
                Job(
                    f"ddp_train.py ({name})",
                    name,
                    "_runs/ddp_train.py:train" if name == "run_ranks" else "_runs/ddp_train.py",
                    args=[args.epochs, 32, 0.1, "OUT"]
                    if name == "run_ranks"
                    else ["--epochs", args.epochs, "--out", "OUT"],
                )
                for name in launchers
            ]
        rows: dict[str, dict[str, float]] = {}
        for i in range(launches):
            job = jobs[i % len(jobs)]
            out = folder / "out"
            shutil.rmtree(out, ignore_errors=True)
            out.unlink(missing_ok=True)  # a job whose OUT is a file (fsdp_memory.py's JSON): the next job's folder
            t0 = time.perf_counter()
            nonzero, terminate, first = launch(job, folder, out, env, args.timeout)
            key = f"{job.label} [{job.launcher}]"
            row = rows.setdefault(
                key, {"launches": 0, "nonzero": 0, "terminate": 0, "crashes": 0, "exposed": 0, "seconds": 0.0}
            )
            row["exposed"] += EXPOSED in LAST_OUTPUT[0]
            row["seconds"] += time.perf_counter() - t0
            row["launches"] += 1
            row["nonzero"] += nonzero
            row["terminate"] += terminate
            row["crashes"] += nonzero or terminate
            if args.verbose and (nonzero or terminate):
                print(f"launch {i + 1} ({key}): crash: {first}", flush=True)
    wall = time.perf_counter() - start
    keys = ("launches", "nonzero", "terminate", "crashes", "exposed")
    total = {key: int(sum(row[key] for row in rows.values())) for key in keys}
    what = "every notebook script" if args.all_scripts else args.script or "notebook 11 _runs/ddp_train.py"
    portable = args.portable or os.environ.get("ATEN_CPU_CAPABILITY") == "default"
    print(
        f"{what}; portable kernels: {'yes' if portable else 'no'}; "
        f"simulated GPUs: {os.environ.get('COURSE_SIMULATED_GPUS', '0')}; {os.cpu_count()} CPU cores"
    )
    exposed = args.count_exposed
    width = max(len(k) for k in rows)
    print(
        f"{'job [launcher]':<{width}} {'launches':>9} {'crashes':>8} {'nonzero':>8} {'terminate':>10} "
        f"{'exposed' if exposed else '':>8} {'s/launch':>9}"
    )
    for key, row in rows.items():
        print(
            f"{key:<{width}} {int(row['launches']):>9} {int(row['crashes']):>8} {int(row['nonzero']):>8} "
            f"{int(row['terminate']):>10} {int(row['exposed']) if exposed else '':>8} "
            f"{row['seconds'] / max(row['launches'], 1):>9.2f}"
        )
    print(
        f"RESULT launches={total['launches']} crashes={total['crashes']} terminate={total['terminate']} "
        f"nonzero={total['nonzero']} exposed={total['exposed'] if exposed else '-'} wall_s={wall:.0f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
