"""The GPU goals read from a GPU run's results: each goal, the case, the measured ratio, the
target and whether it is met, and for each group the path that was fastest (what the plan's CUDA
rows should pick). Reads only what the cuda suite wrote (``cuda_layers_content.json``,
``cuda_layers_local.json``, ``cuda_models.json`` in one folder, or a group's ``.partial.json``
where its time ran out); a goal whose rows are missing is listed as not measured, never as met.

    python benchmarks/gpu_goals.py DIR        # writes DIR/gpu_goals.md and prints it

Ratios are within one run on one GPU, as the suite measured them (medians of its repeats): > 1
means the Triton kernel (or attnconv) is faster than the anchor. Beside each content goal, its
ceiling on that GPU: the ratio SDPA with no positional term (FlashAttention in bf16) reaches
against the same anchor, the floor no positional kernel is expected to beat; beside a paper
model's speed goals, the path's counted FLOPs at the GPU's measured GEMM peak (cuda_models.py)
against the same anchor. A goal whose ceiling misses its target is out of reach there.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .models import SA_MODELS

CONTENT, LOCAL, MODELS = "cuda_layers_content", "cuda_layers_local", "cuda_models"


@dataclass(frozen=True)
class Goal:
    what: str  # the goal in the words
    case: str  # the row it was read from
    value: float | None  # None: not measured
    target: float
    most: bool = False  # True: value <= target (memory), else value >= target
    ceiling: float | None = None  # no-bias SDPA's value of the same ratio (None: not measured)

    def _meets(self, value: float | None) -> bool | None:
        if value is None:
            return None
        return value <= self.target if self.most else value >= self.target

    @property
    def met(self) -> bool | None:
        return self._meets(self.value)

    @property
    def reachable(self) -> bool | None:
        """Whether no-bias SDPA itself meets the target (None: no ceiling measured)."""
        return self._meets(self.ceiling)


def _ratio(r: dict, anchor: str, path: str, what: str = "ms") -> float | None:
    a, b = r.get(f"{anchor}_{what}"), r.get(f"{path}_{what}")
    return a / b if isinstance(a, float) and isinstance(b, float) and b > 0 else None


def _fastest(r: dict, paths: tuple[str, ...]) -> str | None:
    """The one of ``paths`` the row timed fastest (None: it timed none)."""
    timed = [p for p in paths if isinstance(r.get(f"{p}_ms"), float)]
    return min(timed, key=lambda p: r[f"{p}_ms"]) if timed else None


def _content_goals(rows: list[dict]) -> list[Goal]:
    """The content-attention goals, per case the suite ran, for the faster of the plan's kernel
    (attnconv) and the Triton kernel (what the plan picks once measured): against dense SDPA +
    float bias and against SDPA with no positional term."""
    out = []
    for r in rows:
        path = _fastest(r, ("attnconv", "triton"))
        if path is None:
            continue
        name, hw = f"{r['name']} ({path})", r["hw"]
        dense, top = _ratio(r, "dense", path), _ratio(r, "dense", "flash")  # ours, the ceiling
        if r["train"] and r["dtype"] == "bf16":
            memory = _ratio(r, path, "dense", "mb")  # path / dense
            least = _ratio(r, "flash", "dense", "mb")
            flash = _ratio(r, "flash", path)
            out += [
                Goal(
                    "bf16 training: x dense SDPA + bias",
                    name,
                    dense,
                    1.5 if hw > 16 else 1,
                    False,
                    top,
                ),
                Goal("bf16 training: peak memory / dense", name, memory, 0.25, True, least),
                Goal("bf16 training: x SDPA without positions", name, flash, 0.6, False, 1.0),
            ]
        elif r["train"]:
            out.append(Goal("fp32 training: x dense SDPA + bias", name, dense, 1, False, top))
        else:
            out.append(Goal("inference: x dense SDPA + bias", name, dense, 1, False, top))
    return out


def _model_goals(rows: list[dict]) -> list[Goal]:
    """The paper models' full training step: attnconv against the reference algorithm (fp32) and
    the same model on dense SDPA + bias (bf16); bf16 is attnconv's faster bf16 path."""
    out = []
    for model in dict.fromkeys([*SA_MODELS, *(r["model"] for r in rows)]):
        paths = {r["path"]: r for r in rows if r["model"] == model and "img_s" in r}
        bf16 = [paths[p] for p in ("attnconv bf16", "attnconv bf16 triton") if p in paths]
        best = max(bf16, key=lambda r: r["img_s"]) if bf16 else {}
        fp32 = paths.get("attnconv fp32", {})
        case = f"{model} ({best.get('path', 'attnconv bf16')})"
        ref, dense = (paths.get(p, {}).get("img_s") for p in ("reference", "dense bf16"))

        def top(r: dict, anchor: float | None) -> float | None:  # its FLOPs at the GEMM peak
            ceiling = r.get("ceiling_img_s")
            return ceiling / anchor if ceiling and anchor else None

        out += [
            Goal(
                "bf16: x the reference algorithm in fp32",
                case,
                best.get("x_ref"),
                4,
                False,
                top(best, ref),
            ),
            Goal(
                "fp32: x the reference algorithm",
                f"{model} (attnconv fp32)",
                fp32.get("x_ref"),
                1.2,
                False,
                top(fp32, ref),
            ),
            Goal(
                "bf16: x the model on dense SDPA + bias",
                case,
                best.get("x_dense"),
                1.3,
                False,
                top(best, dense),
            ),
            Goal("peak memory / the reference's", case, best.get("mem_ref"), 0.5, most=True),
        ]
    return out


