"""kernels/plan.py picks every layer's kernel by a table whose first matching row wins: the
window attention's, the hidden dropout's and a converted convolution's, beside MHSA2d's; one
``backend`` knob per layer ("reference" among them); each row's capability (``can_run``) apart
from the choice, so the kernel a table names is the one that runs."""

from __future__ import annotations

import re

import pytest
import torch

from attnconv import AttentionStem2d, LocalSelfAttention2d, MultiHeadSelfAttention2d
from attnconv.layers.kernels import fused, plan
from attnconv.layers.kernels.window import local_attention

TABLES = {
    "mhsa": (plan.TABLE, plan.Case),
    "transform": (plan.TRANSFORM_TABLE, plan.Case),
    "local": (plan.LOCAL_TABLE, plan.LocalCase),
    "dropout": (plan.DROPOUT_TABLE, plan.DropoutCase),
    "converted": (plan.CONVERTED_TABLE, plan.ConvertedCase),
    "sequence": (plan.SEQUENCE_TABLE, plan.SequenceCase),
}


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_table_names_its_rows_once_and_ends_in_a_catch_all(name):
    table, _ = TABLES[name]
    names = [row.name for row in table]
    assert len(set(names)) == len(names) and all(row.term and row.rule for row in table)
    assert table[-1].when(None) if name != "mhsa" else table[-1].name == "fold"


def test_dropout_table():
    choose = lambda *a, **k: plan.choose(plan.DropoutCase(*a, **k), plan.DROPOUT_TABLE)  # noqa: E731
    assert choose("cuda", module=True) == "torch"  # HashDropout keeps torch's dropout off the CPU
    assert choose("cuda") == "reference"  # hash_dropout hashes on every device
    assert (
        choose("cpu", module=True)
        == choose("cpu")
        == ("fused" if fused.available() else "reference")
    )


def test_converted_table_and_why():
    choose = lambda **k: plan.choose(plan.ConvertedCase(**k), plan.CONVERTED_TABLE)  # noqa: E731
    assert choose(hard=False) == "attention"
    assert choose(hard=True) == "one_conv" and choose(hard=True, clamped=True) == "head_mix"
    assert choose(hard=True, backend="reference") == choose(hard=True, maps=True) == "attention"
    why = plan.explain(plan.ConvertedCase(hard=True, clamped=True), plan.CONVERTED_TABLE)
    assert why.splitlines()[0].startswith("passed over: attention (needs any:")
    assert why.splitlines()[-1].startswith("chosen: head_mix (hard heads:")


@pytest.mark.parametrize(
    "make",
    [
        lambda **k: MultiHeadSelfAttention2d(4, 4, 2, positional="quadratic", **k),
        lambda **k: LocalSelfAttention2d(4, 4, 2, 3, **k),
        lambda **k: AttentionStem2d(3, 8, 2, kernel_size=3, **k),
    ],
)
def test_one_knob_backend_and_the_retired_spellings_in_one_line(make):
    """``backend`` is the one knob: impl=, fused=, compiled= given, or ``impl`` set, is one
    TypeError line naming the backend to use; a bad name lists the layer's backends."""
    layer = make(backend="reference")
    assert layer.backend == "reference"
    layer.backend = None
    assert layer.backend is None
    for old, instead in (("impl", "backend='reference'"), ("fused", "backend='fused'")):
        with pytest.raises(TypeError, match=f"{old}= is gone, one knob names every kernel: .*"
                           + re.escape(instead)) as e:  # fmt: skip
            make(**{old: "reference"})
        assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match="compiled= is gone"):
        make(compiled=True)
    with pytest.raises(TypeError, match="impl= is gone"):
        layer.impl = "reference"
    with pytest.raises(AttributeError):
        layer.impl  # noqa: B018
    with pytest.raises(ValueError, match=r"backend must be None or one of \('reference',"):
        make(backend="nope")


def test_the_models_and_the_conversion_refuse_the_retired_spellings():
    from attnconv import create_model
    from attnconv.convert import conv_to_attention

    with pytest.raises(TypeError, match="create_model\\('sa_quadratic'\\): impl= is gone"):
        create_model("sa_quadratic", impl="reference")
    with pytest.raises(TypeError, match="conv_to_attention: impl= is gone"):
        conv_to_attention(torch.nn.Conv2d(2, 2, 3), impl="reference")


