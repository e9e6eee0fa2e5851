"""precision.hi_kept_low: a bfloat16 q read in float32 (the learned relative tables' logits, the
Triton and Flex paths' q_axis) with autograd keeping q itself, not its float32 copy, from the
forward to the backward; values and gradients bit for bit those of the plain ``hi``."""

from __future__ import annotations

import contextlib
import gc
import weakref

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnconv.layers.kernels import content, triton_axis
from attnconv.layers.mhsa2d import MultiHeadSelfAttention2d
from attnconv.layers.precision import hi, hi_kept_low

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _term(nh: int, dk: int, h: int, w: int, seed: int):
    torch.manual_seed(seed)
    lay = MultiHeadSelfAttention2d(
        8, 8, nh, head_dim=dk, positional="relative_learned", max_size=max(h, w)
    )
    return lay, lay.positional_encoding.term(h, w, content=True)


def _recording(monkeypatch) -> list:
    """Every pack hook's result from here on (a tuple: a view of hi(q) kept as q)."""
    real, stored = torch.autograd.graph.saved_tensors_hooks, []

    def recording(pack, unpack):
        return real(lambda x: stored.append(r := pack(x)) or r, unpack)

    monkeypatch.setattr(torch.autograd.graph, "saved_tensors_hooks", recording)
    return stored


@settings(max_examples=10, deadline=None)
@given(
    b=st.integers(1, 3),
    nh=st.integers(1, 3),
    h=st.integers(1, 5),
    w=st.integers(1, 5),
    dk=st.sampled_from([2, 4, 6]),
    dtype=st.sampled_from([torch.bfloat16, torch.float16]),
    seed=st.integers(0, 99),
)
def test_values_and_gradients_equal_the_plain_upcasts(b, nh, h, w, dk, dtype, seed):
    """content.q_axis_kept_low (the Triton and Flex paths') against term.q_axis(hi(q)), q a
    strided view as the projection gives it: values and the gradients of q and the tables bit
    for bit against the plain upcast of q made contiguous as the path makes it, with both halves
    of hi(q) kept as q; against the strided view's upcast within float32 roundoff (a BLAS may
    sum another layout in another order: docs/benchmarks.md)."""
    lay, term = _term(nh, dk, h, w, seed)
    gen = torch.Generator().manual_seed(seed)
    q0 = torch.randn(b, h * w, nh, dk, generator=gen).to(dtype).transpose(1, 2)  # a view
    g = torch.randn(b, nh, h * w, h + w, generator=gen)
    out = {}
    for case in ("kept", "contiguous", "strided"):
        q = q0.detach().requires_grad_()
        with pytest.MonkeyPatch.context() as m:
            stored = _recording(m)
            if case == "kept":
                y = content.q_axis_kept_low(term, q)[1]
            else:
                y = term.q_axis(hi(q.contiguous() if case == "contiguous" else q))
        assert sum(isinstance(r, tuple) for r in stored) == (2 if case == "kept" else 0)
        out[case] = [y, *torch.autograd.grad(y, [q, *lay.positional_encoding.parameters()], g)]
    for a, r, s in zip(out["kept"], out["contiguous"], out["strided"]):
        assert a.dtype == r.dtype == s.dtype and torch.equal(a, r)
        torch.testing.assert_close(a.float(), s.float())  # float32 roundoff


def test_a_query_changed_in_place_before_the_backward_is_an_error():
    """As autograd's own version check makes it: the backward would otherwise read the new q."""
    _, term = _term(2, 4, 3, 4, 0)
    q = torch.randn(2, 2, 12, 4).bfloat16().requires_grad_()
    q2 = q * 1  # a tensor in the graph that can be written in place
    _, y = content.q_axis_kept_low(term, q2)
    y.sum().backward(retain_graph=True)  # as made: fine
    with torch.no_grad():
        q2.mul_(2)
    with pytest.raises(RuntimeError, match="modified in place"):
        y.sum().backward()


