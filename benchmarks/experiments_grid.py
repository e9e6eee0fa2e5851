"""The grid experiment of the report (Cordonnier et al. 2020, fig. 3-4): grid_sa_quadratic's and
grid_long's heads against steps and the grid5k_* sensitivity runs, from their centre logs
(centers.jsonl) and metrics only."""

from __future__ import annotations

from pathlib import Path

import experiments_captions as captions
from experiments_runs import (
    CONFIGS,
    FIGS,
    ROOT,
    kept,
    per_layer,
    planned_lr_sum,
    progress,
    read_metrics,
    summed_lr,
    total_steps,
    train_config,
)
from experiments_sensitivity import SENSITIVITY_TITLE, grid_sensitivity

GRID_TITLE = "### Do the quadratic heads form a grid? (Cordonnier et al. 2020, fig. 3-4)"
LONG_TITLE = "#### grid_long: the reference recipe's summed learning rate"
SEED1_TITLE = "#### grid_long_seed1: the same budget, seed 1"


def grid_formation(lines: list[str], runs: Path) -> None:
    """Issue: do the quadratic heads form a grid at a CPU budget? grid_sa_quadratic (20x the
    Table 1 budget) and grid_long (the reference's summed learning rate), each from its centre
    log, finished or not; then the sensitivity runs."""
    evos = {}
    name, cfg = "grid_sa_quadratic", CONFIGS / "grid_sa_quadratic.yaml"
    ref = CONFIGS.parent / "sa_quadratic.yaml"  # the reference code's recipe
    ref_steps, ref_lr = planned_lr_sum(ref)
    evo = grid_run(lines, runs, name, "grid")
    if evo is None:  # not under this run root: its last regenerated section, said so
        lines += kept(GRID_TITLE, LONG_TITLE)
    else:
        evos[name] = evo
    if evo is not None and (runs / name / "metrics.csv").exists():
        lr_sum = summed_lr(runs / name)
        t = train_config(ref)
        ips, images = read_metrics(runs / name)["images_per_s"], ref_steps * t.batch_size
        lines += [
            f"The reference code's budget (its recipe, src/attnconv/configs/sa_quadratic.yaml: "
            f"{t.epochs} epochs of the 50,000 training images, batch {t.batch_size}, "
            f"hidden 400) is {images / 1e6:.0f}M images, "
            f"{images / train_config(cfg).batch_size / total_steps(cfg):.0f}x this run's, "
            f"and a sum of the learning rate of {ref_lr:.0f} over its {ref_steps} steps, "
            f"{ref_lr / lr_sum(total_steps(cfg)):.1f}x this run's; at this run's measured "
            f"{ips:.0f} images/s (hidden 64, one core) it would take "
            f"{images / ips / 3600:.0f} h of one core, a lower bound for hidden 400.",
            "",
        ]
    long = grid_run(lines, runs, "grid_long", "grid_long")
    if long is not None:
        evos["grid_long"] = long
    else:
        lines += kept(LONG_TITLE, (SEED1_TITLE, SENSITIVITY_TITLE))
    seed1 = grid_run(lines, runs, "grid_long_seed1", "grid_long_seed1")
    if seed1 is None:  # both seeds' heads
        lines += kept(SEED1_TITLE, SENSITIVITY_TITLE)
    elif long is not None:
        both_seeds(lines, long, seed1)
    grid_sensitivity(lines, runs, evos, ref_lr)


def held_since(evo: list[dict], key: str = "grid3") -> list[int]:
    """Per layer: the first logged step from which its ``key`` stayed at its final value."""
    out = []
    for li in range(len(evo[-1]["layers"])):
        end, since = evo[-1]["layers"][li][key], evo[-1]["step"]
        for e in reversed(evo):
            if e["layers"][li][key] != end:
                break
            since = e["step"]
        out.append(since)
    return out


