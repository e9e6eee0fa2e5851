"""The grid experiment's sensitivity section (benchmarks/experiments_grid.py): the grid5k_* runs,
one change each from grid5k_base, and grid_long, their travel left to a 3x3 grid against the
summed learning rate S, and the power law fitted to it."""

from __future__ import annotations

import csv
from pathlib import Path

import experiments_captions as captions
from experiments_long import MODEL_GPU_RATE, hardware
from experiments_runs import (
    CONFIGS,
    FIGS,
    per_layer,
    progress,
    run_cells,
    summed_lr,
)

SENSITIVITY_TITLE = (
    "#### Sensitivity: one change at a time from grid5k_base (5,000 steps), and grid_long"
)


GRID_RUNS = "grid5k_*.yaml"  # one change each from grid5k_base (_grid_5k.yaml)


def change(cfg: Path) -> str:
    """What a grid5k_* config changes: its first comment line after 'Grid sensitivity...: '."""
    return cfg.read_text().splitlines()[0].lstrip("# ").split(": ", 1)[-1].rstrip(".")


def grid_sensitivity(lines: list[str], runs: Path, known: dict[str, list], ref_lr: float) -> None:
    """The grid5k_* runs (one change each from grid5k_base, 5,000 steps) and grid_long (the
    reference's summed learning rate ``ref_lr``): where their heads are at their last logged
    step, and (figure) how far the centres moved and how many heads are sharp against the
    summed learning rate, with grid_sa_quadratic for scale. ``known``: run -> its
    head_evolution, already read."""
    from attnconv.analysis.evolution import head_evolution

    rows, curves = [], {}
    long = [CONFIGS / "grid_sa_quadratic.yaml", CONFIGS / "grid_long.yaml"]
    for cfg in [*long, *sorted(CONFIGS.glob(GRID_RUNS))]:
        log, out = runs / cfg.stem / "centers.jsonl", runs / cfg.stem
        if not log.exists() or not (out / "metrics.csv").exists():
            continue
        evo = known[cfg.stem] if cfg.stem in known else head_evolution(log)
        lr_sum = summed_lr(out)
        if evo[-1]["step"] == 0:  # started, nothing trained yet
            continue
        curves[cfg.stem] = [(lr_sum(e["step"]), e["layers"]) for e in evo]
        if cfg.stem == "grid_sa_quadratic":
            continue
        lay, acc, s = evo[-1]["layers"], run_cells(out)[1], curves[cfg.stem][-1][0]
        # the mean displacement beside grid_long's at the same summed learning rate (grid_long,
        # logged first): does a change move the centres further per unit of S?
        ref = curves.get("grid_long") if cfg.stem != "grid_long" else None
        at = displacement_at(ref, s) if ref else None
        rows.append(
            f"| {cfg.stem} | {change(cfg)} | {progress(cfg, out)} | {evo[-1]['step']} | "
            f"{s:.0f} | {per_layer((x['displacement'] for x in lay), '{:.2f}')} | "
            f"{mean_of(lay, 'displacement'):.2f}{'' if at is None else f' ({at:.2f})'} | "
            f"{per_layer(x['mean_distance'] for x in lay)} | "
            f"{per_layer((x['travel3'] for x in lay), '{:.2f}')} | "
            f"{sum(x['sharp_heads'] for x in lay)} | {sum(x['grid3'] for x in lay)} | "
            f"{'' if acc is None else f'{100 * acc:.1f}%'} | {hardware(out)[1]} |"
        )
    if not rows:
        return
    rates = [  # every training row of the runs shown, either side of the GPU threshold
        float(r["images_per_s"])
        for name in curves
        for r in csv.DictReader(open(runs / name / "metrics.csv"))
        if r["kind"] == "train"
    ]
    gpu = MODEL_GPU_RATE["sa_quadratic"]  # every grid run is sa_quadratic
    below = max((x for x in rates if x <= gpu), default=0.0)
    above = min((x for x in rates if x > gpu), default=float("nan"))
    base = next((n for n in ("grid_long", "grid_sa_quadratic") if n in curves), None)
    pts = curves.get(base)  # the longest run under this root: the projection's data
    fit = power_fit(pts, lo=pts[-1][0] / 4) if pts else None  # the last 4x of S: the local law
    whole = power_fit(pts) if pts else None
    fig = sensitivity_figure(curves, FIGS / "grid_sensitivity.png", fit, ref_lr, base)
    cap = captions.grid_sensitivity(list(curves), base if fit and ref_lr else None)
    lines += [
        SENSITIVITY_TITLE,
        "",
        "Per layer (1 -> 6) at the run's last logged step: centre displacement from step 0 "
        "and its mean over the 54 heads (in brackets: grid_long's at the same summed "
        "learning rate), mean attention distance, and the travel left to a 3x3 grid, in "
        "tokens; sharp heads and 3x3 grid score summed over the layers; the training rows "
        f"logged above {gpu:.0f} img/s, a GPU's (these runs' rows are at most {below:.0f} "
        f"img/s below it, at least {above:.0f} above). Each row is "
        "a single run (seed 0): the differences between rows are single-run results, not "
        "tested.",
        "",
        "| run | change from grid5k_base | progress | step | sum of lr | displacement | "
        "mean (grid_long) | mean distance | travel left to a 3x3 grid | sharp heads | "
        "3x3 grid | test acc. | GPU rows |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        f"![grid sensitivity](figures/{fig.name})",
        "",
        *cap,
    ]
    if fit and whole:
        (a, b, lo, hi), (a1, b1, lo1, _) = fit, whole
        lines += [
            f"Projection (a fit, not a measurement; `grid_long` measures it): a power law "
            f"fitted to {base}'s displacement (mean of the 54 heads) against "
            f"the summed learning rate S over its last 4x of S ({lo:.0f} to {hi:.0f}), "
            f"d = {a:.3f} S^{b:.2f}, gives {a * ref_lr**b:.2f} tokens at the reference "
            f"recipe's S = {ref_lr:.0f}; fitted from S = {lo1:.0f} instead, d = {a1:.3f} "
            f"S^{b1:.2f} gives {a1 * ref_lr**b1:.2f} (the curve bends: the projection "
            f"depends on the range). To hold the 9 offsets of a 3x3 grid the heads had to "
            f"travel {mean_of(pts[0][1], 'travel3'):.2f} tokens on average at step 0 and "
            f"still have {mean_of(pts[-1][1], 'travel3'):.2f} to go at its last logged "
            f"step.",
            "",
        ]
        end, d_end = pts[-1][0], mean_of(pts[-1][1], "displacement")
        early = power_fit([p for p in pts if p[0] <= end / 4], lo=end / 16)
        if early:  # the same extrapolation, made from a quarter of the run, against its end
            a4, b4, lo4, hi4 = early
            lines += [
                f"The method checked on {base} itself: the same fit over the last 4x of "
                f"its first quarter of S ({lo4:.0f} to {hi4:.0f}) projects "
                f"{a4 * end**b4:.2f} tokens at S = {end:.0f}; the run measured "
                f"{d_end:.2f}.",
                "",
            ]