def test_local_layer_says_why():
    why = LocalSelfAttention2d(4, 4, 2, 3, backend="window").kernel("cpu", why=True)
    assert why.splitlines()[-1] == "chosen: window (any: otherwise: the Python window kernel)"
    assert why.splitlines()[0].startswith("passed over: reference (needs any: backend=")


def test_cuda_learned_relative_content_takes_the_fold_where_an_h100_measured_it_faster():
    """plan.FOLD_CUDA_FP32_MAX_T and the note above it: learned-relative content attention on CUDA
    runs the fold in bfloat16 and in float32 up to 32x32, Flex past it; quadratic logits keep
    Flex; a backend or the CPU is not affected."""
    if not plan.FLEX:
        pytest.skip("this torch has no FlexAttention")
    torch.manual_seed(0)
    make = lambda pos: MultiHeadSelfAttention2d(8, 8, 2, positional=pos, max_size=64)  # noqa: E731
    learned, quadratic = make("relative_learned"), make("quadratic")
    small, large = torch.randn(1, 8, 32, 32), torch.randn(1, 8, 64, 64)
    assert learned.kernel(small, device="cuda") == "fold"
    assert learned.kernel(large, device="cuda") == "flex"
    assert learned.to(torch.bfloat16).kernel(large.bfloat16(), device="cuda") == "fold"
    assert quadratic.kernel(small, device="cuda") == "flex"
    assert learned.float().kernel(small, device="cpu") != "fold"
    learned.backend = "flex"
    assert learned.kernel(small, device="cuda") == "flex"
    learned.backend = None
    why = learned.kernel(small, device="cuda", why=True).splitlines()
    assert why[-1].startswith("chosen: fold")
    assert any(
        line.startswith("passed over: flex (") and "FOLD_CUDA_FP32_MAX_T" in line for line in why
    )


@pytest.mark.parametrize(
    "make, why",
    [
        (lambda: MultiHeadSelfAttention2d(8, 8, 2, positional="relative", backend="triton"),
         "backend='triton' does not run here: the Triton GPU kernel needs positional logits that "
         "split into a row and a column part (an axis term), and it has logits folded into q and "
         "k from its relative encoding with content on cpu; the fold (the positional logits "
         "folded into q and k, then PyTorch's fused attention) runs instead, with the same "
         "results"),
        (lambda: LocalSelfAttention2d(8, 8, 2, 3, padding="zeros", backend="triton"),
         "backend='triton' does not run here: the Triton GPU kernel cannot run here: it takes "
         "padding=\"mask\", not 'zeros'; the window function runs instead"),
        (lambda: MultiHeadSelfAttention2d(8, 8, 2, positional="relative", backend="blocked"),
         "backend='blocked' does not run here: the blocked CPU kernel needs"),
        (lambda: MultiHeadSelfAttention2d(
            8, 8, 2, positional="quadratic", content=False, backend="triton"),
         "backend='triton' does not run here: the separable kernel (a row then a column "
         "operator, position only) serves this layer before the Triton GPU kernel would (it has "
         "row and column logits from its quadratic encoding on cpu), with the same results"),
    ],
)  # fmt: skip
def test_a_forced_backend_passed_over_says_so_in_one_line(make, why):
    """backend="triton" on an encoding or a border the kernel does not take ran another kernel
    silently (a correct result, not the one asked for); now one warning says, in words, which
    kernel runs and why (what the asked one needs and what the layer has, or that the plan puts
    another kernel first for it)."""
    layer = make()
    with pytest.warns(UserWarning, match=re.escape(why)) as caught:
        layer(torch.randn(1, 8, 5, 5))
    assert all("\n" not in str(w.message) for w in caught)
    assert {w.filename for w in caught} == {__file__}  # the caller's line, not torch's module.py


def test_a_forced_backend_that_runs_warns_nothing(recwarn):
    x = torch.randn(1, 8, 5, 5)
    MultiHeadSelfAttention2d(8, 8, 2, positional="quadratic", backend="blocked")(x)  # blocked(_g.)
    fold = MultiHeadSelfAttention2d(8, 8, 2, positional="quadratic", content=True, backend="fold")
    with torch.no_grad():  # fixed logits in inference: the shared bias, fold's "no blocked kernel"
        assert fold.eval().kernel(x) == "shared_bias"
        fold(x)
    assert not [w for w in recwarn if "does not run here" in str(w.message)]


