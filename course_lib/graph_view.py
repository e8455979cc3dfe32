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
            out[attr[len("_saved_") :]] = _FREED
            continue
        if isinstance(value, torch.Tensor):
            out[attr[len("_saved_") :]] = value
    try:  # custom autograd.Function nodes (BackwardCFunction) expose ctx.saved_tensors
        custom = node.saved_tensors
    except AttributeError:  # a built-in node: no such attribute
        custom = ()
    except RuntimeError:  # already released by backward()
        out["saved_tensors"] = _FREED
        custom = ()
    for i, t in enumerate(custom):
        if isinstance(t, torch.Tensor):
            out[f"saved_tensors[{i}]"] = t
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
        raise ValueError(
            "output does not require grad, so autograd recorded no graph for it "
            "(was it computed under torch.no_grad(), or from tensors without requires_grad=True?)"
        )
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
    (with the tensors they saved), green boxes are leaves (named via ``names``), arrows
    point the way data flowed forward. Boxes are measured before they are placed, so
    wide labels never overlap, and arrows run from box edge to box edge.
    """
    import matplotlib.pyplot as plt

    g = build_graph(output, names, show_saved=show_saved)
    layer = _layers(g)
    columns, row = _rows(g, layer)

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 4))
    fig = ax.figure
    fontsize, pad = 8.0, 0.4
    colours = {"op": "#cfe2f3", "leaf": "#d9ead3", "output": "#fce5cd"}
    boxes = {}
    for n in g.nodes:
        d = g.nodes[n]
        boxes[n] = ax.text(
            0,
            0,
            d["label"],
            ha="center",
            va="center",
            fontsize=fontsize,
            family="monospace",
            zorder=3,
            bbox=dict(boxstyle=f"round,pad={pad}", fc=colours[d["kind"]], ec="0.3"),
        )
    # Measure every box in inches (text extent plus the bbox padding on both sides).
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    size: dict[str, tuple[float, float]] = {}
    for n, t in boxes.items():
        ext = t.get_window_extent(renderer)
        padding = 2 * pad * fontsize / 72
        size[n] = (ext.width / fig.dpi + padding, ext.height / fig.dpi + padding)
    gap_x, gap_y, margin = 0.8, 0.3, 0.2
    col_w = {col: max(size[n][0] for n in nodes) for col, nodes in columns.items()}
    row_h = max(h for _, h in size.values()) + gap_y
    x_of: dict[int, float] = {}
    x = margin
    for col in sorted(columns):
        x_of[col] = x + col_w[col] / 2
        x += col_w[col] + gap_x
    width = x - gap_x + margin
    rows = max(len(c) for c in columns.values())
    height = rows * row_h + margin
    pos = {n: (x_of[layer[n]], height / 2 + row[n] * row_h) for n in g.nodes}
    # Data coordinates are inches: size the figure to the layout when we own it.
    if fig.axes == [ax]:
        fig.set_size_inches(max(width, 4.0), height + 1.2)
    for n, t in boxes.items():
        t.set_position(pos[n])
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    # Read the drawn boxes' true extents back in data coordinates, so arrows start and end on their edges.
    fig.canvas.draw()
    to_data = ax.transData.inverted()
    half_w = {}
    for n, t in boxes.items():
        (x0, _), (x1, _) = to_data.transform(t.get_bbox_patch().get_window_extent(renderer).get_points())
        half_w[n] = (x1 - x0) / 2
    _arrows_and_axes(ax, g, pos, half_w, x_of, sorted(columns), title)
    return ax


def _rows(g: Any, layer: dict[str, int]) -> tuple[dict[int, list[str]], dict[str, float]]:
    """The nodes of each column, and each node's row: a column ordered by the mean row of its successors (fewer
    crossings), from the output back."""
    columns: dict[int, list[str]] = {}
    for n, col in layer.items():
        columns.setdefault(col, []).append(n)
    row: dict[str, float] = {}
    for col in sorted(columns, reverse=True):
        nodes = columns[col]

        def key(n: str) -> tuple[float, str]:
            ys = [row[s] for s in g.successors(n) if s in row]
            return (sum(ys) / len(ys) if ys else 0.0, g.nodes[n]["label"])

        nodes.sort(key=key)
        for i, n in enumerate(nodes):
            row[n] = (len(nodes) - 1) / 2 - i
    return columns, row


def _arrows_and_axes(
    ax: Any,
    g: Any,
    pos: dict[str, tuple[float, float]],
    half_w: dict[str, float],
    x_of: dict[int, float],
    cols: list[int],
    title: str | None,
) -> None:
    """Arrows from box edge to box edge, the layer ticks, the title."""
    for u, v in g.edges:  # from the right edge of the input's box to the left edge of its user's box
        start = (pos[u][0] + half_w[u], pos[u][1])
        end = (pos[v][0] - half_w[v], pos[v][1])
        ax.annotate(
            "",
            xy=end,
            xytext=start,
            zorder=2,
            arrowprops=dict(arrowstyle="-|>", color="0.35", lw=1.2, shrinkA=0, shrinkB=1, mutation_scale=14),
        )
    ax.set_xticks([x_of[col] for col in cols], [str(col) for col in cols])
    ax.set_yticks([])
    ax.set_xlabel("layer of the graph (forward direction →)")
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    ax.set_title(
        title
        or f"Autograd graph: {sum(1 for n in g if g.nodes[n]['kind'] == 'op')} backward "
        f"functions, {sum(1 for n in g if g.nodes[n]['kind'] == 'leaf')} leaves"
    )
