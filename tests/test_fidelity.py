"""The paper models follow the reference code (epfml/attention-cnn): its initialisation, its
parametrization of the Gaussian precision, its weight-decay groups and its schedule."""

from __future__ import annotations

import math

import pytest
import torch

import attnconv
from attnconv.catalog import RECIPES
from attnconv.layers.encodings import GeneralizedQuadraticEncoding, QuadraticEncoding
from attnconv.train.config import ScheduleConfig
from attnconv.train.optim import lr_at, no_decay_names, param_groups


def _position_logits(model, h: int = 16, w: int = 16) -> torch.Tensor:
    """(B|1, Nh, T, T) positional logits of the first layer (dense reference equations)."""
    attn = model.layers[0].attn
    x = torch.randn(2, attn.in_channels, h, w)
    with torch.no_grad():
        _, _, bias = attn.dense(x)
    return bias


@pytest.mark.parametrize(
    "name, lo, hi",
    [
        ("sa_learned", 0.6, 1.0),
        ("sa_learned_content", 0.4, 0.75),
        ("sa_learned_content_runs", 0.6, 1.0),
    ],
)
def test_reference_init_learned_logits_are_not_uniform(name, lo, hi):
    """Paper configuration, default init: the learned relative logits start with the reference's
    spread (~0.8 position-only, ~0.6 with content), so the most attended key of a 256-key row
    holds several times the uniform 1/256; BERT's init starts exactly uniform (~0.01)."""
    torch.manual_seed(0)
    ref = _position_logits(attnconv.create_model(name))  # hidden 400, 16x16 tokens
    spread = ref.std(-1).mean().item()
    top = torch.softmax(ref, -1).amax(-1).mean().item()
    assert lo < spread < hi and top > 3 / 256
    torch.manual_seed(0)
    bert = _position_logits(attnconv.create_model(name, init="bert"))
    assert bert.std(-1).mean().item() < 0.02
    assert torch.softmax(bert, -1).amax(-1).mean().item() < 1.1 / 256


def test_reference_init_statistics():
    """Linear layers keep PyTorch's default init (uniform, bound 1/sqrt(fan_in)), the learned
    tables nn.Embedding's N(0, 1); with init="bert" Linear is N(0, 0.02) with zero bias."""
    torch.manual_seed(0)
    m = attnconv.create_model("sa_learned")
    fc1 = m.layers[0].fc1.weight
    assert fc1.abs().max().item() <= 1 / math.sqrt(400) + 1e-7
    assert abs(fc1.std().item() - 1 / math.sqrt(3 * 400)) < 2e-3
    table = m.layers[0].attn.positional_encoding.tables.rel_row
    assert abs(table.std().item() - 1.0) < 0.05
    b = attnconv.create_model("sa_learned", init="bert")
    assert abs(b.layers[0].fc1.weight.std().item() - 0.02) < 1e-3
    assert b.layers[0].fc1.bias.abs().max().item() == 0.0
    with pytest.raises(ValueError, match="init must be one of"):
        attnconv.create_model("sa_learned", init="xavier")


def test_alpha_is_never_negative():
    """alpha = s^2 / 2 whatever the raw parameter s (the reference's spread)."""
    enc = QuadraticEncoding(5)
    with torch.no_grad():
        enc.spread.copy_(torch.tensor([-3.0, -1e-3, 0.0, 2.0, -1e4]))
    assert bool((enc.alpha >= 0).all())
    torch.testing.assert_close(enc.alpha, 0.5 * enc.spread.detach() ** 2)
    # a gradient step that would push alpha below zero lands on s < 0, alpha still >= 0
    enc.spread.grad = None
    (enc.alpha.sum()).backward()
    with torch.no_grad():
        enc.spread -= 10.0 * enc.spread.grad
    assert bool((enc.alpha >= 0).all())
    enc.set_alpha(torch.tensor([0.0, 1.0, 2.0, 1e4, 0.5]))
    torch.testing.assert_close(enc.alpha, torch.tensor([0.0, 1.0, 2.0, 1e4, 0.5]))
    with pytest.raises(ValueError, match="alpha must be finite and >= 0"):
        enc.set_alpha(-1.0)


def test_init_matches_the_reference_distribution():
    """s = 1 + N(0, 0.01^2) (alpha ~ 0.5), generalized A = I + N(0, 0.01^2), Sigma^-1 = A A^T."""
    torch.manual_seed(0)
    enc = QuadraticEncoding(4000)
    assert abs(enc.spread.mean().item() - 1.0) < 1e-3
    assert abs(enc.spread.std().item() - 0.01) < 1e-3
    g = GeneralizedQuadraticEncoding(3)
    a = g.spread.detach()
    torch.testing.assert_close(g.precision.detach(), a @ a.transpose(-1, -2))
    assert (a - torch.eye(2)).abs().max().item() < 0.06


