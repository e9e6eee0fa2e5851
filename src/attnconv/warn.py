"""Warnings at the user's line: ``warn`` points a warning at the first frame outside attnconv
and torch (a layer's forward is called through torch's Module.__call__, so a fixed stacklevel
named torch's module.py, or an attnconv line, depending on the path taken)."""

from __future__ import annotations

import os
import sys
import warnings

import torch

_INSIDE = tuple(os.path.dirname(os.path.abspath(p)) + os.sep for p in (__file__, torch.__file__))


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the caller's caller outside attnconv and
    torch (the user's script, test or notebook cell). While torch.compile traces, said once as
    the graph is built (a warning inside the graph would break it)."""
    if torch.compiler.is_compiling():
        return _warn_while_tracing(message, category)
    _at_user_line(message, category)


# Dynamo calls a function marked so while it traces, outside the graph, and keeps its result
@torch.compiler.assume_constant_result
def _warn_while_tracing(message: str, category: type[Warning]) -> None:
    _at_user_line(message, category)


def _at_user_line(message: str, category: type[Warning]) -> None:
    frame, level = sys._getframe(1), 2  # stacklevel 2: the frame that called warn
    while frame is not None and frame.f_code.co_filename.startswith(_INSIDE):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level if frame is not None else 2)
