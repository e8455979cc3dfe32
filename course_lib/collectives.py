"""The ring all-reduce on real processes: point-to-point messages between ranks of a process group.

Notebook 07 writes this ring by hand (``_runs/ring.py``) and checks, on every rank, that it gives
the same sums and sends the same bytes as this copy; ``benchmarks/all_reduce.py`` times this copy
against ``dist.all_reduce``. (``course_lib.allreduce_sim`` is the single-process simulation of the
same algorithm, used to count bytes and draw the steps.)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["ring_all_reduce"]


def ring_all_reduce(t: torch.Tensor) -> int:
    """Sum ``t`` over all ranks of the default process group, in place; return the bytes this rank sent.

    ``N - 1`` scatter-reduce steps, then ``N - 1`` all-gather steps, each sending one chunk to the
    right neighbour (``isend``, so that no rank blocks before it posts its receive) and receiving
    one from the left. A one-process group returns at once, having sent nothing.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t must be a torch.Tensor, got {type(t).__name__}")
    if not dist.is_initialized():
        raise RuntimeError("ring_all_reduce needs a process group: call dist.init_process_group first")
    if not t.is_contiguous():
        raise ValueError("t must be contiguous: the ring writes its chunks in place through views")
    rank, n = dist.get_rank(), dist.get_world_size()
    right, left = (rank + 1) % n, (rank - 1) % n
    chunks = t.view(-1).tensor_split(n)  # views: writing a chunk writes t
    sent = 0
    for step in range(n - 1):  # scatter-reduce
        send_c, recv_c = (rank - step) % n, (rank - step - 1) % n
        incoming = torch.empty_like(chunks[recv_c])
        request = dist.isend(chunks[send_c], dst=right)
        dist.recv(incoming, src=left)
        _wait(request)
        chunks[recv_c].add_(incoming)
        sent += chunks[send_c].numel() * t.element_size()
    for step in range(n - 1):  # all-gather
        send_c, recv_c = (rank + 1 - step) % n, (rank - step) % n
        request = dist.isend(chunks[send_c], dst=right)
        dist.recv(chunks[recv_c], src=left)  # receive straight into place
        _wait(request)
        sent += chunks[send_c].numel() * t.element_size()
    return sent


def _wait(request: dist.Work | None) -> None:
    """Wait for an ``isend`` (typed ``Work | None``: ``None`` only for a rank outside the group)."""
    if request is not None:
        request.wait()
