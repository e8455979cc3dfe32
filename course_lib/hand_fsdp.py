"""FSDP by hand: the canonical copy of what notebook 14 writes in its section "FSDP by hand".

:class:`HandFSDP` does what FSDP2's ``fully_shard`` does, in plain Python over
``torch.distributed`` (ZeRO stage 3). The model is cut into **units**: the modules you name, then
the root (the whole model) for every parameter left over. Per unit:

* **flatten, pad, shard**: the unit's trainable parameters are concatenated into one flat fp32
  vector, padded with zeros to a multiple of the world size ``N``, and rank ``r`` keeps chunk ``r``
  as an ``nn.Parameter``: the **master shard**, the only copy of those weights on this rank. It is
  registered on the unit (``hand_fsdp_shard``), so ``model.parameters()`` yields the shards and
  any ``torch.optim`` optimizer steps on them, with optimizer state for the shard only. The
  original parameters are removed from their modules;
* **pre-forward hook**: all-gather the shards (cast to ``param_dtype`` first, so a bf16 policy
  gathers half the bytes) into a full flat tensor, and give every module views of it in place of
  its parameters;
* **post-forward hook**: free the full tensor's memory (its storage is resized to 0 bytes; the
  root keeps its parameters until backward, as FSDP2's root does), and hook the unit's outputs so
  that the first gradient reaching them all-gathers the parameters **again**, into the same
  storage, before the unit's backward reads them;
* **backward**: the gather is an ``autograd.Function`` whose backward receives the gradient of
  the full flat tensor (autograd sums the uses of a tied parameter into it): cast it to
  ``reduce_dtype``, **reduce-scatter** it (rank ``r`` receives the sum of chunk ``r``), divide by
  ``N`` once, and hand it to the shard as its gradient, in the shard's dtype. Then the full tensor
  is freed again.

The optimizer therefore steps on the fp32 master shard while forward and backward run in
``param_dtype``: notebook 06's master weights, sharded. The tests check that training with
HandFSDP equals training with ``fully_shard`` under the matching ``MixedPrecisionPolicy``.

Where it differs from FSDP2:

* FSDP2 shards each parameter on its dim 0 (a ``DTensor`` per parameter); HandFSDP shards a unit's
  flat vector (FSDP1's layout). Element-wise optimizers (SGD, Adam, AdamW, ...) give the same
  result either way; one that looks at a whole parameter (a per-tensor norm) would not.
* Frozen parameters (``requires_grad=False``) are not sharded: they stay whole, in their own
  dtype, on every rank (they have no gradient and no optimizer state, the larger parts of the ZeRO
  count), and a forward uses a ``param_dtype`` copy of them. FSDP2 shards and gathers them too.
* No prefetch (FSDP2 starts the next unit's all-gather early), no separate streams, no
  ``DTensor`` state dicts; collectives run synchronously. A parameter shared by two units is
  refused (FSDP2 refuses it too).

:attr:`HandFSDP.log` records every all-gather and reduce-scatter (bytes of the full, padded tensor);
:attr:`HandFSDP.peak_gathered_bytes` is the most gathered parameters held at once (``course_lib.sharding``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .comm_log import CommLog
from .timelines import Timeline
from .torch_private import tree_flatten, tree_map_only
from .validation import check_bool, check_int, check_items

__all__ = ["HandFSDP", "SHARD_NAME", "shard_layout"]

SHARD_NAME = "hand_fsdp_shard"


def _check_dtype(name: str, dtype: object) -> torch.dtype | None:
    if dtype is None:
        return None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point torch.dtype or None, got {dtype!r}")
    return dtype


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class _Unit:
    """One unit: its parameters' places in the modules, its master shard, its gathered flat tensor."""

    def __init__(self, owner: HandFSDP, module: nn.Module, name: str, is_root: bool, claimed: set[int]) -> None:
        self.owner, self.module, self.name, self.is_root = owner, module, name, is_root
        self.params: list[nn.Parameter] = []
        self.places: list[list[tuple[nn.Module, str]]] = []
        self.frozen: list[tuple[nn.Module, str, nn.Parameter]] = []  # stay whole; cast for compute
        index: dict[int, int] = {}
        for sub in module.modules():
            for attr, p in list(sub._parameters.items()):
                if p is None or getattr(p, "_hand_fsdp_shard", False):
                    continue
                if not p.requires_grad:
                    if (id(sub), attr) not in owner._frozen_places:
                        owner._frozen_places.add((id(sub), attr))
                        self.frozen.append((sub, attr, p))
                    continue
                if id(p) in claimed and id(p) not in index:
                    raise ValueError(
                        f"a parameter ({attr} of {type(sub).__name__}) is shared between two units: "
                        "put the modules that share it in the same unit (FSDP2 requires this too)"
                    )
                if id(p) not in index:
                    index[id(p)] = len(self.params)
                    self.params.append(p)
                    self.places.append([])
                self.places[index[id(p)]].append((sub, attr))
        claimed.update(index)
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) > 1:
            raise ValueError(f"unit {name!r} mixes dtypes {sorted(map(str, dtypes))}: one flat shard needs one")
        self.numels = [p.numel() for p in self.params]
        self.total = sum(self.numels)
        n, rank = owner.world_size, owner.rank
        self.padded = math.ceil(self.total / n) * n if self.total else 0
        self.shard_numel = self.padded // n
        self.full: torch.Tensor | None = None
        self.gathered_bytes = 0
        if not self.params:
            self.shard: nn.Parameter | None = None
            return
        with torch.no_grad():
            flat = torch.zeros(self.padded, dtype=self.params[0].dtype, device=self.params[0].device)
            offset = 0
            for p, numel in zip(self.params, self.numels):
                flat[offset : offset + numel].copy_(p.detach().reshape(-1))
                offset += numel
            shard = nn.Parameter(flat[rank * self.shard_numel : (rank + 1) * self.shard_numel].clone())
        shard._hand_fsdp_shard = True  # type: ignore[attr-defined]
        self.shard = shard
        for places in self.places:
            for sub, attr in places:
                del sub._parameters[attr]
        module.register_parameter(SHARD_NAME, shard)
        self._point_modules_at(torch.empty(self.padded, dtype=self.compute_dtype, device=shard.device))
        self._free()

    @property
    def compute_dtype(self) -> torch.dtype:
        assert self.shard is not None
        return self.owner.param_dtype or self.shard.dtype

    def _point_modules_at(self, full: torch.Tensor) -> None:
        """Give every module a view of ``full`` where its parameter was."""
        self.full = full
        offset = 0
        for p, numel, places in zip(self.params, self.numels, self.places):
            view = full[offset : offset + numel].view(p.shape)
            for sub, attr in places:
                setattr(sub, attr, view)
            offset += numel

    def _all_gather_into(self, out: torch.Tensor, why: str) -> None:
        assert self.shard is not None
        src = self.shard.detach().to(out.dtype)
        owner = self.owner
        start = owner.timeline.now() if owner.timeline is not None else 0.0
        dist.all_gather_single(out, src, group=owner.group)
        owner.log.record("all_gather", _nbytes(out))
        if owner.timeline is not None:
            owner.timeline.add("comm", f"all-gather {self.name} ({why})", start, owner.timeline.now())
        self.gathered_bytes = _nbytes(out)
        owner._gathered_now += self.gathered_bytes
        owner.peak_gathered_bytes = max(owner.peak_gathered_bytes, owner._gathered_now)

    def gather(self) -> torch.Tensor:
        """A new full flat tensor in the compute dtype (forward)."""
        self._free()
        assert self.shard is not None
        full = torch.empty(self.padded, dtype=self.compute_dtype, device=self.shard.device)
        self._all_gather_into(full, "forward")
        return full

    def regather(self) -> None:
        """All-gather into the freed storage of the current full tensor (backward).

        The write goes through a second tensor on the same storage, so the version counter that
        autograd checks on the saved views does not move: the values written are the ones forward used.
        """
        full = self.full
        if full is None or full.untyped_storage().nbytes() > 0:
            return
        storage = full.untyped_storage()
        storage.resize_(_nbytes(full))
        alias = torch.empty(0, dtype=full.dtype, device=full.device).set_(storage, 0, full.shape, (1,))
        with torch.no_grad():
            self._all_gather_into(alias, "backward")

    def _free(self) -> None:
        full = self.full
        if full is not None and full.untyped_storage().nbytes() > 0:
            full.untyped_storage().resize_(0)
            self.owner._gathered_now -= self.gathered_bytes
            self.gathered_bytes = 0

    def reduce_scatter(self, grad_full: torch.Tensor) -> torch.Tensor:
        """Rank r's chunk of the mean over ranks of ``grad_full``, in the shard's dtype."""
        assert self.shard is not None
        owner = self.owner
        grad = grad_full.to(owner.reduce_dtype or grad_full.dtype).contiguous()
        out = torch.empty(self.shard_numel, dtype=grad.dtype, device=grad.device)
        start = owner.timeline.now() if owner.timeline is not None else 0.0
        dist.reduce_scatter_single(out, grad, group=owner.group)  # sum of chunk r over ranks
        owner.log.record("reduce_scatter", _nbytes(grad))
        if owner.timeline is not None:
            owner.timeline.add("comm", f"reduce-scatter {self.name}", start, owner.timeline.now())
        out.div_(owner.world_size)  # the mean: divided once
        return out.to(self.shard.dtype)


