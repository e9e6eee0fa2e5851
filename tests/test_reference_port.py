"""The port between the paper models and the reference code's ``BertImage``, both directions:
against the reference's state-dict layout re-stated below (names, shapes, buffers) and its
forward re-stated in bench/reference_algo.py, logits equal in float64 with dropout off."""

from __future__ import annotations

import pytest
import torch

import attnconv
from attnconv.bench.reference_algo import ReferenceBertImage, check_equal
from attnconv.models._common import num_params
from attnconv.models.reference_port import from_reference, reference_model, to_reference

SMALL = dict(hidden_size=12, num_layers=2, num_heads=3, ff_size=8)
NAMES = ["sa_quadratic", "sa_learned", "sa_learned_content", "sa_learned_content_runs"]
ALL = ["sa_quadratic", "sa_quadratic_generalized", *NAMES[1:]]
PAPER = dict(D=400, nh=9, ff=512, layers=6, m=16)  # runs/learned/run.sh, train.py defaults


def reference_layout(
    name: str, D: int, nh: int, ff: int, layers: int, m: int, classes: int = 10, cin: int = 12
) -> dict[str, tuple[int, ...]]:
    """name -> shape of a reference checkpoint's state dict (train.py's store_checkpoint: the
    model's state dict less ``self.R``), read from epfml/attention-cnn at 9ffaa30:
    models/transformer.py (BertImage: features_upscale, encoder, classifier, the attention_mask
    buffer) and models/bert.py (BertLayer; GaussianSelfAttention; Learned2DRelativeSelfAttention:
    tables (2m-1, P), P = hidden_size as position_encoding_size = -1, head_keys_row/col
    Linear(P, Nh, bias=False), with use_attention_data query/key Linear(D, Nh*D), value
    Linear(Nh*D, D), the persistent relative_indices (m, m)). sa_learned_content is the later
    upstream layer (query_positional_score): P = hidden_size // 2 and no head keys."""
    out = {
        "features_upscale.weight": (D, cin),
        "features_upscale.bias": (D,),
        "classifier.weight": (classes, D),
        "classifier.bias": (classes,),
        "attention_mask": (),
    }
    for i in range(layers):
        s, p = f"encoder.layer.{i}.attention.self.", f"encoder.layer.{i}."
        if name.startswith("sa_quadratic"):
            out[s + "attention_centers"] = (nh, 2)
            out[s + "attention_spreads"] = (nh, 2, 2) if name.endswith("generalized") else (nh,)
        else:
            P = D // 2 if name == "sa_learned_content" else D
            out[s + "row_embeddings.weight"] = out[s + "col_embeddings.weight"] = (2 * m - 1, P)
            out[s + "relative_indices"] = (m, m)
            if name != "sa_learned_content":
                out[s + "head_keys_row.weight"] = out[s + "head_keys_col.weight"] = (nh, P)
            if name != "sa_learned":
                for t in ("query", "key"):
                    out[s + t + ".weight"], out[s + t + ".bias"] = (nh * D, D), (nh * D,)
        out[s + "value.weight"], out[s + "value.bias"] = (D, nh * D), (D,)
        for n, shape in (
            ("attention.output.dense", (D, D)),
            ("intermediate.dense", (ff, D)),
            ("output.dense", (D, ff)),
        ):
            out[p + n + ".weight"], out[p + n + ".bias"] = shape, shape[:1]
        for n in ("attention.output.LayerNorm", "output.LayerNorm"):
            out[p + n + ".weight"] = out[p + n + ".bias"] = (D,)
    return out


def _shapes(state: dict) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in state.items()}


@pytest.mark.parametrize("name", ALL)
def test_to_reference_writes_the_reference_layout(name):
    """Names, shapes and buffers of a reference checkpoint, small and at the paper's size, where
    the reference's parameters number ours: sa_learned_content 29.48M (Table 1's 29.5M),
    sa_learned_content_runs 29.60M."""
    torch.manual_seed(0)
    m = attnconv.create_model(name, **SMALL)
    assert _shapes(to_reference(m)) == reference_layout(name, 12, 3, 8, 2, 16)
    with torch.device("meta"):
        big = attnconv.create_model(name)
    want = reference_layout(name, **PAPER)
    assert _shapes(to_reference(big)) == want
    buffers = ("attention_mask", "relative_indices")
    n_ref = sum(torch.Size(s).numel() for k, s in want.items() if not k.endswith(buffers))
    assert n_ref == num_params(big)
    exact = {"sa_learned_content": 29_484_282, "sa_learned_content_runs": 29_601_882}
    assert num_params(big) == exact.get(name, num_params(big))
    assert reference_model(to_reference(m)) == name


def test_reference_buffers_hold_the_reference_values():
    """relative_indices[i, k] = k - i + m - 1 (int64), attention_mask = 1 (BertImage)."""
    state = to_reference(attnconv.create_model("sa_learned_content_runs", **SMALL))
    idx = state["encoder.layer.1.attention.self.relative_indices"]
    r = torch.arange(16)
    assert idx.dtype == torch.int64 and torch.equal(idx, r[None, :] - r[:, None] + 15)
    assert state["attention_mask"].item() == 1.0


