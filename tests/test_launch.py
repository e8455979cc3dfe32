"""The notebook launcher: real multi-process jobs that fail in every way, cleanly and in time."""

from __future__ import annotations

import os
import socket
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from course_lib.launch import (
    LaunchError,
    LaunchResult,
    child_stderr,
    free_port,
    launched_processes,
    port_in_use,
    run_ranks,
    run_script,
    run_torchrun,
    torchrun_command,
)
from course_lib.launch.forkserver import forkserver_pid
from course_lib.launch.guardian import guardian_pid

WORKERS = """
import time
import torch
import torch.distributed as dist


def add_ranks(rank, world_size, scale):
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print(f"rank {rank} of {world_size}: sum={t.item():.1f}")
    return t.item() * scale


def raise_on_rank_1(rank, world_size):
    if rank == 1:
        raise ValueError("rank 1 broke on purpose")
    dist.barrier()


def no_group(rank, world_size):
    return dist.is_initialized()


def visible_gpus(rank, world_size):
    import os
    return os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.get("HIP_VISIBLE_DEVICES")
"""

SCRIPTS = {
    "ok.py": """
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([float(dist.get_rank() + 1)])
        dist.all_reduce(t)
        print(f"rank {dist.get_rank()}: sum={t.item():.1f}")
        dist.destroy_process_group()
    """,
    "raises.py": """
        import torch.distributed as dist
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            raise ValueError("rank 1 broke on purpose")
        dist.barrier()
        dist.destroy_process_group()
    """,
    "fails_once.py": """
        import os, torch.distributed as dist
        attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
        # a fresh prefix per attempt: the agent's store still holds the dead attempt's gloo addresses
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)
        dist.init_process_group("gloo", store=dist.PrefixStore(f"attempt{attempt}", store),
                                rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
        print(f"rank {dist.get_rank()}: attempt {attempt}", flush=True)
        if attempt == 0 and dist.get_rank() == 1:
            os._exit(3)  # dies without a word, as a killed process would
        dist.barrier()
        dist.destroy_process_group()
    """,
    "hangs.py": """
        import time, torch, torch.distributed as dist
        dist.init_process_group("gloo")
        print("in the job", flush=True)
        if dist.get_rank() == 0:
            dist.all_reduce(torch.ones(1))  # rank 1 never joins: rank 0 waits forever
        else:
            time.sleep(600)
    """,
    "fixed_port.py": """
        import os, sys, torch.distributed as dist
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = sys.argv[1]
        dist.init_process_group("gloo", rank=0, world_size=1)
    """,
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("jobs")
    (d / "launch_test_workers.py").write_text(WORKERS)
    for name, body in SCRIPTS.items():
        (d / name).write_text(textwrap.dedent(body))
    return d


def _marked_processes() -> list[int]:
    """Every live process that carries the launcher's marker and was launched from this test process,
    found independently with psutil (other jobs on a shared machine carry the marker with their own owner)."""
    found = []
    me = str(os.getpid())
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            env = p.environ()
            if "COURSE_LIB_LAUNCH_ID" in env and env.get("COURSE_LIB_LAUNCH_OWNER") == me:
                found.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _assert_nothing_left() -> None:
    """No launched process is alive: only this process's fork server may be, idle (no rank under it)."""
    assert _marked_processes() == []
    assert launched_processes(owner=os.getpid()) == []
    server = forkserver_pid()
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in (server, guardian_pid())]
    assert left == []


def test_free_port_is_free_and_port_in_use_sees_a_listener() -> None:
    port = free_port()
    assert 1 <= port <= 65535 and not port_in_use(port)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert port_in_use(s.getsockname()[1])
    with pytest.raises(TypeError, match="port must be an int"):
        port_in_use("80")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="1..65535"):
        port_in_use(70000)
    with pytest.raises(TypeError, match="host"):
        free_port("")


