"""Issue 15, item 8: ``torch.export.export`` works for every public layer and a converted network
in eval mode, with the batch size dynamic (image sizes / sequence lengths are static: the
positional tables and the converted convolution's geometry are specialised to them); the
exported program equals the eager module at another batch size. ``torch.jit.script`` on any of
them (or a model holding one) raises our one-line ScriptingUnsupported naming torch.export."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.export import Dim, export

import attnconv
from attnconv.convert import convert_model
from attnconv.exporting import ExportUnsupported, export_model
from attnconv.layers.encodings import POSITIONALS
from attnconv.layers.feedforward import FeedForward
from attnconv.layers.local import LocalSelfAttention2d
from attnconv.layers.mha import MultiHeadAttention, SinusoidalPositionalEncoding
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from attnconv.layers.scripting import ScriptingUnsupported
from attnconv.layers.stem import AttentionStem2d
from attnconv.models import create_model


def _cases():
    torch.manual_seed(0)
    img, seq = torch.randn(2, 8, 6, 6), torch.randn(2, 5, 8)
    out = [
        (f"mhsa2d-{p}", MultiHeadSelfAttention2d(8, 8, 2, positional=p, max_size=16), img)
        for p in POSITIONALS
    ]
    out += [
        ("local", LocalSelfAttention2d(8, 8, 2, 3), img),
        ("local-zeros-qr", LocalSelfAttention2d(8, 8, 2, 3, padding="zeros", logits="qr"), img),
        ("stem", AttentionStem2d(8, 8, 2, kernel_size=3, mixtures=2, pool=1), img),
        ("mha", MultiHeadAttention(8, 2), seq),
        ("feedforward", FeedForward(8, 16), seq),
        ("sinusoidal", SinusoidalPositionalEncoding(8), seq),
    ]
    net = create_model("tiny_cnn", num_classes=10, width=8)
    x = torch.randn(2, 3, 32, 32)
    out.append(("converted-hard", convert_model(net, inplace=False), x))
    out.append(("converted-soft", convert_model(net, alpha=4.0, inplace=False), x))
    return out


CASES = _cases()


@pytest.mark.parametrize("name, module, x", CASES, ids=[c[0] for c in CASES])
def test_export_with_dynamic_batch_equals_eager(name, module, x):
    module.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = export(module, (x,), dynamic_shapes=({0: Dim("batch", min=1, max=256)},))
    for b in (1, 3):
        xb = torch.cat([x] * 2)[:b]
        with torch.no_grad():
            torch.testing.assert_close(ep.module()(xb), module(xb), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name, module, x", CASES, ids=[c[0] for c in CASES])
def test_torchscript_is_our_one_line_message(name, module, x):
    if name == "feedforward":  # plain Linear / activation / Dropout: TorchScript compiles it
        torch.jit.script(module)
        return
    with pytest.raises(ScriptingUnsupported, match=r"does not support torch.jit.script") as e:
        torch.jit.script(module)
    assert "torch.export.export" in str(e.value) and "\n" not in str(e.value)


def test_torchscript_of_a_model_holding_a_layer_is_our_message():
    model = create_model("sa_quadratic", num_classes=10, num_layers=1, hidden_size=16, num_heads=2)
    with pytest.raises(ScriptingUnsupported, match="MultiHeadSelfAttention2d does not support"):
        torch.jit.script(model)


# ---- export_model: the paper models and converted CNNs for inference (issue 77, item 5) ----
SMALL_SA = dict(hidden_size=16, num_layers=2, num_heads=2, ff_size=16, downsample=4)


def _sa(name: str):
    torch.manual_seed(0)
    return create_model(name, num_classes=10, **SMALL_SA)


def _converted_resnet18():
    torch.manual_seed(0)
    cnn = create_model("resnet18_cifar", num_classes=10, widths=[4, 8, 16, 32]).eval()
    return convert_model(cnn, inplace=False)


MODELS = {
    "sa_quadratic": lambda: _sa("sa_quadratic"),
    "sa_learned": lambda: _sa("sa_learned"),
    "sa_learned_content": lambda: _sa("sa_learned_content"),
    "converted-resnet18": _converted_resnet18,
}
_PROGRAMS: dict = {}


def _program(name: str):
    """(eager model in eval mode, its exported program), exported once per test session."""
    if name not in _PROGRAMS:
        model = MODELS[name]().train()
        ep = export_model(model, torch.randn(4, 3, 32, 32))
        assert model.training  # its mode is restored
        _PROGRAMS[name] = (model.eval(), ep)
    return _PROGRAMS[name]


@pytest.mark.parametrize("name", list(MODELS))
@given(batch=st.integers(1, 9), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=8)
def test_exported_model_equals_eager_at_any_batch(name, batch, seed):
    """One program, exported at batch 4 on one thread (the separable kernel's image blocks
    once fixed the batch there): at every batch its outputs equal eager's to float32's default
    tolerances."""
    model, ep = _program(name)
    x = torch.randn(batch, 3, 32, 32, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), model(x))


def test_exported_program_saves_and_loads(tmp_path):
    """The program holds plain torch ops only: torch.export.save / load, the same outputs."""
    model, ep = _program("sa_quadratic")
    torch.export.save(ep, tmp_path / "sa.pt2")
    loaded = torch.export.load(tmp_path / "sa.pt2")
    targets = {str(n.target) for n in loaded.graph.nodes if n.op == "call_function"}
    assert not [t for t in targets if "attnconv" in t], targets
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(loaded.module()(x), model(x))


def test_export_of_a_converted_checkpoint(tmp_path):
    """`attnconv convert NAME --out DIR`, then load_model(DIR): the converted network exports
    and equals eager at another batch."""
    from attnconv.cli import main
    from attnconv.loading import load_model

    assert main(["convert", "tiny_cnn", "--num-images", "4", "--out", str(tmp_path / "c")]) == 0
    model, _ = load_model(tmp_path / "c")
    ep = export_model(model, torch.randn(2, 3, 32, 32))
    x = torch.randn(5, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), model(x))


def test_fixed_batch_export():
    """dynamic_batch=False: the example's batch only."""
    ep = export_model(_sa("sa_learned"), torch.randn(2, 3, 32, 32), dynamic_batch=False)
    with pytest.raises(Exception, match="2"):
        ep.module()(torch.randn(3, 3, 32, 32))


