"""torch.func transforms (grad, vmap, jacrev, jvp, hessian) and forward-mode AD through every
public layer and the paper models: inside a transform every kernel table picks its plain path
(plan.py), so per-sample gradients, Jacobians, Jacobian-vector products and Hessians equal
ordinary autograd on the fast paths, in float64; under bf16 autocast per-sample gradients are
as close to float64 as a backward pass through the reference path.

Before this, every content layer, SASA's window attention and the attention stem raised torch's
"In order to use an autograd.Function with functorch transforms ..." (the fused kernels'
autograd Functions are not transform-aware)."""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.func import functional_call, grad, hessian, jacrev, jvp, vmap

from attnconv.layers.encodings import POSITIONALS
from attnconv.layers.kernels import plan
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from attnconv.models import create_model
from public_layers import public_layers

LAYERS = public_layers(None)
IDS = [r[0] for r in LAYERS]


def _params(layer):
    return {k: v.detach() for k, v in layer.named_parameters()}


def _per_sample_grads(layer, xs: torch.Tensor) -> dict[str, torch.Tensor]:
    """d(sum(layer(x_i)^2))/d(params, x_i) for each sample i: vmap over grad."""

    def loss(p, x):
        return functional_call(layer, p, (x[None],)).square().sum()

    return vmap(grad(loss, argnums=(0, 1)), in_dims=(None, 0))(_params(layer), xs)


def _loop_grads(layer, xs: torch.Tensor):
    """The same with ordinary autograd, one sample at a time (the layer's fast path)."""
    out = []
    for x in xs:
        x = x[None].clone().requires_grad_(True)
        ps = dict(layer.named_parameters())
        gs = torch.autograd.grad(layer(x).square().sum(), [*ps.values(), x], allow_unused=True)
        out.append((dict(zip(ps, gs[:-1])), gs[-1][0]))
    return out


def _assert_per_sample_equal(layer, xs):
    gp, gx = _per_sample_grads(layer, xs)
    for i, (lp, lx) in enumerate(_loop_grads(layer, xs)):
        torch.testing.assert_close(gx[i], lx, rtol=1e-10, atol=1e-12)
        for k, g in lp.items():
            want = torch.zeros_like(gp[k][i]) if g is None else g
            torch.testing.assert_close(gp[k][i], want, rtol=1e-10, atol=1e-12, msg=k)


@pytest.mark.parametrize("name, layer, x", LAYERS, ids=IDS)
def test_per_sample_gradients_equal_autograd(name, layer, x):
    torch.manual_seed(0)
    layer = layer.double().eval()
    xs = torch.randn(2, *x.shape[1:], dtype=torch.float64)
    _assert_per_sample_equal(layer, xs)