def test_old_generalized_checkpoints_still_load():
    """The former factor L with Sigma^-1 = L^T L loads as spread A = L^T (same Sigma^-1)."""
    g = GeneralizedQuadraticEncoding(3)
    L = torch.randn(3, 2, 2)
    g.load_state_dict({"centers": torch.zeros(3, 2), "precision_factor": L})
    torch.testing.assert_close(g.precision.detach(), L.transpose(-1, -2) @ L)


def test_old_checkpoints_with_alpha_still_load():
    enc = QuadraticEncoding(3)
    state = {"centers": torch.zeros(3, 2), "alpha": torch.tensor([0.5, 2.0, 8.0])}
    enc.load_state_dict(state)
    torch.testing.assert_close(enc.alpha.detach(), torch.tensor([0.5, 2.0, 8.0]))
    with pytest.raises(ValueError, match="negative alpha"):
        enc.load_state_dict({"centers": torch.zeros(3, 2), "alpha": torch.tensor([-1.0, 1, 1])})


@pytest.mark.parametrize("name", ["sa_quadratic", "sa_quadratic_generalized"])
def test_centres_and_precisions_are_never_decayed(name):
    """Whatever the config says, centres and spreads / precision factors get no weight decay;
    with decay_1d (the reference) biases and LayerNorms are decayed, else not."""
    m = attnconv.create_model(name, hidden_size=18, num_layers=2, ff_size=8)
    geometry = {n for n in dict(m.named_parameters()) if n.endswith(("centers", "spread"))}
    assert len(geometry) == 4
    for decay_1d in (False, True):
        names = set(no_decay_names(m, [], decay_1d))
        assert geometry <= names
        norms = {n for n in dict(m.named_parameters()) if "norm" in n or n.endswith("bias")}
        assert (norms <= names) is (not decay_1d)
        if decay_1d:
            assert names == geometry
    groups = param_groups(m, 1e-4, [], True)
    assert groups[1]["weight_decay"] == 0.0
    assert {id(p) for p in groups[1]["params"]} == {
        id(p) for n, p in m.named_parameters() if n in geometry
    }


def test_per_epoch_schedule_is_the_reference_staircase():
    """Stepped once per epoch: W = 5% of 300 = 15 warm-up epochs, epoch 0 at lr 0, then cosine."""
    cfg = ScheduleConfig(name="cosine", warmup=0.05, per_epoch=True)
    spe, total = 10, 300 * 10

    def lr(step):
        return lr_at(step, 0.1, cfg, total, spe)

    assert lr(0) == 0.0 and lr(9) == 0.0
    assert lr(10) == pytest.approx(0.1 / 15) and lr(19) == lr(10)
    assert lr(14 * 10) == pytest.approx(0.1 * 14 / 15)
    assert lr(15 * 10) == pytest.approx(0.1)
    assert lr(total - 1) == pytest.approx(0.05 * (1 + math.cos(math.pi * 284 / 285)))


