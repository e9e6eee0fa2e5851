"""The Vaswani encoder-decoder: masks, fast == reference, and an end-to-end sequence task."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from attnconv.models import create_model
from attnconv.models._common import num_params

PAD, BOS, EOS = 0, 1, 2
NSYM, LMIN, LMAX = 10, 3, 8
V = 3 + NSYM


def reverse_batch(B: int, g: torch.Generator):
    """Random strings over 10 symbols, lengths 3..8, padded; target = reversed string + EOS."""
    lengths = torch.randint(LMIN, LMAX + 1, (B,), generator=g)
    src = torch.full((B, LMAX), PAD)
    tgt = torch.full((B, LMAX + 1), PAD)
    for i, n in enumerate(lengths.tolist()):
        s = torch.randint(3, V, (n,), generator=g)
        src[i, :n] = s
        tgt[i, :n] = s.flip(0)
        tgt[i, n] = EOS
    tgt_in = torch.cat([torch.full((B, 1), BOS), tgt[:, :-1]], 1)
    tgt_in = tgt_in.masked_fill(tgt_in == EOS, PAD)  # teacher forcing input: BOS + target
    return src, tgt_in, tgt


def small(**kw):
    cfg = dict(src_vocab_size=V, d_model=32, num_heads=4, d_ff=64, dropout=0.0, max_len=16)
    return create_model("transformer_small", **{**cfg, **kw})


@pytest.mark.slow
def test_reverse_task_greedy_decoding_over_99_percent():
    """Learns to reverse random token strings (variable length, padded) to > 99% token
    accuracy with greedy decoding on fresh strings; ~10-20 s on this 2-core machine."""
    torch.manual_seed(0)
    steps = 400
    m = small(d_model=64, d_ff=128)
    opt = torch.optim.Adam(m.parameters(), lr=3e-3, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / 50, 0.5 * (1 + math.cos(math.pi * s / steps)))
    )
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        src, tgt_in, tgt = reverse_batch(64, g)
        loss = F.cross_entropy(m(src, tgt_in).flatten(0, 1), tgt.flatten(), ignore_index=PAD)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    m.eval()
    src, _, tgt = reverse_batch(500, torch.Generator().manual_seed(99))
    out = m.greedy_decode(src, LMAX + 1)
    out = F.pad(out, (0, LMAX + 1 - out.shape[1]), value=PAD)
    keep = tgt != PAD  # the reversed tokens and the EOS
    token_acc = (out == tgt)[keep].float().mean().item()
    assert token_acc > 0.99, token_acc
    # greedy output ends with EOS then padding
    assert torch.all(out[keep.logical_not()] == PAD)


def test_parameter_counts():
    with torch.device("meta"):
        base = create_model("transformer_base")
    # 6+6 layers, d_model 512, d_ff 2048, shared 37000 vocab; Vaswani Table 3 says 65M
    assert num_params(base) == 63_082_496
    assert abs(num_params(base) / 65e6 - 1) < 0.03
    assert base.out.weight is base.src_embed.weight is base.tgt_embed.weight


def test_fast_equals_reference_values_and_gradients():
    torch.manual_seed(1)
    fast, ref = small(), small(backend="reference")
    ref.load_state_dict(fast.state_dict())
    src, tgt_in, tgt = reverse_batch(4, torch.Generator().manual_seed(2))
    grads = []
    for m in (fast, ref):
        logits = m(src, tgt_in)
        F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=PAD).backward()
        grads.append((logits.detach(), [p.grad.clone() for p in m.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-4, atol=1e-5)
    for a, b in zip(grads[0][1], grads[1][1]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_decoder_is_causal_and_padding_is_ignored():
    torch.manual_seed(3)
    m = small().eval()
    src, tgt_in, _ = reverse_batch(3, torch.Generator().manual_seed(4))
    logits = m(src, tgt_in)
    later = tgt_in.clone()
    later[:, 5:] = 7  # change future target tokens
    torch.testing.assert_close(m(src, later)[:, :5], logits[:, :5])
    # extra source padding changes nothing
    padded = F.pad(src, (0, 4), value=PAD)
    torch.testing.assert_close(m(padded, tgt_in), logits, rtol=1e-5, atol=1e-5)


def test_attention_maps_and_greedy_consistency():
    torch.manual_seed(5)
    m = small(num_encoder_layers=2, num_decoder_layers=3).eval()
    src, tgt_in, _ = reverse_batch(2, torch.Generator().manual_seed(6))
    logits, attn = m(src, tgt_in, return_attention=True)
    torch.testing.assert_close(logits, m(src, tgt_in), rtol=1e-5, atol=1e-5)
    assert [a.shape for a in attn["encoder"]] == [(2, 4, LMAX, LMAX)] * 2
    assert [a.shape for a in attn["decoder_self"]] == [(2, 4, LMAX + 1, LMAX + 1)] * 3
    assert [a.shape for a in attn["decoder_cross"]] == [(2, 4, LMAX + 1, LMAX)] * 3
    src_pad = src == PAD
    for a in attn["encoder"] + attn["decoder_cross"]:
        assert torch.all(a.masked_select(src_pad[:, None, None, :].expand_as(a)) == 0)
    upper = torch.ones(LMAX + 1, LMAX + 1, dtype=torch.bool).triu(1)
    for a in attn["decoder_self"]:
        assert torch.all(a[..., upper] == 0)
    # greedy decoding = argmax of the teacher-forced logits on its own output
    out = m.greedy_decode(src, 5)
    ys = torch.cat([torch.full((2, 1), BOS), out[:, :-1]], 1)
    assert out.shape[1] <= 5
    pred = m(src, ys).argmax(-1)
    alive = torch.cat(
        [torch.ones(2, 1, dtype=torch.bool), (out[:, :-1] != EOS).cumprod(1).bool()], 1
    )
    assert torch.equal(pred[alive], out[alive])


def test_bad_input():
    m = small()
    with pytest.raises(ValueError, match=r"src must be a \(B, T\) int64"):
        m(torch.randn(2, 5), torch.ones(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match=r"ids outside \[0, 13\)"):
        m(torch.full((1, 3), 13), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds max_len 16"):
        m(torch.ones(1, 17, dtype=torch.long), torch.ones(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="divisible by num_heads"):
        small(d_model=30)
    with pytest.raises(ValueError, match="unknown option"):
        create_model("transformer_small", vocab=5)
