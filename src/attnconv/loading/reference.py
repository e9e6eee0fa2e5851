"""A reference checkpoint file (epfml/attention-cnn's ``BertImage``, ``train.py``'s
``store_checkpoint``) loaded into a paper model (``attnconv.models.sa_cifar``).

The file is read with :func:`~attnconv.loading.source.read_tensors` (safetensors, or
``torch.load(weights_only=True)``: nothing is unpickled) and unwrapped from the reference's
``{"epoch", "test_accuracy", "model_state_dict"}`` dict and ``DataParallel``'s ``module.``
prefix; ``attnconv.models.reference_port.from_reference`` maps its names. Every problem is one
line: :class:`~attnconv.loading.source.WeightsError` naming the file.
"""

from __future__ import annotations

from pathlib import Path

from attnconv.models.reference_port import from_reference
from attnconv.models.sa_cifar import SelfAttentionCifar

from .source import WeightsError, read_tensors

__all__ = ["load_reference_checkpoint"]


def load_reference_checkpoint(model: SelfAttentionCifar, path: str | Path) -> SelfAttentionCifar:
    """Load a reference checkpoint file (torch.save of a state dict, or of a dict holding one
    under ``model_state_dict``) into ``model``; never unpickles code (weights_only=True). A
    file that is not such a checkpoint, or holds another model's weights: WeightsError.

    Args:
        model: the paper model (``sa_quadratic``, ``sa_learned``, ...) of the checkpoint's
            settings.
        path: the reference code's checkpoint file.

    Returns:
        ``model``, its weights replaced by the checkpoint's (names and layouts mapped by
        ``attnconv.models.reference_port.from_reference``).

    Raises:
        WeightsError: not such a checkpoint, or another model's weights.
    """
    state = read_tensors(path, nests=("model_state_dict",))
    state = {k.removeprefix("module."): v for k, v in state.items()}  # DataParallel
    try:
        mapped = from_reference(state, model)
    except ValueError as e:
        raise WeightsError(f"{path}: {e}") from None
    model.load_state_dict(mapped)
    return model