def test_a_kernel_that_cannot_run_is_passed_over_by_the_plan_not_by_itself(monkeypatch):
    """Capability apart from choice (capability.py): a kernel the C++ build, the device or an
    export rules out is passed over by the table, which says so ("cannot run here: ..."), and
    the kernel named is the one that runs: none checks again and falls back."""
    from attnconv.layers.kernels import capability, window

    monkeypatch.setattr(fused, "available", lambda: False)
    monkeypatch.setattr(window, "available", lambda: False)
    local = LocalSelfAttention2d(4, 4, 2, 3)
    assert local.kernel("cpu") == "window"
    assert "passed over: fused (cannot run here: the C++ kernels are not built" in local.kernel(
        "cpu", why=True
    )
    layer = MultiHeadSelfAttention2d(8, 8, 2, positional="relative_learned", backend="fused")
    x = torch.randn(1, 8, 16, 16)
    why = layer.kernel(x, why=True).splitlines()
    assert any(line.startswith("passed over: fused (cannot run here: the C++") for line in why)
    with pytest.warns(UserWarning, match="the fused C.. CPU kernel cannot run here: the C.. "):
        layer(x)
    q = torch.randn(1, 2, 4, 5, 5)
    with pytest.raises(
        ValueError, match="backend='fused' runs on a CPU with the C.. kernels built"
    ):
        local_attention(q, q, q, kernel_size=3, backend="fused")
    case = plan.LocalCase(tracing=True)  # an export cannot trace into the C++ extension
    assert capability.fused_built(case) == "an export cannot trace into the C++ extension"


def test_the_stem_takes_no_window_kernel_that_cannot_mix_its_values():
    """The attention stem's spatially-aware values are a capability Flex and Triton lack: the
    table passes them over on CUDA (the stem no longer renames "flex" to "window" itself)."""
    stem = AttentionStem2d(3, 8, 2, kernel_size=3)
    assert stem.kernel("cuda") == "window"
    assert "spatially-aware values" in stem.kernel("cuda", why=True)


def test_the_sequence_table():
    """MultiHeadAttention, the ViT and the Transformer: PyTorch's fused kernel where it runs,
    the plain equations for returned maps, zero-width q and k, or backend="reference"."""
    from attnconv.layers.functional import sequence_kernel
    from attnconv.layers.mha import MultiHeadAttention

    assert sequence_kernel(None, False, 8) == sequence_kernel("sdpa", False, 8) == "sdpa"
    assert sequence_kernel("reference", False, 8) == "reference"
    assert sequence_kernel(None, True, 8) == sequence_kernel(None, False, 0) == "reference"
    why = sequence_kernel(None, True, 8, why=True).splitlines()
    assert why == [
        "passed over: sdpa (cannot run here: it returns no probabilities (return_attention))",
        'chosen: reference (any: backend="reference", or otherwise: the plain path)',
    ]
    mha = MultiHeadAttention(8, 2)
    assert mha.kernel() == "sdpa" and mha.kernel(return_attention=True) == "reference"
    mha.backend = "reference"
    assert mha.kernel() == "reference"
    with pytest.raises(ValueError, match=r"backend must be None or one of \('reference', 'sdpa'\)"):
        mha.backend = "flex"


def test_forward_tokens_runs_the_kernel_the_plan_names():
    """The paper models' token path: on a CPU the plan names "separable_tokens" for
    position-only row and column logits, attention dropout included, and forward_tokens runs it
    (the output map summed in); on CUDA, or with content, it names the NCHW kernel forward runs."""
    from attnconv.layers.kernels import KERNELS

    lay = MultiHeadSelfAttention2d(8, 8, 2, positional="quadratic", content=False, dropout=0.1)
    x = torch.randn(2, 8, 5, 5)
    assert lay.train().kernel(x, tokens=True) == "separable_tokens"
    assert lay.kernel(x) != "separable_tokens" and lay.kernel(x, tokens=True, device="cuda") == (
        lay.kernel(x, device="cuda")
    )
    assert KERNELS["separable_tokens"].layout == "projected"
    ran = []
    run = KERNELS["separable_tokens"].run
    KERNELS["separable_tokens"] = KERNELS["separable_tokens"]._replace(
        run=lambda *a, **k: ran.append(k["p_drop"]) or run(*a, **k)
    )
    try:
        lay.forward_tokens(x.permute(2, 3, 0, 1))
    finally:
        KERNELS["separable_tokens"] = KERNELS["separable_tokens"]._replace(run=run)
    assert ran == [0.1]
    content = MultiHeadSelfAttention2d(8, 8, 2, positional="quadratic", content=True)
    assert content.kernel(x, tokens=True) == content.kernel(x)