def mean_of(layers: list[dict], key: str) -> float:
    """A per-layer quantity of head_evolution averaged over the layers (each the mean of its
    heads, so: the mean over all heads)."""
    return sum(x[key] for x in layers) / len(layers)


def displacement_at(pts: list, s: float) -> float | None:
    """The mean displacement of a run's logged points ``pts`` ((S, layers) in order of S)
    interpolated linearly at summed learning rate ``s``; None outside the logged range."""
    for (s0, lay0), (s1, lay1) in zip(pts, pts[1:]):
        if s0 <= s <= s1:
            d0, d1 = mean_of(lay0, "displacement"), mean_of(lay1, "displacement")
            return d0 if s1 == s0 else d0 + (d1 - d0) * (s - s0) / (s1 - s0)
    return None


def power_fit(pts: list, lo: float = 10.0) -> tuple[float, float, float, float] | None:
    """Least squares of log d on log S over the logged points with S >= ``lo`` (the warm-up's
    first steps left out): (a, b, S_min, S_max) of d = a S^b, d the mean displacement."""
    import numpy as np

    xy = [(x, mean_of(lay, "displacement")) for x, lay in pts if x >= lo]
    xy = [(x, y) for x, y in xy if y > 0]
    if len(xy) < 3:
        return None
    x, y = np.log(np.array(xy)).T
    b, log_a = np.polyfit(x, y, 1)
    return float(np.exp(log_a)), float(b), xy[0][0], xy[-1][0]


def sensitivity_figure(
    curves: dict[str, list], path: Path, fit=None, ref_lr=None, base: str | None = None
) -> Path:
    """Two panels against the summed learning rate, one line per run: the centres' displacement
    averaged over every head of every layer (log-log, with the power-law ``fit`` of run
    ``base`` extended to the reference recipe's summed lr ``ref_lr`` and the travel a 3x3 grid
    needed at step 0), and the number of sharp heads (all layers)."""
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 4))
    for name, pts in curves.items():
        pts = [(s, lay) for s, lay in pts if s > 0]  # log axes: step 0 left out
        x = [s for s, _ in pts]
        moved = [mean_of(lay, "displacement") for _, lay in pts]
        sharp = [sum(layer["sharp_heads"] for layer in lay) for _, lay in pts]
        style = dict(color="k", lw=2) if name == "grid_sa_quadratic" else dict(lw=1.2)
        ax0.plot(x, moved, label=name, **style)
        ax1.plot(x, sharp, label=name, **style)
    if fit and ref_lr:
        a, b, lo, _ = fit
        xs = np.geomspace(lo, ref_lr, 50)
        ax0.plot(
            xs, a * xs**b, "k--", lw=1, label=f"{base}, fit over its last 4x: {a:.3f} S^{b:.2f}"
        )
        ax0.axvline(ref_lr, color="gray", ls=":", lw=1)
        ax0.annotate(
            "reference recipe's S",
            (ref_lr, 0.02),
            xycoords=("data", "axes fraction"),
            rotation=90,
            va="bottom",
            ha="right",
            fontsize=7,
            color="gray",
        )
        need = mean_of(curves[base][0][1], "travel3")
        ax0.axhline(need, color="tab:red", ls=":", lw=1, label="travel to a 3x3 grid at step 0")
    ax0.set(
        xscale="log",
        yscale="log",
        xlabel="sum of the learning rate so far (S)",
        ylabel="centre displacement (tokens)",
        title="centres' displacement from step 0, mean of the 54 heads",
    )
    ax1.set(
        xscale="log",
        xlabel="sum of the learning rate so far (S)",
        ylabel="sharp heads",
        title="heads with > 50% of their mass on one key (of 54)",
    )
    handles, labels = ax0.get_legend_handles_labels()  # one legend, beside the panels
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=7)
    long = "; grid_sa_quadratic in black (20,000 steps)" if "grid_sa_quadratic" in curves else ""
    fig.suptitle(f"sa_quadratic, the grid runs against their summed learning rate{long}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
