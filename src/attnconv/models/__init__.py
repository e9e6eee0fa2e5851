"""Paper models behind one registry. Each model module registers its factories on import."""

import importlib
import importlib.util

from .registry import create_model, list_models, register_model

# model modules; each is imported if present (errors inside a module are raised, not hidden)
_MODULES = ("resnet", "sa_cifar", "vit", "transformer", "sasa", "tiny")
for _m in _MODULES:
    if importlib.util.find_spec(f"{__name__}.{_m}") is not None:
        importlib.import_module(f"{__name__}.{_m}")

__all__ = ["create_model", "list_models", "register_model"]
