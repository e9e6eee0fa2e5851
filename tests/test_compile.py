"""torch.compile of every registry family (issue 77): no graph break in train or eval mode
(``torch._dynamo.explain``), the compiled outputs and gradients equal to eager's, Inductor on
the paper's models, and ``train.compile`` end to end.

``backend="aot_eager"`` runs the graph AOTAutograd traces with torch's own ops and the default
generator, so the hash dropout's seeds (one 0-dim tensor drawn in the graph,
``functional.seed_tensor``) and torch's dropout masks are the eager ones under one seed: the
training step with its default dropout is compared whole. Inductor draws its own random
numbers unless ``fallback_random`` (set in its test).

torch 2.8, the floor, compiles every family whole too (its CI runs ``test_no_graph_break``):
the kernel plan reads its Case through functions and loops, since 2.8's Dynamo reads no
property of a NamedTuple and takes no default in next() of a generator (a graph break at
every attention layer otherwise)."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

import attnconv
from attnconv.convert import convert_model
from attnconv.train import compiled
from attnconv.train.config import config_from_dict
from attnconv.train.loop import Trainer
from train_helpers import small, use_cache

SMALL_SA = dict(hidden_size=16, num_layers=2, num_heads=2, ff_size=16, img_size=16)
SMALL_SASA = dict(widths=[4, 4, 4, 4], depths=[1, 1, 1, 1], num_heads=2, stem_heads=2)
FAMILIES = (
    "sa_quadratic",
    "sa_quadratic_generalized",
    "sa_learned",
    "sa_learned_content",
    "sasa_resnet26_cifar",
    "sasa_resnet26_convstem_cifar",
    "vit_tiny_cifar",
    "transformer_small",
    "converted",  # convert_model(resnet18_cifar): Theorem 1's hard heads
)
DROPOUT = {  # the families' dropout options (None: the family has none)
    "sa": dict(dropout=0.1, attn_dropout=0.1),  # their defaults (hash dropout, attention's)
    "vit": dict(dropout=0.1, attn_dropout=0.1),  # torch's nn.Dropout, SDPA's
    "transformer": dict(dropout=0.1),
}


def family(name: str, dropout: bool = True):
    """A small model of ``name`` and its inputs; ``dropout=False``: every dropout at 0."""
    torch.manual_seed(0)
    kind = name.split("_")[0]
    drop = DROPOUT.get(kind, {})
    drop = drop if dropout else dict.fromkeys(drop, 0.0)
    x = (torch.randn(2, 3, 16, 16),)
    if kind == "sa":
        m = attnconv.create_model(name, downsample=2, **SMALL_SA, **drop)
    elif kind == "sasa":
        m = attnconv.create_model(name, img_size=16, **SMALL_SASA)
    elif kind == "vit":
        vit = dict(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2)
        m = attnconv.create_model(name, **vit, **drop)
    elif kind == "transformer":
        sizes = dict(src_vocab_size=20, d_model=16, num_heads=2, d_ff=16, max_len=16)
        layers = dict(num_encoder_layers=2, num_decoder_layers=2)
        m = attnconv.create_model(name, **sizes, **layers, **drop)
        x = (torch.randint(3, 20, (2, 7)), torch.randint(3, 20, (2, 5)))
    else:
        cnn = attnconv.create_model("resnet18_cifar", widths=[4, 8, 16, 32])
        m = convert_model(cnn.eval())
    return m, x


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Each test compiles afresh (many share the layers' code objects: no recompile limit)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _step(model, x, train: bool):
    """(output, gradients of every parameter) of one forward (and backward in training)."""
    model.train(train)
    out = model(*x)
    if not train:
        return out, []
    out.float().sin().sum().backward()  # (not zero at a zero output: ViT's head starts so)
    return out, [p.grad for p in model.parameters()]


def _same(name: str, train: bool, dropout: bool, backend: str = "aot_eager", tol=None):
    """The compiled model's output and gradients against eager's, under one seed."""
    eager, x = family(name, dropout)
    model = copy.deepcopy(eager)
    compiled_model = torch.compile(model, backend=backend, fullgraph=True)
    torch.manual_seed(1)
    y1, g1 = _step(eager, x, train)
    torch.manual_seed(1)
    y2, g2 = _step(compiled_model, x, train)
    # the converted network's hard heads: a shift eager, the attention path compiled
    kw = tol or (dict(atol=1e-4, rtol=1e-3) if name == "converted" else {})
    torch.testing.assert_close(y2, y1, **kw)
    assert len(g1) == len(g2)
    for a, b in zip(g1, g2):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(b, a, **kw)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("name", FAMILIES)
def test_no_graph_break(name, train):
    """One graph, no break, in training (the family's default dropout) and in eval mode."""
    model, x = family(name)
    model.train(train)
    e = torch._dynamo.explain(model)(*x)
    reasons = [str(b.reason).splitlines()[0] for b in e.break_reasons]
    assert e.graph_break_count == 0 and e.graph_count == 1, reasons


@pytest.mark.parametrize("name", FAMILIES)
def test_compiled_eval_equals_eager(name):
    """fullgraph=True compiles; the eval outputs equal eager's (to float32 rounding)."""
    _same(name, train=False, dropout=False)


@pytest.mark.parametrize("name", FAMILIES)
def test_compiled_training_gradients_equal_eager(name):
    """A training step without dropout: every parameter's gradient equals eager's."""
    _same(name, train=True, dropout=False)


@pytest.mark.parametrize("name", [n for n in FAMILIES if n.split("_")[0] in DROPOUT])
def test_compiled_dropout_draws_the_eager_masks(name):
    """With the default dropout, one seed: the compiled step's output and gradients equal
    eager's (the hash masks redrawn from the same seeds; torch's dropout from the same
    generator), and differ under another seed (the dropout is on)."""
    _same(name, train=True, dropout=True)
    grads = []
    for seed in (1, 2):  # (ViT's head starts at zero: its output too, not its gradients)
        model, x = family(name)
        torch.manual_seed(seed)
        grads.append(torch.cat([g.flatten() for g in _step(model, x, True)[1] if g is not None]))
    assert not torch.allclose(*grads)


def test_a_second_batch_size_recompiles_with_the_custom_ops():
    """The last, smaller batch of an epoch: a second graph (dynamic batch), the same values."""
    eager, (x,) = family("sa_learned_content")
    model = torch.compile(copy.deepcopy(eager), backend="aot_eager", fullgraph=True)
    for b in (2, 3, 1):
        xb = torch.randn(b, *x.shape[1:])
        torch.manual_seed(b)
        y1, _ = _step(eager, (xb,), True)
        torch.manual_seed(b)
        y2, _ = _step(model, (xb,), True)
        torch.testing.assert_close(y2, y1)


@pytest.mark.slow  # Inductor's C++ compile: minutes on a 2-core CPU
@pytest.mark.parametrize("name", ["sa_quadratic", "sa_learned_content"])
def test_inductor_trains_the_paper_models_with_their_dropout(name):
    """Inductor compiles the default dropout (the masks were its int64 hash, which its CPU code
    did not compile: now custom ops) and the kernels; with torch's random draws in the graph
    (fallback_random) the step equals eager's."""
    import torch._inductor.config as inductor

    with inductor.patch(fallback_random=True):
        _same(name, train=True, dropout=True, backend="inductor", tol=dict(atol=1e-5, rtol=1e-4))


# ---- train.compile -------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    use_cache(tmp_path_factory.mktemp("decoded"))


def _trainer(cifar_zip, tmp_path, model: dict, **train) -> Trainer:
    d = small(
        cifar_zip,
        tmp_path / "run",
        model=model,
        data={"max_per_class": 10, "eval_max_per_class": 2},
        train={"epochs": 1, "steps_per_epoch": 2, "compile": True, **train},
    )
    return Trainer(config_from_dict(d))


@pytest.mark.slow  # Inductor: about a minute
def test_train_compile_on_the_cpu_recipe(tmp_path, caplog):
    """`attnconv train cpu/sa_quadratic --set train.compile=true`: trains compiled (its
    attention and hidden dropout included), nothing said of a fallback."""
    from attnconv.cli import main

    args = ["train", "cpu/sa_quadratic", "--out", str(tmp_path)]
    sets = ("train.compile=true", "train.epochs=1", "train.steps_per_epoch=2")
    sets += ("data.max_per_class=10", "data.eval_max_per_class=2", "train.progress=false")
    with caplog.at_level(logging.WARNING):
        assert main([*args, *(a for s in sets for a in ("--set", s))]) in (0, None)
    assert "training eager" not in caplog.text
    assert (tmp_path / "checkpoints").is_dir()


@pytest.mark.slow  # Inductor: about a minute
def test_train_compile_on_a_small_sasa_model(cifar_zip, tmp_path, caplog):
    """A small SASA ResNet (window attention, attention stem) trains compiled."""
    model = {"name": "sasa_resnet26_cifar", "kwargs": SMALL_SASA}
    tr = _trainer(cifar_zip, tmp_path, model)
    with caplog.at_level(logging.WARNING):
        tr.fit()
    assert tr.net is not tr.eager_net and "training eager" not in caplog.text


def test_an_option_that_cannot_compile_trains_eager_with_one_line(cifar_zip, tmp_path, caplog):
    """model.backend='flex' on a CPU (no CPU backward for compiled FlexAttention): one warning
    line naming the option, and the run trains eager."""
    model = {"name": "sa_learned_content", "kwargs": dict(SMALL_SA, img_size=32, downsample=4)}
    with caplog.at_level(logging.WARNING):
        tr = _trainer(cifar_zip, tmp_path, {**model, "backend": "flex"})
    lines = [r.getMessage() for r in caplog.records if "train.compile" in r.getMessage()]
    assert len(lines) == 1 and "backend='flex'" in lines[0] and "training eager" in lines[0]
    assert tr.net is tr.eager_net
    tr.fit()


def test_a_failed_compile_says_one_line_and_trains_eager(cifar_zip, tmp_path, caplog):
    """A compiler failure at the first step (here a stand-in for Inductor's): one line, not the
    compiler's output, and the step runs again eager."""

    class InductorError(RuntimeError):
        __module__ = "torch._inductor.exc"

    class Broken(torch.nn.Module):
        def forward(self, x):
            raise InductorError("C++ compile error\n" + "compiler output\n" * 50)

    tr = _trainer(cifar_zip, tmp_path, {"name": "tiny_cnn", "kwargs": {"width": 8}})
    tr.net = Broken()
    with caplog.at_level(logging.WARNING):
        tr.fit()
    lines = [r.getMessage() for r in caplog.records if "train.compile" in r.getMessage()]
    assert len(lines) == 1 and "InductorError: C++ compile error" in lines[0]
    assert "compiler output" not in caplog.text and tr.net is tr.eager_net and tr.step == 2


def test_blocker_names_the_option():
    """The option refused: flex training on a CPU (not on CUDA); triton compiles (its custom
    ops, tests/test_triton_ops.py)."""
    model, _ = family("sa_learned_content")
    assert compiled.blocker(model, torch.device("cpu")) is None
    attnconv.set_backend(model, "flex")
    why = compiled.blocker(model, torch.device("cpu"))
    assert why.startswith("backend='flex' (layer layers.0.attn) does not compile")
    assert compiled.blocker(model, torch.device("cuda")) is None
    attnconv.set_backend(model, "triton")
    assert compiled.blocker(model, torch.device("cpu")) is None
