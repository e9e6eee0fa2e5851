"""The FlexAttention backend of content attention (kernels/flex.py), issue 17: the quadratic and
learned-relative logits as a score_mod equal the dense reference. On CPU Flex runs eagerly
(forward only); on CUDA (when present) the layer routes there by itself, and gradients are
checked too."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnconv.layers.kernels.flex import flex_axis_attention
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _pair(positional: str, heads: int, dtype, device, seed: int):
    torch.manual_seed(seed)
    fast = MultiHeadSelfAttention2d(6, 6, heads, positional=positional, content=True, max_size=8)
    fast = fast.to(device, dtype)
    with torch.no_grad():
        if positional == "quadratic":
            fast.positional_encoding.centers.uniform_(-3, 3)
    ref = MultiHeadSelfAttention2d(
        6, 6, heads, positional=positional, content=True, max_size=8, backend="reference"
    ).to(device, dtype)
    ref.load_state_dict(fast.state_dict())
    fast.backend = "flex"
    return fast, ref


@pytest.mark.slow
@given(
    positional=st.sampled_from(["quadratic", "relative_learned"]),
    b=st.integers(1, 2),
    heads=st.integers(1, 3),
    h=st.integers(1, 6),
    w=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_flex_backend_equals_reference_cpu(positional, b, heads, h, w, seed):
    fast, ref = _pair(positional, heads, torch.float64, "cpu", seed)
    x = torch.randn(b, 6, h, w, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), ref(x), rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("positional", ["quadratic", "relative_learned"])
def test_flex_backend_on_device(positional, device):
    """Values on every device; gradients too where Flex has a backward (CUDA)."""
    fast, ref = _pair(positional, 2, torch.float32, device, 0)
    x = torch.randn(2, 6, 5, 7, device=device, requires_grad=True)
    with torch.set_grad_enabled(device.type == "cuda"):
        yf, yr = fast(x), ref(x)
    torch.testing.assert_close(yf, yr, rtol=1e-4, atol=1e-5)
    if device.type == "cuda":
        gf = torch.autograd.grad(yf.square().sum(), [x, *fast.parameters()], allow_unused=True)
        gr = torch.autograd.grad(yr.square().sum(), [x, *ref.parameters()], allow_unused=True)
        for a, r in zip(gf, gr):
            assert (a is None) == (r is None)
            if a is not None:
                torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-5)


def _rel(a: torch.Tensor, ref: torch.Tensor, scale: float) -> float:
    """max |a - ref| over ``scale`` (the reference's own max |.|, or another scale where it
    vanishes)."""
    return ((a.double() - ref.double()).abs().max() / scale).item()


# A gradient that vanishes in float64 (alpha 1e4: each head attends one pixel, the query's
# gradient is 3e-201) comes out of Flex's backward as float32 roundoff: dS = P (dP - delta),
# delta = rowsum(dO O), cancels dO.v_j computed in two orders (H200: 3.8e-6, against a layer
# input gradient of 4.7). The dense path's softmax backward cancels it exactly. Such a gradient
# is measured over the layer input's gradient (the size of the cancelling terms) and allowed 64
# units of float32 roundoff.
VANISHING_FLOOR = 64 * torch.finfo(torch.float32).eps


FLEX_PRECISION = [("quadratic", 16, 10.0), ("quadratic", 32, 1e4), ("relative_learned", 32, None)]


@pytest.mark.parametrize("positional,hw,alpha", FLEX_PRECISION)
@pytest.mark.parametrize("autocast", [False, True])
def test_flex_backend_is_as_exact_as_dense(positional, hw, alpha, autocast, device):
    """Issue 17: the Flex backend's output error against float64 (fp32, and bf16 autocast where
    the device has it) at most 2x the dense path's; gradients too where Flex has a backward
    (CUDA). Under autocast q, k, v stay bfloat16 and the positional logits are added in float32
    to the kernel's float32 scores (kernels/content.py, flex)."""
    torch.manual_seed(hw)
    fast = MultiHeadSelfAttention2d(16, 16, 2, positional=positional, content=True, max_size=hw)
    fast = fast.to(device)
    if alpha is not None:
        with torch.no_grad():
            fast.positional_encoding.set_alpha(alpha)
            fast.positional_encoding.centers.uniform_(-4.0, 4.0)
    plain = copy.deepcopy(fast)
    plain.backend, fast.backend = "reference", "flex"
    x = torch.randn(1, 16, hw, hw, device=device)
    grad = device.type == "cuda"

    def run(layer, inp, amp):
        inp = inp.clone().requires_grad_(grad)
        with torch.set_grad_enabled(grad), torch.autocast(device.type, torch.bfloat16, amp):
            y = layer(inp)
        if not grad:
            return [y]
        params = [inp, layer.query_proj.weight, *layer.positional_encoding.parameters()]
        return [y, *torch.autograd.grad(y.float().square().sum(), params)]

    ref = run(copy.deepcopy(plain).double(), x.double(), False)
    names = ["y", "x", "Wq", "encoding", "encoding"]
    for name, a, p, r in zip(names, run(fast, x, autocast), run(plain, x, autocast), ref):
        scale = r.abs().max().item()
        vanishes = scale < 1e-30
        scale = ref[1].abs().max().item() if vanishes else scale  # ref[1]: the input's gradient
        e_a, e_p = _rel(a, r, scale), _rel(p, r, scale)
        # the encoding's gradients: a few scalars, sums of cancelling terms (test_precision.py)
        floor = (
            VANISHING_FLOOR if vanishes else 2e-6 if name == "encoding" and not autocast else 1e-12
        )  # 1e-12: zero
        assert name == "encoding" or e_p < (2e-2 if autocast else 1e-5), (name, e_p)
        assert e_a <= 2 * max(e_p, floor), (name, e_a, e_p)


