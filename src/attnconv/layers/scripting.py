"""TorchScript: our layers are not scriptable (Python control flow, dataclass geometry, custom
autograd functions); ``torch.jit.script`` says so in one line and names what works instead.

``NotScriptable`` is a mixin for the layers' ``nn.Module`` classes: ``torch.jit.script`` calls
``__prepare_scriptable__`` on a module and each of its submodules before compiling, so a model
holding any of our layers stops there too, with the same message.
"""

from __future__ import annotations


class ScriptingUnsupported(RuntimeError):
    """torch.jit.script on an attnconv layer."""


class NotScriptable:
    def __prepare_scriptable__(self):
        raise ScriptingUnsupported(
            f"attnconv: {type(self).__name__} does not support torch.jit.script (TorchScript is "
            "deprecated in PyTorch); export it instead: torch.export.export(model.eval(), (x,))"
        )