class _Gather(torch.autograd.Function):
    """Forward: all-gather a unit's shards. Backward: reduce-scatter the gradient back to the shard."""

    @staticmethod
    def forward(ctx: Any, shard: torch.Tensor, unit: _Unit) -> torch.Tensor:
        ctx.unit = unit
        return unit.gather()

    @staticmethod
    def backward(ctx: Any, grad_full: torch.Tensor) -> tuple[torch.Tensor, None]:
        unit: _Unit = ctx.unit
        grad_shard = unit.reduce_scatter(grad_full)
        unit._free()
        return grad_shard, None


class HandFSDP:
    """Shard ``module`` by hand, ZeRO-3 style: ``units`` first (deepest first), then the root.

    ``param_dtype``: the dtype forward and backward compute in and the all-gather sends (default:
    the parameters' own); ``reduce_dtype``: the dtype gradients are reduce-scattered in (default:
    ``param_dtype``); as FSDP2's ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``. With
    ``param_dtype`` set, floating-point inputs of every unit are cast to it
    (``cast_forward_inputs``). ``reshard_after_forward=False`` keeps each unit's gathered
    parameters from forward until its backward (one all-gather per step instead of two).

    Call the model as usual (``model(x)``); ``model.parameters()`` then yields the master shards, for
    the optimizer. :meth:`full_parameters` all-gathers the fp32 parameters by their original names.

    In a worker (on every rank)::

        fsdp = HandFSDP(model, units=list(model), param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)  # the fp32 master shards
        loss_fn(model(x), y).backward()
        opt.step()
    """

    def __init__(
        self,
        module: nn.Module,
        units: Iterable[nn.Module] = (),
        *,
        param_dtype: torch.dtype | None = None,
        reduce_dtype: torch.dtype | None = None,
        reshard_after_forward: bool = True,
        cast_forward_inputs: bool = True,
        group: Any = None,
        timeline: Timeline | None = None,
    ) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"module must be an nn.Module, got {type(module).__name__}")
        if isinstance(units, nn.Module) or not isinstance(units, Iterable):
            raise TypeError("units must be a list of submodules (a list, even for one)")
        units = list(units)
        if not all(isinstance(u, nn.Module) for u in units):
            raise TypeError("every unit must be an nn.Module")
        if timeline is not None and not isinstance(timeline, Timeline):
            raise TypeError(f"timeline must be a Timeline or None, got {type(timeline).__name__}")
        param_dtype = _check_dtype("param_dtype", param_dtype)
        reduce_dtype = _check_dtype("reduce_dtype", reduce_dtype)
        check_bool("reshard_after_forward", reshard_after_forward)
        check_bool("cast_forward_inputs", cast_forward_inputs)
        if any(getattr(p, "_hand_fsdp_shard", False) for p in module.parameters()):
            raise ValueError("this module is already sharded by a HandFSDP")
        names = {id(m): name for name, m in module.named_modules()}
        for u in units:
            if id(u) not in names:
                raise ValueError(f"unit {type(u).__name__} is not a submodule of the model")
            if u is module:
                raise ValueError("the model itself is the root unit: list only submodules in units")
        if len({id(u) for u in units}) != len(units):
            raise ValueError("a module is listed twice in units")
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("HandFSDP needs a process group: call dist.init_process_group first (or use run_ranks)")
        self.module = module
        self.param_dtype = param_dtype
        self.reduce_dtype = reduce_dtype
        self.reshard_after_forward = reshard_after_forward
        self.cast_forward_inputs = cast_forward_inputs
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.timeline = timeline
        self.log = CommLog()
        self.peak_gathered_bytes = 0
        self._gathered_now = 0
        self._frozen_places: set[tuple[int, str]] = set()
        self._names: dict[int, str] = {}
        for pname, p in module.named_parameters(remove_duplicate=False):
            self._names.setdefault(id(p), pname)  # a tied parameter keeps its first name
        depth = {id(u): names[id(u)].count(".") for u in units}
        ordered = sorted(units, key=lambda u: -depth[id(u)])  # inner units first, like fully_shard calls
        claimed: set[int] = set()
        self.units: list[_Unit] = []
        for u in [*ordered, module]:
            unit = _Unit(self, u, names[id(u)] or "root", u is module, claimed)
            self.units.append(unit)
            u.register_forward_pre_hook(self._pre_forward_hook(unit), with_kwargs=True)
            u.register_forward_hook(self._post_forward_hook(unit))

    # -- hooks -----------------------------------------------------------------------------------
    def _pre_forward_hook(self, unit: _Unit) -> Any:
        def hook(mod: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
            if unit.shard is not None:
                full = _Gather.apply(unit.shard, unit)
                assert isinstance(full, torch.Tensor)
                unit._point_modules_at(full)
            if self.param_dtype is not None:  # frozen parameters: a low-precision copy for this forward
                for sub, attr, p in unit.frozen:
                    sub._parameters[attr] = p.detach().to(self.param_dtype)  # type: ignore[assignment]
            if self.param_dtype is not None and self.cast_forward_inputs:
                dtype = self.param_dtype

                def cast(t: torch.Tensor) -> torch.Tensor:
                    return t.to(dtype) if t.is_floating_point() else t

                args, kwargs = tree_map_only(torch.Tensor, cast, (args, kwargs))
            return args, kwargs

        return hook

    def _post_forward_hook(self, unit: _Unit) -> Any:
        def hook(mod: nn.Module, args: Any, output: Any) -> Any:
            for sub, attr, p in unit.frozen:
                sub._parameters[attr] = p  # the fp32 parameter back (autograd keeps the copy it saved)
            if unit.shard is None:
                return output
            training = torch.is_grad_enabled()
            if not training or (self.reshard_after_forward and not unit.is_root):
                unit._free()
                outputs = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
                if training and outputs:
                    torch.autograd.graph.register_multi_grad_hook(outputs, lambda _grads: unit.regather(), mode="any")
            return output

        return hook

    # -- what a notebook inspects ----------------------------------------------------------------
    def parameters(self) -> list[nn.Parameter]:
        """The master shards this rank holds (one per unit with trainable parameters)."""
        return [u.shard for u in self.units if u.shard is not None]

    @property
    def shard_bytes(self) -> int:
        """Bytes of this rank's master shards (padding included)."""
        return sum(_nbytes(s) for s in self.parameters())

    @property
    def gathered_now_bytes(self) -> int:
        """Bytes of gathered (full) parameters held at this moment."""
        return self._gathered_now

    def unit_names(self) -> list[str]:
        """The units in the order they were sharded (the root last)."""
        return [u.name for u in self.units]

    def unit_numels(self) -> dict[str, tuple[int, int]]:
        """``{unit: (parameters, padded length)}``."""
        return {u.name: (u.total, u.padded) for u in self.units}

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """All-gather every unit's master shards (a collective: call it on every rank) and return the
        trainable parameters under their original names (``named_parameters()`` names, the first
        name of a tied one), in the shards' dtype. Not recorded in :attr:`log`."""
        out: dict[str, torch.Tensor] = {}
        for u in self.units:
            if u.shard is None:
                continue
            flat = torch.empty(u.padded, dtype=u.shard.dtype, device=u.shard.device)
            dist.all_gather_single(flat, u.shard.detach(), group=self.group)
            offset = 0
            for p, numel in zip(u.params, u.numels):
                out[self._names[id(p)]] = flat[offset : offset + numel].view(p.shape).clone()
                offset += numel
        return out

    def reset_counters(self) -> None:
        """Clear :attr:`log` and the peak (the bytes gathered right now stay counted)."""
        self.log.reset()
        self.peak_gathered_bytes = self._gathered_now


def shard_layout(numels: Sequence[int], world_size: int) -> tuple[int, int]:
    """``(padded length, shard length)`` of a flat vector of tensors of ``numels`` elements.

    >>> shard_layout([10, 3], 4)
    (16, 4)
    """
    n = check_int("world_size", world_size, minimum=1)
    total = sum(check_items("numels", numels, int, "a list of ints", minimum=0))
    padded = math.ceil(total / n) * n
    return padded, padded // n