@pytest.mark.parametrize("name, layer, x", LAYERS, ids=IDS)
def test_jacrev_and_jvp_equal_autograd(name, layer, x):
    torch.manual_seed(1)
    layer = layer.double().eval()
    x = x.detach()
    want = torch.autograd.functional.jacobian(layer, x)  # ordinary autograd, the fast path
    torch.testing.assert_close(jacrev(layer)(x), want, rtol=1e-10, atol=1e-12)
    t = torch.randn_like(x)
    jt_want = want.flatten(x.dim()) @ t.flatten()
    _, jt = jvp(layer, (x,), (t,))
    torch.testing.assert_close(jt, jt_want, rtol=1e-9, atol=1e-11)
    with fwAD.dual_level():  # forward-mode AD without torch.func: dual tensors
        y = layer(fwAD.make_dual(x, t))
        torch.testing.assert_close(fwAD.unpack_dual(y).tangent, jt_want, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize(
    "name", [n for n in IDS if n.startswith(("mhsa2d", "mha", "converted")) and "none" not in n]
)
def test_hessian_through_fast_layers_equals_plain(name):
    """Layers whose fast path has no second derivative (a double backward raises
    HigherOrderGradError): under torch.func.hessian they run the plain equations, so the Hessian
    is the plain path's, computed by ordinary double backward."""
    torch.manual_seed(2)
    fast = dict(zip(IDS, LAYERS))[name][1].double().eval()
    ref = dict(zip(IDS, [r[1] for r in public_layers("reference")]))[name].double().eval()
    ref.load_state_dict(fast.state_dict())
    x = torch.randn(1, *dict(zip(IDS, LAYERS))[name][2].shape[1:], dtype=torch.float64)

    def f(layer):
        return lambda t: layer(t).square().sum()

    want = torch.autograd.functional.hessian(f(ref), x)
    assert want.abs().max() > 1e-3  # a real second derivative
    torch.testing.assert_close(hessian(f(fast))(x), want, rtol=1e-9, atol=1e-11)


@settings(max_examples=10)
@given(
    h=st.integers(1, 5),
    w=st.integers(1, 5),
    heads=st.integers(1, 3),
    pos=st.sampled_from([p for p in POSITIONALS if p != "none"]),
    content=st.booleans(),
)
def test_mhsa2d_per_sample_gradients_any_shape(h, w, heads, pos, content):
    torch.manual_seed(h * 31 + w)
    layer = MultiHeadSelfAttention2d(
        2 * heads, 3 * heads, heads, positional=pos, content=content, max_size=8
    ).double()
    _assert_per_sample_equal(layer.eval(), torch.randn(2, 2 * heads, h, w, dtype=torch.float64))


def _paper_model(name: str = "sa_quadratic"):
    return create_model(name, hidden_size=16, num_layers=2, num_heads=4).double()


@pytest.mark.parametrize("name", ["sa_quadratic", "sa_learned_content"])
def test_paper_model_per_sample_gradients_with_dropout(name):
    """Training mode (hidden and attention dropout) under vmap(randomness="same"): each sample
    gets the mask a single-image step draws from the same generator state, so the per-sample
    gradients equal a loop of ordinary steps (the fast kernels), each from that state."""
    model = _paper_model(name).train()
    assert model.cfg.dropout > 0 and model.cfg.attn_dropout > 0
    xs = torch.randn(3, 3, 16, 16, dtype=torch.float64)
    ys = torch.tensor([1, 4, 7])

    def loss(p, x, y):
        return F.cross_entropy(functional_call(model, p, (x[None],)), y[None])

    torch.manual_seed(5)
    per_sample = vmap(grad(loss), in_dims=(None, 0, 0), randomness="same")(_params(model), xs, ys)
    for i in range(3):
        torch.manual_seed(5)
        model.zero_grad()
        F.cross_entropy(model(xs[i : i + 1]), ys[i : i + 1]).backward()
        for k, p in model.named_parameters():
            torch.testing.assert_close(per_sample[k][i], p.grad, rtol=1e-9, atol=1e-12, msg=k)


def test_vmap_different_randomness_is_one_line():
    model = _paper_model().train()

    def loss(p, x):
        return functional_call(model, p, (x[None],)).sum()

    xs = torch.randn(2, 3, 16, 16, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="one seed a step.*randomness='same'") as e:
        vmap(grad(loss), in_dims=(None, 0), randomness="different")(_params(model), xs)
    assert "\n" not in str(e.value)
    model.eval()  # no dropout: any randomness
    vmap(grad(loss), in_dims=(None, 0), randomness="different")(_params(model), xs)


PURE = {"reference", "separable", "shared", "dense_dropout", "fold"}  # plain torch ops only


@pytest.mark.parametrize("backend", [None, *plan.BACKENDS])
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_table_picks_plain_torch_ops_in_a_transform(backend, device):
    layer = MultiHeadSelfAttention2d(4, 4, 2, positional="quadratic")
    for content in (True, False):
        for p_drop in (0.0, 0.1):
            for dtype in (torch.float32, torch.bfloat16):
                term = layer.positional_encoding.term(4, 4, content=content)
                case = plan.Case(
                    term, content, backend, device, t=16, p_drop=p_drop, dtype=dtype,
                    transformed=True,
                )  # fmt: skip
                assert plan.choose(case, plan.TRANSFORM_TABLE) in PURE
    assert set(row.name for row in plan.TRANSFORM_TABLE) == PURE
    local_backend = backend if backend in plan.LOCAL_BACKENDS else None
    local = plan.LocalCase(local_backend, device, t=16, transformed=True)
    assert plan.choose(local, plan.LOCAL_TABLE) == "reference"
    dropout = plan.DropoutCase(device, module=False, transformed=True)
    assert plan.choose(dropout, plan.DROPOUT_TABLE) == "reference"


def test_a_layer_says_which_kernel_it_runs_in_a_transform():
    layer = MultiHeadSelfAttention2d(4, 4, 2, positional="relative_learned").double()
    seen = []

    def f(x):
        seen.append(layer.kernel(x[None], why=True).splitlines()[-1])
        return layer(x[None]).sum()

    grad(f)(torch.randn(4, 3, 3, dtype=torch.float64))
    assert seen == ["chosen: fold (any: otherwise: folded into q/k, plain softmax attention)"]


def _relative_error(got, want) -> float:
    """||got - want|| / ||want|| over every sample's input and parameter gradients."""
    num = den = 0.0
    for (gp, gx), (wp, wx) in zip(got, want):
        for k in (*wp, None):
            g, w = (gx, wx) if k is None else (gp[k], wp[k])
            g, w = (torch.zeros(()) if t is None else t.double() for t in (g, w))  # unused: 0
            num += float((g - w).square().sum())
            den += float(w.square().sum())
    return (num / den) ** 0.5


def _per_sample_list(layer, xs):
    gp, gx = _per_sample_grads(layer, xs)
    return [({k: gp[k][i] for k in gp}, gx[i]) for i in range(len(xs))]


# The stem's BatchNorm under bf16 autocast inside vmap fails in torch itself (a plain Conv2d +
# BatchNorm2d raises the same "expected scalar type BFloat16 but found Float"). The feed-forward
# block is torch's Linear and ReLU on both sides: a bf16 rounding that moves a pre-activation
# across 0 flips its gate (2 of 40 weight draws: 4.2x and 8.5x the error; 18% off), not a kernel.
BF16_LAYERS = [r[0] for r in LAYERS if r[0] not in ("stem", "feedforward")]


@pytest.mark.parametrize("name", BF16_LAYERS)
def test_per_sample_gradients_under_bf16_autocast(name):
    """vmap(grad) under bf16 autocast against float64 autograd: within 2x of the error of the
    layer's reference path trained the ordinary way (a loop of backward passes) under autocast
    (at most 1.74x over 12 weight draws here; the draw is fixed)."""
    torch.manual_seed(0)
    layer, x = next((m, x) for n, m, x in public_layers(None) if n == name)
    plain = next(m for n, m, _ in public_layers("reference") if n == name)
    plain.load_state_dict(layer.state_dict())
    xs = torch.randn(4, *x.shape[1:], dtype=torch.float64)
    want = _loop_grads(layer.double().eval(), xs)
    layer, plain = layer.float(), plain.float().eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = _per_sample_list(layer, xs.float())
        base = _loop_grads(plain, xs.float())
    err, err_plain = _relative_error(got, want), _relative_error(base, want)
    assert err <= 2 * err_plain + 1e-7, (err, err_plain)
    assert err_plain < 3e-2  # bf16's 8 bits, not a broken reference