TOL = {torch.float64: 1e-12, torch.float32: 1e-5}  # relative max difference of the logits


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("name", NAMES)
def test_ours_to_reference_computes_the_same_logits(name, dtype):
    torch.manual_seed(0)
    m = attnconv.create_model(name, **SMALL).to(dtype)
    ref = ReferenceBertImage(m)
    assert _shapes(ref.state_dict()) == reference_layout(name, 12, 3, 8, 2, 16)
    assert check_equal(m, ref, batch=3, tol=TOL[dtype]) < TOL[dtype]


@pytest.mark.parametrize("dtype", list(TOL))
@pytest.mark.parametrize("name", NAMES)
def test_reference_to_ours_computes_the_same_logits(name, dtype):
    """A reference state dict (its own parameters, its attention_mask and relative_indices
    buffers) loads into our model, which then computes the reference's logits."""
    torch.manual_seed(0)
    m = attnconv.create_model(name, **SMALL).to(dtype)
    ref = ReferenceBertImage(m).eval()
    with torch.no_grad():  # parameters of its own, not ours
        for p in ref.parameters():
            p.add_(0.3 * torch.randn_like(p))
    state = ref.state_dict()
    assert _shapes(state) == reference_layout(name, 12, 3, 8, 2, 16)
    dst = attnconv.create_model(name, **SMALL).to(dtype).eval()
    dst.load_state_dict(from_reference(state, dst))
    x = torch.randn(2, 3, 32, 32, dtype=dtype)
    with torch.no_grad():
        a, r = dst(x), ref(x)
    assert ((a - r).abs().max() / r.abs().max()).item() <= TOL[dtype]


@pytest.mark.parametrize("name", ["sa_learned", "sa_learned_content_runs"])
def test_head_key_tables_swap_axes(name):
    """The reference's head-key scores broadcast row_scores along the image columns (models/
    bert.py at 9ffaa30: view(1, W, 1, W, Nh)): its row tables and keys are our column ones."""
    torch.manual_seed(0)
    m = attnconv.create_model(name, **SMALL)
    enc = m.layers[0].attn.positional_encoding
    ref = to_reference(m)
    p = "encoder.layer.0.attention.self."
    assert torch.equal(ref[p + "row_embeddings.weight"], enc.tables.rel_col)
    assert torch.equal(ref[p + "col_embeddings.weight"], enc.tables.rel_row)
    assert torch.equal(ref[p + "head_keys_row.weight"], enc.head_keys_col.weight)
    c = attnconv.create_model("sa_learned_content", **SMALL)  # the query reads: no swap
    assert torch.equal(
        to_reference(c)[p + "row_embeddings.weight"],
        c.layers[0].attn.positional_encoding.tables.rel_row,
    )


def test_content_checkpoints_load_only_into_their_own_model():
    """The two content layers do not port into each other (head keys, table widths); the error
    names the model the checkpoint holds."""
    runs = to_reference(attnconv.create_model("sa_learned_content_runs", **SMALL))
    with pytest.raises(ValueError, match="no attnconv counterpart.*sa_learned_content_runs"):
        from_reference(runs, attnconv.create_model("sa_learned_content", **SMALL))
    later = to_reference(attnconv.create_model("sa_learned_content", **SMALL))
    with pytest.raises(ValueError, match=r"\(31, 6\).*it holds a sa_learned_content model"):
        from_reference(later, attnconv.create_model("sa_learned_content_runs", **SMALL))


class _NotTensors:  # a pickled object: only full unpickling (which can run code) would read it
    pass


def test_reference_checkpoint_file_errors_are_one_line(tmp_path):
    """``attnconv.loading.load_reference_checkpoint`` never unpickles code and says what is wrong
    with a file in one line naming it: an object in the pickle, a truncated file, another
    model's checkpoint."""
    from attnconv.loading import WeightsError, load_reference_checkpoint

    model = attnconv.create_model("sa_quadratic", **SMALL)
    state = to_reference(model)
    other = to_reference(attnconv.create_model("sa_learned", **SMALL))
    cases = {
        "pickle": ({"model_state_dict": state, "args": _NotTensors()}, "refused"),
        "other": ({"model_state_dict": other}, "no attnconv counterpart.*sa_learned model"),
    }
    for name, (obj, match) in cases.items():
        torch.save(obj, tmp_path / name)
        with pytest.raises(WeightsError, match=match) as e:
            load_reference_checkpoint(model, tmp_path / name)
        assert str(tmp_path / name) in str(e.value) and "\n" not in str(e.value)
    torch.save({"model_state_dict": state}, tmp_path / "whole")
    (tmp_path / "cut").write_bytes((tmp_path / "whole").read_bytes()[:300])
    with pytest.raises(WeightsError, match="truncated or corrupt") as e:
        load_reference_checkpoint(model, tmp_path / "cut")
    assert "\n" not in str(e.value)
    assert load_reference_checkpoint(model, tmp_path / "whole") is model
