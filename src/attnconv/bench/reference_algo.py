"""The reference code's algorithm, re-stated: epfml/attention-cnn's ``BertImage`` (models/bert.py)
as a user runs it on a CPU, the anchor of ``attnconv bench --suite models``.

Read from the reference, kept in its own order and layout (NHWC tokens, reference names):

- ``downsample_concatenate``: 2x2 space-to-depth by views and permutes, ``features_upscale``;
- per layer, ``BertSelfAttention`` replaced by the image attention:
  - ``GaussianSelfAttention`` (sa_quadratic): scores = einsum('ijkld,hd->ijhkl', R, u) with
    R = (d1, d2, d1^2, d2^2, d1 d2) of delta = key - query and u the heads' target vectors,
    softmax over the H*W keys, ONE dropout mask on the (H, W, Nh, H, W) probabilities (no
    batch dimension), einsum('ijhkl,bkld->bijhd') over the raw D-d input of every head;
  - ``Learned2DRelativeSelfAttention`` position only (sa_learned): row_scores from
    ``row_embeddings`` + ``head_keys_row`` broadcast as (1, W, 1, W, Nh) -- along the image
    *columns* -- plus col_scores as (H, 1, H, 1, Nh) along the rows, no 1/sqrt(d) scaling, one
    mask per step as the Gaussian layer (the paper-run commit's layer);
  - the same class with ``use_attention_data`` and ``query_positional_score`` (sa_learned_content,
    the later upstream layer): q = query(X) (B, H, W, Nh, D), q[:D/2] . row_embeddings along the
    rows, q[D/2:] . col_embeddings along the columns, plus q.k, all / sqrt(D), a mask per image;
  - the same class with ``use_attention_data`` at the paper-run commit 9ffaa30
    (sa_learned_content_runs): the position-only layer's head-key scores (1, H, W, Nh, H, W),
    unscaled, plus einsum('bijhd,bklhd->bijhkl', q, k) / sqrt(D), q and k D wide per head, a
    mask per image;
  - ``value``: Linear(Nh*D, D) on the (B, H, W, Nh*D) head outputs;
- ``BertSelfOutput`` / ``BertIntermediate`` / ``BertOutput``: dense, dropout, the reference's own
  ``BertLayerNorm`` ((x - u) / sqrt(s + eps), apex absent on a CPU) and its erf ``gelu``;
- mean pooling over pixels, ``classifier``.

One simplification, in the reference's favour: the Gaussian layer's R buffer is built at the
model's grid (H, W, H, W, 5) instead of the reference's (50, 50, 50, 50, 5) (125 MB a layer), the
same values where it is read. Parameters come from ``reference_port.to_reference(model)``, so the
module computes our model's function; ``check_equal`` proves it before anything is timed.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from ..layers.encodings.gaussian import QuadraticEncoding
from ..layers.encodings.relative import LearnedRelativeEncoding
from ..models.reference_port import to_reference
from ..models.sa_cifar import SelfAttentionCifar

KINDS = ("gaussian", "learned", "learned_content", "learned_content_runs")


def kind_of(model: SelfAttentionCifar) -> str:
    """Which reference attention class computes ``model``'s attention."""
    cfg, enc = model.cfg, model.layers[0].attn.positional_encoding
    if type(enc) is QuadraticEncoding and not cfg.content:
        return "gaussian"
    if isinstance(enc, LearnedRelativeEncoding):
        if not cfg.content:
            return "learned"
        return "learned_content" if enc.query_reads else "learned_content_runs"
    raise ValueError(f"no reference re-statement for positional={cfg.positional!r}")


class BertLayerNorm(nn.Module):
    """The reference's TF-style LayerNorm (epsilon inside the square root)."""

    def __init__(self, d: int, eps: float):
        super().__init__()
        self.weight, self.bias = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))
        self.variance_epsilon = eps

    def forward(self, x):
        u = x.mean(-1, keepdim=True)
        s = (x - u).pow(2).mean(-1, keepdim=True)
        x = (x - u) / torch.sqrt(s + self.variance_epsilon)
        return self.weight * x + self.bias


def gelu(x):
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


def _rel_indices(m: int) -> torch.Tensor:
    """relative_indices[i, k] = k - i + m - 1 (the reference's buffer)."""
    return torch.arange(m).view(1, -1) - torch.arange(m).view(-1, 1) + m - 1