def test_cpu_layer_keeps_the_fused_sdpa_path_by_default():
    layer = MultiHeadSelfAttention2d(4, 4, 2, positional="quadratic", content=True)
    assert layer.backend is None
    x, flex = torch.randn(1, 4, 3, 3), ("flex", "flex_gaussian")
    assert layer.kernel(x, 0.0) not in flex
    assert layer.kernel(x, 0.0, "cuda") in flex and layer.kernel(x, 0.1, "cuda") not in flex


def test_flex_axis_attention_rejects_a_mismatched_table():
    q = torch.randn(1, 1, 6, 4)
    with pytest.raises(ValueError, match="q_axis"):
        flex_axis_attention(q, q, q, torch.randn(1, 1, 6, 4), 2, 3, 0.5)


LOCAL_VARIANTS = [
    ("relative", "qk+qr"),
    ("relative", "qr"),
    ("absolute", "qk+qr"),
    ("absolute", "qr"),
    ("none", "qk"),
]


@pytest.mark.slow
@given(
    variant=st.sampled_from(LOCAL_VARIANTS),
    ks=st.integers(1, 5),
    b=st.integers(1, 2),
    h=st.integers(1, 6),
    w=st.integers(1, 6),
    seed=st.integers(0, 2**16),
)
def test_flex_local_equals_reference_cpu(variant, ks, b, h, w, seed):
    """SASA window attention through Flex (block mask + relative score_mod) == the reference."""
    from attnconv.layers.local import LocalSelfAttention2d

    positional, logits = variant
    torch.manual_seed(seed)
    lay = LocalSelfAttention2d(3, 8, 2, kernel_size=ks, positional=positional, logits=logits)
    lay = lay.double()
    x = torch.randn(b, 3, h, w, dtype=torch.float64)
    with torch.no_grad():
        lay.backend = "reference"
        ref = lay(x)
        lay.backend = "flex"
        torch.testing.assert_close(lay(x), ref, rtol=1e-9, atol=1e-11)


def test_flex_local_on_device(device):
    """The SASA layer routes to Flex by itself on CUDA (values and gradients checked there);
    on CPU it is forced, forward only."""
    from attnconv.layers.local import LocalSelfAttention2d

    torch.manual_seed(0)
    lay = LocalSelfAttention2d(4, 8, 2, kernel_size=3).to(device)
    if device.type == "cpu":
        lay.backend = "flex"
    assert lay.kernel(device) == "flex"
    x = torch.randn(2, 4, 6, 5, device=device, requires_grad=True)
    with torch.set_grad_enabled(device.type == "cuda"):
        y = lay(x)
        lay.backend = "reference"
        yr = lay(x)
    torch.testing.assert_close(y, yr, rtol=1e-4, atol=1e-5)
    if device.type == "cuda":
        ga = torch.autograd.grad(y.square().sum(), [x, *lay.parameters()])
        gr = torch.autograd.grad(yr.square().sum(), [x, *lay.parameters()])
        for a, r in zip(ga, gr):
            torch.testing.assert_close(a, r, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gaussian_score_mod_is_the_dense_logits_to_the_bit(dtype):
    """Eq. 9's isotropic logit is written once (terms.isotropic_energy): the Flex score_mod on
    the whole index grid gives the quadratic encoding's dense logits bit for bit."""
    from attnconv.layers.encodings import QuadraticEncoding
    from attnconv.layers.kernels.flex import gaussian_score_mod

    torch.manual_seed(0)
    enc = QuadraticEncoding(3).to(dtype)
    with torch.no_grad():
        enc.centers.uniform_(-4, 4)
        enc.set_alpha(torch.tensor([0.5, 10.0, 1e4]))
    h, w = 5, 7
    t = h * w
    mod = gaussian_score_mod(enc.alpha.detach(), enc.centers.detach(), w)
    grid = mod(
        torch.zeros(3, t, t, dtype=dtype),
        0,
        torch.arange(3)[:, None, None],
        torch.arange(t)[None, :, None],
        torch.arange(t)[None, None, :],
    )
    assert torch.equal(grid, enc.dense_logits(h, w).detach())
