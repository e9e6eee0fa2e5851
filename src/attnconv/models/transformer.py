"""The Transformer of Vaswani et al., "Attention Is All You Need" (NeurIPS 2017).

Encoder-decoder (sec. 3.1, fig. 1): each sub-layer is LayerNorm(x + Dropout(Sublayer(x)))
(post-LN); the encoder has self-attention + feed-forward, the decoder masked (causal)
self-attention, cross-attention on the encoder output, feed-forward. Embeddings are scaled by
sqrt(d_model) and summed with the sinusoidal positions (sec. 3.4-3.5); with a shared vocabulary
the two embeddings and the pre-softmax linear share one matrix (sec. 3.4).
All attention is ``attnconv.MultiHeadAttention`` (the library's one kernel).

Token ids: ``pad_id`` (masked out of every attention as a key), ``bos_id`` starts decoding,
``eos_id`` ends it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from ..layers.feedforward import FeedForward
from ..layers.mha import MultiHeadAttention, SinusoidalPositionalEncoding
from ._common import build_config
from .registry import register_model

__all__ = ["TransformerConfig", "Transformer", "transformer_base", "transformer_small"]


@dataclass
class TransformerConfig:
    src_vocab_size: int = 37000  # the paper's shared BPE vocabulary (WMT14 en-de)
    tgt_vocab_size: int | None = None  # None: same vocabulary as the source
    d_model: int = 512
    num_heads: int = 8
    num_encoder_layers: int = 6
    num_decoder_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    max_len: int = 1024
    share_embeddings: bool = True  # tie src/tgt embeddings and output (only if vocab shared)
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    backend: str | None = None  # the attention's (functional.SEQUENCE_TABLE; None: its choice)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(
            cfg.d_model, cfg.num_heads, dropout=cfg.dropout, backend=cfg.backend
        )
        self.ff = FeedForward(cfg.d_model, cfg.d_ff, cfg.dropout)
        self.norm1 = nn.LayerNorm(cfg.d_model)
        self.norm2 = nn.LayerNorm(cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x, src_pad, return_attention=False):
        a = self.self_attn(x, key_padding_mask=src_pad, return_attention=return_attention)
        a, attn = a if return_attention else (a, None)
        x = self.norm1(x + self.drop(a))  # (B, Ts, d)
        x = self.norm2(x + self.drop(self.ff(x)))
        return x, attn


class DecoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        d, h = cfg.d_model, cfg.num_heads
        self.self_attn = MultiHeadAttention(d, h, dropout=cfg.dropout, backend=cfg.backend)
        self.cross_attn = MultiHeadAttention(d, h, dropout=cfg.dropout, backend=cfg.backend)
        self.ff = FeedForward(d, cfg.d_ff, cfg.dropout)
        self.norm1 = nn.LayerNorm(d)
        self.norm2 = nn.LayerNorm(d)
        self.norm3 = nn.LayerNorm(d)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, y, memory, tgt_pad, src_pad, return_attention=False):
        ra = return_attention
        a = self.self_attn(y, key_padding_mask=tgt_pad, causal=True, return_attention=ra)
        a, self_attn = a if ra else (a, None)
        y = self.norm1(y + self.drop(a))  # (B, Tt, d), masked self-attention
        c = self.cross_attn(y, memory, key_padding_mask=src_pad, return_attention=ra)
        c, cross_attn = c if ra else (c, None)
        y = self.norm2(y + self.drop(c))  # queries from the decoder, keys/values from encoder
        y = self.norm3(y + self.drop(self.ff(y)))
        return y, self_attn, cross_attn


class Transformer(nn.Module):
    """Encoder-decoder Transformer over token ids (B, T).

    ``forward(src, tgt_in, return_attention=False)`` -> logits (B, Tt, tgt_vocab); with
    ``return_attention=True`` also a dict of lists (one per layer) of (B, h, Tq, Tk)
    probabilities: "encoder", "decoder_self", "decoder_cross".
    ``greedy_decode(src, max_len)`` -> (B, <= max_len) generated ids (after BOS; pad after EOS).
    """

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        if cfg.d_model % cfg.num_heads != 0:
            raise ValueError(
                f"d_model ({cfg.d_model}) must be divisible by num_heads ({cfg.num_heads})"
            )
        tgt_vocab = cfg.src_vocab_size if cfg.tgt_vocab_size is None else cfg.tgt_vocab_size
        ids = {"pad_id": cfg.pad_id, "bos_id": cfg.bos_id, "eos_id": cfg.eos_id}
        if any(i < 0 for i in ids.values()) or cfg.pad_id in (cfg.bos_id, cfg.eos_id):
            raise ValueError(f"special ids must be >= 0 and pad_id not bos_id or eos_id, got {ids}")
        for name, v in (("src_vocab_size", cfg.src_vocab_size), ("tgt_vocab_size", tgt_vocab)):
            if v <= max(cfg.pad_id, cfg.bos_id, cfg.eos_id):
                raise ValueError(f"{name} {v} must exceed the special ids pad/bos/eos")
        self.cfg = cfg
        self.tgt_vocab_size = tgt_vocab
        self.src_embed = nn.Embedding(cfg.src_vocab_size, cfg.d_model)
        shared = cfg.share_embeddings and tgt_vocab == cfg.src_vocab_size
        self.tgt_embed = self.src_embed if shared else nn.Embedding(tgt_vocab, cfg.d_model)
        self.pos = SinusoidalPositionalEncoding(cfg.d_model, max_len=cfg.max_len)
        self.drop = nn.Dropout(cfg.dropout)
        self.encoder = nn.ModuleList([EncoderLayer(cfg) for _ in range(cfg.num_encoder_layers)])
        self.decoder = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg.num_decoder_layers)])
        self.out = nn.Linear(cfg.d_model, tgt_vocab, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)
        nn.init.normal_(self.src_embed.weight, std=cfg.d_model**-0.5)
        if self.tgt_embed is not self.src_embed:
            nn.init.normal_(self.tgt_embed.weight, std=cfg.d_model**-0.5)
        if cfg.share_embeddings:
            self.out.weight = self.tgt_embed.weight  # pre-softmax linear = embedding (sec. 3.4)

    def _check_ids(self, ids: torch.Tensor, name: str, vocab: int) -> None:
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.long:
            got = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise ValueError(f"{name} must be a (B, T) int64 tensor of token ids, got {got}")
        if ids.shape[1] > self.cfg.max_len:
            raise ValueError(f"{name} length {ids.shape[1]} exceeds max_len {self.cfg.max_len}")
        if torch.compiler.is_compiling():  # a branch on the ids' values would break the graph
            ok = ((ids >= 0) & (ids < vocab)).all()  # the same check, in it (a RuntimeError)
            torch._assert_async(ok, f"{name} has ids outside [0, {vocab})")
        elif ids.numel() and (ids.min() < 0 or ids.max() >= vocab):
            raise ValueError(f"{name} has ids outside [0, {vocab})")

    def _embed(self, ids: torch.Tensor, table: nn.Embedding) -> torch.Tensor:
        x = table(ids) * math.sqrt(self.cfg.d_model)  # (B, T, d)
        return self.drop(self.pos(x))

    def encode(self, src: torch.Tensor, return_attention: bool = False):
        """src (B, Ts) -> memory (B, Ts, d), src padding mask (B, Ts) [, attention list]."""
        self._check_ids(src, "src", self.cfg.src_vocab_size)
        src_pad = src == self.cfg.pad_id
        x, attns = self._embed(src, self.src_embed), []
        for layer in self.encoder:
            x, a = layer(x, src_pad, return_attention)
            attns.append(a)
        return (x, src_pad, attns) if return_attention else (x, src_pad)

    def decode(self, tgt_in, memory, src_pad, return_attention: bool = False):
        """tgt_in (B, Tt) (BOS first) -> logits (B, Tt, tgt_vocab) [, self, cross lists]."""
        self._check_ids(tgt_in, "tgt", self.tgt_vocab_size)
        tgt_pad = tgt_in == self.cfg.pad_id
        y, selfs, crosses = self._embed(tgt_in, self.tgt_embed), [], []
        for layer in self.decoder:
            y, s, c = layer(y, memory, tgt_pad, src_pad, return_attention)
            selfs.append(s)
            crosses.append(c)
        logits = self.out(y)
        return (logits, selfs, crosses) if return_attention else logits

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor, return_attention: bool = False):
        if return_attention:
            memory, src_pad, enc = self.encode(src, return_attention=True)
            logits, selfs, crosses = self.decode(tgt_in, memory, src_pad, return_attention=True)
            return logits, {"encoder": enc, "decoder_self": selfs, "decoder_cross": crosses}
        memory, src_pad = self.encode(src)
        return self.decode(tgt_in, memory, src_pad)

    @torch.no_grad()
    def greedy_decode(self, src: torch.Tensor, max_len: int) -> torch.Tensor:
        """Argmax decoding from BOS for up to max_len tokens (at most the model's ``max_len``:
        BOS and max_len - 1 tokens are the last step's input); stops when every row has EOS."""
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
            raise ValueError(f"max_len must be an int >= 1, got {max_len!r}")
        if max_len > self.cfg.max_len:
            raise ValueError(f"max_len {max_len} exceeds the model's max_len {self.cfg.max_len}")
        memory, src_pad = self.encode(src)
        B = src.shape[0]
        ys = torch.full((B, 1), self.cfg.bos_id, dtype=torch.long, device=src.device)
        done = torch.zeros(B, dtype=torch.bool, device=src.device)
        for _ in range(max_len):
            nxt = self.decode(ys, memory, src_pad)[:, -1].argmax(-1)  # (B,)
            nxt = nxt.masked_fill(done, self.cfg.pad_id)
            ys = torch.cat([ys, nxt[:, None]], dim=1)
            done |= nxt == self.cfg.eos_id
            if done.all():
                break
        return ys[:, 1:]


def _transformer(name: str, defaults: dict, overrides: dict) -> Transformer:
    return Transformer(build_config(TransformerConfig, name, defaults, overrides))


@register_model
def transformer_base(**overrides) -> Transformer:
    """Transformer base (Vaswani Table 3): d_model 512, 8 heads, 6+6 layers, d_ff 2048,
    dropout 0.1, shared 37000-token vocabulary: 63.1M parameters (the paper rounds to 65M)."""
    return _transformer("transformer_base", {}, overrides)


@register_model
def transformer_small(**overrides) -> Transformer:
    """A CPU-sized Transformer: d_model 128, 4 heads, 2+2 layers, d_ff 256, vocabulary 1000."""
    defaults = dict(
        src_vocab_size=1000,
        d_model=128,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        d_ff=256,
        max_len=512,
    )
    return _transformer("transformer_small", defaults, overrides)
