"""The one place that picks every layer's kernel, each by a table of named rows whose first match
wins (``choose``; ``explain`` says why each earlier row was passed over):

- ``TABLE``: MultiHeadSelfAttention2d's attention, term type x device x grad x dropout x size,
  with the thresholds the benchmarks measured (bench/anchors.py on CPU, bench/cuda.py on a GPU),
  and ``TRANSFORM_TABLE``, the same inside a torch.func transform;
- re-exported from tables.py: ``LOCAL_TABLE`` (the k x k window attention of
  LocalSelfAttention2d and the attention stem), ``DROPOUT_TABLE`` (the hidden dropout's mask,
  dropout.py), ``CONVERTED_TABLE`` (a converted convolution's forward, convert/modules.py);
- re-exported from functional.py: ``SEQUENCE_TABLE`` (MultiHeadAttention, the ViT, the
  Transformer: PyTorch's fused kernel or the plain equations).

Each row keeps apart what its kernel can run (``can_run``, capability.py: installed, built, the
device, the Triton kernels' shape and shared-memory limits, an export) and when the plan picks
it (the rows' predicates, the measured thresholds); a row is chosen only where both hold, so the
kernel a table names is the one that runs, and ``layer.kernel()`` / ``explain`` name it.

A layer's ``backend`` argument overrides the choice ("reference": the plain equations). Inside a
``torch.func`` transform (grad, vmap, jacrev) or forward-mode AD, MHSA2d reads TRANSFORM_TABLE
(kernels of plain torch ops, differentiable any number of times) and every other table its
plain path: the other kernels' autograd Functions are not transform-aware
(first_order.transforms_active).

TABLE:

| kernel           | term                   | when                                             |
|------------------|------------------------|--------------------------------------------------|
| reference        | any                    | backend="reference"                              |
| shift            | Shift, position only   | no dropout                                       |
| separable_tokens | Axis, position only    | CPU, forward_tokens' (H, W, B, C) tokens (any    |
|                  |                        | dropout: the hash's links)                       |
| separable        | Axis, position only    | CPU, no dropout (a GPU: shared, a few batched    |
|                  |                        | launches instead of a loop over heads/blocks)    |
| shared           | any, position only     | (computed once for the batch)                    |
| triton           | Axis                   | backend="triton" (triton_axis.py; any dropout)   |
| fused            | Axis                   | CPU, extension built (fused.py); dropout, or     |
|                  |                        | training from BLOCKED_MIN_T, inference at 16^2   |
|                  |                        | (to FUSED_INFERENCE_MAX_T) but not shared_bias's |
| dense_dropout    | Axis                   | CPU, dropout, backend != "fold"                  |
| flex_gaussian    | Axis with a Gaussian   | Flex, no dropout, no grad to the encoding        |
| flex             | Axis                   | Flex (CUDA, or backend="flex"), no dropout, but  |
|                  |                        | on CUDA not learned-relative logits in bf16, or  |
|                  |                        | in fp32 up to FOLD_CUDA_FP32_MAX_T (the fold)    |
| shared_bias      | Axis, fixed logits     | no grad, no dropout, T <= SHARED_BIAS_MAX_T      |
| blocked          | Axis                   | CPU, T >= BLOCKED_MIN_T (or "blocked"), no drop. |
|                  |                        | (inference past FUSED_INFERENCE_MAX_T; no C++)   |
| blocked_gaussian | Gaussian               | CPU, not exported (or "blocked")                 |
| fold             | any                    | otherwise: folded into q/k, the fused SDPA       |
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from .. import first_order, rows
from ..encodings.terms import AxisTerm, GaussianTerm, ShiftTerm, Term
from ..first_order import transforms_active
from ..functional import SEQUENCE_BACKENDS as SEQUENCE_BACKENDS
from ..functional import SEQUENCE_TABLE as SEQUENCE_TABLE
from ..functional import SequenceCase as SequenceCase
from ..precision import autocast_dtype
from ..rows import Row
from .capability import FLEX as FLEX
from .capability import flex_installed, fused_built, triton_axis_fits
from .forced import term_words as term_words
from .forced import warn_if_passed_over as warn_if_passed_over
from .tables import CONVERTED_TABLE as CONVERTED_TABLE
from .tables import DROPOUT_TABLE as DROPOUT_TABLE
from .tables import LOCAL_TABLE as LOCAL_TABLE
from .tables import WINDOW_CUDA_MIN_T as WINDOW_CUDA_MIN_T
from .tables import ConvertedCase as ConvertedCase
from .tables import DropoutCase as DropoutCase
from .tables import LocalCase as LocalCase

BACKENDS = ("reference", "flex", "blocked", "fused", "fold", "triton")  # MHSA2d's
LOCAL_BACKENDS = ("reference", "flex", "fused", "window", "triton")  # the window attention's
STEM_BACKENDS = ("reference", "fused", "window")  # the attention stem's (no Flex path)
SHARED_BIAS_MAX_T = 64 * 64  # (Nh, T, T) float32 bias in inference: 64 MiB per head at 64^2
BLOCKED_MIN_T = 16 * 16  # smaller images: the blocked kernel's Python loop costs its gain
FUSED_INFERENCE_MAX_T = 16 * 16  # inference: fused up to here, blocked above
# (set by benchmarks/results/fused_inference.md, with the commands that measured it)
# On CUDA the content rows fall to flex (fold with dropout), but to the fold for learned-relative
# logits in bf16, and in fp32 up to FOLD_CUDA_FP32_MAX_T: set by
# benchmarks/results/cuda_layers_content.md, measured by `attnconv bench --suite cuda -- --only
# content`, and its gpu_goals.md (docs/benchmarks.md, "The goals, read from a run").
# The Triton kernel's row stays opt-in until a GPU times it beside them (gpu_session.sh).
FOLD_CUDA_FP32_MAX_T = 32 * 32
AXIS = "positional logits that split into a row and a column part (an axis term)"


class Case(NamedTuple):
    """What the choice reads: the term, the layer's backend override, the device, whether
    gradients reach the layer (``grad``) or the encoding's parameters (``pos_grad``), attention
    dropout, the number of pixels, and whether a compiler is tracing (no blocked Gaussian loop;
    the C++ extension only for torch.compile, ``compiled``, as the custom ops of ops.py); the
    sizes the Triton kernel's limits read (capability.triton_axis_fits)."""

    term: Term
    content: bool = True
    backend: str | None = None
    device: str = "cpu"
    grad: bool = True
    pos_grad: bool = True
    p_drop: float = 0.0
    t: int = 1
    tracing: bool = False
    dtype: torch.dtype | None = None  # what q, k, v compute in (autocast's)
    transformed: bool = False  # inside a torch.func transform
    compiled: bool = False  # torch.compile traces (not an export): the custom ops run
    batch: int = 1
    heads: int = 1
    dk: int = 1  # q's and k's width per head
    dv: int = 1  # v's
    h: int = 1
    w: int = 1
    per_image: bool = True  # a dropout mask per image (not one for the batch)
    tokens: bool = False  # MHSA2d.forward_tokens: (H, W, B, C) tokens, not an NCHW image


