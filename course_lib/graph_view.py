"""A view of the autograd graph: walk ``grad_fn.next_functions`` and draw what autograd built.

No Graphviz binary is needed: the graph is a :class:`networkx.DiGraph`, laid out in layers
(inputs on the left, the output on the right) and drawn with matplotlib.

* :func:`build_graph` returns the ``DiGraph`` (node attributes: ``kind``, ``label``, ...).
* :func:`describe_graph` returns a text listing, deterministic, for checked notebook output.
* :func:`draw_graph` draws it and returns the matplotlib ``Axes``.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import networkx as nx
import torch

__all__ = ["build_graph", "describe_graph", "draw_graph", "saved_tensors_of"]

_FREED = "freed"


def _named(names: Mapping[str, torch.Tensor] | torch.nn.Module | None) -> dict[str, torch.Tensor]:
    if names is None:
        return {}
    if isinstance(names, torch.nn.Module):
        return dict(names.named_parameters())
    if not isinstance(names, Mapping):
        raise TypeError(f"names must be a dict of name -> tensor or an nn.Module, got {type(names).__name__}")
    out = {}
    for k, v in names.items():
        if not isinstance(k, str) or not isinstance(v, torch.Tensor):
            raise TypeError(f"names must map str -> Tensor; got {type(k).__name__} -> {type(v).__name__}")
        out[k] = v
    return out


def _shape(t: torch.Tensor) -> str:
    return str(tuple(t.shape))


def saved_tensors_of(node: Any) -> dict[str, torch.Tensor | str]:
    """The tensors a backward node saved, as ``{name: tensor}``.

    Reads the ``_saved_*`` attributes that PyTorch exposes on built-in backward nodes (and
    ``saved_tensors`` of custom ``autograd.Function`` nodes). A saved slot holding ``None``
    (not needed, e.g. ``self`` of ``a * b`` when ``b`` does not require grad) is left out; a
    slot already released by ``backward()`` maps to the string ``"freed"``.
    """
    if node is None or not hasattr(node, "next_functions"):
        raise TypeError(f"expected an autograd node (a tensor's grad_fn), got {type(node).__name__}")
    out: dict[str, torch.Tensor | str] = {}
    for attr in sorted(a for a in dir(node) if a.startswith("_saved_")):
        try:
            value = getattr(node, attr)
        except RuntimeError:
            out[attr[len("_saved_"):]] = _FREED
            continue
        if isinstance(value, torch.Tensor):
            out[attr[len("_saved_"):]] = value
    if hasattr(node, "saved_tensors"):  # custom autograd.Function (BackwardCFunction)
        try:
            for i, t in enumerate(node.saved_tensors):
                if isinstance(t, torch.Tensor):
                    out[f"saved_tensors[{i}]"] = t
        except RuntimeError:
            out["saved_tensors"] = _FREED
    return out


def build_graph(
    output: torch.Tensor,
    names: Mapping[str, torch.Tensor] | torch.nn.Module | None = None,
    *,
    show_saved: bool = True,
) -> nx.DiGraph:
    """The backward graph reachable from ``output.grad_fn``, edges pointing the way data flowed forward.

    Node attributes: ``kind`` is ``"op"`` (a backward function), ``"leaf"`` (a tensor whose
    gradient is accumulated, through ``AccumulateGrad``) or ``"output"``; ``label`` is the text
    drawn; ``saved`` (ops) lists ``"name (shape)"`` for each saved tensor.
    ``names`` maps names to tensors (or pass a module for its named parameters) so leaves are labelled.
    """
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"output must be a torch.Tensor, got {type(output).__name__}")
    if not output.requires_grad:
        raise ValueError("output does not require grad, so autograd recorded no graph for it "
                         "(was it computed under torch.no_grad(), or from tensors without requires_grad=True?)")
    named = _named(names)
    by_id = {id(t): n for n, t in named.items()}
    by_storage = {t.untyped_storage().data_ptr(): (n, tuple(t.shape)) for n, t in named.items()}

    g = nx.DiGraph()
    out_id = "output"
    g.add_node(out_id, kind="output", label=f"output\n{_shape(output)}", saved=[])
    if output.grad_fn is None:  # a leaf that requires grad: the graph is one node
        name = by_id.get(id(output), "tensor")
        g.nodes[out_id].update(kind="leaf", label=f"{name}\n{_shape(output)}")
        return g

    seen: dict[Any, str] = {}

    def node_id(fn: Any) -> str:
        if fn not in seen:
            seen[fn] = f"n{len(seen)}"
        return seen[fn]

    stack = [output.grad_fn]
    g.add_edge(node_id(output.grad_fn), out_id)
    while stack:
        fn = stack.pop()
        nid = node_id(fn)
        if "kind" in g.nodes[nid]:
            continue
        if hasattr(fn, "variable"):  # AccumulateGrad: a leaf tensor
            var = fn.variable
            name = by_id.get(id(var), "leaf")
            g.nodes[nid].update(kind="leaf", label=f"{name}\n{_shape(var)}", name=name, saved=[])
            continue
        saved: list[str] = []
        if show_saved:
            for sname, t in saved_tensors_of(fn).items():
                if isinstance(t, str):
                    saved.append(f"{sname}: {t}")
                else:
                    alias = ""
                    if (hit := by_storage.get(t.untyped_storage().data_ptr())) is not None:
                        alias = f" = {hit[0]}" if hit[1] == tuple(t.shape) else f" = view of {hit[0]}"
                    saved.append(f"{sname} {_shape(t)}{alias}")
        label = type(fn).__name__ + ("".join("\n" + s for s in saved) if saved else "")
        g.nodes[nid].update(kind="op", label=label, name=type(fn).__name__, saved=saved)
        for nxt, _ in fn.next_functions:
            if nxt is None:  # an input that does not require grad: no edge
                continue
            g.add_edge(node_id(nxt), nid)
            stack.append(nxt)
    return g


def _layers(g: nx.DiGraph) -> dict[str, int]:
    # Layer = longest path to the output, counted backwards, so each leaf sits just before its first user.
    depth: dict[str, int] = {}
    for gen_index, generation in enumerate(nx.topological_generations(g.reverse(copy=False))):
        for n in generation:
            depth[n] = gen_index
    top = max(depth.values())
    return {n: top - d for n, d in depth.items()}


def describe_graph(
    output: torch.Tensor,
    names: Mapping[str, torch.Tensor] | torch.nn.Module | None = None,
) -> str:
    """The graph as text, one node per line in forward order, with its inputs and saved tensors."""
    g = build_graph(output, names)
    layer = _layers(g)
    order = sorted(g.nodes, key=lambda n: (layer[n], g.nodes[n]["label"]))
    short = {n: g.nodes[n]["label"].split("\n")[0] for n in g.nodes}
    lines = []
    for n in order:
        d = g.nodes[n]
        ins = sorted(short[p] for p in g.predecessors(n))
        text = f"{d['kind']:<6} {short[n]}"
        if d["kind"] == "leaf":
            text += " " + d["label"].split("\n")[1]
        if ins:
            text += "  <- " + ", ".join(ins)
        if d.get("saved"):
            text += "  | saved: " + "; ".join(d["saved"])
        lines.append(text)
    return "\n".join(lines)


def draw_graph(
    output: torch.Tensor,
    names: Mapping[str, torch.Tensor] | torch.nn.Module | None = None,
    *,
    ax: Any = None,
    title: str | None = None,
    show_saved: bool = True,
) -> Any:
    """Draw the backward graph of ``output`` with matplotlib; returns the ``Axes``.

    Inputs are on the left, the output on the right; blue boxes are backward functions
    (with the tensors they saved), green boxes are leaves (named via ``names``).
    """
    import matplotlib.pyplot as plt

    g = build_graph(output, names, show_saved=show_saved)
    layer = _layers(g)
    columns: dict[int, list[str]] = {}
    for n, l in layer.items():
        columns.setdefault(l, []).append(n)
    # Order each column by the mean position of its successors (fewer crossings), from the output back.
    pos: dict[str, tuple[float, float]] = {}
    for l in sorted(columns, reverse=True):
        nodes = columns[l]

        def key(n: str) -> tuple[float, str]:
            ys = [pos[s][1] for s in g.successors(n) if s in pos]
            return (sum(ys) / len(ys) if ys else 0.0, g.nodes[n]["label"])

        nodes.sort(key=key)
        k = len(nodes)
        for i, n in enumerate(nodes):
            pos[n] = (float(l), (k - 1) / 2 - i)
    if ax is None:
        width = min(18.0, max(6.0, 2.1 * (max(layer.values()) + 1)))
        height = max(3.0, 1.1 * max(len(c) for c in columns.values()) + 1.0)
        _, ax = plt.subplots(figsize=(width, height))
    colours = {"op": "#cfe2f3", "leaf": "#d9ead3", "output": "#fce5cd"}
    boxes = {}
    for n, (x, y) in pos.items():
        d = g.nodes[n]
        boxes[n] = ax.text(x, y, d["label"], ha="center", va="center", fontsize=8, family="monospace",
                           zorder=3, bbox=dict(boxstyle="round,pad=0.4", fc=colours[d["kind"]], ec="0.3"))
    for u, v in g.edges:  # arrows clipped to the boxes they join
        ax.annotate("", xy=pos[v], xytext=pos[u], zorder=2,
                    arrowprops=dict(arrowstyle="-|>", color="0.35", lw=1.2, shrinkA=2, shrinkB=2,
                                    patchA=boxes[u].get_bbox_patch(), patchB=boxes[v].get_bbox_patch()))
    xs = [p[0] for p in pos.values()]
    ys = [p[1] for p in pos.values()]
    ax.set_xlim(min(xs) - 0.6, max(xs) + 0.6)
    ax.set_ylim(min(ys) - 0.8, max(ys) + 0.8)
    ax.set_xticks(sorted(set(int(x) for x in xs)))
    ax.set_yticks([])
    ax.set_xlabel("layer of the graph (forward direction →)")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title(title or f"Autograd graph: {sum(1 for n in g if g.nodes[n]['kind'] == 'op')} backward "
                 f"functions, {sum(1 for n in g if g.nodes[n]['kind'] == 'leaf')} leaves")
    return ax
