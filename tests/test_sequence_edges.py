"""The sequence side's bad input, each one line before any work: greedy decoding past the
model's length (it failed after decoding, and only for some sources), special ids that break
the masks, the sinusoidal encoding's sizes and integer input (it truncated the table), an
attention scale that is not a finite number (the two paths disagreed on NaN)."""

from __future__ import annotations

import math

import pytest
import torch

from attnconv.layers.functional import attention_probs, scaled_dot_product_attention
from attnconv.layers.mha import MultiHeadAttention, SinusoidalPositionalEncoding
from attnconv.models import create_model

TINY = dict(
    src_vocab_size=12, d_model=16, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
    d_ff=32, max_len=5,
)  # fmt: skip


def test_greedy_decode_past_the_models_length_is_refused_before_decoding():
    torch.manual_seed(0)
    m = create_model("transformer_small", **TINY).eval()
    src = torch.tensor([[5, 7, 2]])
    for bad, match in [(6, "exceeds the model's max_len 5"), (2.0, "int >= 1"), (0, ">= 1")]:
        with pytest.raises(ValueError, match=match):
            m.greedy_decode(src, bad)
    assert m.greedy_decode(src, 5).shape[1] <= 5  # the longest a model of max_len 5 decodes


@pytest.mark.parametrize("ids", [{"bos_id": 0}, {"eos_id": 0}, {"bos_id": -1}])
def test_special_ids_that_break_the_masks_are_refused(ids):
    """bos_id == pad_id masked BOS as a key everywhere (its query's row summed to 0)."""
    with pytest.raises(ValueError, match="special ids"):
        create_model("transformer_small", **TINY, **ids)


def test_sinusoidal_encoding_sizes_and_input():
    pe = SinusoidalPositionalEncoding(8, max_len=16)
    with pytest.raises(TypeError, match="floating-point"):
        pe(torch.ones(1, 3, 8, dtype=torch.long))  # the table was cut to integers
    for bad in (-1, 2.0, True):
        with pytest.raises(ValueError, match="int >= 0"):
            pe.encoding(bad)  # -1 returned max_len - 1 rows
    assert pe.encoding(0).shape == (0, 8) and pe.encoding(16).shape == (16, 8)
    for kw in ({"max_len": -1}, {"max_len": 0}, {"base": float("nan")}):
        with pytest.raises(ValueError):
            SinusoidalPositionalEncoding(8, **kw)
    with pytest.raises((TypeError, ValueError)):
        SinusoidalPositionalEncoding("8")


@pytest.mark.parametrize("backend", [None, "reference"])
@pytest.mark.parametrize("scale", [float("nan"), math.inf, "0.5", True])
def test_attention_scale_must_be_a_finite_number(backend, scale):
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="scale must be a finite number or None"):
        scaled_dot_product_attention(q, q, q, scale=scale, backend=backend)
    with pytest.raises(ValueError, match="scale must be a finite number or None"):
        attention_probs(q, q, scale=scale)  # the plain path's probabilities: the same check
    y = scaled_dot_product_attention(q, q, q, scale=0.5, backend=backend)
    ref = torch.softmax(q @ q.transpose(-1, -2) * 0.5, -1) @ q
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-6)


def test_causal_rule_is_end_aligned_as_documented():
    """MultiHeadAttention's docstring said "query i attends keys j <= i"; the mask is aligned
    to the end (j <= i + Tk - Tq), as the docstrings now say."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2).eval()
    q, kv = torch.randn(1, 2, 8), torch.randn(1, 4, 8)
    _, attn = mha(q, kv, causal=True, return_attention=True)
    allowed = attn[0, 0] > 0
    assert allowed.tolist() == [[True, True, True, False], [True, True, True, True]]
