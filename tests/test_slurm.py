"""A real Slurm cluster of two nodes on this machine (scripts/slurm_cluster.py): up, a torchrun job, scancel,
a node failure, and nothing left behind whatever happens.

These tests run through ``make test-slurm``, which sets ``COURSE_SLURM_TESTS=1``; elsewhere they skip
(they take about a minute). Without Slurm they skip with how to install it; with
``COURSE_REQUIRE_SLURM=1`` (``.ci/run``) that skip is a failure. The ranks are CPU processes
(``CUDA_VISIBLE_DEVICES=""``, gloo, ``OMP_NUM_THREADS=1``).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from course_lib.launch import free_port
from course_tools.slurm_cluster import (
    INSTALL_HINT,
    PROGRAMS,
    SlurmCluster,
    SlurmClusterError,
    missing_programs,
    wait_until,
)

pytestmark = pytest.mark.slow  # a real Slurm cluster and its jobs: `make test-slurm`

ROOT = Path(__file__).resolve().parents[1]
ENABLED = os.environ.get("COURSE_SLURM_TESTS") == "1"
REQUIRED = os.environ.get("COURSE_REQUIRE_SLURM") == "1"

# The course's job script: two nodes, one task per node (a torchrun agent, which starts that node's rank),
# the rendezvous on the first node. RDZV=c10d (default): torchrun's elastic rendezvous, where the agents
# number the nodes themselves in the order they join (it ignores --node-rank). RDZV=static: node i is
# --node-rank=$SLURM_NODEID, so rank i runs on the job's node i every time.
JOB_SCRIPT = """\
#!/bin/bash
#SBATCH --job-name=allreduce
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output=slurm-%j.out
#SBATCH --no-requeue
# CPU ranks that talk over gloo: no GPU, one thread each.
export CUDA_VISIBLE_DEVICES= OMP_NUM_THREADS=1
set -euo pipefail
# The rendezvous runs on the job's first node. These nodes share one machine, so ask Slurm for the
# node's address; on a real cluster its host name would do.
head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
HEAD_ADDR=$(scontrol show node "$head_node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
export HEAD_ADDR RDZV_PORT=${RDZV_PORT:-29500}
echo "job $SLURM_JOB_ID: $SLURM_NNODES nodes ($SLURM_JOB_NODELIST), rendezvous on $head_node at $HEAD_ADDR:$RDZV_PORT"
if [ "${RDZV:-c10d}" = c10d ]; then
    srun --output=rank-%j-node%n.out torchrun --nnodes="$SLURM_NNODES" --nproc-per-node=1 \\
        --rdzv-backend=c10d --rdzv-endpoint="$HEAD_ADDR:$RDZV_PORT" --rdzv-id="$SLURM_JOB_ID" allreduce.py "$@"
else
    # In single quotes, so that each task reads its own SLURM_NODEID (this shell, on node 0, would say 0).
    srun --output=rank-%j-node%n.out bash -c 'exec torchrun --nnodes="$SLURM_NNODES" --nproc-per-node=1 \\
        --node-rank="$SLURM_NODEID" --master-addr="$HEAD_ADDR" --master-port="$RDZV_PORT" allreduce.py "$@"' bash "$@"
fi
"""

WORKER = """\
import os
import sys
import time

import torch
import torch.distributed as dist

# A CPU job, even where the machine has GPUs.
assert os.environ["CUDA_VISIBLE_DEVICES"] == "" and os.environ["OMP_NUM_THREADS"] == "1"
assert torch.cuda.device_count() == 0
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
node = os.environ["SLURMD_NODENAME"]
total = torch.tensor([float(rank + 1)])
dist.all_reduce(total)
print(f"rank {rank} of {world} on node {node}: all_reduce sum={total.item():.1f}", flush=True)
if sys.argv[1:] == ["--forever"]:  # a training run that never ends: one collective per step
    print(f"rank {rank} on node {node}: training", flush=True)
    while True:
        dist.all_reduce(torch.ones(1))
        time.sleep(0.2)
dist.barrier()
dist.destroy_process_group()
"""

RANK_LINE = re.compile(r"^rank (\d) of 2 on node (n\d): all_reduce sum=(\S+)$", re.M)


def _skip_or_fail(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"the Slurm tests are required (COURSE_REQUIRE_SLURM=1) but: {reason}", pytrace=False)
    pytest.skip(reason)


@pytest.fixture
def slurm() -> None:
    """Skips unless the Slurm tests were asked for and Slurm is installed."""
    if not ENABLED:
        pytest.skip("the real-Slurm tests run with `make test-slurm` (COURSE_SLURM_TESTS=1)")
    missing = missing_programs()
    if missing:
        _skip_or_fail(f"Slurm is not installed (no {', '.join(missing)}): {INSTALL_HINT}; then `make test-slurm`")


def _leftovers(cluster: SlurmCluster) -> list[str]:
    """Live processes of the cluster, found independently with psutil: by marker, by state directory."""
    found = []
    for p in psutil.process_iter(["pid", "status", "cmdline"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            env = p.environ()
            cmdline = " ".join(p.info["cmdline"] or [])
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if (
            env.get("COURSE_SLURM_CLUSTER") == cluster.id
            or env.get("SLURM_CONF") == str(cluster.conf)
            or str(cluster.state_dir) in cmdline
        ):
            found.append(f"{p.pid} {cmdline}")
    return found


def _assert_nothing_left(cluster: SlurmCluster) -> None:
    assert _leftovers(cluster) == []
    assert cluster.processes() == []
    assert psutil.Process().children(recursive=True) == []


@pytest.fixture
def cluster(slurm: None) -> Iterator[SlurmCluster]:
    c = SlurmCluster()
    c.start()
    try:
        yield c
    finally:
        c.stop()
        _assert_nothing_left(c)
        assert not c.state_dir.exists()


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    (tmp_path / "job.sh").write_text(JOB_SCRIPT)
    (tmp_path / "allreduce.py").write_text(WORKER)
    return tmp_path


def _submit(cluster: SlurmCluster, job_dir: Path, *args: str, rdzv: str = "c10d") -> int:
    return cluster.sbatch(job_dir / "job.sh", *args, env={"RDZV_PORT": str(free_port()), "RDZV": rdzv})


def _wait_training(cluster: SlurmCluster, job_dir: Path, job: int) -> None:
    """Until both ranks say they are in the training loop (the job is really running on both nodes)."""

    def training() -> bool:
        logs = [p.read_text() for p in job_dir.glob(f"rank-{job}-node*.out")]
        return len(logs) == 2 and all(": training" in text for text in logs)

    try:
        wait_until(training, 120, f"job {job}'s two ranks to start training")
    except SlurmClusterError:
        print(cluster.job(job), *(p.read_text() for p in sorted(job_dir.glob("*.out"))), sep="\n")
        raise


# --------------------------------------------------------------------------- no Slurm needed


def test_arguments_are_checked_before_anything_starts() -> None:
    with pytest.raises(ValueError, match="nodes must be"):
        SlurmCluster(nodes=["N 1"])
    with pytest.raises(ValueError, match="distinct"):
        SlurmCluster(nodes=["n1", "n1"])
    with pytest.raises(ValueError, match="cpus_per_node must be a positive int"):
        SlurmCluster(cpus_per_node=0)
    with pytest.raises(ValueError, match="start_timeout"):
        SlurmCluster(start_timeout=-1)
    with pytest.raises(TypeError, match="extra_conf"):
        SlurmCluster(extra_conf=["x"])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout must be a positive"):
        wait_until(lambda: True, 0, "nothing")
    c = SlurmCluster(nodes=("a", "b"), cpus_per_node=3)
    text = c.slurm_conf_text()
    assert "NodeName=a NodeAddr=127.0.0.1" in text and "CPUs=3" in text and "PartitionName=debug Nodes=a,b" in text
    assert "JobCompType=jobcomp/filetxt" in text and "AccountingStorageType=accounting_storage/none" in text
    with pytest.raises(ValueError, match="daemon must be"):
        c.log_files("n9")
    assert c.env()["CUDA_VISIBLE_DEVICES"] == "" and c.env()["OMP_NUM_THREADS"] == "1"
    assert c.env()["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    c.stop()  # never started: nothing to do


def test_without_slurm_the_tests_skip_saying_how_to_install_it_or_fail_where_required(tmp_path: Path) -> None:
    run = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-W", "ignore::pytest.PytestConfigWarning"]
    run += ["-rs", __file__, "-k", "comes_up"]
    env = {**os.environ, "COURSE_SLURM_TESTS": "1", "PATH": str(tmp_path)}  # no Slurm on this PATH
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"  # starts in a second: no nbval, no Jupyter
    env.pop("COURSE_REQUIRE_SLURM", None)
    skipped = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert skipped.returncode == 0 and "1 skipped" in skipped.stdout, skipped.stdout
    assert "Slurm is not installed" in skipped.stdout and "apt-get install -y slurm-wlm munge" in skipped.stdout
    env["COURSE_REQUIRE_SLURM"] = "1"
    failed = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert failed.returncode == 1 and "the Slurm tests are required (COURSE_REQUIRE_SLURM=1)" in failed.stdout


def test_start_without_slurm_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr("course_tools.slurm_cluster._SBIN", ())
    monkeypatch.setenv("PATH", str(tmp_path))
    assert missing_programs() == list(PROGRAMS)
    c = SlurmCluster()
    with pytest.raises(SlurmClusterError, match="missing munged, slurmctld.*apt-get install -y slurm-wlm munge"):
        c.start()
    assert not c.started and c.processes() == []


# --------------------------------------------------------------------------- the cluster itself


def test_the_cluster_comes_up_with_two_idle_nodes_and_goes_down_leaving_nothing(slurm: None) -> None:
    for _ in range(2):  # a second cluster starts right after the first
        c = SlurmCluster()
        start = time.monotonic()
        with c:
            up = time.monotonic() - start
            assert c.node_states() == {"n1": "IDLE", "n2": "IDLE"}
            assert re.search(r"^n1 .* idle", c.sinfo(), re.M) and re.search(r"^n2 .* idle", c.sinfo(), re.M)
            daemons = {psutil.Process(p).name() for p in c.processes()}
            assert {"munged", "slurmctld", "slurmd"} <= daemons, daemons
            assert len(_leftovers(c)) >= 4  # munged, slurmctld, two slurmd (psutil sees them too)
            print(f"up in ~{up:.1f} s: {sorted(daemons)}")
        _assert_nothing_left(c)
        assert not c.state_dir.exists()


def test_a_daemon_that_fails_to_start_is_named_with_its_log_and_nothing_is_left(slurm: None) -> None:
    c = SlurmCluster(extra_conf="NoSuchParameter=1")
    try:
        # every daemon reads the bad key and exits; whichever the start notices first is named (slurmctld or a
        # node's slurmd: a race between the daemons' parsers), with its log
        with pytest.raises(SlurmClusterError, match=r"(slurmctld|n\d+) exited .*(?s:.*)NoSuchParameter") as failed:
            c.start()
        named = str(failed.value).split(" exited", 1)[0]
        _assert_nothing_left(c)
        assert c.log_files(named)[0].exists()  # its output, kept for reading
    finally:
        shutil.rmtree(c.state_dir, ignore_errors=True)


def test_the_watchdog_stops_the_cluster_when_its_owner_is_killed(slurm: None, tmp_path: Path) -> None:
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time; from course_tools.slurm_cluster import SlurmCluster\n"
            "c = SlurmCluster().start()\nprint(c.id, c.conf, flush=True)\ntime.sleep(600)",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert owner.stdout is not None
        cluster_id, conf = owner.stdout.readline().split()
        c = SlurmCluster()
        c.id, c.state_dir = cluster_id, Path(conf).parent  # the same cluster, seen from here
        assert len(c.processes()) >= 4
        owner.send_signal(signal.SIGKILL)  # no atexit, no finally: only the watchdog is left to clean up
        owner.wait(timeout=10)
        wait_until(lambda: not c.processes() and not _leftovers(c), 30, "the watchdog to stop the cluster")
        wait_until(lambda: not c.state_dir.exists(), 10, "the watchdog to remove the state directory")
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait()
    assert psutil.Process().children(recursive=True) == []


def test_the_command_line_starts_reports_and_stops_a_cluster(slurm: None) -> None:
    d = Path(f"/tmp/course-slurm-cli-{os.getpid()}")
    script = [sys.executable, str(ROOT / "scripts" / "slurm_cluster.py")]

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*script, *args, "--dir", str(d)], capture_output=True, text=True, timeout=120)

    try:
        up = cli("up")
        assert up.returncode == 0, up.stderr
        assert f"export SLURM_CONF={d}/slurm.conf" in up.stdout
        status = cli("status")
        assert status.returncode == 0 and re.search(r"^n2 .* idle", status.stdout, re.M), status.stdout
        again = cli("up")
        assert again.returncode == 1 and "already running" in again.stderr
    finally:
        down = cli("down")
        assert down.returncode == 0 and "nothing left running" in down.stdout, down.stdout + down.stderr
        c = SlurmCluster(d)
        assert _leftovers(c) == []
        assert cli("status").returncode == 1
        shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------- jobs


@pytest.mark.parametrize("rdzv", ["c10d", "static"])
def test_a_two_node_torchrun_job_all_reduces_across_both_nodes(cluster: SlurmCluster, job_dir: Path, rdzv: str) -> None:
    start = time.monotonic()
    job = _submit(cluster, job_dir, rdzv=rdzv)
    record = cluster.wait_job(job, timeout=240)
    wall = time.monotonic() - start
    batch_log = (job_dir / f"slurm-{job}.out").read_text()
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", (record, batch_log)
    assert record["NodeList"] == "n[1-2]" and record["NumNodes"] == "2"
    assert f"job {job}: 2 nodes (n[1-2]), rendezvous on n1 at 127.0.0.1:" in batch_log
    rank_logs = sorted(job_dir.glob(f"rank-{job}-node*.out"))  # srun --output=rank-%j-node%n.out
    assert [p.name for p in rank_logs] == [f"rank-{job}-node0.out", f"rank-{job}-node1.out"]
    lines = [m.groups() for p in rank_logs for m in RANK_LINE.finditer(p.read_text())]
    assert len(lines) == 2, [p.read_text() for p in rank_logs]
    assert {rank for rank, _, _ in lines} == {"0", "1"}
    assert {node for _, node, _ in lines} == {"n1", "n2"}  # the two ranks ran on different nodes
    assert {total for _, _, total in lines} == {"3.0"}  # and agree: 1 + 2
    if rdzv == "static":  # rank i on the job's node i, in the log of node i
        assert lines == [("0", "n1", "3.0"), ("1", "n2", "3.0")]
    done = {r["JobId"]: r for r in cluster.jobcomp()}
    assert done[str(job)]["JobState"] == "COMPLETED" and done[str(job)]["NodeCnt"] == "2"
    assert cluster.job_processes(job) == []
    print(f"{rdzv} job {job} submitted to COMPLETED in ~{wall:.1f} s")


def test_scancel_ends_a_running_job_and_all_its_processes(cluster: SlurmCluster, job_dir: Path) -> None:
    job = _submit(cluster, job_dir, "--forever")
    _wait_training(cluster, job_dir, job)
    assert cluster.job(job)["JobState"] == "RUNNING"
    running = cluster.job_processes(job)
    names = {psutil.Process(p).name() for p in running}
    assert {"slurmstepd", "srun", "torchrun"} <= names or len(running) >= 6, names
    start = time.monotonic()
    cluster.run(["scancel", str(job)])
    record = cluster.wait_job(job, timeout=60)
    assert record["JobState"] == "CANCELLED", record
    wait_until(lambda: not cluster.job_processes(job), 30, f"job {job}'s processes to end")
    gone = time.monotonic() - start
    assert not [p for p in running if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    assert "CANCELLED AT" in (job_dir / f"slurm-{job}.out").read_text()
    assert set(cluster.node_states().values()) == {"IDLE"}
    print(f"scancel: job and its {len(running)} processes gone in ~{gone:.1f} s")


def test_a_node_that_dies_fails_the_job_and_is_marked_down(cluster: SlurmCluster, job_dir: Path) -> None:
    job = _submit(cluster, job_dir, "--forever")
    _wait_training(cluster, job_dir, job)
    start = time.monotonic()
    killed = cluster.kill_node("n2")  # its slurmd, slurmstepd, torchrun agent and rank
    assert len(killed) >= 3
    record = cluster.wait_job(job, timeout=90)
    failed = time.monotonic() - start
    assert record["JobState"] == "NODE_FAIL", record
    n2 = cluster.node("n2")
    assert (
        n2["State"].startswith("DOWN") and "NOT_RESPONDING" in n2["State"] and n2["Reason"].startswith("Not responding")
    )
    batch_log = (job_dir / f"slurm-{job}.out").read_text()
    assert "Node failure on n2" in batch_log or "DUE TO NODE FAILURE" in batch_log, batch_log
    wait_until(lambda: not cluster.job_processes(job), 30, f"job {job}'s processes on n1 to end")
    assert cluster.node_states()["n1"] == "IDLE"
    cluster.start_node("n2")  # the node comes back (ReturnToService=2) and takes jobs again
    wait_until(lambda: cluster.node_states()["n2"] == "IDLE", 60, "n2 to be idle again")
    print(f"node failure: job NODE_FAIL and n2 {n2['State']} ~{failed:.1f} s after the kill")


# --------------------------------------------------------------------------- notebook 22's capstone job


def _notebook_job_files() -> tuple[str, str, float]:
    """Notebook 22's own job script (its CAPSTONE_SBATCH cell), training script (%%writefile) and FP32_TOL."""
    import ast

    import jupytext

    from course_lib.manifest import written_file

    nb = jupytext.read(ROOT / "sources" / "22_capstone.py", fmt="py:percent")
    values: dict[str, object] = {}
    for cell in nb.cells:
        if cell.cell_type != "code" or not ("CAPSTONE_SBATCH =" in cell.source or "FP32_TOL," in cell.source):
            continue
        for node in ast.parse(cell.source).body:  # the cell's top-level assignments of constants
            if not isinstance(node, ast.Assign):
                continue
            target, value = node.targets[0], node.value
            pairs = (
                zip(target.elts, value.elts)
                if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                else [(target, value)]
            )
            for name, v in pairs:
                if isinstance(name, ast.Name) and name.id in ("CAPSTONE_SBATCH", "FP32_TOL"):
                    values[name.id] = ast.literal_eval(v)
    job, tol = values["CAPSTONE_SBATCH"], values["FP32_TOL"]
    assert isinstance(job, str) and isinstance(tol, float)
    return job, written_file("22_capstone", "_runs/capstone_train.py"), tol


def test_the_capstone_job_trains_on_two_slurm_nodes_like_one_process(cluster: SlurmCluster, tmp_path: Path) -> None:
    import json

    job_script, train_script, tol = _notebook_job_files()
    assert "#SBATCH --nodes=2" in job_script and "--rdzv-backend=c10d" in job_script
    (tmp_path / "capstone.sbatch").write_text(job_script)
    (tmp_path / "capstone_train.py").write_text(train_script)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    subprocess.run(
        [sys.executable, "capstone_train.py", "--out", "single"],
        cwd=tmp_path,
        env=env,
        check=True,
        capture_output=True,
        timeout=300,
    )  # the one-process reference
    start = time.monotonic()
    job = cluster.sbatch(tmp_path / "capstone.sbatch", "--dp", "ddp", env={"RDZV_PORT": str(free_port())})
    record = cluster.wait_job(job, timeout=300)
    wall = time.monotonic() - start
    batch_log = (tmp_path / f"slurm-{job}.out").read_text()
    rank_logs = {p.name: p.read_text() for p in sorted(tmp_path.glob(f"rank-{job}-node*.out"))}
    assert record["JobState"] == "COMPLETED" and record["ExitCode"] == "0:0", (record, batch_log, rank_logs)
    assert record["NodeList"] == "n[1-2]" and record["NumNodes"] == "2"
    single = json.loads((tmp_path / "single" / "result.json").read_text())
    slurm = json.loads((tmp_path / f"capstone-{job}" / "result.json").read_text())
    assert slurm["world"] == 2
    diff = max(abs(slurm["losses"][s] - single["losses"][s]) for s in single["losses"])
    assert diff < tol, (diff, tol)
    assert cluster.job_processes(job) == []
    print(
        f"capstone job {job} on n[1-2]: submitted to COMPLETED in ~{wall:.1f} s; loss difference {diff:.1e} < {tol:g}"
    )
    print(batch_log, *rank_logs.items(), sep="\n")
