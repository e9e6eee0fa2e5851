"""The Triton kernels as custom ops (layers/kernels/triton_ops.py) under torch.compile: with
fullgraph=True (no graph break), the compiled kernel, SASA's window through it and both layers
on backend="triton" give eager's outputs and gradients exactly, dropout's links under one seed
included; the ops' fakes and autograd pass torch.library.opcheck. Without a GPU, through
Triton's interpreter on CPU tensors (conftest sets TRITON_INTERPRET=1), with AOTAutograd's
eager backend: the same custom ops run, with torch's own ops around them; and once with
Inductor's code around the op."""

from __future__ import annotations

import copy

import pytest
import torch

from attnconv.layers.kernels import triton_axis
from attnconv.layers.kernels.triton_axis import axis_attention_triton
from attnconv.layers.kernels.triton_local import local_attention_triton
from attnconv.layers.local import LocalSelfAttention2d
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
pytestmark = pytest.mark.skipif(
    not triton_axis.INSTALLED or (DEVICE == "cpu" and not triton_axis.interpreted()),
    reason="needs triton (pip install triton) and a GPU or TRITON_INTERPRET=1",
)
B, NH, H, W, DK, DV = 2, 2, 3, 5, 8, 4
T = H * W


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _leaves(*shapes, seed=0):
    gen = torch.Generator().manual_seed(seed)
    xs = (torch.randn(s, dtype=torch.float64, generator=gen) for s in shapes)
    return [x.to(DEVICE).requires_grad_() for x in xs]


def _same(f, xs, seed=3, backend="aot_eager", tol=None):
    """f(*xs) compiled whole (AOTAutograd, torch's ops around the custom ops) against eager:
    the output and the gradients of every input, exactly (``tol``: within it), under one seed."""
    compiled = torch.compile(f, backend=backend, fullgraph=True)
    res = []
    for g in (f, compiled):
        torch.manual_seed(seed)
        y = g(*xs)
        res.append((y, *torch.autograd.grad(y.sin().sum(), xs)))
    for a, b in zip(*res):
        torch.testing.assert_close(b, a, **(tol or dict(rtol=0, atol=0)))


@pytest.mark.parametrize("p, per_image", [(0.0, True), (0.3, True), (0.3, False)])
def test_compiled_kernel_equals_eager(p, per_image):
    """q, k per image, v one head's expanded over the heads (stride 0), the axis logits one for
    the batch; with dropout, the seed drawn in the graph from the default generator."""
    xs = _leaves((B, NH, T, DK), (B, NH, T, DK), (B, 1, T, DV), (1, NH, T, H + W))

    def f(q, k, v, qa):
        return axis_attention_triton(q, k, v.expand(B, NH, T, DV), qa, H, W, 0.37, p, per_image)

    _same(f, xs)


def test_inductor_compiles_around_the_op():
    """Inductor's code around the op (float32, attention dropout; torch's random draws in the
    graph, fallback_random, so the seed is eager's): the output and gradients within float32's
    rounding of eager's."""
    import torch._inductor.config as inductor

    xs = [x.float().detach().requires_grad_() for x in _leaves(*[(B, NH, T, DK)] * 2)]
    xs += [x.float().detach().requires_grad_() for x in _leaves((B, NH, T, DV), (B, NH, T, H + W))]

    def f(q, k, v, qa):
        return axis_attention_triton((q * 2).relu(), k, v.sin(), qa, H, W, 0.37, 0.3).cos()

    with inductor.patch(fallback_random=True):
        _same(f, xs, backend="inductor", tol=dict(rtol=1e-5, atol=1e-5))


def test_compiled_window_kernel_equals_eager():
    """SASA's 3 x 3 window (q, k, v maps, the relative tables learned through the logits)."""
    xs = _leaves((B, NH, 8, 5, 6), (B, NH, 8, 5, 6), (B, NH, 4, 5, 6), (3, 4), (3, 4))
    _same(lambda q, k, v, r, c: local_attention_triton(q, k, v, 3, r, c), xs)


LAYERS = (
    lambda: MultiHeadSelfAttention2d(
        12, 12, num_heads=3, head_dim=8, positional="relative_learned", dropout=0.25
    ),
    lambda: LocalSelfAttention2d(6, 8, 2, 3, backend="triton"),
)


@pytest.mark.parametrize("layer", LAYERS, ids=["mhsa2d", "local"])
def test_layer_on_triton_compiles_whole_and_trains_as_eager(layer):
    """A layer on backend="triton" in training (MultiHeadSelfAttention2d with attention dropout):
    no graph break, and the compiled output and every gradient (input, parameters) are eager's."""
    torch.manual_seed(0)
    lay = layer().double().to(DEVICE).train()
    lay.backend = "triton"
    x = _leaves((2, 12 if isinstance(lay, MultiHeadSelfAttention2d) else 6, 5, 7))[0]
    assert torch._dynamo.explain(copy.deepcopy(lay))(x).graph_break_count == 0
    compiled = torch.compile(copy.deepcopy(lay), backend="aot_eager", fullgraph=True)
    res = []
    for m in (lay, compiled):
        torch.manual_seed(5)
        y = m(x)
        res.append((y, *torch.autograd.grad(y.sin().sum(), [x, *m.parameters()])))
    for a, b in zip(*res):
        torch.testing.assert_close(b, a, rtol=0, atol=0)


@pytest.mark.parametrize("window", [0, pytest.param(3, marks=pytest.mark.slow)])
def test_the_ops_pass_opcheck(window):
    """torch.library.opcheck: the schema, the fakes' shapes, dtypes and strides against the
    kernels' outputs, the autograd registration, AOTAutograd's dispatch."""
    na = 2 * window if window else H + W
    q, k, v, qa = _leaves((B, NH, T, DK), (B, NH, T, DK), (B, NH, T, DV), (B, NH, T, na))
    p = 0.0 if window else 0.2
    seed = torch.tensor(7, dtype=torch.int64)
    args = (q, k, v, qa, H, W, 0.37 if not window else 1.0, p, seed, True, None, window, [B, NH])
    torch.library.opcheck(torch.ops.attnconv.triton_axis.default, args)
    y, stats, block = torch.ops.attnconv.triton_axis(*args)
    dy = torch.randn_like(y)
    back = (dy, *(x.detach() for x in (q, k, v, qa, stats)), block, *args[4:])
    torch.library.opcheck(torch.ops.attnconv.triton_axis_backward.default, back)


def test_the_op_takes_any_layout_a_compiler_hands_it():
    """Inputs whose last axis is not contiguous (a layout Inductor may choose): the op's values
    and gradients are those of the same inputs contiguous."""
    q, k, v, qa = _leaves((B, NH, DK, T), (B, NH, DK, T), (B, NH, DV, T), (B, NH, H + W, T))
    seed = torch.tensor(7, dtype=torch.int64)
    args = (H, W, 0.37, 0.2, seed, True, None, 0, [B, NH])
    res = []
    for layout in (lambda x: x.mT, lambda x: x.mT.contiguous()):
        xs = [layout(x) for x in (q, k, v, qa)]
        y = torch.ops.attnconv.triton_axis(*xs, *args)[0]
        res.append((y, *torch.autograd.grad(y.sin().sum(), [q, k, v, qa])))
    for a, b in zip(*res):
        torch.testing.assert_close(b, a, rtol=0, atol=0)