def both_seeds(lines: list[str], seed0: list[dict], seed1: list[dict], rows: int = 11) -> None:
    """grid_long's two seeds side by side at the steps both logged: the 3x3 grid score, the
    sharp heads and the mean attention distance (tokens) per layer, then when each layer's grid
    score and sharp heads settled on their final values."""
    by1 = {e["step"]: e for e in seed1}
    common = [e for e in seed0 if e["step"] in by1]
    picks = sorted({round(i * (len(common) - 1) / (rows - 1)) for i in range(rows)})

    def cells(e: dict) -> list[str]:
        lay = e["layers"]
        return [
            per_layer((x["grid3"] for x in lay), "{}"),
            per_layer((x["sharp_heads"] for x in lay), "{}"),
            per_layer(x["mean_distance"] for x in lay),
        ]

    lines += [
        "Both seeds side by side (`grid_long` is seed 0), per layer (1 -> 6) at the steps both "
        "logged: the 3x3 grid score, the sharp heads and the mean attention distance in "
        "tokens.",
        "",
        "| step | 3x3 grid, seed 0 | seed 1 | sharp heads, seed 0 | seed 1 | mean distance, "
        "seed 0 | seed 1 |",
        "|---|---|---|---|---|---|---|",
    ]
    for e in (common[i] for i in picks):
        (g0, h0, d0), (g1, h1, d1) = cells(e), cells(by1[e["step"]])
        lines.append(f"| {e['step']} | {g0} | {g1} | {h0} | {h1} | {d0} | {d1} |")
    since = [(held_since(ev), held_since(ev, "sharp_heads")) for ev in (seed0, seed1)]
    lines += [
        "",
        "Since when each layer's value held to the end (step per layer, 1 -> 6): the 3x3 grid "
        f"score since {per_layer(since[0][0], '{}')} (seed 0) and "
        f"{per_layer(since[1][0], '{}')} (seed 1); the number of sharp heads since "
        f"{per_layer(since[0][1], '{}')} (seed 0) and {per_layer(since[1][1], '{}')} (seed 1).",
        "",
    ]


