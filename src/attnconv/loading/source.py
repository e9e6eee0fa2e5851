"""A foreign weights file (timm, Hugging Face) read into our ``VisionTransformer`` names.

``read_tensors`` reads one file: safetensors, or a torch zip with ``torch.load(weights_only=True)``
(a file that needs full unpickling is refused). The format modules (``timm_format``,
``hf_format``) map its tensors to a :class:`Source`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch


class WeightsError(ValueError):
    """Foreign weights that cannot be loaded; the message names the file and the problem.

    A ValueError: a timm, Hugging Face or reference-code file of another architecture, patch
    size or model, or one that is not a weights file at all.
    """


@dataclass
class Source:
    """A checkpoint in our ``VisionTransformer`` names, with the settings it fixes."""

    format: str  # "timm" | "hf"
    path: Path
    state: dict[str, torch.Tensor]  # our names; no head if the checkpoint has none
    settings: dict = field(default_factory=dict)  # ViTConfig fields the checkpoint fixes
    num_heads: int | None = None  # known from a config (timm's state dict cannot tell)
    notes: list[str] = field(default_factory=list)  # what was dropped, for the message

    @property
    def num_classes(self) -> int | None:
        w = self.state.get("head.weight")
        return None if w is None else int(w.shape[0])


def add_zero_qkv_biases(state: dict[str, torch.Tensor]) -> None:
    """qkv_bias=False weights: the missing q/k/v biases are added as zeros (exactly the same
    function), so the model built keeps the default qkv_bias=True and loads either kind."""
    for k in [k for k in state if k.endswith("attn.q_proj.weight")]:
        for proj in ("q_proj", "k_proj", "v_proj"):
            w = state[k.replace("q_proj", proj)]
            state[k.replace("q_proj", proj).replace("weight", "bias")] = w.new_zeros(w.shape[0])


def _kind(path: Path) -> str:
    """'safetensors', 'torch-zip' or 'pickle' (torch's legacy format, or any pickle) from the
    first bytes; else WeightsError."""
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) == 9 and head[8:9] == b"{":
        return "safetensors"  # u64 header length, then the JSON header
    if head[:4] == b"PK\x03\x04":
        return "torch-zip"
    if len(head) > 1 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "pickle"
    raise WeightsError(f"{path}: not a weights file (neither safetensors nor a torch.save zip)")


NESTS = ("model", "state_dict", "module")  # where torch checkpoints nest their state dict


def read_tensors(path: str | Path, nests: tuple[str, ...] = NESTS) -> dict[str, torch.Tensor]:
    """The tensors of one weights file: safetensors, or ``torch.load(weights_only=True)``.

    A torch checkpoint that nests its state dict under one of ``nests`` (DeiT's releases:
    ``model`` / ``state_dict``; the reference's: ``model_state_dict``) is unwrapped. Truncated
    and corrupt files, and pickles holding anything but tensors (only full unpickling, which
    can run code, would read them): WeightsError.
    """
    from safetensors.torch import load_file

    path = Path(path)
    kind = _kind(path)  # a "pickle" is torch's legacy format: also read weights-only
    try:
        if kind == "safetensors":
            return load_file(str(path))
        with open(path, "rb") as f:  # a file object: torch never guesses from the name
            obj = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - every reader error becomes one line
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if kind != "safetensors" and "weights_only" in str(e).lower():
            raise WeightsError(
                f"{path}: refused, it holds Python objects that only full unpickling "
                "(unsafe) could load; save just the state dict"
            ) from None
        raise WeightsError(f"{path}: truncated or corrupt {kind} file ({msg[:160]})") from None
    for key in nests:
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise WeightsError(f"{path}: not a state dict (a dict of tensors)")
    return dict(obj)
