"""Parameter mapping between the paper models (sa_cifar.py) and the reference code,
epfml/attention-cnn's ``BertImage`` (models/bert.py), so a reference checkpoint can be loaded.

Reference names (``encoder.layer.{i}.`` prefix inside layers) -> attnconv (``layers.{i}.``):

- ``features_upscale`` (``Linear(ds*ds*3, D)``) -> ``embed``, input columns permuted (below)
- ``attention.self.attention_centers`` (Nh, 2) -> ``attn.positional_encoding.centers``
- ``attention.self.attention_spreads``: isotropic (Nh,) = s -> ``...spread`` (alpha = s^2 / 2);
  full (Nh, 2, 2) = A -> ``...spread`` too (Sigma^-1 = A A^T in both)
- ``attention.self.row_embeddings`` / ``col_embeddings`` -> ``...tables.rel_col`` / ``rel_row``
  and ``attention.self.head_keys_row`` / ``head_keys_col`` -> ``...head_keys_col`` /
  ``head_keys_row`` where per-head keys read the tables (sa_learned, sa_learned_content_runs:
  models/bert.py at 9ffaa30 broadcasts row_scores as (1, W, 1, W, Nh), along the image columns
  of its (B, H, W, C) tokens, and col_scores as (H, 1, H, 1, Nh), along the rows); where the
  query reads them (sa_learned_content) ``row_embeddings`` -> ``rel_row``, ``col_embeddings`` ->
  ``rel_col``
- ``attention.self.query`` / ``key`` (content) -> ``attn.query_proj`` / ``key_proj``
  (zero bias where the reference has none)
- ``attention.self.value`` (Linear(Nh*D, D), head-major) -> ``attn.out_proj`` (Wval Wout)
- ``attention.output.dense`` / ``attention.output.LayerNorm`` -> ``attn_dense`` / ``norm1``
- ``intermediate.dense`` / ``output.dense`` / ``output.LayerNorm`` -> ``fc1`` / ``fc2`` / ``norm2``
- ``classifier`` -> ``head``

Space-to-depth: the reference's ``downsample_concatenate`` orders a ds x ds block's values as
(block row, block column, channel), channel fastest; ``F.pixel_unshuffle`` orders them
(channel, block row, block column). Both number offsets (row, col) = key - query and the
Gaussian centres (row, col) alike, so centres need no change. Buffers (the Gaussian's ``R``,
``attention_mask``, ``relative_indices``) and the unused ``mask_embedding`` / ``cls_embedding``
are skipped on the way in; ``to_reference`` writes the buffers a reference checkpoint holds
(train.py's ``store_checkpoint``: the state dict less ``self.R``), so its keys are a reference
checkpoint's. Which learned content layer a reference checkpoint holds: ``reference_model``.
Reading a checkpoint file: ``attnconv.loading.reference.load_reference_checkpoint``.
"""

from __future__ import annotations

import torch

from ..layers.encodings.relative import LearnedRelativeEncoding
from .sa_cifar import SelfAttentionCifar

_LAYER = {  # reference suffix -> attnconv suffix, inside encoder.layer.{i}. / layers.{i}.
    "attention.self.attention_centers": "attn.positional_encoding.centers",
    "attention.self.row_embeddings.weight": "attn.positional_encoding.tables.rel_row",
    "attention.self.col_embeddings.weight": "attn.positional_encoding.tables.rel_col",
    "attention.self.head_keys_row.weight": "attn.positional_encoding.head_keys_row.weight",
    "attention.self.head_keys_col.weight": "attn.positional_encoding.head_keys_col.weight",
    "attention.self.query.weight": "attn.query_proj.weight",
    "attention.self.query.bias": "attn.query_proj.bias",
    "attention.self.key.weight": "attn.key_proj.weight",
    "attention.self.key.bias": "attn.key_proj.bias",
    "attention.self.value.weight": "attn.out_proj.weight",
    "attention.self.value.bias": "attn.out_proj.bias",
    "attention.output.dense.weight": "attn_dense.weight",
    "attention.output.dense.bias": "attn_dense.bias",
    "attention.output.LayerNorm.weight": "norm1.weight",
    "attention.output.LayerNorm.bias": "norm1.bias",
    "intermediate.dense.weight": "fc1.weight",
    "intermediate.dense.bias": "fc1.bias",
    "output.dense.weight": "fc2.weight",
    "output.dense.bias": "fc2.bias",
    "output.LayerNorm.weight": "norm2.weight",
    "output.LayerNorm.bias": "norm2.bias",
}
_TOP = {
    "features_upscale.weight": "embed.weight",
    "features_upscale.bias": "embed.bias",
    "classifier.weight": "head.weight",
    "classifier.bias": "head.bias",
}
_SKIP = (
    "attention.self.R",
    "attention_mask",
    "mask_embedding",
    "cls_embedding",
    "relative_indices",
)
# Learned2DRelativeSelfAttention's head-key scores (models/bert.py at 9ffaa30, get_attention_probs)
# broadcast row_scores as (1, W, 1, W, Nh), along the image columns, and col_scores along the rows
# (the later layer's q . row_embeddings reads the rows): its row tables are our column tables there.
_SWAP_AXES = {
    "row_embeddings": "col_embeddings",
    "col_embeddings": "row_embeddings",
    "head_keys_row": "head_keys_col",
    "head_keys_col": "head_keys_row",
}


def embed_permutation(in_chans: int, ds: int) -> torch.Tensor:
    """perm with ours[:, j] = reference[:, perm[j]]: j = c*ds*ds + i*ds + k (pixel_unshuffle)
    reads reference column i*ds*C + k*C + c (downsample_concatenate)."""
    c, i, k = torch.meshgrid(
        torch.arange(in_chans), torch.arange(ds), torch.arange(ds), indexing="ij"
    )
    return (i * ds * in_chans + k * in_chans + c).flatten()