def grid_run(lines: list[str], runs: Path, name: str, stem: str) -> list | None:
    """One grid run's section: its heads against steps (table, evolution figure), then where
    they sit (grid_heads); figures named ``stem``_*.png. -> its head_evolution, or
    None when it has no centre log yet."""
    from attnconv.analysis.evolution import evolution_figure, head_evolution

    log = runs / name / "centers.jsonl"
    if not log.exists():
        return None
    evo = head_evolution(log)
    cfg = CONFIGS / f"{name}.yaml"
    steps = total_steps(cfg)
    head = {"grid_sa_quadratic": GRID_TITLE, "grid_long_seed1": SEED1_TITLE}.get(name, LONG_TITLE)
    lines += [
        head,
        "",
        f"`{name}`: sa_quadratic at the Table 1 CPU scale with {steps // 1000}x its budget "
        f"({steps} steps of {train_config(cfg).batch_size} images, cosine); "
        f"{progress(cfg, runs / name)}. "
        "Per layer (1 -> 6), from its centre log (exact: position-only attention does not "
        "depend on the input): centre displacement from step 0, the centres' distance "
        "from the query |Delta| and the mean attention distance, in tokens of the 16x16 "
        "grid (means over the heads), the largest top-key share of a head (sharp "
        "above 0.5), sharp heads, grid score 3x3/5x5, and the travel left to a 3x3 grid "
        "(the mean distance a head must still move to hold its own offset of the 3x3 "
        "kernel, heads assigned to offsets at the least total); the sum of the learning "
        "rate over the steps so far (the distance plain SGD moves a parameter per unit "
        "gradient).",
        "",
        "| step | sum of lr | displacement | centre distance | mean distance | largest "
        "peak | sharp heads | grid 3x3/5x5 | travel left to a 3x3 grid |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    picks = sorted({round(i * (len(evo) - 1) / 5) for i in range(6)})
    lr_sum = summed_lr(runs / name)
    for e in (evo[i] for i in picks):
        lay = e["layers"]
        lines.append(
            f"| {e['step']} | {lr_sum(e['step']):.0f} | "
            f"{per_layer((x['displacement'] for x in lay), '{:.2f}')} | "
            f"{per_layer((x['center_distance'] for x in lay), '{:.2f}')} | "
            f"{per_layer(x['mean_distance'] for x in lay)} | "
            f"{per_layer((max(x['peak_mass']) for x in lay), '{:.2f}')} | "
            f"{per_layer((x['sharp_heads'] for x in lay), '{}')} | "
            f"{per_layer((str(x['grid3']) + '/' + str(x['grid5']) for x in lay), '{}')} | "
            f"{per_layer((x['travel3'] for x in lay), '{:.2f}')} |"
        )
    FIGS.mkdir(parents=True, exist_ok=True)
    fig = evolution_figure(evo, FIGS / f"{stem}_evolution.png")
    lines += [
        "",
        f"![{name} evolution](figures/{fig.name})",
        "",
        *captions.grid_evolution(name, evo),
    ]
    grid_heads(lines, log, stem, name)
    if name == "grid_long":
        grid_pull(lines, lr_sum)
    return evo


def grid_heads(lines: list[str], log: Path, stem: str, name: str | None = None) -> None:
    """The grid run's heads: every centre's path (fig. 3), the mass contours at the last logged
    step, and per layer where its sharp heads sit; ``name``: the run (default: the log's folder)."""
    import numpy as np

    from attnconv.analysis.center_figures import plot_center_trajectories, plot_mass_contours
    from attnconv.analysis.evolution import last_heads, read_evolution
    from attnconv.analysis.grid import SHARP

    recs = read_evolution(log)
    steps = np.array([r["step"] for r in recs])
    paths = [
        np.array([r["layers"][li] for r in recs], dtype=np.float64)
        for li in range(len(recs[0]["layers"]))
    ]
    traj = plot_center_trajectories(
        steps, paths, FIGS / f"{stem}_center_trajectories.png", unit="step"
    )
    step, heads = last_heads(log)
    contours = plot_mass_contours(
        [hd["maps"] for hd in heads],
        (8, 8),
        (16, 16),
        FIGS / f"{stem}_mass_contours.png",
        centers=[hd["centers"] for hd in heads],
        title=f"step {step}: 50% (solid) / 90% (dashed) of each head's mass for the middle "
        "query; x = head centre",
    )
    lines += [
        f"Where the heads sit at step {step} (offset = the top key minus the query, in "
        "tokens (row, col); a sharp head puts > 50% of its mass there), how far each sharp "
        "head's centre travelled from step 0, and the other heads' mean centre distance "
        "from the query |Delta| at step 0 and now:",
        "",
        "| layer | sharp heads: offset top-key share (travel) | the other heads: top-key "
        "share | the others' mean abs(Delta), step 0 -> now |",
        "|---|---|---|---|",
    ]
    for li, (hd, path) in enumerate(zip(heads, paths), 1):
        g = hd["score"]
        travel = np.linalg.norm(path[-1] - path[0], axis=-1)  # (Nh,) tokens
        dist0, dist = np.linalg.norm(path[0], axis=-1), np.linalg.norm(path[-1], axis=-1)
        sharp = sorted(
            (tuple(o), p, t) for o, p, t in zip(g.offsets, g.peak_mass, travel) if p > SHARP
        )
        others = [i for i, p in enumerate(g.peak_mass) if p <= SHARP]
        rest = sorted((g.peak_mass[i] for i in others), reverse=True)
        moved = f"{dist0[others].mean():.2f} -> {dist[others].mean():.2f}" if others else "-"
        held = ", ".join(f"({r}, {c}) {p:.2f} ({t:.2f})" for (r, c), p, t in sharp) or "-"
        lines.append(f"| {li} | {held} | {', '.join(f'{p:.2f}' for p in rest) or '-'} | {moved} |")
    name = name or log.parent.name
    lines += [
        "",
        f"![grid centre trajectories](figures/{traj.name})",
        "",
        *captions.grid_trajectories(name, int(steps[-1])),
        f"![grid mass contours](figures/{contours.name})",
        "",
        *captions.grid_contours(name, step),
    ]


PULLS = ROOT / "benchmarks" / "results"  # grid_width_checkpoint_<step>.json (grid_width.py)


def grid_pull(lines: list[str], lr_sum, layer: int = 4, pulls: Path = PULLS) -> None:
    """Where the loss pulls grid_long's centres at its milestones: the mean centre gradient of
    each layer over 16,384 training images (benchmarks/grid_width.py --checkpoint), resolved
    where above twice its error; per head of ``layer``, in (radial < 0) or out."""
    import json
    import re

    rows = []
    for f in pulls.glob("grid_width_checkpoint_*.json"):
        for r in json.loads(f.read_text())["results"]:
            m = re.search(r"grid_long/checkpoints/step-(\d+)", r["model"])
            if m and r.get("heads", {}).get("layer") == layer:
                rows.append((int(m.group(1)), r))
    if not rows:
        return
    lines += [
        f"Where the loss pulls the centres, at the milestones measured (`python "
        f"benchmarks/grid_width.py --batches 512 --heads {layer} --name "
        "grid_width_checkpoint_N --checkpoint <run root>/grid_long/checkpoints/step-N`, "
        "one file each in benchmarks/results/): the norm of each layer's mean centre "
        "gradient over its error, the summed learning rate that moves a centre one token "
        f"at that pull (momentum 0.9; '-' where within twice its error), and layer "
        f"{layer}'s heads whose own pull is resolved, towards the query or away:",
        "",
        f"| step | sum of lr | drift / its error, layer 1 -> 6 | summed lr per token | "
        f"layer {layer}: heads pulled in / out / unresolved |",
        "|---|---|---|---|---|",
    ]
    for step, r in sorted(rows, key=lambda t: t[0]):
        lay, heads = r["layers"], r["heads"]["rows"]
        pulled = [h["radial"] for h in heads if h["resolved"]]
        ratio = per_layer(x["drift"] / x["drift_error"] for x in lay)
        speed = ", ".join(f"{x['summed_lr_per_token']:.0f}" if x["resolved"] else "-" for x in lay)
        lines.append(
            f"| {step} | {lr_sum(step):.0f} | {ratio} | {speed} | "
            f"{sum(p < 0 for p in pulled)} / {sum(p >= 0 for p in pulled)} / "
            f"{len(heads) - len(pulled)} |"
        )
    lines.append("")