# what the rows read of a Case, as functions of it (not properties: torch 2.8's Dynamo reads no
# property of a NamedTuple and breaks the graph there)
def _position_only(c: Case) -> bool:
    return not (c.content or c.term.reads_q)


def _flex(c: Case) -> bool:
    """Flex picked: on CUDA by the plan, else by backend="flex" (installed: its can_run)."""
    return c.device == "cuda" if c.backend is None else c.backend == "flex"


def _cpu_blocked(c: Case) -> bool:
    if c.backend in (None, "flex"):
        return c.device == "cpu"
    return c.backend == "blocked"


def _axis(c: Case) -> bool:
    return isinstance(c.term, AxisTerm)


def _fold_beats_flex(c: Case) -> bool:
    """Learned-relative logits on CUDA with the plan choosing: the fold measured faster than
    Flex there in bfloat16 and in float32 up to FOLD_CUDA_FP32_MAX_T (the note above)."""
    if c.backend is not None or c.device != "cuda" or not c.content:
        return False
    if not (c.term.query_reads and c.term.gaussian is None):
        return False
    return c.dtype == torch.bfloat16 or (c.dtype == torch.float32 and c.t <= FOLD_CUDA_FP32_MAX_T)


def _shared_bias(c: Case) -> bool:
    """Fixed positional logits (no q in them) in inference: one (Nh, T, T) bias for the batch."""
    return (
        _axis(c)
        and not c.term.query_reads
        and not c.grad
        and c.p_drop == 0
        and c.t <= SHARED_BIAS_MAX_T
    )