# ------------------------------------------------------------------ reference parameter mapping
def _ref_downsample_concatenate(x: torch.Tensor, k: int) -> torch.Tensor:
    """The reference's space-to-depth on (B, H, W, C), re-derived: a k x k block's values in
    (block row, block column, channel) order -> (B, H/k, W/k, k*k*C)."""
    b, h, w, c = x.shape
    return (
        x.reshape(b, h // k, k, w // k, k, c)
        .permute(0, 1, 3, 2, 4, 5)
        .reshape(b, h // k, w // k, k * k * c)
    )


def _ref_gaussian_probs(centers, spreads, h, w):
    """The reference's GaussianSelfAttention.get_attention_probs, re-derived: logits
    t_h . (d1, d2, d1^2, d2^2, d1 d2), delta = key - query, softmax over keys."""
    if spreads.dim() == 1:
        a = c = spreads**2
        b = torch.zeros_like(spreads)
    else:
        inv = spreads @ spreads.transpose(-1, -2)
        a, b, c = inv[:, 0, 0], inv[:, 0, 1], inv[:, 1, 1]
    mu1, mu2 = centers[:, 0], centers[:, 1]
    t = -0.5 * torch.stack([-2 * (a * mu1 + b * mu2), -2 * (c * mu2 + b * mu1), a, c, 2 * b], -1)
    ii, jj = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    pos = torch.stack([ii, jj], -1).reshape(-1, 2).double()  # (T, 2)
    d = pos[None, :, :] - pos[:, None, :]  # (T, T, 2) key - query
    d1, d2 = d[..., 0], d[..., 1]
    r = torch.stack([d1, d2, d1**2, d2**2, d1 * d2], -1)
    return torch.softmax(torch.einsum("qkd,hd->hqk", r, t.double()), -1)


SMALL_PORT = dict(hidden_size=12, num_layers=2, num_heads=3, ff_size=8, img_size=8)


@pytest.mark.parametrize(
    "name",
    [
        "sa_quadratic",
        "sa_quadratic_generalized",
        "sa_learned",
        "sa_learned_content",
        "sa_learned_content_runs",
    ],
)
def test_reference_mapping_round_trip(name):
    from attnconv.models.reference_port import from_reference, to_reference

    torch.manual_seed(0)
    m = attnconv.create_model(name, **SMALL_PORT)
    ref = to_reference(m)
    assert "features_upscale.weight" in ref and "encoder.layer.1.attention.self.value.weight" in ref
    back = from_reference(ref, m)
    own = m.state_dict()
    assert set(back) == set(own)
    for k in own:
        torch.testing.assert_close(back[k], own[k], rtol=0, atol=0)
    bad = dict(ref, **{"encoder.layer.0.attention.self.foo": torch.zeros(1)})
    with pytest.raises(ValueError, match="no attnconv counterpart"):
        from_reference(bad, m)
    del ref["classifier.weight"]
    with pytest.raises(ValueError, match="missing classifier.weight"):
        from_reference(ref, m)


def test_reference_space_to_depth_order_and_gaussian_parametrization():
    """A model loaded from reference-layout weights computes what the reference's equations do:
    its embedding of the reference's space-to-depth features, its Gaussian probabilities from
    the reference's spreads (isotropic s and full A)."""
    from attnconv.models.reference_port import from_reference, to_reference

    for name in ("sa_quadratic", "sa_quadratic_generalized"):
        torch.manual_seed(1)
        m = attnconv.create_model(name, **SMALL_PORT).double()
        ref = to_reference(m)
        x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
        feats = _ref_downsample_concatenate(x.permute(0, 2, 3, 1), 2)  # (B, 4, 4, 12)
        ref_embed = feats @ ref["features_upscale.weight"].t() + ref["features_upscale.bias"]
        ours = m.embed(torch.nn.functional.pixel_unshuffle(x, 2).permute(0, 2, 3, 1))
        torch.testing.assert_close(ours, ref_embed)
        with torch.no_grad():  # sharpen and move the heads so the check is not trivial
            ref["encoder.layer.0.attention.self.attention_spreads"] *= 1.7
            ref["encoder.layer.0.attention.self.attention_centers"] += 0.6
        m.load_state_dict(from_reference(ref, m))
        probs = m.layers[0].attn.attention_probs(torch.randn(1, 12, 4, 4, dtype=torch.float64))
        expect = _ref_gaussian_probs(
            ref["encoder.layer.0.attention.self.attention_centers"],
            ref["encoder.layer.0.attention.self.attention_spreads"],
            4,
            4,
        )
        torch.testing.assert_close(probs[0], expect)


def test_load_reference_checkpoint_file(tmp_path):
    from attnconv.loading import load_reference_checkpoint
    from attnconv.models.reference_port import to_reference

    torch.manual_seed(0)
    src = attnconv.create_model("sa_quadratic", **SMALL_PORT)
    f = tmp_path / "best.checkpoint"
    state = {f"module.{k}": v for k, v in to_reference(src).items()}
    torch.save({"epoch": 3, "test_accuracy": 0.5, "model_state_dict": state}, f)
    dst = load_reference_checkpoint(attnconv.create_model("sa_quadratic", **SMALL_PORT), str(f))
    x = torch.randn(2, 3, 8, 8)
    torch.testing.assert_close(dst.eval()(x), src.eval()(x))


@pytest.mark.parametrize("name", ["sa_quadratic", "sa_learned", "sa_learned_content"])
def test_paper_configs_train_in_bf16_and_float32_is_one_flag_away(name):
    """The fidelity table's precision row: the paper configs autocast to bfloat16 where the
    reference trains in float32; `--set train.bf16=false` is the float32 recipe, nothing else
    changed."""
    from attnconv.train.config import load_config

    path = RECIPES / f"{name}.yaml"
    bf16, fp32 = load_config(path), load_config(path, ["train.bf16=false"])
    assert bf16.train.bf16 is True and fp32.train.bf16 is False
    a, b = bf16.to_dict(), fp32.to_dict()
    a["train"].pop("bf16"), b["train"].pop("bf16")
    assert a == b
