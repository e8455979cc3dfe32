"""Launch multi-process PyTorch jobs from a notebook: never hang, never orphan, always show the error.

A distributed job started from a notebook cell has four ways to go wrong that a terminal hides: the
output of the child processes goes nowhere, a rank that hangs in a collective hangs the cell forever,
a crash leaves processes behind holding the port, and the one traceback that matters is buried in
the noise of the others. Every launch here picks a **free port** unless told one, **streams** each
rank's lines into the cell (prefixed ``[rank N]``; in a Jupyter kernel the live view is replaced by
the output grouped by rank, so a committed notebook does not depend on which process printed first),
enforces a **timeout**, **kills every process it started** on error or timeout (a marker in each
child's environment lets a final sweep of ``/proc`` find any that escaped their process group), and
raises :class:`LaunchError` naming the failing rank and quoting its traceback.

The public API, one module per job (each function's docstring has the details):

* :func:`run_torchrun` and :func:`run_script` (``jobs``): a script under ``torchrun`` (one node, or
  ``nnodes`` agents on this machine: multi-node for real), or plain commands;
* :func:`run_ranks` (``ranks``, with the child's entry point in ``worker``): ``fn(rank, world_size, *args)``
  in new processes with the process group ready, returning each rank's value (not
  ``torch.multiprocessing.spawn``, which leaves the group to ``fn`` and returns nothing). On Linux a CPU job's
  ranks are forks of the fork server (``forkserver``), which has imported torch once: ~3 s of CPU less per rank;
  :func:`~course_lib.launch.forkserver.stop_forkserver` stops it, ``COURSE_LIB_FORKSERVER=0`` turns it off;
* :func:`torchrun_command` (``commands``): the exact command line, for printing and for ``run_script``;
* :func:`free_port`, :func:`port_in_use` (``ports``); :func:`child_stderr` (``stderr``);
* :func:`launched_processes` (``engine``, which also runs every job); :class:`LaunchResult` and
  :class:`LaunchError` (``results``); which rank failed first (``diagnosis``).

Between its modules the package passes a small internal API, public names in each module (listed in the
module's ``__all__``, documented) that this package does not export: the argument checks (``checks``),
:func:`~course_lib.launch.ports.check_port` and :func:`~course_lib.launch.ports.rendezvous_port` (``ports``),
:func:`~course_lib.launch.commands.is_launcher` and :func:`~course_lib.launch.commands.rank_offset`
(``commands``), :func:`~course_lib.launch.engine.run_processes` (``engine``), the failure diagnosis
(``diagnosis``), :func:`~course_lib.launch.worker.worker_main` (``worker``) and the fork server (``forkserver``).

Processes are Linux/macOS processes; the ``/proc`` sweep is Linux-only (elsewhere process groups alone
do the cleanup).

Every launch is a **CPU job unless asked**: the processes see no GPU (``CUDA_VISIBLE_DEVICES=""``), so
the course prints the same on a GPU workstation as on a laptop. ``device="cuda"`` opts in (one GPU per
rank for :func:`run_ranks`, which binds it; the script's own choice under :func:`run_torchrun`).
"""

from .commands import torchrun_command
from .engine import launched_processes
from .jobs import run_script, run_torchrun
from .ports import free_port, port_in_use
from .ranks import run_ranks
from .results import LaunchError, LaunchResult
from .stderr import child_stderr

__all__ = [
    "LaunchError",
    "LaunchResult",
    "free_port",
    "port_in_use",
    "run_script",
    "run_torchrun",
    "run_ranks",
    "torchrun_command",
    "launched_processes",
    "child_stderr",
]