def test_an_option_that_cannot_export_is_one_line():
    """backend='triton' is refused before tracing, in one line naming the option and layer."""
    model = _sa("sa_quadratic")
    attnconv.set_backend(model, "triton")
    with pytest.raises(ExportUnsupported) as e:
        export_model(model, torch.randn(2, 3, 32, 32))
    msg = str(e.value)
    assert "\n" not in msg and "backend='triton' (layer " in msg and "does not export" in msg


class _DataDependent(torch.nn.Module):
    def forward(self, x):
        return x if x.sum() > 0 else -x  # a branch on a value: the tracer refuses it


def test_a_tracer_failure_is_one_line_with_the_cause_kept():
    with pytest.raises(ExportUnsupported) as e:
        export_model(_DataDependent(), torch.randn(2, 3))
    msg = str(e.value)
    assert msg.startswith("attnconv: _DataDependent cannot export (") and "\n" not in msg
    assert e.value.__cause__ is not None and len(msg) < 300


def test_a_layers_own_error_is_not_rewritten():
    """A model's ValueError about its input stays the model's error."""
    with pytest.raises(ValueError, match="expected an NCHW image batch"):
        export_model(_sa("sa_quadratic"), torch.randn(2, 4, 32, 32))


def test_export_model_needs_example_tensors():
    with pytest.raises(ExportUnsupported, match="needs example tensors"):
        export_model(_sa("sa_quadratic"))
