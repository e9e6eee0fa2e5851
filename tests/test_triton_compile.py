"""The Triton kernels compile for the GPUs they are written for (sm_90: the H100/H200 a session
may be lent; sm_80: A100), on this CPU machine, through the same launch code a GPU call runs
(layers/kernels/triton_compile.py, in a process without TRITON_INTERPRET). The interpreter tests
(test_triton_axis.py) check values; these check what only the compiler refuses: a global that
is not a constexpr (the kernels read one, INTERPRET, and no GPU could compile them until this
test), tl.dot shapes and dtypes, and the shared memory each block asks for against the
architecture's limit."""

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

triton = pytest.importorskip("triton")

from attnconv.layers.kernels import triton_axis, triton_compile  # noqa: E402
from attnconv.layers.kernels.triton_compile import SHARED_LIMIT, Case  # noqa: E402
from compile_helpers import compiled_python  # noqa: E402


def _compile(*args: str) -> list[dict]:
    out = compiled_python("-m", "attnconv.layers.kernels.triton_compile", "--json", *args)
    return [json.loads(line) for line in out.splitlines()]


def _check(rows: list[dict], cases: list[Case], archs: list[int]):
    want = [
        (str(c), a, k)
        for c in cases
        for a in archs
        for k in (["_fwd", "_bwd_dq_delta", "_bwd_dq", "_bwd_dkdv"] if c.train else ["_fwd"])
    ]
    assert [(r["case"], r["arch"], r["kernel"]) for r in rows] == want
    for r in rows:
        assert 0 < r["shared"] <= SHARED_LIMIT[r["arch"]], r
        if r["registers"] is not None:  # cuobjdump beside triton: the cubin was really built
            assert 0 < r["registers"] <= 255, r
        if r["mma"] is not None:  # the products on tensor cores exactly where the dtype allows
            tensor_cores = r["case"].split()[0] in ("bf16", "fp16", "tf32")
            assert (r["mma"] > 0) == tensor_cores, r  # float32 / float64: FMA by design


@pytest.mark.slow  # every kernel and tile compiled for sm_90
def test_kernels_compile_for_sm90_within_its_shared_memory():
    _check(_compile("--quick"), triton_compile.cases(quick=True), [90])


@pytest.mark.slow
def test_every_case_compiles_for_sm90_sm80_and_sm86():
    """sm_86/89 (RTX 30xx/40xx) give a block 99 KiB: with Triton's default 64 x 64 blocks some
    backward kernels fitted there only at fewer pipelining stages (triton_axis.launch steps
    down); with the swept tiles (triton_tiles) every case fits at Triton's default 3. The SASA
    window kernels (triton_local.py) among them."""
    assert any(c.window for c in triton_compile.cases())
    rows = _compile("--arch", "90", "80", "86")
    _check(rows, triton_compile.cases(), [90, 80, 86])
    assert {r["stages"] for r in rows} == {3}


@pytest.mark.slow
def test_the_envelope_fits_sm80_and_sm90_at_the_first_rung():
    """fit compiles nothing inside ENVELOPE on sm_80/sm_90-sized GPUs: this is why."""
    rows = _compile("--envelope", "--arch", "80", "90")
    _check(rows, triton_compile.envelope(), [80, 90])
    assert {r["stages"] for r in rows} == {3}  # the first rung: the tile's own query block


def test_inside_the_envelope_means_rows_to_64_the_tested_widths_and_a_large_gpu():
    inside, limit = triton_compile.inside, SHARED_LIMIT[80]
    bf16, f32 = torch.bfloat16, torch.float32
    assert inside(Case(bf16, 64, 64, 128, 128), limit) and inside(Case(f32, 3, 5, 64, 8), limit)
    assert not inside(Case(f32, 16, 16, 128, 64), limit)  # wider than float32's corner
    assert not inside(Case(bf16, 1, 128, 16, 16), limit)  # rows over 64: 128-key blocks
    assert not inside(Case(torch.float64, 4, 4, 8, 8), limit)  # gradcheck's: always compiled
    assert not inside(Case(bf16, 8, 8, 16, 16), SHARED_LIMIT[86])  # a 99 KiB GPU: compiled