class ImageSelfAttention(nn.Module):
    """The reference's Gaussian / Learned2DRelative self-attention (see the module docstring)."""

    def __init__(
        self, kind: str, d: int, nh: int, p_drop: float, grid: int, max_pos: int, emb_dim: int
    ):
        super().__init__()
        self.kind, self.d, self.nh, self.grid = kind, d, nh, grid
        self.dropout = nn.Dropout(p_drop)
        self.value = nn.Linear(nh * d, d)
        if kind == "gaussian":
            self.attention_centers = nn.Parameter(torch.zeros(nh, 2))
            self.attention_spreads = nn.Parameter(torch.ones(nh))
            r = torch.arange(grid)
            g = torch.stack(torch.meshgrid(r, r, indexing="ij"), -1)  # (H, W, 2)
            rel = g[None, None] - g[:, :, None, None]  # (H, W, H, W, 2): key - query
            R = torch.cat([rel, rel**2, (rel[..., 0] * rel[..., 1])[..., None]], -1).float()
            self.register_buffer("R", R, persistent=False)
            return
        self.row_embeddings = nn.Embedding(2 * max_pos - 1, emb_dim)
        self.col_embeddings = nn.Embedding(2 * max_pos - 1, emb_dim)
        self.register_buffer("relative_indices", _rel_indices(max_pos))  # in its checkpoints
        if kind in ("learned", "learned_content_runs"):
            self.head_keys_row = nn.Linear(emb_dim, nh, bias=False)
            self.head_keys_col = nn.Linear(emb_dim, nh, bias=False)
        if kind != "learned":
            self.query = nn.Linear(d, nh * d)
            self.key = nn.Linear(d, nh * d)

    def gaussian_scores(self, h: int, w: int) -> torch.Tensor:
        a = c = self.attention_spreads**2  # isotropic: Sigma^-1 = s^2 I
        b = torch.zeros_like(self.attention_spreads)
        mu1, mu2 = self.attention_centers[:, 0], self.attention_centers[:, 1]
        u = (
            -1
            / 2
            * torch.stack([-2 * (a * mu1 + b * mu2), -2 * (c * mu2 + b * mu1), a, c, 2 * b], dim=-1)
        )
        return torch.einsum("ijkld,hd->ijhkl", self.R[:h, :w, :h, :w, :], u)  # (H, W, Nh, H, W)

    def learned_scores(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, _ = x.shape
        row_emb = self.row_embeddings(self.relative_indices[:w, :w].reshape(-1))
        col_emb = self.col_embeddings(self.relative_indices[:h, :h].reshape(-1))
        d = self.d
        if self.kind != "learned_content":  # head keys, no scaling; rows of the table on columns
            row = self.head_keys_row(row_emb).view(1, w, 1, w, self.nh)
            col = self.head_keys_col(col_emb).view(h, 1, h, 1, self.nh)
            pos = (row + col).permute(0, 1, 4, 2, 3).unsqueeze(0)  # (1, H, W, Nh, H, W)
            if self.kind == "learned":
                return pos
            q = self.query(x).view(b, h, w, self.nh, d)
            k = self.key(x).view(b, h, w, self.nh, d)
            return pos + torch.einsum("bijhd,bklhd->bijhkl", q, k) / math.sqrt(d)
        q = self.query(x).view(b, h, w, self.nh, d)
        k = self.key(x).view(b, h, w, self.nh, d)
        row = torch.einsum("bijhd,ikd->bijhk", q[..., : d // 2], row_emb.view(w, w, -1))
        col = torch.einsum("bijhd,jld->bijhl", q[..., d // 2 :], col_emb.view(h, h, -1))
        scores = (row.unsqueeze(-1) + col.unsqueeze(-2)) / math.sqrt(d)
        return scores + torch.einsum("bijhd,bklhd->bijhkl", q, k) / math.sqrt(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, h, w, _ = x.shape
        if self.kind == "gaussian":
            probs = torch.softmax(self.gaussian_scores(h, w).view(h, w, self.nh, -1), -1)
            probs = self.dropout(probs.view(h, w, self.nh, h, w))
            v = torch.einsum("ijhkl,bkld->bijhd", probs, x)
        elif self.kind == "learned":
            s = self.learned_scores(x)[0]
            probs = self.dropout(torch.softmax(s.reshape(h, w, self.nh, -1), -1).view(s.shape))
            v = torch.einsum("ijhkl,bkld->bijhd", probs, x)
        else:
            s = self.learned_scores(x)
            probs = self.dropout(torch.softmax(s.view(*s.shape[:-2], -1), -1).view(s.shape))
            v = torch.einsum("bijhkl,bkld->bijhd", probs, x)
        return self.value(v.contiguous().view(b, h, w, -1))


class ReferenceLayer(nn.Module):
    def __init__(self, kind, cfg, grid, max_pos, emb_dim):
        super().__init__()
        d, eps = cfg.hidden_size, cfg.layer_norm_eps
        self.attention = nn.Module()
        self.attention.self = ImageSelfAttention(
            kind, d, cfg.num_heads, cfg.attn_dropout, grid, max_pos, emb_dim
        )
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(d, d)
        self.attention.output.LayerNorm = BertLayerNorm(d, eps)
        self.intermediate = nn.Module()
        self.intermediate.dense = nn.Linear(d, cfg.ff_size)
        self.output = nn.Module()
        self.output.dense = nn.Linear(cfg.ff_size, d)
        self.output.LayerNorm = BertLayerNorm(d, eps)
        self.dropout = nn.Dropout(cfg.dropout)  # hidden_dropout_prob (one module, same op)

    def forward(self, x):
        a = self.attention.output.dense(self.attention.self(x))
        x = self.attention.output.LayerNorm(self.dropout(a) + x)  # BertSelfOutput
        f = self.output.dense(gelu(self.intermediate.dense(x)))  # BertIntermediate, BertOutput
        return self.output.LayerNorm(self.dropout(f) + x)


class ReferenceBertImage(nn.Module):
    """BertImage re-stated (module docstring), holding ``model``'s parameters (reference names)."""

    def __init__(self, model: SelfAttentionCifar):
        super().__init__()
        cfg, self.kind = model.cfg, kind_of(model)
        self.ds, grid = cfg.downsample, cfg.img_size // cfg.downsample
        state = to_reference(model)
        emb = state.get("encoder.layer.0.attention.self.row_embeddings.weight")
        max_pos, emb_dim = ((emb.shape[0] + 1) // 2, emb.shape[1]) if emb is not None else (1, 1)
        self.features_upscale = nn.Linear(cfg.in_chans * self.ds**2, cfg.hidden_size)
        self.encoder = nn.Module()
        self.encoder.layer = nn.ModuleList(
            ReferenceLayer(self.kind, cfg, grid, max_pos, emb_dim) for _ in range(cfg.num_layers)
        )
        self.classifier = nn.Linear(cfg.hidden_size, cfg.num_classes)
        self.register_buffer("attention_mask", torch.tensor(1.0))  # BertImage's, unused here
        missing, unexpected = self.load_state_dict(state, strict=False)
        if unexpected or [k for k in missing if "key.bias" not in k and "query.bias" not in k]:
            raise ValueError(f"reference re-statement: unmatched {unexpected[:3] or missing[:3]}")
        self.to(next(model.parameters()).dtype)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x, k = images.permute(0, 2, 3, 1), self.ds  # NHWC
        b, h, w, c = x.shape  # downsample_concatenate
        y = x.contiguous().view(b, h, w // k, c * k).permute(0, 2, 1, 3).contiguous()
        y = y.view(b, w // k, h // k, k * k * c).contiguous().permute(0, 2, 1, 3).contiguous()
        x = self.features_upscale(y)
        for layer in self.encoder.layer:
            x = layer(x)
        return self.classifier(x.mean(dim=(1, 2)))


def check_equal(
    model: SelfAttentionCifar, ref: ReferenceBertImage, batch: int = 2, tol: float = 1e-4
) -> float:
    """Dropout off: the re-statement's logits against ``model``'s on random images; returns the
    relative max difference, raises if above ``tol``."""
    was = model.training, ref.training
    model.eval(), ref.eval()
    g = torch.Generator().manual_seed(0)
    c, s = model.cfg.in_chans, model.cfg.img_size
    x = torch.randn(batch, c, s, s, generator=g).to(next(model.parameters()).dtype)
    with torch.no_grad():
        a, r = model(x), ref(x)
    model.train(was[0]), ref.train(was[1])
    err = ((a - r).abs().max() / r.abs().max().clamp_min(1e-30)).item()
    if not err <= tol:
        raise ValueError(f"reference re-statement differs from the model: rel. max diff {err:.2e}")
    return err