def test_torchrun_command_is_what_one_types() -> None:
    cmd = torchrun_command(
        "train.py",
        nproc_per_node=4,
        nnodes=2,
        node_rank=1,
        master_addr="10.0.0.1",
        master_port=1234,
        args=["--epochs", 3],
    )
    assert Path(cmd[0]).name == "torchrun" or cmd[1:3] == ["-m", "torch.distributed.run"]
    assert "--nnodes=2" in cmd and "--node_rank=1" in cmd and "--nproc_per_node=4" in cmd
    assert "--master_addr=10.0.0.1" in cmd and "--master_port=1234" in cmd
    assert cmd[-3:] == ["train.py", "--epochs", "3"]
    legacy = torchrun_command("train.py", module="launch", tee=False)
    assert legacy[1:3] == ["-m", "torch.distributed.launch"] and "--tee" not in legacy
    elastic = torchrun_command("train.py", rdzv="c10d", master_port=29400)
    assert "--rdzv-backend=c10d" in elastic and "--rdzv-endpoint=127.0.0.1:29400" in elastic
    with pytest.raises(ValueError, match="node_rank"):
        torchrun_command("train.py", nnodes=2, node_rank=2)
    with pytest.raises(ValueError, match="rdzv"):
        torchrun_command("train.py", rdzv="etcd")
    with pytest.raises(ValueError, match="module"):
        torchrun_command("train.py", module="deepspeed")
    with pytest.raises(TypeError, match="args"):
        torchrun_command("train.py", args="--epochs 3")  # type: ignore[arg-type]
    restarts = torchrun_command("train.py", launcher_args=["--max-restarts=1"], args=["--epochs", 3])
    assert restarts[-4:] == ["--max-restarts=1", "train.py", "--epochs", "3"]
    with pytest.raises(TypeError, match="launcher_args"):
        torchrun_command("train.py", launcher_args="--max-restarts=1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="launcher_args must start with an option"):
        torchrun_command("train.py", launcher_args=["train.py"])


def test_invalid_arguments_are_refused_before_anything_starts(jobs: Path) -> None:
    with pytest.raises(TypeError, match="timeout"):
        run_script(["python", "-c", "pass"], timeout="10")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="timeout"):
        run_script(["python", "-c", "pass"], timeout=0)
    with pytest.raises(ValueError, match="echo"):
        run_script(["python", "-c", "pass"], echo="loud")
    with pytest.raises(TypeError, match="argv"):
        run_script("python -c pass")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="labels"):
        run_script(["python", "-c", "pass"], labels=["a", "b"])
    with pytest.raises(FileNotFoundError, match="program not found"):
        run_script(["no-such-program-here"])
    with pytest.raises(ValueError, match="cwd"):
        run_script(["python", "-c", "pass"], cwd=jobs / "missing")
    with pytest.raises(ValueError, match="nprocs"):
        run_ranks("launch_test_workers.py:add_ranks", 0)
    with pytest.raises(ValueError, match="backend"):
        run_ranks(str(jobs / "launch_test_workers.py") + ":add_ranks", backend="tcp")
    with pytest.raises(ValueError, match="file.py:function"):
        run_ranks("add_ranks")
    _assert_nothing_left()