def _fused_wins(c: Case) -> bool:
    """Where the fused C++ kernel runs (forced, or measured faster by benchmarks/layers_ab.py):
    with dropout (the others store or redraw the mask), from BLOCKED_MIN_T in training (no
    Python loop over blocks), and in inference up to FUSED_INFERENCE_MAX_T unless the shared
    bias applies (layers_ab.py --inference, benchmarks/results/fused_inference.md: faster than
    the blocked kernel on sa_learned_content's forward; the shared bias measured faster with
    quadratic logits)."""
    if c.backend == "fused" or c.p_drop > 0:
        return True
    if c.grad:
        return c.t >= BLOCKED_MIN_T
    return BLOCKED_MIN_T <= c.t <= FUSED_INFERENCE_MAX_T and not _shared_bias(c)


TABLE = (
    Row("reference", lambda c: c.backend == "reference", "any", 'backend="reference"'),
    Row(
        "shift",
        lambda c: _position_only(c) and isinstance(c.term, ShiftTerm) and c.p_drop == 0,
        "Shift, position only",
        "no dropout",
    ),
    Row(
        "separable_tokens",
        lambda c: c.tokens and _position_only(c) and _axis(c) and c.device == "cpu",
        "Axis, position only",
        "CPU, forward_tokens' (H, W, B, C) tokens (any dropout: the hash's links)",
    ),
    Row(
        "separable",
        lambda c: _position_only(c) and _axis(c) and c.p_drop == 0 and c.device == "cpu",
        "Axis, position only",
        "CPU, no dropout (a GPU: shared, a few "
        "batched launches instead of a loop over heads/blocks)",
    ),
    Row(
        "shared", lambda c: _position_only(c), "any, position only", "(computed once for the batch)"
    ),
    Row(
        "triton",
        lambda c: _axis(c) and c.backend == "triton",
        "Axis",
        'backend="triton" (triton_axis.py; any dropout)',
        AXIS,
        triton_axis_fits,
    ),
    Row(
        "fused",
        lambda c: _axis(c) and c.backend in (None, "fused") and _fused_wins(c),
        "Axis",
        "CPU, extension built (fused.py); "
        "dropout, or training from BLOCKED_MIN_T, inference at 16^2 (to FUSED_INFERENCE_MAX_T) "
        "but not shared_bias's",
        f"{AXIS}, on a CPU, with the C++ kernels built (attnconv build-kernels), not exported",
        fused_built,
    ),
    Row(
        "dense_dropout",
        lambda c: _axis(c) and c.device == "cpu" and c.p_drop > 0 and c.backend != "fold",
        "Axis",
        'CPU, dropout, backend != "fold"',
    ),
    Row(
        "flex_gaussian",
        lambda c: (
            _axis(c)
            and _flex(c)
            and c.p_drop == 0
            and c.term.gaussian is not None
            and not c.pos_grad
        ),
        "Axis with a Gaussian",
        "Flex, no dropout, no grad to the encoding",
        "",
        flex_installed,
    ),
    Row(
        "flex",
        lambda c: _axis(c) and _flex(c) and c.p_drop == 0 and not _fold_beats_flex(c),
        "Axis",
        'Flex (CUDA, or backend="flex"), no dropout, but on CUDA not learned-relative logits '
        "in bf16, or in fp32 up to FOLD_CUDA_FP32_MAX_T (the fold)",
        f"{AXIS}, no attention dropout, and FlexAttention (torch 2.5 or later)",
        flex_installed,
    ),
    Row(
        "shared_bias",
        _shared_bias,
        "Axis, fixed logits",
        "no grad, no dropout, T <= SHARED_BIAS_MAX_T",
    ),
    Row(
        "blocked",
        lambda c: (
            _axis(c)
            and c.p_drop == 0
            and _cpu_blocked(c)
            and (c.t >= BLOCKED_MIN_T or c.backend == "blocked")
        ),
        "Axis",
        'CPU, T >= BLOCKED_MIN_T (or "blocked"), no drop. (inference past '
        "FUSED_INFERENCE_MAX_T; no C++)",
        f"{AXIS} without attention dropout, or Gaussian logits (a quadratic encoding)",
    ),
    Row(
        "blocked_gaussian",
        lambda c: (
            isinstance(c.term, GaussianTerm)
            and _cpu_blocked(c)
            and (c.backend is not None or c.compiled or not c.tracing)
        ),
        "Gaussian",
        'CPU, not exported (or "blocked")',
    ),
    Row("fold", lambda c: True, "any", "otherwise: folded into q/k, the fused SDPA"),
)


