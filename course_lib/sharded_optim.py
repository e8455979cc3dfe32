"""A sharded optimizer (ZeRO stage 1) that handles real models: any ``torch.optim`` class, parameter
groups, frozen parameters, and no gradient averaging of its own under DDP.

Notebook 14's ``HandZero`` showed the idea on one model: every rank keeps optimizer state for its
share of the parameters only, steps its share, then shares the updated parameters. It put every
parameter into its flat buffer and its Adam, frozen ones included; a frozen parameter then got a
zero gradient instead of none, and AdamW's weight decay shrank it (2.0 → 1.8088 in 10 steps) although
nothing should have touched it. :class:`ShardedOptimizer` is the version to reuse:

* it wraps any ``torch.optim`` optimizer class (``ShardedOptimizer(params, torch.optim.AdamW,
  lr=..., weight_decay=...)``) and takes parameters or parameter groups, as that class would; it is
  itself a ``torch.optim.Optimizer`` whose ``param_groups`` hold every trainable parameter, so
  ``zero_grad`` and learning-rate schedulers work on it (each step copies the groups' options to
  the inner optimizer);
* it **skips parameters that do not require grad**: they are never sharded, never stepped, and no
  weight decay reaches them;
* it shards in one of two ways:

  - ``shard_by="parameter"``: whole parameters are assigned to ranks (group by group, largest first,
    each to the rank with the fewest elements so far: ``ZeroRedundancyOptimizer``'s rule, applied to
    the trainable parameters only); each rank steps its
    own parameters, then every parameter is broadcast from its owner. Valid for **every**
    optimizer, including those that look at a whole tensor at once (per-tensor norms as in LAMB,
    factored second moments as in Adafactor, orthogonalised updates as in Muon). The shares can be
    uneven (a big embedding is one rank's alone).
  - ``shard_by="element"``: each group's parameters are flattened into one vector, padded to a
    multiple of the world size, and rank ``r`` owns chunk ``r``, which may cut a tensor in two.
    Equal shares, one all-gather per group; valid only for **element-wise** optimizers, whose
    update of an element depends on that element's gradient and state alone
    (:data:`ELEMENTWISE_OPTIMIZERS`: SGD, Adam, AdamW, ...). Any other class is refused unless you
    pass ``elementwise=True`` to vouch for it.
* it expects gradients that are **already averaged** (by DDP, ``HandDDP`` or a plain all-reduce):
  it reads each rank's ``.grad`` and communicates only parameters, so under DDP nothing is averaged
  twice. ``reduce_gradients=True`` is for use *without* DDP: it reduces (per parameter, to the
  owner) or reduce-scatters (per element) the local gradients and divides by the world size once.

Every collective is recorded in :attr:`ShardedOptimizer.log` (``course_lib.hand_ddp.CommLog``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .comm_log import CommLog
from .validation import check_bool, check_int, check_items

__all__ = ["ELEMENTWISE_OPTIMIZERS", "ShardedOptimizer", "partition_parameters"]

ELEMENTWISE_OPTIMIZERS: tuple[type[torch.optim.Optimizer], ...] = (
    torch.optim.SGD,
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adamax,
    torch.optim.Adagrad,
    torch.optim.Adadelta,
    torch.optim.RMSprop,
    torch.optim.Rprop,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.ASGD,
)


MAX_WORLD_SIZE = 2**20  # more ranks than any job has: a typo, refused before a list that long is made


def partition_parameters(numels: list[int], world_size: int, loads: list[int] | None = None) -> list[int]:
    """The owner rank of each tensor: largest first, each to the rank with the fewest elements so far
    (ties to the lowest rank), as ``ZeroRedundancyOptimizer`` partitions a parameter group.

    ``loads``: the elements each rank owns already (from earlier groups; updated in place), as
    ``ZeroRedundancyOptimizer`` carries them from one group to the next.

    >>> partition_parameters([100, 10, 60, 50], 2)      # 100 -> 0, 60 -> 1, 50 -> 1, 10 -> 0
    [0, 0, 1, 1]
    >>> loads = [0, 0]; partition_parameters([8], 2, loads), partition_parameters([8], 2, loads), loads
    ([0], [1], [8, 8])
    """
    n = check_int("world_size", world_size, minimum=1, maximum=MAX_WORLD_SIZE, what=f"an int in [1, {MAX_WORLD_SIZE}]")
    sizes = check_items("numels", numels, int, "a list of ints (elements per tensor)", minimum=0)
    if loads is None:
        loads = [0] * n
    elif not isinstance(loads, list) or len(loads) != n:
        raise ValueError(f"loads must be a list of {n} ints, one per rank")
    owner = [0] * len(sizes)
    for i in sorted(range(len(sizes)), key=lambda i: sizes[i], reverse=True):  # stable: equal sizes keep order
        rank = loads.index(min(loads))
        owner[i] = rank
        loads[rank] += sizes[i]
    return owner


def _groups(params: Any) -> list[dict[str, Any]]:
    if isinstance(params, torch.Tensor):
        raise TypeError("params must be an iterable of tensors or of parameter-group dicts, not a single tensor")
    if not isinstance(params, Iterable):
        raise TypeError(f"params must be an iterable of tensors or of parameter groups, got {type(params).__name__}")
    items = list(params)
    if not items:
        raise ValueError("ShardedOptimizer got an empty parameter list")
    if all(isinstance(p, dict) for p in items):
        groups = []
        for g in items:
            if "params" not in g:
                raise ValueError("each parameter group needs a 'params' entry")
            ps = [g["params"]] if isinstance(g["params"], torch.Tensor) else list(g["params"])
            groups.append({**g, "params": ps})
    elif all(isinstance(p, torch.Tensor) for p in items):
        groups = [{"params": items}]
    else:
        raise TypeError("params must be all tensors or all parameter-group dicts")
    for g in groups:
        for p in g["params"]:
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"a parameter group holds a {type(p).__name__}, not a tensor")
    return groups


class ShardedOptimizer(torch.optim.Optimizer):
    """ZeRO-1 over any ``torch.optim`` class: each rank keeps state for and steps only its shard.

    ``optimizer_class`` and ``**defaults`` are what you would pass to build the optimizer alone.
    ``shard_by``: ``"parameter"`` (any optimizer) or ``"element"`` (element-wise optimizers only).
    ``reduce_gradients``: ``False`` under DDP (gradients are already averaged); ``True`` to average
    them here instead. ``group``: the process group (default: the world).
    """

    def __init__(
        self,
        params: Any,
        optimizer_class: type[torch.optim.Optimizer],
        *,
        shard_by: str = "parameter",
        reduce_gradients: bool = False,
        elementwise: bool | None = None,
        group: Any = None,
        **defaults: Any,
    ) -> None:
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, torch.optim.Optimizer)):
            raise TypeError(f"optimizer_class must be a torch.optim.Optimizer subclass, got {optimizer_class!r}")
        if shard_by not in ("parameter", "element"):
            raise ValueError(f"shard_by must be 'parameter' or 'element', got {shard_by!r}")
        self.reduce_gradients = check_bool("reduce_gradients", reduce_gradients)
        if shard_by == "element":
            ok = issubclass(optimizer_class, ELEMENTWISE_OPTIMIZERS) if elementwise is None else elementwise
            if not check_bool("elementwise", ok):
                raise ValueError(
                    f"{optimizer_class.__name__} is not known to be element-wise: sharding by element would cut "
                    "tensors whose update needs the whole tensor. Use shard_by='parameter', or pass "
                    "elementwise=True if each element's update depends on that element alone."
                )
        groups = _groups(params)
        frozen = sum(1 for g in groups for p in g["params"] if not p.requires_grad)
        for g in groups:
            g["params"] = [p for p in g["params"] if p.requires_grad]
        if not any(g["params"] for g in groups):
            raise ValueError("no parameter requires grad: there is nothing to optimize")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ShardedOptimizer needs a process group: call dist.init_process_group first")
        self.frozen_skipped = frozen
        super().__init__(groups, defaults)
        self.optimizer_class = optimizer_class
        self.shard_by = shard_by
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.log = CommLog()
        self._owner: dict[int, int] = {}
        self._flats: list[dict[str, Any]] = []
        local_groups: list[dict[str, Any]] = []
        self._loads = [0] * self.world_size  # elements each rank owns so far (by parameter)
        for g in self.param_groups:
            options = {k: v for k, v in g.items() if k != "params"}
            if shard_by == "parameter":
                owners = partition_parameters([p.numel() for p in g["params"]], self.world_size, self._loads)
                for p, r in zip(g["params"], owners):
                    self._owner[id(p)] = r
                local_groups.append({**options, "params": [p for p, r in zip(g["params"], owners) if r == self.rank]})
            else:
                local_groups.append({**options, "params": [self._flat_shard(g["params"])]})
        self.optim = optimizer_class(local_groups, **defaults)
        for outer, inner in zip(self.param_groups, self.optim.param_groups):
            for k, v in inner.items():
                if k != "params":
                    outer.setdefault(k, v)  # the inner class's defaults, visible to schedulers

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a parameter group after construction, as ``torch.optim`` allows (a fine-tuning job adds the layers
        it unfreezes): its trainable parameters are sharded like the first groups' (by parameter: each to the rank
        that owns the fewest elements so far; by element: a flat shard of its own), and its frozen ones skipped."""
        if not hasattr(self, "optim"):  # torch.optim.Optimizer.__init__ adds the first groups; __init__ shards them
            super().add_param_group(param_group)
            return
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict with a 'params' entry, got {type(param_group).__name__}")
        (group,) = _groups([param_group])
        trainable = [p for p in group["params"] if p.requires_grad]
        if not trainable:
            raise ValueError("the new group has no parameter that requires grad: there is nothing to add")
        known = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in known for p in trainable):
            raise ValueError("some parameters of the new group are already in another group")
        super().add_param_group({**group, "params": trainable})
        outer = self.param_groups[-1]
        options = {k: v for k, v in outer.items() if k != "params"}
        if self.shard_by == "parameter":
            owners = partition_parameters([p.numel() for p in trainable], self.world_size, self._loads)
            for p, r in zip(trainable, owners):
                self._owner[id(p)] = r
            self.optim.add_param_group({**options, "params": [p for p, r in zip(trainable, owners) if r == self.rank]})
        else:
            self.optim.add_param_group({**options, "params": [self._flat_shard(trainable)]})

    def _flat_shard(self, params: list[nn.Parameter]) -> torch.Tensor:
        dtypes = {p.dtype for p in params}
        if len(dtypes) > 1:
            raise ValueError("shard_by='element' flattens a group into one vector: its parameters need one dtype")
        total = sum(p.numel() for p in params)
        padded = math.ceil(total / self.world_size) * self.world_size
        shard_len = padded // self.world_size
        with torch.no_grad():
            flat = torch.zeros(padded, dtype=params[0].dtype, device=params[0].device)
            if params:
                flat[:total] = torch.cat([p.detach().reshape(-1) for p in params])
            shard = flat[self.rank * shard_len : (self.rank + 1) * shard_len].clone()
        self._flats.append({"params": params, "total": total, "padded": padded, "shard": shard})
        return shard

    # -- inspection ------------------------------------------------------------------------------
    def owner(self, param: torch.Tensor) -> int | None:
        """The rank that steps ``param`` (``shard_by="parameter"``; ``None`` for a frozen or unknown one)."""
        return self._owner.get(id(param))

    def state_bytes(self) -> int:
        """Bytes of optimizer state this rank holds (scalar step counters left out)."""
        total = 0
        for state in self.optim.state.values():
            for v in state.values():
                if isinstance(v, torch.Tensor) and v.dim() > 0:
                    total += v.numel() * v.element_size()
        return total

    def state_dict(self) -> dict[str, Any]:
        """This rank's inner optimizer state (each rank saves its own, as with a sharded checkpoint)."""
        return self.optim.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.optim.load_state_dict(state_dict)

    # -- the step --------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Step this rank's shard with the inner optimizer, then share the updated parameters."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for outer, inner in zip(self.param_groups, self.optim.param_groups):
            for k, v in outer.items():
                if k != "params":
                    inner[k] = v
        if self.shard_by == "parameter":
            self._step_by_parameter()
        else:
            self._step_by_element()
        return loss

    def _step_by_parameter(self) -> None:
        params = [p for g in self.param_groups for p in g["params"]]
        if self.reduce_gradients:
            for p in params:
                if p.grad is not None:
                    owner = self._owner[id(p)]
                    dst = dist.get_global_rank(self.group, owner) if self.group else owner
                    dist.reduce(p.grad, dst=dst, group=self.group)
                    self.log.record("reduce", p.grad.numel() * p.grad.element_size())
                    if owner == self.rank:
                        p.grad.div_(self.world_size)
        self.optim.step()
        for p in params:
            owner = self._owner[id(p)]
            src = dist.get_global_rank(self.group, owner) if self.group else owner
            dist.broadcast(p.detach(), src=src, group=self.group)
            self.log.record("broadcast", p.numel() * p.element_size())

    def _step_by_element(self) -> None:
        for flat in self._flats:
            params, shard = flat["params"], flat["shard"]
            missing = [tuple(p.shape) for p in params if p.grad is None]
            if missing:
                raise RuntimeError(
                    f"parameters of shapes {missing[:4]} have no gradient this step: a flat shard cannot skip part "
                    "of itself (a zero gradient would still be decayed). Freeze them (requires_grad_(False)) or "
                    "use shard_by='parameter'."
                )
            shard_len = shard.numel()
            grad = torch.zeros(flat["padded"], dtype=shard.dtype, device=shard.device)
            grad[: flat["total"]] = torch.cat([p.grad.reshape(-1) for p in params])
            if self.reduce_gradients:
                mine = torch.empty(shard_len, dtype=grad.dtype, device=grad.device)
                dist.reduce_scatter_single(mine, grad, group=self.group)
                self.log.record("reduce_scatter", grad.numel() * grad.element_size())
                mine.div_(self.world_size)
            else:
                mine = grad[self.rank * shard_len : (self.rank + 1) * shard_len].clone()
            shard.grad = mine
        self.optim.step()
        for flat in self._flats:
            params, shard = flat["params"], flat["shard"]
            full = torch.empty(flat["padded"], dtype=shard.dtype, device=shard.device)
            dist.all_gather_single(full, shard, group=self.group)
            self.log.record("all_gather", full.numel() * full.element_size())
            offset = 0
            for p in params:
                p.copy_(full[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