class _Kernel:
    """A launch target whose blocks fit only at `stages` or fewer and a query block of `m` or
    less, refused as Triton refuses a block: OutOfResources at launch."""

    __name__ = "k"

    def __init__(self, stages, m=64):
        self.stages, self.m, self.tried = stages, m, []

    def __getitem__(self, grid):
        def run(*args, num_stages, BLOCK_M, **meta):
            self.tried.append((num_stages, BLOCK_M, grid))
            if num_stages > self.stages or BLOCK_M > self.m:
                raise triton.runtime.errors.OutOfResources(num_stages * 50_000, 101376, "shared")

        return run


def test_launch_steps_down_until_the_block_fits():
    x, grid = torch.zeros(1), lambda m: (100 // m["BLOCK_M"],)
    assert triton_axis.rungs({"BLOCK_M": 64}) == [(3, 64), (2, 64), (1, 64), (1, 32), (1, 16)]
    k = _Kernel(stages=1)
    triton_axis.launch(k, grid, (x,), {"A": 1, "BLOCK_M": 64})
    assert k.tried == [(3, 64, (1,)), (2, 64, (1,)), (1, 64, (1,))]
    triton_axis.launch(k, grid, (x,), {"A": 1, "BLOCK_M": 64})  # remembered: no refusal again
    assert k.tried[3:] == [(1, 64, (1,))]
    k = _Kernel(stages=1, m=16)  # the query block halves; the grid follows it
    triton_axis.launch(k, grid, (x,), {"A": 2, "BLOCK_M": 64})
    assert k.tried[-2:] == [(1, 32, (3,)), (1, 16, (6,))]
    k = _Kernel(stages=3)  # fits at once: Triton's default, the grid as given
    triton_axis.launch(k, (7,), (x,), {"A": 3, "BLOCK_M": 64})
    assert k.tried == [(3, 64, (7,))]
    with pytest.raises(triton.runtime.errors.OutOfResources):
        triton_axis.launch(_Kernel(stages=0), (1,), (x,), {"A": 4, "BLOCK_M": 16})


_REFUSAL = """
from attnconv.layers.kernels.triton_compile import Case, refusal, SHARED_LIMIT
import torch
big = Case(torch.bfloat16, 8, 128, 256, 256)  # the widest rows and heads the kernel takes
print(refusal(big, 86, SHARED_LIMIT[86]))
print(refusal(Case(torch.bfloat16, 5, 7, 8, 8, p=0.1), 86, SHARED_LIMIT[86]))
"""


@pytest.mark.slow
def test_a_call_whose_blocks_exceed_the_gpus_shared_memory_is_refused_in_one_line():
    """The plan passes the Triton kernel over with this line (capability.triton_axis_fits asks
    triton_compile.fit for the GPU at hand): bf16 at head width 256 and rows of 128 needs more than
    sm_86's 99 KiB at every rung of triton_axis.launch."""
    big, small = compiled_python("-c", _REFUSAL).splitlines()
    assert (
        "block needs" in big and "the GPU gives 99 KiB (head width 256, image rows of 128)" in big
    )
    assert small == "None"


_DEVICE_LIMIT = """
from attnconv.layers.kernels.triton_compile import Case, compile_case, SHARED_LIMIT
import torch
case = Case(torch.float32, 16, 16, 128, 128, tf32=True)
for c in compile_case(case, 90, SHARED_LIMIT[86]):  # sm_90 code, a 99 KiB GPU's limit
    print(c.kernel, c.stages, c.block_m, c.shared, c.limit, c.fits)
"""


@pytest.mark.slow
def test_the_rung_search_fits_the_limit_it_is_given_not_the_architectures():
    """refusal passes the GPU's own shared memory: the rungs walk down to it (tf32 dK/dV at head
    width 128 needs more than 99 KiB at 3 stages), where sm_90's table limit would have
    stopped at the first."""
    rows = [line.split() for line in compiled_python("-c", _DEVICE_LIMIT).splitlines()]
    assert [r[0] for r in rows] == ["_fwd", "_bwd_dq_delta", "_bwd_dq", "_bwd_dkdv"]
    assert all(int(r[3]) <= SHARED_LIMIT[86] == int(r[4]) and r[5] == "True" for r in rows)
    assert min(int(r[1]) for r in rows) < 3  # some kernel stepped down


def test_a_call_trains_when_any_input_needs_a_gradient_the_axis_logits_too():
    """fit is asked about the backward kernels whenever one will run: also when only the
    positional encoding learns (frozen projections), through the axis logits."""
    q, k, v = (torch.zeros(1, 1, 4, 8) for _ in "qkv")
    qa = torch.zeros(1, 1, 4, 4, requires_grad=True)
    assert triton_axis.trains(q, k, v, qa) and not triton_axis.trains(q, k, v, qa.detach())
    with torch.no_grad():
        assert not triton_axis.trains(q, k, v, qa)


def test_the_compile_check_refuses_the_interpreter():
    cmd = [sys.executable, "-m", "attnconv.layers.kernels.triton_compile", "--quick"]
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "unset TRITON_INTERPRET" in out.stderr


def test_the_compile_check_without_triton_names_the_install(monkeypatch):
    monkeypatch.setattr(triton_axis, "INSTALLED", False)
    with pytest.raises(SystemExit, match=r"triton is not installed \(pip install triton\)"):
        triton_compile.main(["--quick"])


def test_the_compiled_signature_names_every_parameter_of_each_launch():
    for kernel, args, meta in triton_compile.launches(Case(torch.bfloat16, 6, 10, 48, 40, p=0.1)):
        sig = triton_compile.signature(kernel, args, meta)
        names = [n for n in kernel.arg_names if n != "N"]  # N: a constexpr's default
        assert list(sig) == names, kernel.__name__  # nothing missing or extra, in order
        assert sig["Q"] == "*bf16" and sig["QA"] == "*fp32" and sig["SC"] == "*fp32"


def test_the_check_compiles_what_the_launch_code_builds():
    """The compile check takes its launches from triton_axis itself (not a copy of them)."""
    case = Case(torch.float16, 4, 9, 24, 16, p=0.2, per_image=False)
    (fwd, _, meta), *back = triton_compile.launches(case)
    assert fwd is triton_axis._fwd
    dq, dkdv = triton_axis._bwd_dq, triton_axis._bwd_dkdv
    assert [k for k, _, _ in back] == [dq, dq, dkdv]
    assert [m.get("DELTA_PASS") for _, _, m in back] == [True, False, None]  # delta first
    assert meta["DKP"] == 32 and meta["DVP"] == 16 and meta["WP"] == 16 and meta["DROP"]
    assert not meta["PER_IMAGE"]


def test_a_parameter_the_launch_does_not_give_is_named():
    kernel, args, meta = triton_compile.launches(Case(torch.bfloat16, 4, 4, 16, 16))[0]
    with pytest.raises(TypeError, match="gives no SHIFT"):
        triton_compile.signature(kernel, args[:-1], meta)


def test_the_test_compiles_benchmark_compiles_what_it_recorded():
    """benchmarks/triton_test_compiles.py's compiling half, on one recorded launch."""
    (kernel, _, meta), *_ = triton_compile.launches(Case(torch.bfloat16, 4, 4, 16, 16))
    seen = [
        (kernel.__name__, tuple((k, v) for k, v in meta.items() if k != "ACC"), "torch.bfloat16")
    ]
    script = str(Path(__file__).resolve().parents[1] / "benchmarks" / "triton_test_compiles.py")
    out = compiled_python(script, "--child", repr(seen), timeout=300)
    assert out.startswith("1 kernels launched by tests/test_triton_axis.py; compiled for sm_90")
    assert "bfloat16" in out.splitlines()[1]


_SHARED_BLOCK = """
from attnconv.layers.kernels.triton_compile import Case, check, SHARED_LIMIT
import torch
case = Case(torch.float32, 8, 128, 64, 64, tf32=True)
fit = check(case, 86, SHARED_LIMIT[86])  # sm_86: a 99 KiB GPU
print(fit.why, fit.block_m)
from attnconv.layers.kernels.triton_compile import launches
for kernel, _, meta in launches(case, fit.block_m):
    print(kernel.__name__, meta["BLOCK_M"])
"""


@pytest.mark.slow
def test_a_gpu_that_refuses_one_kernels_block_gets_one_block_for_all_three():
    """tf32 at head width 64 and rows of 128 on sm_86: the forward fits a 32-query block, the
    dK/dV kernel only 16. The check hands the call the smaller block for all three kernels
    (content.triton passes it on), so the backward recomputes the logits as the forward did."""
    out = compiled_python("-c", _SHARED_BLOCK).splitlines()
    assert out[0] == "None 16"
    assert out[1:] == ["_fwd 16", "_bwd_dq 16", "_bwd_dq 16", "_bwd_dkdv 16"]


def test_the_axis_logits_add_a_fifth_to_a_plain_flash_loop_at_most():
    """benchmarks/triton_loops.py: the forward's key loop against a plain flash-attention loop
    at the same tile, compiled for sm_90. Without dropout the row and column logits cost 1.19x
    the plain loop's instructions (bf16, 32x32, width 16; 2026-11-28, triton 3.9 and 3.6), with
    the same tensor-core instructions; a change that makes the loop dearer than 1.3x, or moves
    a product off the tensor cores, shows here."""
    out = compiled_python(
        str(Path(__file__).parents[1] / "benchmarks/triton_loops.py"), "--quick", "--json"
    )
    (row,) = [json.loads(line) for line in out.splitlines()]
    assert row["plain"] > 100 and row["ours"] > 100  # a loop was found in each listing
    assert row["ours"] <= 1.3 * row["plain"], row
    assert row["ours_mma"] == row["plain_mma"] > 0, row


@pytest.mark.parametrize("window", [0, 3])
def test_float64_launches_carry_their_scale_in_float64(window):
    """A Python float reaches a compiled kernel as fp32 (Triton's launcher), where the
    interpreter keeps it float64: float64 kernels given scale = 0.37 as a float would match the
    plain equations here and miss them by ~1e-8 on a GPU. Every launch carries [scale,
    1 / (1 - p)] in a tensor of its accumulation dtype, which the float64 kernels read (the
    others take the floats, exact for their fp32 arithmetic)."""
    p = 0.0 if window else 0.1
    for dtype in (torch.float64, torch.float32, torch.bfloat16):
        case = Case(dtype, 5, 7, 8, 8, p=p, window=window)
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        for kernel, args, _ in triton_compile.launches(case):
            sc = dict(zip(kernel.arg_names, args))["SC"]
            want = torch.tensor([8**-0.5, 1 / (1 - p)], dtype=torch.float64)
            assert sc.dtype == acc and torch.equal(sc.double(), want.to(acc).double())
    src = inspect.getsource(triton_axis._fwd.fn)
    assert "if ACC == tl.float64:" in src and "tl.load(SC)" in src


def test_a_compiled_forward_decides_the_fit_at_trace_time(monkeypatch):
    """Under torch.compile the GPU check (device properties, a compile outside the envelope) runs
    once while Dynamo traces, its answer a constant of the graph: no graph break (here a stand-in
    GPU: the properties and the check replaced)."""
    props = type("Props", (), dict(major=9, minor=0, shared_memory_per_block_optin=1))
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    monkeypatch.setattr(triton_compile, "check", lambda *a: asked.append(a) or (None, 32))

    def f(x):
        why, block = triton_compile.fit_on(0, x.dtype, 4, 5, x.shape[-1], 8, 0.1, True, True, 0)
        return x * block if why is None else x

    x = torch.ones(2, 16)
    torch._dynamo.reset()
    assert torch._dynamo.explain(f)(x).graph_break_count == 0
    compiled = torch.compile(f, backend="eager", fullgraph=True)
    assert torch.equal(compiled(x), x * 32) and torch.equal(compiled(x), x * 32)
    assert len(asked) == 2  # once by explain's trace, once by the compile's; no call at a run
    assert asked[0][0].dtype == torch.float32 and asked[0][1:] == (90, 1)
    torch._dynamo.reset()