def fastest(rows: list[dict], paths: tuple[str, ...]) -> list[tuple[str, str, float]]:
    """(case, the fastest of ``paths``, its ms) per row that timed any of them: what the plan's
    CUDA row for the case should pick."""
    best = [(r, _fastest(r, paths)) for r in rows]
    return [(r["name"], p, r[f"{p}_ms"]) for r, p in best if p is not None]


def _load(folder: Path, name: str) -> dict:
    """<name>.json, else the rows its run saved before its time ran out (<name>.partial.json,
    marked ``partial``), else {}."""
    for suffix, extra in ((".json", {}), (".partial.json", {"partial": True})):
        path = folder / f"{name}{suffix}"
        if path.is_file():
            return json.loads(path.read_text()) | extra
    return {}


def report(folder: Path) -> str:
    content, local, models = (_load(folder, n) for n in (CONTENT, LOCAL, MODELS))
    rows = [r for r in content.get("rows", []) if r.get("group") == "content"]
    goals = _content_goals(rows) + _model_goals(models.get("rows", []))
    device = next((d["device"] for d in (content, local, models) if d.get("device")), "unknown")
    lines = [
        "# The GPU goals, read from one run",
        "",
        f"Device: {device}. Read by `python benchmarks/gpu_goals.py {folder}` from the cuda "
        f"suite's files there ({CONTENT}, {LOCAL}, {MODELS} .json; a missing one: its goals not "
        "measured). Ratios > 1: ours faster."
        + "".join(
            f" {n}: only the cases run before its time ran out (.partial.json)."
            for n, d in ((CONTENT, content), (LOCAL, local), (MODELS, models))
            if d.get("partial")
        ),
        "",
        "| goal | case | measured | target | met | ceiling |",
        "|---|---|---|---|---|---|",
    ]
    for g in goals:
        value = "not measured" if g.value is None else f"{g.value:.2f}"
        bound = f"<= {g.target:g}" if g.most else f">= {g.target:g}"
        met = {None: "-", True: "yes", False: "**no**"}[g.met]
        top = "-" if g.ceiling is None else f"{g.ceiling:.2f}"
        top += " (out of reach)" if g.reachable is False else ""
        lines.append(f"| {g.what} | {g.case} | {value} | {bound} | {met} | {top} |")
    measured = [g for g in goals if g.met is not None]
    beyond = [g for g in goals if g.reachable is False]
    lines += [
        "",
        f"Met: {sum(bool(g.met) for g in measured)} of {len(measured)} measured "
        f"({len(goals) - len(measured)} not measured); {len(beyond)} out of reach on this GPU "
        "(the ceiling misses the target). Ceiling: for content attention, no-bias SDPA's ratio "
        "(the floor no positional kernel is expected to beat); for a paper model, its step's "
        "counted FLOPs at the measured GEMM peak.",
    ]
    for title, group_rows, paths in (
        ("Content attention", rows, ("attnconv", "triton", "dense", "fold")),
        ("SASA local attention", local.get("rows", []), ("attnconv", "window", "triton", "unfold")),
    ):
        best = fastest(group_rows, paths)
        if best:
            lines += ["", f"## {title}: the fastest path a case ({', '.join(paths)})", ""]
            lines += ["| case | fastest | ms |", "|---|---|---|"]
            lines += [f"| {c} | {p} | {ms:.3f} |" for c, p, ms in best]
    return "\n".join(lines) + "\n"


def write(folder: Path) -> str:
    """``report(folder)`` written to folder/gpu_goals.md; returns the text."""
    text = report(folder)
    (folder / "gpu_goals.md").write_text(text)
    return text
