"""All-reduce simulated in one process: a parameter server and a ring, with every byte counted.

N "workers" are N tensors (one gradient each) in one Python process. The functions move
chunks between them exactly as the real algorithms move them between machines, record every
transfer, and keep a snapshot after each step, so a notebook can step through the algorithm
and a benchmark can compare measured traffic with the textbook formulas:

* ring all-reduce (scatter-reduce, then all-gather, N-1 steps each): every worker sends
  ``2 (N-1)/N * S`` bytes for a gradient of ``S`` bytes, whatever N is;
* parameter server: every worker sends ``S`` and receives ``S``, but the server receives
  ``N * S`` and sends ``N * S``: its link is the bottleneck, and it grows with N.

>>> import torch
>>> grads = [torch.full((6,), float(i)) for i in range(3)]
>>> r = ring_all_reduce(grads)
>>> r.outputs[0].tolist(), r.sent_bytes          # 0+1+2 everywhere; 2*(3-1)/3*24 = 32 bytes each
([3.0, 3.0, 3.0, 3.0, 3.0, 3.0], [32, 32, 32])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from .validation import check_int, check_number

__all__ = [
    "Transfer",
    "Snapshot",
    "AllReduceResult",
    "chunk_bounds",
    "ring_all_reduce",
    "parameter_server_all_reduce",
    "ring_bytes_formula",
    "parameter_server_bytes_formula",
    "render_snapshot",
]

_OPS = ("sum", "mean")


@dataclass(frozen=True)
class Transfer:
    """One message: ``nbytes`` from ``src`` to ``dst`` during ``step`` (workers are 0..N-1, the server is -1)."""

    step: int
    phase: str
    src: int
    dst: int
    chunk: int | None  # which chunk (ring), None for a whole tensor (parameter server)
    nbytes: int


@dataclass(frozen=True)
class Snapshot:
    """The state after one step: for each worker and each chunk, whose gradients it holds summed."""

    step: int
    phase: str
    contributions: tuple[tuple[frozenset[int], ...], ...]  # [worker][chunk] -> set of worker ids
    transfers: tuple[Transfer, ...]  # the messages of this step


@dataclass
class AllReduceResult:
    """What a simulated all-reduce produced and what it cost."""

    algorithm: str
    world_size: int
    tensor_bytes: int
    outputs: list[torch.Tensor]
    transfers: list[Transfer] = field(default_factory=list)
    snapshots: list[Snapshot] = field(default_factory=list)
    server_sent_bytes: int = 0
    server_received_bytes: int = 0

    @property
    def sent_bytes(self) -> list[int]:
        """Bytes each worker sent."""
        out = [0] * self.world_size
        for t in self.transfers:
            if t.src >= 0:
                out[t.src] += t.nbytes
        return out

    @property
    def received_bytes(self) -> list[int]:
        """Bytes each worker received."""
        out = [0] * self.world_size
        for t in self.transfers:
            if t.dst >= 0:
                out[t.dst] += t.nbytes
        return out

    @property
    def steps(self) -> int:
        """Communication rounds (messages in one round travel at the same time)."""
        return len({t.step for t in self.transfers})


MAX_CHUNKS = 2**20  # more workers than any simulated ring holds: refused, not looped over


def _validate(tensors: Sequence[torch.Tensor], op: str) -> list[torch.Tensor]:
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, Sequence):
        raise TypeError("tensors must be a list of tensors, one per worker")
    if len(tensors) < 1:
        raise ValueError("need at least one worker (one tensor)")
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensors[{i}] is a {type(t).__name__}, not a torch.Tensor")
    first = tensors[0]
    for i, t in enumerate(tensors):
        if t.shape != first.shape or t.dtype != first.dtype:
            raise ValueError(
                f"every worker must hold a tensor of the same shape and dtype: tensors[0] is"
                f" {tuple(first.shape)} {first.dtype}, tensors[{i}] is {tuple(t.shape)} {t.dtype}"
            )
    if op not in _OPS:
        raise ValueError(f"op must be one of {_OPS}, got {op!r}")
    return [t.detach().reshape(-1).clone() for t in tensors]


def chunk_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """Split ``numel`` elements into ``n`` contiguous chunks as ``torch.tensor_split`` does: ``[(start, stop), ...]``.

    >>> chunk_bounds(10, 3)
    [(0, 4), (4, 7), (7, 10)]
    """
    check_int("numel", numel, minimum=0)
    check_int("n", n, minimum=1, maximum=MAX_CHUNKS, what=f"an int in [1, {MAX_CHUNKS}] (a count of workers)")
    base, extra = divmod(numel, n)
    bounds, start = [], 0
    for i in range(n):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _finish(bufs: list[torch.Tensor], like: torch.Tensor, n: int, op: str) -> list[torch.Tensor]:
    if op == "mean":
        bufs = [b / n if b.is_floating_point() else b // n for b in bufs]
    return [b.reshape(like.shape) for b in bufs]


def ring_all_reduce(tensors: Sequence[torch.Tensor], op: str = "sum") -> AllReduceResult:
    """Ring all-reduce of one tensor per worker: N-1 scatter-reduce steps, then N-1 all-gather steps.

    In scatter-reduce step ``s`` worker ``i`` sends chunk ``(i - s) mod N`` to worker ``i+1``,
    which adds it to its own copy; after N-1 steps worker ``i`` holds the full sum of chunk
    ``(i + 1) mod N``. In all-gather step ``s`` worker ``i`` sends chunk ``(i + 1 - s) mod N``
    to worker ``i+1``, which overwrites its copy. Messages of one step are simultaneous.
    ``op="mean"`` divides by N at the end (what DDP does to gradients).
    """
    bufs = _validate(tensors, op)
    n = len(bufs)
    elem = bufs[0].element_size()
    bounds = chunk_bounds(bufs[0].numel(), n)
    have = [[frozenset({w}) for _ in range(n)] for w in range(n)]
    res = AllReduceResult("ring", n, bufs[0].numel() * elem, [])
    res.snapshots.append(Snapshot(0, "start", tuple(tuple(r) for r in have), ()))
    step = 0
    for phase in ("scatter-reduce", "all-gather"):
        for s in range(n - 1):
            step += 1
            msgs = []
            for i in range(n):
                c = (i - s) % n if phase == "scatter-reduce" else (i + 1 - s) % n
                lo, hi = bounds[c]
                msgs.append((i, (i + 1) % n, c, bufs[i][lo:hi].clone(), have[i][c]))
            transfers = []
            for src, dst, c, payload, contrib in msgs:  # everything sent this step arrives together
                lo, hi = bounds[c]
                if phase == "scatter-reduce":
                    bufs[dst][lo:hi] += payload
                    have[dst][c] = have[dst][c] | contrib
                else:
                    bufs[dst][lo:hi] = payload
                    have[dst][c] = contrib
                transfers.append(Transfer(step, phase, src, dst, c, payload.numel() * elem))
            res.transfers.extend(transfers)
            res.snapshots.append(Snapshot(step, phase, tuple(tuple(r) for r in have), tuple(transfers)))
    res.outputs = _finish(bufs, tensors[0], n, op)
    return res


def parameter_server_all_reduce(tensors: Sequence[torch.Tensor], op: str = "sum") -> AllReduceResult:
    """All-reduce through a central server (id ``-1``): every worker pushes its whole tensor, the
    server reduces, then sends the whole result back to every worker. Two steps; one chunk each."""
    bufs = _validate(tensors, op)
    n = len(bufs)
    nbytes = bufs[0].numel() * bufs[0].element_size()
    res = AllReduceResult("parameter server", n, nbytes, [])
    res.snapshots.append(Snapshot(0, "start", tuple((frozenset({w}),) for w in range(n)), ()))
    push = tuple(Transfer(1, "push", w, -1, None, nbytes) for w in range(n))
    total = torch.stack(bufs).sum(0)
    res.transfers.extend(push)
    res.snapshots.append(Snapshot(1, "push", tuple((frozenset({w}),) for w in range(n)), push))
    pull = tuple(Transfer(2, "pull", -1, w, None, nbytes) for w in range(n))
    res.transfers.extend(pull)
    everyone = frozenset(range(n))
    res.snapshots.append(Snapshot(2, "pull", tuple((everyone,) for _ in range(n)), pull))
    res.server_received_bytes = n * nbytes
    res.server_sent_bytes = n * nbytes
    res.outputs = _finish([total.clone() for _ in range(n)], tensors[0], n, op)
    return res


def _check_size(nbytes: int | float, n: int) -> None:
    if check_number("nbytes", nbytes) < 0:
        raise ValueError(f"nbytes must be a non-negative number, got {nbytes!r}")
    check_int("n (the number of workers)", n, minimum=1)


def ring_bytes_formula(nbytes: int | float, n: int) -> float:
    """Bytes each worker sends (and receives) in a ring all-reduce of ``nbytes``: ``2 (n-1)/n * nbytes``."""
    _check_size(nbytes, n)
    return 2 * (n - 1) / n * nbytes


def parameter_server_bytes_formula(nbytes: int | float, n: int) -> dict[str, float]:
    """Bytes sent with a parameter server: ``{"worker": nbytes, "server": n * nbytes}`` (received: the same)."""
    _check_size(nbytes, n)
    return {"worker": float(nbytes), "server": float(n * nbytes)}


def render_snapshot(snapshot: Snapshot) -> str:
    """A text picture of one step: a row per worker, a column per chunk, ``a+b+c`` = whose sum it holds.

    A ``*`` marks a chunk that holds every worker's contribution (fully reduced).
    """
    if not isinstance(snapshot, Snapshot):
        raise TypeError(f"snapshot must be a Snapshot, got {type(snapshot).__name__}")
    rows = snapshot.contributions
    n_workers = len(rows)
    cells = [["+".join(str(w) for w in sorted(c)) + ("*" if len(c) == n_workers else "") for c in r] for r in rows]
    full = len("+".join(str(w) for w in range(n_workers))) + 1  # the widest a cell can get: stable layout
    width = max(len(f"chunk {len(rows[0]) - 1}"), full, *(len(x) for r in cells for x in r))
    head = f"step {snapshot.step} ({snapshot.phase})"
    lines = [head, "          " + " ".join(f"{'chunk ' + str(c):>{width}}" for c in range(len(rows[0])))]
    for w, r in enumerate(cells):
        lines.append(f"worker {w:<2} " + " ".join(f"{x:>{width}}" for x in r))
    if snapshot.transfers:
        msgs = ", ".join(
            f"{'S' if t.src < 0 else t.src}->{'S' if t.dst < 0 else t.dst}"
            + ("" if t.chunk is None else f"[c{t.chunk}]")
            for t in snapshot.transfers
        )
        lines.append(f"messages: {msgs}")
    return "\n".join(lines)
