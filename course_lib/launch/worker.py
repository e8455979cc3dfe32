"""The entry point of a :func:`~course_lib.launch.run_ranks` child process: load the function, join the
group, run, write the result, and tear down so that the process exits cleanly."""

from __future__ import annotations

import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["worker_main"]


def worker_main() -> None:
    """Entry point of a :func:`~course_lib.launch.run_ranks` child: ``python -c ... spec.pkl rank``.

    Internal: ``run_ranks`` starts each child with ``from course_lib.launch.worker import worker_main; worker_main()``.
    """
    import traceback

    spec_file, rank_s = sys.argv[1], sys.argv[2]
    rank = int(rank_s)
    spec = pickle.loads(Path(spec_file).read_bytes())
    ws = spec["world_size"]
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(ws),
        LOCAL_WORLD_SIZE=str(ws),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(spec["port"]),
    )
    for p in reversed(spec["sys_path"]):
        if p not in sys.path:
            sys.path.append(p)
    try:
        fn = _load_function(spec)
        args = pickle.loads(spec["payload"])
        import torch.distributed as dist

        # Before the group exists: functions of torch.distributed.nn.functional take
        # ``group=group.WORLD`` as a default argument, evaluated at import. DDP imports that module
        # lazily (through torch._dynamo); imported after init_process_group, it would hold the
        # default group for good, and destroy_process_group() below could not free it.
        # torch.distributed.optim's ZeroRedundancyOptimizer module does the same (its _broadcast_object).
        import torch.distributed.nn  # noqa: F401
        import torch.distributed.optim  # noqa: F401

        group = spec["init_method"] != "none"
        _start_group(spec, rank, ws)
        try:
            value = fn(rank, ws, *args)
        except BaseException:
            # record before destroy_process_group(): destroying closes the connections, and the
            # other ranks then fail too; the time stamp lets the launcher tell cause from effect
            Path(spec["dir"], f"error_{rank}.txt").write_text(f"{time.time():.6f}\n{traceback.format_exc()}")
            if group and dist.is_initialized():
                dist.destroy_process_group()
            raise
        Path(spec["dir"], f"result_{rank}.pkl").write_bytes(pickle.dumps(value))
        del value, fn, args  # fn's module may hold the job's objects; the result is on disk
        if group and dist.is_initialized():
            # Tear down together, drop PyTorch's caches that hold the group, free it while Python is fully alive
            # (the last reference going joins gloo's worker threads), and check that it is gone: a gloo thread
            # still alive at interpreter shutdown that drops a finished collective holding Python tensors needs
            # the GIL, is ended by Python instead, and the process aborts ("terminate called without an active
            # exception") after all the work is done. course_lib.teardown says what holds a group that survives.
            from course_lib.teardown import end_process_group

            end_process_group(barrier=True)
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        text = traceback.format_exc()
        err = Path(spec["dir"], f"error_{rank}.txt")
        if not err.exists():
            err.write_text(f"{time.time():.6f}\n{text}")
        sys.stderr.write(text)
        sys.stderr.flush()
        # After a failure, skip interpreter teardown: a peer may be gone and a gloo thread stuck in
        # its collective; the error is recorded and the exit code says the rest.
        os._exit(1)


def _load_function(spec: dict[str, Any]) -> Any:
    """The job's function, from its file (loaded once per process) or its module."""
    import importlib
    import importlib.util

    if spec["path"] is not None:
        mod = sys.modules.get(spec["module"])
        if mod is None or getattr(mod, "__file__", None) != spec["path"]:
            ispec = importlib.util.spec_from_file_location(spec["module"], spec["path"])
            assert ispec is not None and ispec.loader is not None
            mod = importlib.util.module_from_spec(ispec)
            sys.modules[spec["module"]] = mod
            ispec.loader.exec_module(mod)
    else:
        mod = importlib.import_module(spec["module"])
    fn: Any = mod
    for part in spec["name"].split("."):
        fn = getattr(fn, part)
    return fn


def _start_group(spec: dict[str, Any], rank: int, world_size: int) -> None:
    """Bind this rank's GPU (``device="cuda"``) and open the default process group (unless ``init_method="none"``)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    device_id = None
    if spec["device"] == "cuda":
        device_id = torch.device("cuda", rank)  # one GPU per rank: LOCAL_RANK == rank on this one machine
        torch.cuda.set_device(device_id)
    if spec["init_method"] != "none":
        url = "env://" if spec["init_method"] == "env" else f"tcp://127.0.0.1:{spec['port']}"
        dist.init_process_group(
            spec["backend"],
            init_method=url,
            rank=rank,
            world_size=world_size,
            # longer than the launch's own timeout: a hung job is stopped by the launcher, which reports where each
            # rank waited, rather than by a gloo timeout racing it in one rank
            timeout=timedelta(seconds=max(spec["timeout"], 1.0) + 10.0),
            device_id=device_id,
        )