def _name_map(model: SelfAttentionCifar) -> dict[str, str]:
    """reference name -> attnconv name, for the names this model has."""
    own = set(model.state_dict())
    out = {r: a for r, a in _TOP.items() if a in own}
    swap = any(k.endswith("positional_encoding.head_keys_row.weight") for k in own)
    for i in range(len(model.layers)):
        for r, a in _LAYER.items():
            if swap and r.split(".")[2] in _SWAP_AXES:
                name = r.split(".")[2]
                r = r.replace(name, _SWAP_AXES[name])
            if f"layers.{i}.{a}" in own:
                out[f"encoder.layer.{i}.{r}"] = f"layers.{i}.{a}"
        spread = f"layers.{i}.attn.positional_encoding.spread"
        if spread in own:
            out[f"encoder.layer.{i}.attention.self.attention_spreads"] = spread
    return out


def reference_model(state: dict[str, torch.Tensor]) -> str:
    """The registered model whose layers a reference ``BertImage`` state dict holds: Gaussian
    spreads (Nh,) sa_quadratic, (Nh, 2, 2) sa_quadratic_generalized; learned tables with head
    keys and no query sa_learned, with a query sa_learned_content_runs (the paper-run commit's
    content layer); a query and no head keys sa_learned_content (the later upstream layer).

    Args:
        state: a reference checkpoint's state dict (``encoder.layer.{i}.`` names).

    Returns:
        The name of the registered model that holds those layers.

    Raises:
        ValueError: neither Gaussian nor learned relative attention in the state dict.
    """
    p = "encoder.layer.0.attention.self."
    if p + "attention_spreads" in state:
        full = state[p + "attention_spreads"].dim() == 3
        return "sa_quadratic_generalized" if full else "sa_quadratic"
    if p + "row_embeddings.weight" not in state:
        raise ValueError("reference checkpoint: no Gaussian or learned relative attention found")
    keys, query = p + "head_keys_row.weight" in state, p + "query.weight" in state
    if keys:
        return "sa_learned_content_runs" if query else "sa_learned"
    return "sa_learned_content"


def _which(state: dict) -> str:
    try:
        return f" (it holds a {reference_model(state)} model)"
    except ValueError:
        return ""


def from_reference(state: dict[str, torch.Tensor], model: SelfAttentionCifar) -> dict:
    """The reference's state dict -> ``model``'s, every tensor mapped (missing query/key biases
    zero); raises ValueError naming the first unmapped, missing or mis-shaped keys and the model
    the checkpoint holds (``reference_model``).

    Args:
        state: the reference checkpoint's state dict (``BertImage`` names).
        model: the paper model to load it into (its settings must match the checkpoint's).

    Returns:
        A state dict in ``model``'s names, shapes and dtypes, for ``model.load_state_dict``.

    Raises:
        ValueError: a key with no counterpart, a missing key, or a shape that differs.
    """
    names, own = _name_map(model), model.state_dict()
    unknown = [k for k in state if k not in names and not k.endswith(_SKIP)]
    if unknown:
        raise ValueError(
            f"reference checkpoint: keys with no attnconv counterpart: {unknown[:3]}{_which(state)}"
        )
    out = {}
    for r, a in names.items():
        if r not in state:
            if a.endswith(("query_proj.bias", "key_proj.bias")):
                out[a] = torch.zeros_like(own[a])  # the reference's projections have no bias
                continue
            raise ValueError(f"reference checkpoint: missing {r} (for {a}){_which(state)}")
        t = state[r]
        if a == "embed.weight":
            t = t[:, embed_permutation(model.cfg.in_chans, model.cfg.downsample)]
        if t.shape != own[a].shape:
            raise ValueError(
                f"reference checkpoint: {r} has shape {tuple(t.shape)}, {a} needs "
                f"{tuple(own[a].shape)}{_which(state)}"
            )
        out[a] = t.to(own[a].dtype)
    missing = sorted(set(own) - set(out))
    if missing:
        raise ValueError(f"reference checkpoint: nothing for {missing[:3]}")
    return out


def to_reference(model: SelfAttentionCifar) -> dict[str, torch.Tensor]:
    """``model``'s parameters under the reference's names and layout (inverse of
    ``from_reference``), with the buffers a reference checkpoint holds: ``attention_mask``
    (BertImage's tensor(1.0)) and, learned layers, ``relative_indices`` (m, m) long,
    [i, k] = k - i + m - 1, m = max_position_embeddings (our ``max_size``).

    Args:
        model: a paper model (``sa_quadratic``, ``sa_learned``, ...).

    Returns:
        A state dict a reference ``BertImage`` of the same settings loads (copies of the
        tensors, on the model's device).
    """
    own = model.state_dict()
    out = {}
    for r, a in _name_map(model).items():
        t = own[a]
        if a == "embed.weight":
            inv = torch.argsort(embed_permutation(model.cfg.in_chans, model.cfg.downsample))
            t = t[:, inv]
        out[r] = t.clone()
    dev = model.head.weight.device
    out["attention_mask"] = torch.tensor(1.0, dtype=model.head.weight.dtype, device=dev)
    if isinstance(model.layers[0].attn.positional_encoding, LearnedRelativeEncoding):
        m = torch.arange(model.max_size, device=dev)
        idx = m.view(1, -1) - m.view(-1, 1) + model.max_size - 1
        for i in range(len(model.layers)):
            out[f"encoder.layer.{i}.attention.self.relative_indices"] = idx.clone()
    return out
