from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.text import Annotation  # noqa: E402

from course_lib.graph_view import (  # noqa: E402
    build_graph,
    describe_graph,
    draw_graph,
    saved_tensors_of,  # noqa: E402
)


def _mlp_loss() -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    loss = torch.nn.functional.cross_entropy(net(torch.randn(5, 4)), torch.tensor([0, 1, 0, 1, 1]))
    return net, loss


def test_mul_by_a_constant_saves_only_the_constant() -> None:
    a = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = torch.full((3,), 3.0)
    c = a * b
    g = build_graph(c, {"a": a, "b": b})
    kinds = sorted(d["kind"] for _, d in g.nodes(data=True))
    assert kinds == ["leaf", "op", "output"]
    op = next(d for _, d in g.nodes(data=True) if d["kind"] == "op")
    assert op["name"] == "MulBackward0"
    assert op["saved"] == ["other (3,) = b"]  # self is not needed: b does not require grad
    assert describe_graph(c, {"a": a, "b": b}).splitlines() == [
        "leaf   a (3,)",
        "op     MulBackward0  <- a  | saved: other (3,) = b",
        "output output  <- MulBackward0",
    ]


def test_a_two_layer_network_has_its_parameters_as_leaves() -> None:
    net, loss = _mlp_loss()
    g = build_graph(loss, net)
    leaves = sorted(d["name"] for _, d in g.nodes(data=True) if d["kind"] == "leaf")
    assert leaves == ["0.bias", "0.weight", "2.bias", "2.weight"]
    ops = sorted(d["name"] for _, d in g.nodes(data=True) if d["kind"] == "op")
    assert ops.count("AddmmBackward0") == 2 and "ReluBackward0" in ops and "NllLossBackward0" in ops
    text = describe_graph(loss, net)
    assert "mat2 (8, 2) = view of 2.weight" in text
    assert text.splitlines()[-1] == "output output  <- NllLossBackward0"


def test_saved_tensors_are_reported_freed_after_backward() -> None:
    a = torch.ones(3, requires_grad=True)
    c = a * a
    assert set(saved_tensors_of(c.grad_fn)) == {"self", "other"}
    c.sum().backward()
    assert saved_tensors_of(c.grad_fn) == {"other": "freed", "self": "freed"}
    assert "saved: other: freed; self: freed" in describe_graph(c, {"a": a})


def test_custom_function_saved_tensors_are_seen_then_freed() -> None:
    class Square(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):  # type: ignore[override]
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        def backward(ctx, g):  # type: ignore[override]
            (x,) = ctx.saved_tensors
            return 2 * x * g

    x = torch.ones(4, requires_grad=True)
    y = Square.apply(x)
    assert list(saved_tensors_of(y.grad_fn)) == ["saved_tensors[0]"]
    y.sum().backward()
    assert saved_tensors_of(y.grad_fn) == {"saved_tensors": "freed"}
    assert "Square" in describe_graph(y, {"x": x})  # describing a graph after backward never crashes


def test_a_leaf_alone_is_one_node() -> None:
    w = torch.ones(2, requires_grad=True)
    g = build_graph(w, {"w": w})
    assert g.number_of_nodes() == 1


def test_arrows_start_and_end_on_box_edges_and_boxes_do_not_overlap() -> None:
    net, loss = _mlp_loss()
    ax = draw_graph(loss, net)
    fig = ax.figure
    fig.canvas.draw()
    to_data = ax.transData.inverted()
    boxes = [t for t in ax.texts if not isinstance(t, Annotation)]
    extents = [to_data.transform(t.get_bbox_patch().get_window_extent().get_points()) for t in boxes]
    for i, a in enumerate(extents):
        for b in extents[i + 1 :]:
            overlap_x = min(a[1][0], b[1][0]) - max(a[0][0], b[0][0])
            overlap_y = min(a[1][1], b[1][1]) - max(a[0][1], b[0][1])
            assert overlap_x <= 1e-6 or overlap_y <= 1e-6, "two boxes overlap"
    edges_x = {round(float(x), 3) for e in extents for x in (e[0][0], e[1][0])}
    for arrow in (t for t in ax.texts if isinstance(t, Annotation)):
        assert round(float(arrow.xy[0]), 3) in edges_x and round(float(arrow.xyann[0]), 3) in edges_x
    plt.close(fig)


def test_draw_graph_draws_every_node() -> None:
    net, loss = _mlp_loss()
    ax = draw_graph(loss, net)
    g = build_graph(loss, net)
    boxes = [t for t in ax.texts if not isinstance(t, Annotation)]
    arrows = [t for t in ax.texts if isinstance(t, Annotation)]
    assert len(boxes) == g.number_of_nodes() and len(arrows) == g.number_of_edges()
    assert ax.get_title() == "Autograd graph: 7 backward functions, 4 leaves"
    assert ax.get_xlabel()
    plt.close(ax.figure)


def test_bad_input_is_explained() -> None:
    with pytest.raises(TypeError, match="torch.Tensor"):
        build_graph([1, 2])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="does not require grad"):
        build_graph(torch.ones(3))
    with pytest.raises(TypeError, match="names must"):
        build_graph(torch.ones(3, requires_grad=True) * 2, names=[1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="autograd node"):
        saved_tensors_of(None)