def test_hooks_of_a_user_around_it_keep_their_tensors():
    """Only the innermost saved-tensor hooks apply: under a user's (activation offload,
    checkpointing) the plain upcast runs, so their pack hook sees every saved tensor."""
    _, term = _term(2, 4, 3, 4, 0)
    q = torch.randn(2, 2, 12, 4).bfloat16().requires_grad_()
    seen = []
    with torch.autograd.graph.saved_tensors_hooks(lambda x: seen.append(x) or x, lambda x: x):
        content.q_axis_kept_low(term, q)
    assert any(x.dtype == torch.float32 and x.shape == (48, 2) for x in seen)


def _copy_outlives_the_block(kept: bool) -> bool:
    """Whether the float32 copy of q stays alive after the block while the graph does."""
    _, term = _term(2, 4, 3, 4, 0)
    q = torch.randn(2, 2, 12, 4).bfloat16().requires_grad_()
    if kept:
        with hi_kept_low(q) as q_hi:
            y = term.q_axis(q_hi)
    else:
        q_hi = hi(q)
        y = term.q_axis(q_hi)
    copy = weakref.ref(q_hi)
    del q_hi
    gc.collect()
    alive = copy() is not None
    y.sum().backward()  # the graph still runs, from q itself
    assert q.grad is not None and q.grad.abs().sum() > 0
    return alive


def test_the_float32_copy_is_not_held_for_the_backward():
    assert _copy_outlives_the_block(kept=False)  # the plain upcast: autograd keeps it
    assert not _copy_outlives_the_block(kept=True)


def test_float32_and_no_grad_are_passed_through():
    q = torch.randn(1, 2, 3, 4, requires_grad=True)
    with hi_kept_low(q) as q_hi:
        assert q_hi is q
    with torch.no_grad(), hi_kept_low(q.bfloat16()) as q_hi:
        assert q_hi.dtype == torch.float32


def _stored_q_halves(monkeypatch, kept: bool) -> list[tuple]:
    """What autograd stores in the layer's forward (relative_learned with content, the Triton
    backend, bfloat16 autocast), every pack hook's result recorded: the float32 halves of q
    (B Nh T, dk / 2) the tables' products would keep. ``kept=False``: the plain hi (before)."""
    stored = _recording(monkeypatch)
    if not kept:
        monkeypatch.setattr(content, "hi_kept_low", lambda q: contextlib.nullcontext(hi(q)))
    b, nh, dk, h, w = 2, 3, 16, 4, 5
    torch.manual_seed(0)
    lay = MultiHeadSelfAttention2d(
        8, 8, nh, head_dim=dk, positional="relative_learned", max_size=5, backend="triton"
    ).to(DEVICE)
    x = torch.randn(b, 8, h, w, device=DEVICE, requires_grad=True)
    # the plain upcast: a recording hook of the test's own sees what autograd keeps
    record = torch.autograd.graph.saved_tensors_hooks if not kept else None
    with record(lambda t: t, lambda t: t) if record else contextlib.nullcontext():
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            y = lay(x)
    y.float().sum().backward()
    assert x.grad is not None
    return [
        tuple(r.shape)
        for r in stored
        if isinstance(r, torch.Tensor)
        and r.dtype == torch.float32
        and tuple(r.shape) == (b * nh * h * w, dk // 2)
    ]


@pytest.mark.skipif(
    not triton_axis.INSTALLED or not (torch.cuda.is_available() or triton_axis.interpreted()),
    reason="needs triton and a GPU or TRITON_INTERPRET=1",
)
def test_the_triton_path_keeps_no_float32_copy_of_q(monkeypatch):
    """The learned relative logits' product reads q in float32: with hi_kept_low (and q made
    contiguous, so the product saves views of hi(q), not copies of its halves) autograd keeps
    none of it; the plain hi kept both halves, a float32 copy of q a layer."""
    with monkeypatch.context() as m:
        assert len(_stored_q_halves(m, kept=False)) == 2
    assert _stored_q_halves(monkeypatch, kept=True) == []
