"""The kernels of content attention with folded positional terms, and the choice between them
(MultiHeadSelfAttention2d, mhsa2d.py, inherits these methods): one equation,

    softmax(scale q k^T + positional logits) v                        (Cordonnier et al., eq. 1-9)

run by the kernel that measured fastest for the device, the mode and the size (bench/anchors.py
on CPU, bench/cuda.py on a GPU):

- CUDA, row/column encodings: FlexAttention, the logits added by a score_mod (flex.py);
- CPU inference, quadratic up to 64^2: the fused SDPA with one (1, Nh, T, T) bias for the batch;
- CPU from 16^2: the query-blocked exact kernel (blocked.py), dk-wide logits;
- CPU training with attention dropout: dense dk-wide logits plus the row/column logits
  broadcast, the links of ``functional.dropped_links`` removed (the plain path's own mask);
- otherwise (dropout, small images, generalized quadratic, Dai's relative): the exact fold into
  augmented queries/keys for the fused SDPA, no bias tensor.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from .blocked import axis_attention, gaussian_attention, kernel_dtype
from .flex import flex_mod_attention
from .functional import dropped_links, scaled_dot_product_attention
from .positional import hi

_LOW = (torch.bfloat16, torch.float16)
_SHARED_BIAS_MAX_T = 64 * 64  # (Nh, T, T) float32 bias in inference: 64 MiB per head at 64^2
_BLOCKED_MIN_T = 16 * 16  # smaller images: the blocked kernel's Python loop costs its gain


class ContentKernels:
    """The content-attention kernels of MultiHeadSelfAttention2d (a mixin: it reads the layer's
    projections, encoding, scale and backend switches ``flex_backend`` / ``blocked_backend``)."""

    def _use_flex(self, device: torch.device, p_drop: float) -> bool:
        """The FlexAttention backend (flex.py): on CUDA (or when ``flex_backend`` forces it, for
        tests on CPU), row/column encodings, no dropout."""
        enc = self.positional_encoding
        on = self.flex_backend if self.flex_backend is not None else device.type == "cuda"
        return bool(on) and enc.axis_folded and enc.uses_qk_product and p_drop == 0.0

    def _forward_flex(self, xt, v5, h, w) -> torch.Tensor:
        """Content attention with the row/column logits as a FlexAttention score_mod. q, k, v
        keep their (autocast) dtype, the kernel accumulates scores in float32 and the row/column
        logits q_axis are added in float32. -> (B, T, Nh, Dv)"""
        q, k = self._qk(xt, h, w)  # (B, Nh, T, dk)
        v = self._seq_values(v5)
        with torch.autocast(q.device.type, enabled=False):
            enc = self.positional_encoding
            grad = torch.is_grad_enabled() and any(p.requires_grad for p in enc.parameters())
            score_mod = enc.flex_score_mod(hi(q), hi(k), h, w, grad=grad)
            y = flex_mod_attention(q, k.to(q.dtype), v.to(q.dtype), score_mod, self.scale,
                                   compiled=q.device.type == "cuda")  # fmt: skip
        return y.to(xt.dtype).transpose(1, 2)

    def _use_shared_bias(self, xt: torch.Tensor, h: int, w: int, p_drop: float) -> bool:
        """Inference with a separable, input-independent positional term (quadratic) on up to
        _SHARED_BIAS_MAX_T pixels: the fused kernel with one (1, Nh, T, T) bias shared by the
        batch beats the exact fold, whose width dk + H + W exceeds the head's (bench/anchors.py
        measures both). Training keeps the fold (a bias with gradients takes SDPA's math path)."""
        enc = self.positional_encoding
        grad = torch.is_grad_enabled() and (
            xt.requires_grad or any(p.requires_grad for p in self.parameters()))  # fmt: skip
        return (not grad and p_drop == 0.0 and enc.axis_folded and enc.separable
                and h * w <= _SHARED_BIAS_MAX_T)  # fmt: skip

    def _forward_shared_bias(self, xt, v5, h, w) -> torch.Tensor:
        """softmax(q k^T * scale + R[q1, k1] + C[q2, k2]) v, the bias built once from the row and
        column logits (the dense path's values less a per-query constant, which the softmax
        cancels). -> (B, T, Nh, Dv)"""
        row, col = self._axis_logits(h, w, xt.dtype)  # (Nh, h, h), (Nh, w, w), float32+
        t = h * w
        bias = (row[:, :, None, :, None] + col[:, None, :, None, :]).reshape(1, -1, t, t)
        q, k = self._qk(xt, h, w)  # (B, Nh, T, dk)
        v = self._seq_values(v5)
        if q.dtype in _LOW:  # a bfloat16 bias rounds the logits it adds: attention in float32
            q, k, v = q.float(), k.float(), v.float()
        with torch.autocast(q.device.type, enabled=False):
            y = scaled_dot_product_attention(
                q, k, v.to(q.dtype), bias=bias.to(q.device, q.dtype), scale=self.scale
            )  # (B, Nh, T, Dv)
        return y.to(xt.dtype).transpose(1, 2)

    def _use_blocked(self, xt: torch.Tensor, h: int, w: int, p_drop: float) -> bool:
        """The query-blocked exact kernel (blocked.py) for content + row/column logits, no
        dropout, on CPU from _BLOCKED_MIN_T pixels (or as ``blocked_backend`` says): its logits
        are dk wide where the fold's are dk + H + W (bench/anchors.py times both)."""
        enc = self.positional_encoding
        on = self.blocked_backend
        if on is None:
            on = xt.device.type == "cpu" and h * w >= _BLOCKED_MIN_T
        return bool(on) and p_drop == 0.0 and enc.axis_folded and enc.uses_qk_product

    def _forward_blocked(self, xt, v5, h, w) -> torch.Tensor:
        """softmax(scale q k^T + R[q1, k1] + C[q2, k2]) v by query blocks, in float32. -> (B, T,
        Nh, Dv)"""
        q, k = self._qk(xt, h, w)  # (B, Nh, T, dk)
        dt = kernel_dtype(q.dtype)
        with torch.autocast(xt.device.type, enabled=False):  # the axis logits in float32 too
            q, k = q.to(dt), k.to(dt)
            (q_axis,), _ = self.positional_encoding.fold(q, k, h, w)  # (B|1, Nh, T, h + w)
            if q_axis.stride(0) == 0:  # input-independent (quadratic): one copy for the batch
                q_axis = q_axis[:1]
            y = axis_attention(q, k, self._seq_values(v5), q_axis, h, w, self.scale)
        return y.to(xt.dtype).transpose(1, 2)

    def _use_dense_dropout(self, xt: torch.Tensor, p_drop: float) -> bool:
        """Training with attention dropout on CPU, row/column encodings: the fused SDPA's dropout
        path builds the same dense logits from the fold's dk + H + W wide q/k and draws a float
        mask; bench/models.py times the two (sa_learned_content)."""
        enc = self.positional_encoding
        return (xt.device.type == "cpu" and p_drop > 0.0 and enc.axis_folded
                and enc.uses_qk_product and self.blocked_backend is not False)  # fmt: skip

    def _forward_dense_dropout(self, xt, v5, h, w, p_drop) -> torch.Tensor:
        """softmax(scale q k^T + R[q1, k1] + C[q2, k2]) with dropped links removed, times v, in
        float32 (kernel_dtype): the logits one baddbmm onto the broadcast row/column logits,
        dropout a mask fill (1 / (1 - p) applied to the output). -> (B, T, Nh, Dv)"""
        q, k = self._qk(xt, h, w)  # (B, Nh, T, dk)
        b, nh, t, dk = q.shape
        dt = kernel_dtype(q.dtype)
        with torch.autocast(xt.device.type, enabled=False):
            q, k = q.to(dt), k.to(dt)
            (q_axis,), _ = self.positional_encoding.fold(q, k, h, w)  # (B|1, Nh, T, h + w)
            pos = q_axis[..., :h, None] + q_axis[..., None, h:]  # (B|1, Nh, T, h, w), scaled
            pos = pos.expand(b, nh, t, h, w).reshape(b * nh, t, t)
            logits = torch.baddbmm(pos, q.reshape(b * nh, t, dk),
                                   k.reshape(b * nh, t, dk).transpose(1, 2), alpha=self.scale)
            probs = torch.softmax(logits, dim=-1).view(b, nh, t, t)
            probs = probs.masked_fill(dropped_links(nh, t, b, p_drop, q.device), 0.0)
            if v5.shape[3] == 1:  # every head reads the same values: one (Nh*T, T) GEMM each
                y = torch.matmul(probs.view(b, nh * t, t), v5.reshape(b, t, -1).to(dt))
            else:
                y = torch.matmul(probs, self._seq_values(v5).to(dt))
            y = y.view(b, nh, t, -1) * (1.0 / (1.0 - p_drop))
        return y.to(xt.dtype).transpose(1, 2)

    def _forward_folded(self, xt, v5, h, w, p_drop) -> torch.Tensor:
        """Content attention with every positional term folded into q/k: fused SDPA, no bias."""
        if self._use_dense_dropout(xt, p_drop):
            return self._forward_dense_dropout(xt, v5, h, w, p_drop)
        if self._use_flex(xt.device, p_drop):
            return self._forward_flex(xt, v5, h, w)
        if self._use_shared_bias(xt, h, w, p_drop):
            return self._forward_shared_bias(xt, v5, h, w)
        if self._use_blocked(xt, h, w, p_drop):
            return self._forward_blocked(xt, v5, h, w)
        if self._use_gaussian(xt, p_drop):
            return self._forward_gaussian(xt, v5, h, w, p_drop)
        q_aug, k_aug, v = self.folded_qkv(xt, v5, h, w)
        # the folded quadratic logits reach alpha H^2: folded_qkv keeps them in float32, and
        # autocast must not cast them back to bfloat16 inside SDPA
        large = self.positional_encoding.large_logits
        with torch.autocast(q_aug.device.type, enabled=False) if large else nullcontext():
            y = scaled_dot_product_attention(
                q_aug, k_aug, v, scale=1.0, dropout_p=p_drop, impl="auto"
            )  # (B, Nh, T, Dv)
        return y.to(xt.dtype).transpose(1, 2)

    def _use_gaussian(self, xt: torch.Tensor, p_drop: float) -> bool:
        """Generalized quadratic + content on CPU: the blocked kernel with the position logits
        built from the offsets (blocked.gaussian_attention), attention dropout by the plain
        path's own dropped links. Folded into q/k, the bilinear form's alpha H^2 terms cancel
        in float32 (2e-2 of the output at 1 x 1000 pixels, 5-17x the dense path's at 32 x 32)."""
        enc = self.positional_encoding
        on = self.blocked_backend
        if on is None:  # a Python loop over images and blocks: not for a traced graph
            tracing = torch.compiler.is_compiling() or torch.compiler.is_exporting()
            on = xt.device.type == "cpu" and not tracing
        return (bool(on) and enc.position_foldable and not enc.separable
                and enc.uses_qk_product)  # fmt: skip

    def _forward_gaussian(self, xt, v5, h, w, p_drop) -> torch.Tensor:
        """softmax(scale q k^T - 1/2 (d - Delta)^T S (d - Delta)) v by query blocks, in float32.
        -> (B, T, Nh, Dv)"""
        q, k = self._qk(xt, h, w)  # (B, Nh, T, dk)
        enc = self.positional_encoding
        b, nh, t = q.shape[:3]
        drop = dropped_links(nh, t, b, p_drop, q.device) if p_drop > 0 else None
        y = gaussian_attention(q, k, self._seq_values(v5), hi(enc.centers), enc.precision, h, w,
                               self.scale, drop=drop, p_drop=p_drop)  # fmt: skip
        return y.to(xt.dtype).transpose(1, 2)

    def folded_qkv(self, xt, v5, h, w):
        """Augmented q, k (B, Nh, T, dk + folded terms) and v (B, Nh, T, Dv) such that
        softmax(q_aug k_aug^T) v is the layer's attention (scale folded into q_aug)."""
        enc = self.positional_encoding
        q, k = self._qk(xt, h, w)  # (B, Nh, T, dk)
        v = self._seq_values(v5)
        if enc.large_logits and q.dtype in _LOW:  # large folded logits: attention in float32
            q, k, v = q.float(), k.float(), v.float()
        qs, ks = ([q * self.scale], [k]) if enc.uses_qk_product else ([], [])
        q_pos, k_pos = enc.fold(q, k, h, w)  # the positional terms as extra columns
        q_aug, k_aug = torch.cat(qs + q_pos, dim=-1), torch.cat(ks + k_pos, dim=-1)
        return q_aug, k_aug, v.to(q_aug.dtype)
