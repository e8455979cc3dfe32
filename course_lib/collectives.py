"""The ring all-reduce on real processes: point-to-point messages between ranks of a process group.

Notebook 09 writes this ring by hand (``_runs/ring.py``) and checks, on every rank, that it gives
the same sums and sends the same bytes as this copy; ``benchmarks/all_reduce.py`` times this copy
against ``dist.all_reduce``. (``course_lib.allreduce_sim`` is the single-process simulation of the
same algorithm, used to count bytes and draw the steps.) ``tree_all_reduce`` and
``parameter_server_all_reduce`` are the two other algorithms whose times notebook 09 measures and
predicts with ``course_lib.comm_model``.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["ring_all_reduce", "tree_all_reduce", "parameter_server_all_reduce"]


def _check(t: torch.Tensor, who: str) -> tuple[int, int]:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"t must be a torch.Tensor, got {type(t).__name__}")
    if not dist.is_initialized():
        raise RuntimeError(f"{who} needs a process group: call dist.init_process_group first")
    return dist.get_rank(), dist.get_world_size()


def ring_all_reduce(t: torch.Tensor) -> int:
    """Sum ``t`` over all ranks of the default process group, in place; return the bytes this rank sent.

    ``N - 1`` scatter-reduce steps, then ``N - 1`` all-gather steps, each sending one chunk to the
    right neighbour (``isend``, so that no rank blocks before it posts its receive) and receiving
    one from the left. A one-process group returns at once, having sent nothing.
    """
    rank, n = _check(t, "ring_all_reduce")
    if not t.is_contiguous():
        raise ValueError("t must be contiguous: the ring writes its chunks in place through views")
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


def tree_all_reduce(t: torch.Tensor) -> int:
    """Sum ``t`` over all ranks, in place, along a binomial tree; return the bytes this rank sent.

    ``ceil(log2 N)`` rounds reduce onto rank 0 (in round ``r``, rank ``i + 2^r`` sends its partial
    sum to rank ``i`` for every ``i`` divisible by ``2^(r+1)``), then the same rounds in reverse
    broadcast the total back. Every message carries the whole tensor.
    """
    rank, n = _check(t, "tree_all_reduce")
    buf, sent, step = torch.empty_like(t), 0, 1
    while step < n:  # reduce onto rank 0
        if rank % (2 * step) == 0 and rank + step < n:
            dist.recv(buf, src=rank + step)
            t.add_(buf)
        elif rank % (2 * step) == step:
            dist.send(t, dst=rank - step)
            sent += t.numel() * t.element_size()
        step *= 2
    step //= 2
    while step >= 1:  # broadcast back, the same tree in reverse
        if rank % (2 * step) == 0 and rank + step < n:
            dist.send(t, dst=rank + step)
            sent += t.numel() * t.element_size()
        elif rank % (2 * step) == step:
            dist.recv(t, src=rank - step)
        step //= 2
    return sent


def parameter_server_all_reduce(t: torch.Tensor) -> int:
    """Sum ``t`` over all ranks, in place, with rank 0 as the server; return the bytes this rank sent.

    Every other rank sends its tensor to rank 0 and receives the sum back; rank 0 receives the
    ``N-1`` tensors one after the other, adds them to its own, and sends the sum to each rank in turn.
    """
    rank, n = _check(t, "parameter_server_all_reduce")
    nbytes = t.numel() * t.element_size()
    if rank == 0:
        buf = torch.empty_like(t)
        for src in range(1, n):
            dist.recv(buf, src=src)
            t.add_(buf)
        for dst in range(1, n):
            dist.send(t, dst=dst)
        return nbytes * (n - 1)
    dist.send(t, dst=0)
    dist.recv(t, src=0)
    return nbytes


def _wait(request: dist.Work | None) -> None:
    """Wait for an ``isend`` (typed ``Work | None``: ``None`` only for a rank outside the group)."""
    if request is not None:
        request.wait()