# Inside a transform: no autograd Function (plain torch ops only); the fold and the shared
# kernel measured faster there than the reference path (`python benchmarks/per_sample_grads.py`;
# docs/benchmarks.md, "Per-sample gradients through `torch.func`").
TRANSFORM_TABLE = (
    Row(
        "reference",
        lambda c: (
            c.backend == "reference"
            or (_position_only(c) and c.dtype in (torch.bfloat16, torch.float16))
            or (c.p_drop > 0 and not _position_only(c) and not _axis(c))
        ),
        "any",
        'backend="reference"; position only in bf16/fp16; dropout on a non-axis term',
    ),
    Row(
        "separable",
        lambda c: _position_only(c) and _axis(c) and c.p_drop == 0,
        "Axis, position only",
        "no dropout: a row then a column operator (each image's gradient never T x T)",
    ),
    Row("shared", lambda c: _position_only(c), "any, position only", "float32/float64"),
    Row("dense_dropout", lambda c: c.p_drop > 0 and _axis(c), "Axis", "dropout (the hash mask)"),
    Row("fold", lambda c: True, "any", "otherwise: folded into q/k, plain softmax attention"),
)


def choose(case: NamedTuple, table: tuple[Row, ...] = TABLE) -> str:
    """The kernel's name for ``case``: the first row of ``table`` that the plan picks and that
    can run it (rows.choose; TABLE: a name of kernels.KERNELS)."""
    return rows.choose(case, table)


def explain(case: NamedTuple, table: tuple[Row, ...] = TABLE) -> str:
    """Why ``choose(case, table)`` picked its kernel, one line a row (rows.explain)."""
    return rows.explain(case, table)


def tracing() -> bool:
    """A compiler traces the forward (the blocked kernels loop in Python over images/blocks)."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


compiling = first_order.compiling  # torch.compile, not an export: the custom ops of ops.py


def layer_case(
    layer,
    x: torch.Tensor,
    term: Term,
    p_drop: float,
    device: str | None = None,
    tokens: bool = False,
) -> tuple[Case, tuple[Row, ...]]:
    """The case and the table of MultiHeadSelfAttention2d ``layer`` on x (B, Cin, H, W)
    (``tokens``: forward_tokens' call); the gradient facts are read only for the rows that ask
    (an AxisTerm with content, the Triton kernel's compile check)."""
    grad = pos_grad = True
    auto = layer.backend != "reference"
    axis = isinstance(term, AxisTerm)
    if axis and auto and ((layer.input_dependent and not p_drop) or layer.backend == "triton"):
        on = torch.is_grad_enabled()
        pos_grad = on and any(p.requires_grad for p in layer.positional_encoding.parameters())
        grad = on and (x.requires_grad or any(p.requires_grad for p in layer.parameters()))
    # a tuple, not GaussianTerm | AxisTerm: torch 2.8's Dynamo cannot build the union type
    traced = isinstance(term, (GaussianTerm, AxisTerm)) and auto and tracing()
    device = device or x.device.type
    b, _, h, w = x.shape
    case = Case(
        term,
        layer.content,
        layer.backend,
        device,
        grad,
        pos_grad,
        p_drop,
        h * w,
        traced,
        autocast_dtype(device, x.dtype),
        transforms_active(),
        compiling(),
        b,
        layer.num_heads,
        layer.qk_dim,
        layer.head_dim,
        h,
        w,
        layer.dropout_mask == "sample",
        tokens,
    )
    return case, TRANSFORM_TABLE if case.transformed else TABLE


def for_layer(
    layer,
    x: torch.Tensor,
    term: Term,
    p_drop: float,
    device: str | None = None,
    why: bool = False,
    tokens: bool = False,
) -> str:
    """``choose`` for MultiHeadSelfAttention2d ``layer`` on x (B, Cin, H, W) (``why``: ``explain``
    instead; ``tokens``: forward_tokens' call)."""
    case, table = layer_case(layer, x, term, p_drop, device, tokens)
    return explain(case, table) if why else choose(case, table)
