"""torch.compile on the paper models: attnconv eager, attnconv compiled and the plain model
compiled, training step and inference, interleaved in one process.

`attnconv bench --suite compile [--quick] [--threads N] [--repeats N] [--out DIR]
[--update-results] [-- --scale cpu|paper|both --models M [M ...] --backend B]`

Per paper model (sa_quadratic, sa_learned, sa_learned_content), at two scales: ``cpu`` (the
recipe ``cpu/MODEL``: its model options and its batch) and ``paper`` (the model's defaults:
hidden 400, feed-forward 512, 6 layers, 9 heads, 16x16 tokens; batch 8), with the model's
default dropout (0.1 on the attention probabilities and on the hidden states), three codes:

- ``attnconv``: the model as it trains eager, its kernels chosen by the plan;
- ``attnconv compiled``: ``torch.compile(model, fullgraph=True)`` (Inductor unless
  ``--backend``): the kernels as custom ops inside the graph;
- ``plain compiled``: the same model with ``attnconv.set_backend(model, "reference")`` (the
  plain equations, dense logits) under the same ``torch.compile``: what a user writes and
  compiles;

each in two modes: a training step (forward, cross-entropy, backward, SGD step with momentum
0.9; the compiled module is the network, as ``train.compile`` runs it) and inference (eval
mode, ``torch.no_grad``, one forward). Every case has its own copy of the weights.

Method: each scale runs in one fresh subprocess (``--threads``, default 1) with an empty
Inductor cache of its own (a temporary folder), so a compile is a first compile: every case is
built, its first call timed (``compile s``: a compiled case's first call less its median), then
``--repeats`` rounds (default 7) run every case once each, round-robin, so that every ratio
compares calls under the same load. Reported: medians and, within a scale and mode, the ratios
``compiled x eager`` (attnconv eager time / attnconv compiled time), ``x plain compiled``
(plain compiled time / attnconv compiled time) and ``eager x plain compiled`` (plain compiled
time / attnconv eager time); above 1 the first named is faster. ``payback steps``: the compile
time over the time compiling saves a step (none when it saves nothing). Writes
<out>/compile_models.{json,md} (benchmarks/results/ with ``--update-results``).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from attnconv.bench.common import markdown_table, output_dir, suite_parser, write_results
from attnconv.cpuinfo import cpu_name

NAME = "compile_models"
SA_MODELS = ("sa_quadratic", "sa_learned", "sa_learned_content")
CODES = ("attnconv", "attnconv compiled", "plain compiled")
MODES = ("train", "infer")
PAPER_BATCH = 8
QUICK = ({"hidden_size": 16, "num_layers": 1, "num_heads": 2, "ff_size": 16, "downsample": 4}, 2)
COLUMNS = [
    ("scale", "scale", ""),
    ("model", "model", ""),
    ("batch", "B", ""),
    ("mode", "mode", ""),
    ("compiled_x_eager", "compiled x eager", ".2f"),
    ("x_plain", "x plain compiled", ".2f"),
    ("eager_x_plain", "eager x plain compiled", ".2f"),
    ("compile_s", "compile s (attnconv)", ".0f"),
    ("plain_compile_s", "compile s (plain)", ".0f"),
    ("payback", "payback steps", ".0f"),
]


def scale_options(model: str, scale: str) -> tuple[dict, int]:
    """(the model's constructor options, the batch) at a scale: ``cpu`` reads the recipe
    ``cpu/MODEL`` (its base merged), ``paper`` is the model's defaults at batch 8."""
    if scale == "quick":
        return dict(QUICK[0]), QUICK[1]
    if scale == "paper":
        return {}, PAPER_BATCH
    from attnconv.catalog import find_recipe
    from attnconv.train.config import read_yaml

    recipe = read_yaml(find_recipe(f"cpu/{model}"))
    return dict(recipe["model"].get("kwargs") or {}), int(recipe["train"]["batch_size"])


def make_case(model: str, scale: str, code: str, mode: str, backend: str = "inductor"):
    """call(): one training step or one inference forward of ``model`` in ``code`` (its
    network, not compiled, as ``call.net``)."""
    import attnconv

    kwargs, batch = scale_options(model, scale)
    torch.manual_seed(0)
    net = attnconv.create_model(model, num_classes=10, **kwargs)
    if code == "plain compiled":
        attnconv.set_backend(net, "reference")
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(batch, 3, 32, 32, generator=g), torch.randint(0, 10, (batch,), generator=g)
    net.train(mode == "train")
    run = torch.compile(net, fullgraph=True, backend=backend) if "compiled" in code else net
    if mode == "infer":

        def infer() -> None:
            with torch.no_grad():
                run(x)

        infer.net = net
        return infer
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)

    def step() -> None:
        loss = F.cross_entropy(run(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step.net = net
    return step


def specs(scale: str, models: list[str], backend: str) -> list[dict]:
    return [
        dict(model=m, scale=scale, code=c, mode=md, backend=backend)
        for m in models
        for md in MODES
        for c in CODES
    ]


def run_scale(cases: list[dict], repeats: int, threads: int) -> list[dict]:
    """In this process: build every case, time its first call, then ``repeats`` round-robin
    rounds (see the module's docstring)."""
    import torch._dynamo.config as dynamo

    from attnconv.device import flush_subnormals

    torch.set_num_threads(threads)
    flush_subnormals(True)  # as attnconv train runs
    # one model class, a compiled copy per case: every copy is a cache entry of its forward
    dynamo.recompile_limit = dynamo.accumulated_recompile_limit = 4 * len(cases) + 8
    dynamo.fail_on_recompile_limit_hit = True  # never an eager call timed as a compiled one
    calls, first = [], []
    for c in cases:
        call = make_case(**c)
        t0 = time.perf_counter()
        call()
        first.append(time.perf_counter() - t0)
        calls.append(call)
    times: list[list[float]] = [[] for _ in cases]
    for _ in range(repeats):
        for i, call in enumerate(calls):
            t0 = time.perf_counter()
            call()
            times[i].append(time.perf_counter() - t0)
    rows = []
    for c, t, t1 in zip(cases, times, first):
        med = statistics.median(t)
        compiled = "compiled" in c["code"]
        batch = scale_options(c["model"], c["scale"])[1]
        rows.append(
            {**c, "batch": batch, "times_s": t, "median_s": med, "first_s": t1}
            | {"compile_s": t1 - med if compiled else None}
        )
    return rows


def run_scale_subprocess(cases: list[dict], repeats: int, threads: int) -> list[dict]:
    """run_scale in a fresh interpreter with an empty Inductor cache (a first compile)."""
    arg = json.dumps({"cases": cases, "repeats": repeats, "threads": threads})
    with tempfile.TemporaryDirectory(prefix="attnconv-inductor-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        cmd = [sys.executable, "-m", "attnconv.bench.compile", "--child", arg]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        last = (proc.stderr or "").strip().splitlines() or [f"exit code {proc.returncode}"]
        raise RuntimeError(f"compile benchmark child failed: {last[-1][:300]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ratios(rows: list[dict]) -> list[dict]:
    """One summary row per (scale, model, mode): the ratios of the module's docstring."""
    by = {(r["scale"], r["model"], r["mode"], r["code"]): r for r in rows}
    out = []
    for scale, model, mode in dict.fromkeys((r["scale"], r["model"], r["mode"]) for r in rows):
        eager, comp, plain = (by[(scale, model, mode, c)] for c in CODES)
        saved = eager["median_s"] - comp["median_s"]
        out.append(
            dict(scale=scale, model=model, mode=mode, batch=eager["batch"])
            | dict(compiled_x_eager=eager["median_s"] / comp["median_s"])
            | dict(x_plain=plain["median_s"] / comp["median_s"])
            | dict(eager_x_plain=plain["median_s"] / eager["median_s"])
            | dict(compile_s=comp["compile_s"], plain_compile_s=plain["compile_s"])
            | dict(payback=comp["compile_s"] / saved if saved > 0 else None)
        )
    return out


def render(payload: dict) -> str:
    return "\n".join(
        [
            f"Written by `{payload['command']}` ({payload['threads']} thread(s), "
            f"{payload['repeats']} interleaved rounds, medians; {payload['machine']}, torch "
            f"{payload['torch']}, torch.compile backend {payload['backend']}, fullgraph; "
            f"{payload['date']}). Ratios above 1: the first code named is faster. `compile s`: a "
            "compiled case's first call less its median, with an empty Inductor cache."
            + (f" Load: {payload['note']}" if payload.get("note") else ""),
            "",
            markdown_table(payload["summary"], COLUMNS),
        ]
    )


def main(argv: list[str] | None = None) -> int:
    p = suite_parser("compile", __doc__.splitlines()[0], list(SA_MODELS))
    p.add_argument(
        "--scale",
        choices=("cpu", "paper", "both"),
        default="both",
        help="the CPU recipes' sizes, the paper's (hidden 400, batch 8), or both (default)",
    )
    p.add_argument("--models", nargs="+", choices=SA_MODELS, help="default: all three")
    p.add_argument("--backend", default="inductor", help="torch.compile's backend (inductor)")
    p.add_argument("--note", help="what else ran on the machine, for the report")
    args = p.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 7)
    models = [args.only] if args.only else args.models or list(SA_MODELS)
    scales = ["quick"] if args.quick else ["cpu", "paper"] if args.scale == "both" else [args.scale]
    rows = []
    for scale in scales:
        cases = specs(scale, models, args.backend)
        if args.quick:
            rows += run_scale(cases, repeats, args.threads)
        else:
            rows += run_scale_subprocess(cases, repeats, args.threads)
    extra = [f"--scale {args.scale}"] if args.scale != "both" else []
    extra += ["--models " + " ".join(args.models)] if args.models and not args.only else []
    extra += [f"--backend {args.backend}"] if args.backend != "inductor" else []
    extra += [f"--note {json.dumps(args.note)}"] if args.note else []
    cmd = "attnconv bench --suite compile" + (" --quick" if args.quick else "")
    cmd += f" --repeats {args.repeats}" if args.repeats else ""
    cmd += f" --threads {args.threads}" if args.threads != 1 else ""
    cmd += " --update-results" if args.update_results else ""
    cmd += f" -- --only {args.only}" if args.only else ""
    cmd += (" " if " -- " in cmd else " -- ") + " ".join(extra) if extra else ""
    payload = dict(
        command=cmd,
        threads=args.threads,
        repeats=repeats,
        torch=torch.__version__,
        machine=cpu_name(),
        backend=args.backend,
        date=time.strftime("%Y-%m-%d", time.gmtime()),
        note=args.note,
        summary=ratios(rows),
        rows=rows,
    )
    text = render(payload)
    path = write_results(NAME, payload, text, output_dir(args))
    print(text)
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        spec = json.loads(sys.argv[2])
        rows = run_scale(spec["cases"], spec["repeats"], spec["threads"])
        print(json.dumps(rows))
    else:
        raise SystemExit(main())