@pytest.mark.slow  # launches a process tree
def test_run_torchrun_streams_each_rank_and_returns_its_output(jobs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    result = run_torchrun("ok.py", cwd=jobs, timeout=60, echo="live")
    assert isinstance(result, LaunchResult) and result.returncode == 0
    assert result.output(0) == "rank 0: sum=3.0" and result.output(1) == "rank 1: sum=3.0"
    assert 0 < result.wall_time < 60
    printed = capsys.readouterr().out
    assert "[rank 0] rank 0: sum=3.0" in printed and "[rank 1] rank 1: sum=3.0" in printed
    assert result.grouped() == "[rank 0] rank 0: sum=3.0\n[rank 1] rank 1: sum=3.0"
    _assert_nothing_left()


@pytest.mark.slow  # launches a process tree
def test_two_torchrun_agents_make_a_two_node_job(jobs: Path) -> None:
    result = run_torchrun("ok.py", cwd=jobs, nnodes=2, nproc_per_node=1, timeout=60, echo="none")
    assert len(result.commands) == 2
    assert any("--node_rank=0" in c for c in result.commands) and any("--node_rank=1" in c for c in result.commands)
    assert result.output(0) == "rank 0: sum=3.0" and result.output(1) == "rank 1: sum=3.0"
    _assert_nothing_left()


@pytest.mark.slow  # launches a process tree
def test_launcher_args_reach_torchrun_and_max_restarts_restarts_every_worker(jobs: Path) -> None:
    with pytest.raises(LaunchError):  # no restart allowed: rank 1's death fails the job
        run_torchrun("fails_once.py", cwd=jobs, timeout=60, echo="none")
    result = run_torchrun("fails_once.py", cwd=jobs, launcher_args=["--max-restarts=1"], timeout=60, echo="none")
    assert "--max-restarts=1" in result.commands[0]
    # both workers ran twice: the agent restarted the healthy rank 0 as well
    for rank in (0, 1):
        said = [line for line in result.output(rank).splitlines() if line.startswith("rank ")]
        assert said == [f"rank {rank}: attempt 0", f"rank {rank}: attempt 1"]  # (rank 0 also lost its peer)
    _assert_nothing_left()


@pytest.mark.slow  # launches a process tree
def test_a_rank_that_raises_gives_its_traceback(jobs: Path) -> None:
    start = time.monotonic()
    with pytest.raises(LaunchError, match="rank 1 failed") as info:
        run_torchrun("raises.py", cwd=jobs, timeout=60, echo="none")
    assert time.monotonic() - start < 60
    err = info.value
    assert isinstance(err, RuntimeError) and err.reason == "failed" and err.rank == 1
    assert "ValueError: rank 1 broke on purpose" in err.traceback
    assert "ValueError: rank 1 broke on purpose" in str(err)
    assert err.result is not None and err.result.returncode != 0
    _assert_nothing_left()


@pytest.mark.slow  # launches a process tree
def test_a_job_that_hangs_is_killed_at_the_timeout_with_each_ranks_last_words() -> None:
    # plain Python, no torch: it starts in milliseconds even on a loaded machine, so the ranks have
    # printed before the timeout, whatever the load, and the message can quote them
    code = "import sys, time; print(f'[rank{sys.argv[1]}]: in the job', flush=True); time.sleep(600)"
    start = time.monotonic()
    with pytest.raises(LaunchError, match="did not finish within the timeout of 4 s") as info:
        run_script([["python", "-c", code, str(r)] for r in (0, 1)], timeout=4, echo="none")
    elapsed = time.monotonic() - start
    assert 4 <= elapsed < 4 + 20, elapsed  # the timeout, plus what cleanup may take on a busy machine
    assert info.value.reason == "timeout"
    assert "[rank 0] last output: in the job" in str(info.value)  # each rank's last words are quoted
    assert "[rank 1] last output: in the job" in str(info.value)
    _assert_nothing_left()


@pytest.mark.slow  # launches a process tree
def test_a_hung_ranks_last_words_come_before_a_traceback_it_printed_while_waiting() -> None:
    """A rank that gave up waiting (a backend's own timeout racing the launcher's) prints a traceback and lingers:
    the timeout's message still quotes where it waited, not the traceback's last lines."""
    code = (
        "import sys, time, traceback; print(f'[rank{sys.argv[1]}]: waiting in recv', flush=True)\n"
        "if sys.argv[1] == '1':\n"
        "    try:\n        raise RuntimeError('timed out waiting for the peer')\n"
        "    except RuntimeError:\n        traceback.print_exc(file=sys.stdout); sys.stdout.flush()\n"
        "time.sleep(600)"
    )
    with pytest.raises(LaunchError, match="did not finish within the timeout of 4 s") as info:
        run_script([["python", "-c", code, str(r)] for r in (0, 1)], timeout=4, echo="none")
    assert info.value.reason == "timeout"
    assert "[rank 1] last output: waiting in recv" in str(info.value), str(info.value)
    assert "[rank 0] last output: waiting in recv" in str(info.value)
    _assert_nothing_left()


@pytest.mark.slow  # launches a process tree
def test_a_rank_that_hangs_in_a_collective_under_torchrun_is_killed(jobs: Path) -> None:
    # torchrun's workers run in their own sessions: the marker sweep must find and kill them too. The
    # timeout leaves room for `import torch` on a loaded machine; the outcome is a timeout either way.
    start = time.monotonic()
    with pytest.raises(LaunchError, match="did not finish within the timeout of 20 s") as info:
        run_torchrun("hangs.py", cwd=jobs, timeout=20, echo="none")
    assert info.value.reason == "timeout" and time.monotonic() - start >= 20
    _assert_nothing_left()


@pytest.mark.slow  # launches a process tree
def test_a_busy_port_is_a_clear_error(jobs: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(LaunchError, match=f"master port {port} .* already in use") as info:
            run_torchrun("ok.py", cwd=jobs, master_port=port, timeout=30)
        assert info.value.reason == "port in use"
        with pytest.raises(LaunchError, match="port in use|already in use"):
            run_ranks(str(jobs / "launch_test_workers.py") + ":add_ranks", 2, (1.0,), master_port=port)
        # a script that hard-codes its port (as the seeds do) fails at run time; the error says why
        start = time.monotonic()
        with pytest.raises(LaunchError, match="already in use: use a free port") as info:
            run_script(["python", "fixed_port.py", str(port)], cwd=jobs, timeout=30, echo="none")
        assert time.monotonic() - start < 30
        assert "EADDRINUSE" in info.value.traceback
    _assert_nothing_left()


def test_a_bad_script_path_is_a_clear_error(jobs: Path) -> None:
    with pytest.raises(FileNotFoundError, match="script not found: .*missing.py"):
        run_torchrun("missing.py", cwd=jobs)
    with pytest.raises(FileNotFoundError, match="worker file not found"):
        run_ranks(str(jobs / "missing.py") + ":main")
    start = time.monotonic()
    with pytest.raises(LaunchError, match="can't open file .*missing.py") as info:
        run_script(["python", "missing.py"], cwd=jobs, timeout=30, echo="none")
    assert time.monotonic() - start < 30 and info.value.result is not None
    assert info.value.result.returncode == 2
    _assert_nothing_left()


@pytest.mark.slow  # launches a process tree
def test_run_ranks_returns_each_ranks_value_in_rank_order(jobs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    values = run_ranks(str(jobs / "launch_test_workers.py") + ":add_ranks", 2, (10.0,), timeout=60, echo="grouped")
    assert values == [30.0, 30.0]
    assert capsys.readouterr().out.strip() == "[rank 0] rank 0 of 2: sum=3.0\n[rank 1] rank 1 of 2: sum=3.0"
    # tcp:// initialisation, and no group at all
    assert run_ranks(
        str(jobs / "launch_test_workers.py") + ":add_ranks", 2, (1.0,), init_method="tcp", echo="none"
    ) == [
        3.0,
        3.0,
    ]
    assert run_ranks(str(jobs / "launch_test_workers.py") + ":no_group", 2, init_method="none", echo="none") == [
        False,
        False,
    ]
    _assert_nothing_left()


@pytest.mark.slow  # launches a process tree
def test_run_ranks_names_the_rank_that_raised(jobs: Path) -> None:
    with pytest.raises(LaunchError, match="rank 1 failed") as info:
        run_ranks(str(jobs / "launch_test_workers.py") + ":raise_on_rank_1", 2, timeout=60, echo="none")
    # rank 0 also failed (its peer left in the middle of a barrier): the cause is rank 1
    assert info.value.rank == 1 and "rank 1 broke on purpose" in info.value.traceback
    _assert_nothing_left()


def test_run_ranks_refuses_functions_a_new_process_cannot_import() -> None:
    def local_worker(rank: int, world_size: int) -> int:
        return rank

    with pytest.raises(ValueError, match="cannot import it"):
        run_ranks(local_worker)
    with pytest.raises(ValueError, match="cannot import it"):
        run_ranks(lambda rank, world_size: rank)
    with pytest.raises(TypeError, match="picklable"):
        run_ranks("course_lib.launch:free_port", args=(lambda: 0,))
    with pytest.raises(TypeError, match="fn must be"):
        run_ranks(42)  # type: ignore[arg-type]


def test_launch_result_output_selects_by_rank_or_label() -> None:
    r = LaunchResult(returncode=0, wall_time=1.0, lines=[("rank 1", "b"), ("agent", "log"), ("rank 0", "a")])
    assert r.ranks == ["rank 1", "agent", "rank 0"]
    assert r.output(0) == "a" and r.output("agent") == "log"
    assert r.output() == "[rank 1] b\n[agent] log\n[rank 0] a"
    assert r.grouped() == "[rank 0] a\n[rank 1] b"  # agents' lines are not a rank's output
    with pytest.raises(TypeError, match="rank must be"):
        r.output(1.5)  # type: ignore[arg-type]


def test_child_stderr_collects_what_children_write_to_fd_2() -> None:
    import subprocess
    import sys

    with child_stderr() as err:
        subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('dying words\\n')"], check=True)
    assert err == ["dying words\n"]


def test_script_rank_prefix_labels_lines_without_a_launcher(jobs: Path) -> None:
    code = "print('[rank1]: from one'); print('[rank0]: from zero'); print('plain')"
    result = run_script(["python", "-c", code], echo="none")
    assert result.output(1) == "from one" and result.output(0) == "from zero" and result.output("main") == "plain"


@pytest.mark.slow  # launches a process tree
def test_cpu_jobs_hide_the_gpus_unless_asked(jobs: Path) -> None:
    # every launcher: the processes see no GPU, so a CPU job stays on the CPU on a GPU machine
    assert run_ranks(str(jobs / "launch_test_workers.py") + ":visible_gpus", 2, echo="none") == [("", "")] * 2
    code = "import os; print('[rank0]: visible=' + repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"
    assert run_script(["python", "-c", code], echo="none").output(0) == "visible=''"
    # an explicit env entry wins (a learner pinning one GPU by hand), and device="cuda" leaves them alone
    pinned = run_script(["python", "-c", code], echo="none", env={"CUDA_VISIBLE_DEVICES": "1"})
    assert pinned.output(0) == "visible='1'"
    import os

    inherited = run_script(["python", "-c", code], echo="none", device="cuda")
    assert inherited.output(0) == "visible=" + repr(os.environ.get("CUDA_VISIBLE_DEVICES"))
    _assert_nothing_left()


def test_run_ranks_refuses_gpu_layouts_it_cannot_bind(jobs: Path) -> None:
    from course_lib.device import gpu_count

    worker = str(jobs / "launch_test_workers.py") + ":add_ranks"
    with pytest.raises(ValueError, match="device must be one of"):
        run_ranks(worker, 2, device="gpu")
    with pytest.raises(ValueError, match="pass device='cuda'"):
        run_ranks(worker, 2, backend="nccl")  # NCCL on CPU processes
    too_many = gpu_count() + 1  # one rank more than there are GPUs (simulated ones do not count)
    with pytest.raises(ValueError, match=rf"{too_many} ranks need {too_many} GPUs, this machine has {too_many - 1}"):
        run_ranks(worker, too_many, device="cuda")
    with pytest.raises(ValueError, match="device must be one of"):
        run_torchrun("ok.py", cwd=jobs, device="tpu")


def test_launched_processes_refuses_a_bad_owner() -> None:
    with pytest.raises(ValueError, match="owner must be a process id"):
        launched_processes(owner=0)
    with pytest.raises(ValueError, match="owner must be a process id"):
        launched_processes(owner="me")  # type: ignore[arg-type]
    assert launched_processes(owner=os.getpid()) == []
