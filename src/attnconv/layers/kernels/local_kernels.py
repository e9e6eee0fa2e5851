"""The kernels of the k x k window attention (LocalSelfAttention2d, the attention stem), by the
names of plan.LOCAL_TABLE, one signature
``(q, k, v, *, kernel_size, rel_row, rel_col, mix, padding, return_attention)``, as
MultiHeadSelfAttention2d's kernels are kernels.KERNELS:

    y_ij = sum_{(a,b) in N_k(i,j)} softmax_ab(q_ij^T k_ab + q_ij^T r_{a-i,b-j}) v_ab
                                                        (Ramachandran et al. 2019, eq. 2-3)

q (B, nh, dk, H, W), already scaled; k the same or None; v (B, nh, dv, H, W), or
(B, nh, M, dv, H, W) with ``mix`` (k*k, M). The table picks only a kernel that can run the call
(capability.py): none of them checks again or falls back.
"""

from __future__ import annotations

import torch

from . import triton_axis, triton_compile, triton_local
from .flex import flex_local_attention
from .window import local_attention


def _window(backend: str):
    def run(q, k, v, *, kernel_size, rel_row, rel_col, mix, padding, return_attention):
        return local_attention(
            q,
            k,
            v,
            kernel_size=kernel_size,
            rel_row=rel_row,
            rel_col=rel_col,
            mix=mix,
            padding=padding,
            backend=backend,
            return_attention=return_attention,
        )

    run.__name__ = backend
    return run


def flex(q, k, v, *, kernel_size, rel_row, rel_col, mix, padding, return_attention):
    """FlexAttention with the window as its block mask, q^T r_{a-i,b-j} a score_mod (flex.py);
    the border masked, no maps, one value map per key (capability.window_maskable)."""
    qr_row = qr_col = None
    if rel_row is not None:  # q^T r_{a-i,b-j}, per query and offset (B, nh, k, H, W)
        half = q.shape[2] // 2
        qr_row = torch.einsum("bndhw,kd->bnkhw", q[:, :, :half], rel_row)
        qr_col = torch.einsum("bndhw,kd->bnkhw", q[:, :, half:], rel_col)
    return flex_local_attention(
        q, k, v, kernel_size, qr_row, qr_col, compiled=q.device.type == "cuda"
    )


def triton(q, k, v, *, kernel_size, rel_row, rel_col, mix, padding, return_attention):
    """The Triton window kernel (triton_local.py), the query block its GPU's shared memory
    takes (triton_compile.fit, the compile the plan's capability check made, cached)."""
    h, w = q.shape[-2:]
    train = triton_axis.trains(*(t for t in (q, k, v, rel_row, rel_col) if t is not None))
    qs, vs = q.flatten(3).mT, v.flatten(3).mT  # (B, nh, T, d) views, as the kernel's
    why, block_m = triton_compile.fit(qs, vs, h, w, 0.0, True, train, kernel_size)
    if why:  # the plan's Case said it fits: a call it did not describe
        raise RuntimeError(f"attnconv: the Triton window kernel was chosen but cannot run: {why}")
    return triton_local.local_attention_triton(q, k, v, kernel_size, rel_row, rel_col, block_m)


LOCAL_KERNELS = {
    "reference": _window("reference"),
    "triton": triton,
    "flex": flex,
    "fused": _window("fused"),
    "window": _window("window"),
}
