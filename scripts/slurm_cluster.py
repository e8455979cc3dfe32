"""A real two-node Slurm cluster on this one machine: a test fixture, and a command for a terminal.

    python scripts/slurm_cluster.py up [--dir DIR]      # start it and leave it running
    python scripts/slurm_cluster.py status [--dir DIR]  # sinfo and squeue, and the line to use it
    python scripts/slurm_cluster.py down [--dir DIR]    # stop every daemon, job and task it started

    from course_tools.slurm_cluster import SlurmCluster
    with SlurmCluster() as cluster:                    # munged, slurmctld, slurmd -N n1, slurmd -N n2
        job = cluster.sbatch("job.sh")
        record = cluster.wait_job(job, timeout=120)    # scontrol's fields: record["JobState"], ...

It needs Debian's (or Ubuntu's) Slurm and MUNGE packages, ``apt-get install slurm-wlm munge``
(:data:`INSTALL_HINT`); :func:`missing_programs` says what is absent. Root is not needed: every
path (configuration, MUNGE key and socket, state, spool, pid and log files) is under one state
directory, and the daemons run as the calling user (``SlurmUser``/``SlurmdUser``), who is then the
only user whose jobs can run. The nodes ``n1`` and ``n2`` are two ``slurmd -N`` daemons on
127.0.0.1 with their own ports; the machine's CPUs are shared, each node announces
``cpus_per_node`` (``SlurmdParameters=config_overrides``).

Guarantees, as for ``course_lib.launch``: **never hang** (every wait is bounded and, on timeout,
raises :class:`SlurmClusterError` quoting the daemons' last log lines), **never orphan** (``stop``
ends every daemon, job step and task, found through a marker in their environment, then checks that
none is left; it runs on leaving the ``with`` block, at interpreter exit, and, if the Python process
that started the cluster is killed, from a small watchdog process), **show the error** (a daemon that
dies at start is named with its log).

Accounting: Debian's ``sacct`` needs ``slurmdbd`` and a MySQL/MariaDB server ("Slurm accounting
storage is disabled" without one), so this cluster keeps accounting off and records finished jobs
with ``JobCompType=jobcomp/filetxt`` instead: :meth:`SlurmCluster.jobcomp` reads that file, and
:meth:`SlurmCluster.job` (``scontrol show job``) shows any job for ``MinJobAge`` (600 s) after it ends.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "INSTALL_HINT",
    "PROGRAMS",
    "TERMINAL_STATES",
    "SlurmCluster",
    "SlurmClusterError",
    "missing_programs",
    "slurm_version",
    "wait_until",
]

INSTALL_HINT = "install Slurm and MUNGE (Debian/Ubuntu: sudo apt-get install -y slurm-wlm munge)"

# The daemons, then the commands a user types.
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scancel", "sinfo", "scontrol")

# Job states after which a job never runs again (scontrol's JobState, without flags).
TERMINAL_STATES = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "REVOKED",
        "SPECIAL_EXIT",
        "TIMEOUT",
    }
)

_MARKER = "COURSE_SLURM_CLUSTER"  # in every daemon's environment (and so every slurmstepd's), and every job's
_NODE_MARKER = "COURSE_SLURM_NODE"  # in one slurmd's environment (and so its slurmstepds')
_SBIN = ("/usr/sbin", "/sbin", "/usr/local/sbin")  # the daemons' home, often not on a user's PATH
# Variables of an enclosing Slurm job that would send our commands to the wrong job or cluster.
_FOREIGN = re.compile(r"^(SLURM_|SLURMD_|SBATCH_|SALLOC_|SRUN_|SQUEUE_|SINFO_|SCONTROL_)")
_GRACE_S = 1.0  # SIGTERM, then this long, then SIGKILL (the state is thrown away: no need to wait for a save)

T = TypeVar("T")


class SlurmClusterError(RuntimeError):
    """A daemon did not start, a command failed, or a wait ran out of time (the message says which)."""


def _user() -> str:
    """The name of the user this process runs as (not $USER, which ``su`` or ``sudo`` may leave stale)."""
    return pwd.getpwuid(os.getuid()).pw_name


def _search_path() -> str:
    return os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])


def _which(program: str) -> str | None:
    return shutil.which(program, path=_search_path())


def missing_programs() -> list[str]:
    """The Slurm and MUNGE programs this cluster needs that are not installed (empty when all are)."""
    return [p for p in PROGRAMS if _which(p) is None]


def slurm_version() -> str:
    """The installed Slurm's version line, e.g. ``slurm-wlm 22.05.8`` (raises if Slurm is absent)."""
    sinfo = _which("sinfo")
    if sinfo is None:
        raise SlurmClusterError(f"Slurm is not installed: {INSTALL_HINT}")
    return subprocess.run([sinfo, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()


def wait_until(condition: Callable[[], T], timeout: float, what: str, poll: float = 0.2) -> T:
    """Call ``condition`` until it returns something true, and return that; raise after ``timeout`` seconds.

    ``what`` completes the message "timed out after N s waiting for ...".
    """
    if not isinstance(timeout, int | float) or timeout <= 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SlurmClusterError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(poll)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    return "\n".join(text[-lines:]) if text else "(empty)"


def _fields(text: str) -> dict[str, str]:
    """``Key=value Key=value ...`` (one line of ``scontrol -o`` or of the jobcomp file) as a dict.

    A word without ``=`` belongs to the value before it (``Command=/job.sh arg``).
    """
    out: dict[str, str] = {}
    key = ""
    for word in text.split():
        k, eq, v = word.partition("=")
        if eq and re.fullmatch(r"[A-Za-z][\w:/]*", k):
            key = k
            out[key] = v
        elif key:
            out[key] += " " + word
    return out


# --------------------------------------------------------------------------- processes, from /proc


def _proc_table() -> dict[int, tuple[int, bytes]]:
    """Every live (non-zombie) process: pid -> (parent pid, environment block)."""
    table: dict[int, tuple[int, bytes]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            environ = (entry / "environ").read_bytes()
        except OSError:  # gone, or another user's
            continue
        rest = stat[stat.rfind(")") + 2 :].split()
        if rest[0] in ("Z", "X"):  # zombies and dead processes are already gone
            continue
        table[int(entry.name)] = (int(rest[1]), environ)
    return table


def _ancestors(table: Mapping[int, tuple[int, bytes]]) -> set[int]:
    """This process and its ancestors."""
    seen: set[int] = set()
    pid = os.getpid()
    while pid > 1 and pid not in seen:
        seen.add(pid)
        pid = table[pid][0] if pid in table else 0
    return seen


def _marked(needles: Iterable[str], table: Mapping[int, tuple[int, bytes]] | None = None) -> list[int]:
    """Processes whose environment holds one of ``needles`` (``NAME=value``), and all their descendants.

    Leaves out this process and its ancestors (a notebook kernel that exported ``SLURM_CONF``).
    """
    table = _proc_table() if table is None else table
    wanted = {n.encode() for n in needles}
    spared = _ancestors(table)
    found = {pid for pid, (_, env) in table.items() if wanted & set(env.split(b"\0"))}
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(found)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return sorted(found - spared)


def _signal_all(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _end(find: Callable[[], list[int]], grace: float = _GRACE_S) -> list[int]:
    """SIGTERM what ``find`` returns, wait up to ``grace`` s, then SIGKILL until none is left (bounded).

    Returns the processes still alive at the end (empty unless one cannot be killed).
    """
    _signal_all(find(), signal.SIGTERM)
    deadline = time.monotonic() + grace
    while find() and time.monotonic() < deadline:
        time.sleep(0.05)
    for _ in range(50):
        left = find()
        if not left:
            return []
        _signal_all(left, signal.SIGKILL)
        time.sleep(0.1)
    return find()


# --------------------------------------------------------------------------- the cluster

_LIVE: set[SlurmCluster] = set()  # started and not yet stopped: atexit stops them


def _stop_all_at_exit() -> None:
    for cluster in list(_LIVE):
        with contextlib.suppress(Exception):
            cluster.stop()


atexit.register(_stop_all_at_exit)


class SlurmCluster:
    """A Slurm cluster of ``nodes`` (``slurmd -N`` daemons) on 127.0.0.1, all under ``state_dir``.

    ``state_dir=None`` makes a fresh directory in the temporary directory, removed by :meth:`stop`
    unless ``keep=True`` or the start failed (its logs are then kept; a given directory is never
    removed). ``slurmd_timeout`` is Slurm's ``SlurmdTimeout`` in seconds: a node that stops answering
    is ``NOT_RESPONDING`` after about that long, then ``DOWN``, and its jobs end with ``NODE_FAIL``
    (here about 10 to 15 s after a kill, with the default 5). ``extra_conf`` is appended to ``slurm.conf``.
    ``watchdog=False`` leaves the cluster running when this process ends (``slurm_cluster.py up``);
    otherwise a watchdog process stops it if this one dies without stopping it.
    """

    def __init__(
        self,
        state_dir: str | os.PathLike[str] | None = None,
        *,
        nodes: Sequence[str] = ("n1", "n2"),
        cpus_per_node: int = 2,
        slurmd_timeout: int = 5,
        start_timeout: float = 60.0,
        extra_conf: str = "",
        keep: bool = False,
        watchdog: bool = True,
    ) -> None:
        if isinstance(nodes, str) or not nodes or not all(re.fullmatch(r"[a-z][a-z0-9]*", n) for n in nodes):
            raise ValueError(f"nodes must be a non-empty sequence of lowercase names like 'n1', got {nodes!r}")
        if len(set(nodes)) != len(nodes):
            raise ValueError(f"node names must be distinct, got {nodes!r}")
        for name, value in (("cpus_per_node", cpus_per_node), ("slurmd_timeout", slurmd_timeout)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not isinstance(start_timeout, int | float) or start_timeout <= 0:
            raise ValueError(f"start_timeout must be a positive number of seconds, got {start_timeout!r}")
        if not isinstance(extra_conf, str):
            raise TypeError(f"extra_conf must be a string of slurm.conf lines, got {type(extra_conf).__name__}")
        self.nodes = tuple(nodes)
        self.cpus_per_node = cpus_per_node
        self.slurmd_timeout = slurmd_timeout
        self.start_timeout = float(start_timeout)
        self.extra_conf = extra_conf
        self.keep = keep
        self.watchdog = watchdog
        self._given_dir = Path(state_dir).resolve() if state_dir is not None else None
        self.state_dir = self._given_dir or Path()
        self.id = uuid.uuid4().hex
        self.ports: dict[str, int] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._reaper: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()
        self.started = False

    # ----------------------------------------------------------------- paths and environments

    @property
    def conf(self) -> Path:
        """The ``slurm.conf`` every daemon and command of this cluster reads (``SLURM_CONF``)."""
        return self.state_dir / "slurm.conf"

    @property
    def log_dir(self) -> Path:
        return self.state_dir / "log"

    @property
    def jobcomp_file(self) -> Path:
        """One line per finished job (``jobcomp/filetxt``): what ``sacct`` would show without ``slurmdbd``."""
        return self.state_dir / "jobcomp.txt"

    def log_files(self, daemon: str) -> list[Path]:
        """The log files of ``daemon`` (``munged``, ``slurmctld`` or a node name): its output, then Slurm's log."""
        if daemon == "munged":
            return [self.log_dir / "munged.out"]
        if daemon == "slurmctld":
            return [self.log_dir / "slurmctld.out", self.log_dir / "slurmctld.log"]
        if daemon in self.nodes:
            return [self.log_dir / f"slurmd-{daemon}.out", self.log_dir / f"slurmd-{daemon}.log"]
        raise ValueError(f"daemon must be 'munged', 'slurmctld' or a node name {self.nodes}, got {daemon!r}")

    def log_tail(self, daemon: str, lines: int = 15) -> str:
        """The last ``lines`` of each log of ``daemon``, each headed by its path."""
        return "\n".join(f"--- {p}\n{_tail(p, lines)}" for p in self.log_files(daemon) if p.exists())

    def _base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not _FOREIGN.match(k)}
        env.update({"SLURM_CONF": str(self.conf), _MARKER: self.id})
        return env

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment for this cluster's commands (``sbatch``, ``srun``, ``squeue``, ...) and so its jobs.

        ``SLURM_CONF`` points at this cluster; this Python's ``bin`` directory leads ``PATH`` (as an activated
        virtual environment would, so ``torchrun`` and ``python`` in a job script are this one's); jobs are
        CPU jobs (``CUDA_VISIBLE_DEVICES`` and ``HIP_VISIBLE_DEVICES`` empty, ``OMP_NUM_THREADS=1``; a job
        inherits its submitter's environment). ``extra`` is applied last.
        """
        env = self._base_env()
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", ""), *_SBIN])
        env.update({"CUDA_VISIBLE_DEVICES": "", "HIP_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"})
        if extra:
            env.update({str(k): str(v) for k, v in extra.items()})
        return env

    # ----------------------------------------------------------------- configuration

    def slurm_conf_text(self) -> str:
        """The ``slurm.conf`` of this cluster (ports are chosen by :meth:`start`)."""
        d = self.state_dir
        user = _user()
        lines = [
            "# A two-node Slurm cluster on one machine (scripts/slurm_cluster.py). Every path is under this directory.",
            "ClusterName=course",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={self.ports.get('slurmctld', 6817)}",
            f"SlurmdPort={self.ports.get(self.nodes[0], 6818)}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={d / 'munge.socket'}",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
            f"SlurmctldLogFile={self.log_dir / 'slurmctld.log'}",
            f"SlurmdLogFile={self.log_dir / 'slurmd-%n.log'}",
            "MailProg=/bin/true",
            "# No cgroups (they need root): processes are tracked through /proc, tasks are not confined.",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_CPU",
            "# No slurmdbd, so no sacct: finished jobs are written to a text file instead.",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={self.jobcomp_file}",
            "# Fast enough for a lesson: a dead node is DOWN within a few SlurmdTimeouts; scancel's SIGKILL",
            "# follows its SIGTERM after KillWait seconds; a node that comes back is used again.",
            f"SlurmdTimeout={self.slurmd_timeout}",
            "SlurmctldTimeout=10",
            "MessageTimeout=3",
            "KillWait=2",
            "MinJobAge=600",
            "InactiveLimit=0",
            "ReturnToService=2",
            "SlurmdParameters=config_overrides",
        ]
        for name in self.nodes:
            port = self.ports.get(name, 6818)
            lines.append(
                f"NodeName={name} NodeAddr=127.0.0.1 NodeHostname=localhost Port={port} "
                f"CPUs={self.cpus_per_node} State=UNKNOWN"
            )
        lines.append(f"PartitionName=debug Nodes={','.join(self.nodes)} Default=YES MaxTime=INFINITE State=UP")
        if self.extra_conf.strip():
            lines += ["# extra_conf", *self.extra_conf.strip().splitlines()]
        return "\n".join(lines) + "\n"

    def _write_files(self) -> None:
        if self._given_dir is None:
            # Not pytest's tmp_path: munged wants every directory on its socket's path searchable by all.
            self.state_dir = Path(tempfile.mkdtemp(prefix="course-slurm-"))
        d = self.state_dir
        if (d / "cluster.json").exists() and _marked(_needles(json.loads((d / "cluster.json").read_text()))):
            raise SlurmClusterError(f"a cluster is already running in {d}: stop it first (slurm_cluster.py down)")
        for sub in ("state", "log", "spool", *(f"spool/{n}" for n in self.nodes)):
            (d / sub).mkdir(parents=True, exist_ok=True)
        for stale in ("munge.socket", "munge.socket.lock", "jobcomp.txt"):
            with contextlib.suppress(FileNotFoundError):
                (d / stale).unlink()
        for old in (*(d / "state").iterdir(), *d.glob("log/*")):
            if old.is_file():
                old.unlink()
        d.chmod(0o755)  # munged: the socket's directory must be searchable by all, and writable by no one else
        key = d / "munge.key"
        with contextlib.suppress(FileNotFoundError):
            key.unlink()
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(os.urandom(1024))
        self.ports = {"slurmctld": _free_port(), **{n: _free_port() for n in self.nodes}}
        self.conf.write_text(self.slurm_conf_text())
        info = {"id": self.id, "conf": str(self.conf), "nodes": list(self.nodes), "ports": self.ports}
        (d / "cluster.json").write_text(json.dumps(info, indent=1) + "\n")

    # ----------------------------------------------------------------- start and stop

    def _launch(self, name: str, cmd: list[str], env: Mapping[str, str]) -> subprocess.Popen[bytes]:
        out = self.log_files(name)[0]
        with open(out, "ab") as log:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                cwd=self.state_dir,
                start_new_session=True,
            )
        self._procs[name] = proc
        return proc

    def _check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise SlurmClusterError(
                    f"{name} exited with code {proc.returncode} while the cluster was starting. "
                    f"Its log ({self.log_dir}):\n{self.log_tail(name)}"
                )

    def start_node(self, name: str) -> None:
        """Start the ``slurmd`` of node ``name`` (again, after :meth:`kill_node`); it registers within seconds."""
        if name not in self.nodes:
            raise ValueError(f"no node {name!r} in this cluster; its nodes are {self.nodes}")
        proc = self._procs.get(name)
        if proc is not None and proc.poll() is None:
            raise SlurmClusterError(f"the slurmd of {name} is already running (pid {proc.pid})")
        env = {**self._base_env(), _NODE_MARKER: name}
        self._launch(name, [self._program("slurmd"), "-D", "-N", name, "-f", str(self.conf)], env)

    def _program(self, name: str) -> str:
        path = _which(name)
        if path is None:
            raise SlurmClusterError(f"{name} is not installed: {INSTALL_HINT}")
        return path

    def start(self) -> SlurmCluster:
        """Write the configuration, start MUNGE, the controller and every node; return once all nodes are idle.

        Raises :class:`SlurmClusterError` (after stopping whatever it started) when a program is missing,
        a daemon exits, or the nodes are not idle within ``start_timeout`` seconds.
        """
        with self._lock:
            if self.started:
                raise SlurmClusterError("this cluster is already started")
            missing = missing_programs()
            if missing:
                raise SlurmClusterError(f"missing {', '.join(missing)}: {INSTALL_HINT}")
            self._write_files()
            self.started = True
            _LIVE.add(self)
        try:
            self._start_daemons()
        except BaseException:
            self.stop(remove=False)
            raise
        return self

    def _start_daemons(self) -> None:
        d, deadline = self.state_dir, time.monotonic() + self.start_timeout
        if self.watchdog:
            self._reaper = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "_watch", "--dir", str(d), "--pid", str(os.getpid())]
                + ([] if self._given_dir is None and not self.keep else ["--keep"]),
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                env={k: v for k, v in os.environ.items() if k not in ("SLURM_CONF", _MARKER)},
            )
        base = self._base_env()
        munged = [self._program("munged"), "--foreground", f"--socket={d / 'munge.socket'}"]
        munged += [
            f"--key-file={d / 'munge.key'}",
            f"--pid-file={d / 'munged.pid'}",
            f"--seed-file={d / 'munged.seed'}",
        ]
        munged += [f"--log-file={self.log_dir / 'munged.log'}", "--num-threads=4"]
        self._launch("munged", munged, base)

        def left() -> float:
            return max(deadline - time.monotonic(), 0.1)

        def socket_ready() -> bool:
            self._check_alive()
            return (d / "munge.socket").exists()

        self._waiting(socket_ready, left(), "munged's socket")
        self._launch("slurmctld", [self._program("slurmctld"), "-D", "-f", str(self.conf)], base)
        for name in self.nodes:
            self.start_node(name)

        def all_idle() -> bool:
            self._check_alive()
            states = self.node_states(check=False)
            return bool(states) and all(states.get(n) == "IDLE" for n in self.nodes)

        self._waiting(all_idle, left(), f"nodes {', '.join(self.nodes)} to be idle (sinfo)")

    def _waiting(self, condition: Callable[[], bool], timeout: float, what: str) -> None:
        try:
            wait_until(condition, timeout, what)
        except SlurmClusterError as e:
            if "timed out" not in str(e):
                raise
            logs = "\n".join(self.log_tail(n) for n in ("munged", "slurmctld", *self.nodes))
            states = self.run(["sinfo", "-N"], check=False, timeout=10)
            raise SlurmClusterError(f"{e}. sinfo says:\n{states.stdout}{states.stderr}\nThe logs:\n{logs}") from None

    def processes(self) -> list[int]:
        """Every live process of this cluster: daemons, ``slurmstepd``s, job scripts, tasks and their children."""
        return _marked(_needles({"id": self.id, "conf": str(self.conf)}))

    def job_processes(self, job_id: int) -> list[int]:
        """The live processes of one job: its tasks (and their children) and its ``slurmstepd``s."""
        table = _proc_table()
        ours = set(self.processes())
        found = set(_marked([f"SLURM_JOB_ID={job_id}"], table)) & ours
        for pid in ours:
            with contextlib.suppress(OSError):
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if cmd.startswith(f"slurmstepd: [{job_id}.".encode()):
                    found.add(pid)
        return sorted(found)

    def kill_node(self, name: str) -> list[int]:
        """Simulate the sudden loss of node ``name``: SIGKILL its ``slurmd`` and every process of its jobs.

        Returns the PIDs killed. The controller notices after about ``slurmd_timeout`` seconds and more
        (the node becomes ``DOWN+NOT_RESPONDING``, its jobs ``NODE_FAIL``); :meth:`start_node` brings it back.
        """
        if name not in self.nodes:
            raise ValueError(f"no node {name!r} in this cluster; its nodes are {self.nodes}")
        table = _proc_table()
        ours = set(self.processes())
        victims = set(_marked([f"{_NODE_MARKER}={name}", f"SLURMD_NODENAME={name}"], table)) & ours
        proc = self._procs.get(name)
        if proc is not None and proc.poll() is None:
            victims.add(proc.pid)
        _signal_all(victims, signal.SIGKILL)
        if proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        return sorted(victims)

    def stop(self, remove: bool = True) -> None:
        """Stop every daemon, job and task of this cluster and check that none is left. Idempotent.

        Controller and nodes get SIGTERM, then SIGKILL after a few seconds, with every job step and task
        they leave (found by the marker in their environment); MUNGE goes last. A state directory this object
        made is then removed (unless ``keep=True``, or ``remove=False``).
        """
        with self._lock:
            if not self.started:
                return
            if self._reaper is not None:
                with contextlib.suppress(ProcessLookupError):
                    self._reaper.kill()
                self._reaper.wait(timeout=10)
                self._reaper = None
            munged = self._procs.get("munged")
            keep_munge = {munged.pid} if munged is not None and munged.poll() is None else set()
            left = _end(lambda: [p for p in self.processes() if p not in keep_munge])
            left += _end(self.processes)
            for proc in self._procs.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            self._procs.clear()
            self.started = False
            _LIVE.discard(self)
            if left:
                raise SlurmClusterError(f"processes of the cluster survived SIGKILL: {left}")
            if remove and self._given_dir is None and not self.keep:
                shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.started else "stopped"
        return f"SlurmCluster(nodes={self.nodes}, state_dir='{self.state_dir}', {state})"

    # ----------------------------------------------------------------- commands

    def run(
        self,
        args: Sequence[str],
        *,
        timeout: float = 60.0,
        check: bool = True,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (``["squeue"]``, ``["scontrol", "show", "node"]``) against this cluster.

        ``env`` adds to :meth:`env`; ``cwd`` is where it runs. Raises :class:`SlurmClusterError` with its
        output when it fails (``check``) or outlives ``timeout``.
        """
        if isinstance(args, str) or not args:
            raise TypeError(f"args must be a non-empty list of strings like ['squeue'], got {args!r}")
        cmd = [str(a) for a in args]
        exe = _which(cmd[0]) or cmd[0]
        try:
            done = subprocess.run(
                [exe, *cmd[1:]],
                capture_output=True,
                text=True,
                timeout=timeout,
                env=self.env(env),
                stdin=subprocess.DEVNULL,
                cwd=cwd,
            )
        except subprocess.TimeoutExpired as e:
            raise SlurmClusterError(f"`{' '.join(cmd)}` did not finish within {timeout:g} s") from e
        if check and done.returncode != 0:
            raise SlurmClusterError(
                f"`{' '.join(cmd)}` failed (exit code {done.returncode}):\n{done.stderr.strip() or done.stdout.strip()}"
            )
        return done

    def node_states(self, check: bool = True) -> dict[str, str]:
        """Each node's state as ``scontrol show node`` gives it: ``IDLE``, ``ALLOCATED``, ``DOWN+NOT_RESPONDING``..."""
        done = self.run(["scontrol", "show", "node", "-o"], check=check, timeout=30)
        if done.returncode != 0:
            return {}
        return {f["NodeName"]: f.get("State", "") for f in map(_fields, done.stdout.splitlines()) if "NodeName" in f}

    def node(self, name: str) -> dict[str, str]:
        """``scontrol show node NAME`` as a dict (``State``, ``Reason``, ``CPUAlloc``, ...)."""
        return _fields(self.run(["scontrol", "show", "node", "-o", name]).stdout)

    def sbatch(
        self,
        script: str | os.PathLike[str],
        *args: str,
        options: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
    ) -> int:
        """Submit a batch script (``sbatch [options] script args``) and return its job id.

        It is submitted from ``cwd`` (default: the script's directory), where the job runs and where
        relative ``--output`` paths land; ``env`` adds to the job's environment (:meth:`env`).
        """
        path = Path(script).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"no job script at {path}")
        cmd = ["sbatch", "--parsable", *options, str(path), *args]
        done = self.run(cmd, env=env, cwd=path.parent if cwd is None else cwd)
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict[str, str]:
        """``scontrol show job ID`` as a dict: ``JobState``, ``ExitCode``, ``NodeList``, ``StdOut``, ..."""
        return _fields(self.run(["scontrol", "show", "job", "-o", str(job_id)]).stdout)

    def wait_job(
        self, job_id: int, *, states: Iterable[str] = TERMINAL_STATES, timeout: float = 120.0, cancel: bool = True
    ) -> dict[str, str]:
        """Wait until the job's state is one of ``states`` (by default: it ended); return :meth:`job`'s record.

        On timeout the job is cancelled (unless ``cancel=False``) and :class:`SlurmClusterError` quotes
        its record and the end of its output file.
        """
        wanted = set(states)
        record: dict[str, str] = {}

        def reached() -> bool:
            record.update(self.job(job_id))
            return record.get("JobState") in wanted

        try:
            wait_until(reached, timeout, f"job {job_id} to be {'/'.join(sorted(wanted))}", poll=0.25)
        except SlurmClusterError as e:
            if cancel:
                self.run(["scancel", str(job_id)], check=False)
            out = Path(record.get("StdOut", ""))
            tail = _tail(out, 20) if record.get("StdOut") else "(no output file)"
            raise SlurmClusterError(
                f"{e}; it was {record.get('JobState', 'unknown')}"
                f"{' and is cancelled' if cancel else ''}. Its output ({out}):\n{tail}"
            ) from None
        return dict(record)

    def squeue(self) -> str:
        """``squeue``'s table, as a user would read it."""
        return self.run(["squeue"]).stdout

    def sinfo(self) -> str:
        """``sinfo -N -l``'s table: one line per node with its state."""
        return self.run(["sinfo", "-N", "-l"]).stdout

    def jobcomp(self) -> list[dict[str, str]]:
        """Every finished job as the jobcomp file records it (``JobId``, ``JobState``, ``NodeList``, ``ExitCode``)."""
        if not self.jobcomp_file.exists():
            return []
        return [_fields(line) for line in self.jobcomp_file.read_text().splitlines() if line.strip()]


def _needles(info: Mapping[str, Any]) -> list[str]:
    return [f"{_MARKER}={info['id']}", f"SLURM_CONF={info['conf']}"]


# --------------------------------------------------------------------------- command line


def _default_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"course-slurm-{_user()}"


def _read_info(d: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((d / "cluster.json").read_text()))
    except (OSError, ValueError):
        return None


def _down(d: Path) -> int:
    info = _read_info(d)
    if info is None:
        print(f"no cluster in {d}")
        return 0
    needles = _needles(info)
    left = _end(lambda: _marked(needles))
    print(f"stopped the cluster in {d}" + (f"; these survived: {left}" if left else "; nothing left running"))
    return 1 if left else 0


def _watch(d: Path, parent: int, keep: bool) -> int:
    """The watchdog: once ``parent`` is gone, stop what it left behind (and remove its temporary directory)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C in the terminal is for the parent, not for us
    while os.getppid() == parent:
        time.sleep(0.5)
    info = _read_info(d)
    if info is not None:
        _end(lambda: _marked(_needles(info)))
    if not keep:
        shutil.rmtree(d, ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("command", choices=["up", "down", "status", "_watch"])
    parser.add_argument("--dir", type=Path, default=None, help=f"state directory (default {_default_dir()})")
    parser.add_argument("--pid", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--keep", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    d = (args.dir or _default_dir()).resolve()
    if args.command == "_watch":
        return _watch(d, args.pid, args.keep)
    if args.command == "down":
        return _down(d)
    if args.command == "status":
        info = _read_info(d)
        if info is None or not _marked(_needles(info)):
            print(f"no cluster running in {d} (start one with: python scripts/slurm_cluster.py up)")
            return 1
        env = {k: v for k, v in os.environ.items() if not _FOREIGN.match(k)} | {"SLURM_CONF": info["conf"]}
        for cmd in (["sinfo", "-N", "-l"], ["squeue"]):
            subprocess.run([_which(cmd[0]) or cmd[0], *cmd[1:]], env=env, timeout=60, check=False)
        print(f"\nto use it: export SLURM_CONF={info['conf']}")
        return 0
    missing = missing_programs()
    if missing:
        print(f"missing {', '.join(missing)}: {INSTALL_HINT}", file=sys.stderr)
        return 1
    cluster = SlurmCluster(d, watchdog=False)
    try:
        cluster.start()
    except SlurmClusterError as e:
        print(f"the cluster did not start: {e}", file=sys.stderr)
        return 1
    _LIVE.discard(cluster)  # it outlives this command: `down` stops it
    print(cluster.sinfo())
    print(f"Slurm cluster up in {d} (logs in {cluster.log_dir}).")
    print(f"To use it: export SLURM_CONF={cluster.conf}")
    print("To stop it: python scripts/slurm_cluster.py down" + (f" --dir {d}" if args.dir else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
