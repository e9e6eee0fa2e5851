"""The caption under each figure of the report (docs/experiments.md): which run, seed and steps
it shows, what it draws and what to look at. Like the tables, built from the runs' configs and
logs; one italic paragraph directly below the image."""

from __future__ import annotations

from experiments_runs import CONFIGS, train_config


def caption(text: str) -> list[str]:
    """The lines that follow an image's line: its caption, then a blank line."""
    return [f"*{text}*", ""]


def seed_of(name: str) -> int | None:
    """The seed of an experiment recipe (experiments/NAME); None where it has no recipe."""
    cfg = CONFIGS / f"{name}.yaml"
    return train_config(cfg).seed if cfg.exists() else None


def run_label(name: str, config: str | None = None) -> str:
    """The run's name as code and its seed, read from ``config`` (default: the run's own)."""
    seed = seed_of(config or name)
    return f"`{name}`" + ("" if seed is None else f" (seed {seed})")


def grid_evolution(name: str, evo: list[dict]) -> list[str]:
    last = evo[-1]
    held = ", ".join(str(x["grid3"]) for x in last["layers"])
    return caption(
        f"{run_label(name)}, one line per layer from step 0 to step {last['step']}: the "
        "columns of the table above. Look at the 3x3 grid score (bottom right; 9 = a sharp head "
        "on every offset of a 3x3 kernel) and the travel left to that grid (top right; 0 = a "
        f"kernel). At step {last['step']} the layers hold {held} of the 9 offsets; the dashed "
        "line (bottom left) is the 0.5 top-key share above which a head is sharp."
    )


def grid_trajectories(name: str, step: int) -> list[str]:
    return caption(
        f"{run_label(name)}: the path of each head's centre (a colour per head, 9 per "
        f"layer) from the first logged step (o) to step {step} (arrowhead), in tokens from the "
        "query (star). In Cordonnier et al.'s fig. 3 the paths end on the offsets around the "
        "query, one head each: a kernel."
    )


def grid_contours(name: str, step: int) -> list[str]:
    return caption(
        f"`{name}` at step {step}: the keys holding 50% (solid) and 90% (dashed) of each head's "
        "attention for the middle query (star), x = the head's centre; position-only attention, "
        "so the same for every image. A sharp head is a small ring on one offset; a contour "
        "around the whole grid is a head spread over all of it."
    )


def grid_sensitivity(names: list[str], fitted: str | None) -> list[str]:
    """``fitted``: the run whose power-law fit the figure draws (None: no fit drawn)."""
    seeds = {seed_of(n) for n in names}
    seed = f", seed {seeds.pop()} each" if len(seeds) == 1 and None not in seeds else ""
    lines = (
        f"; dashed: the power law fitted to `{fitted}`; red dotted: the travel to a 3x3 "
        "grid at step 0; grey dotted: the reference recipe's S"
        if fitted
        else ""
    )
    return caption(
        f"The {len(names)} grid runs (sa_quadratic{seed}) against their summed learning rate "
        f"S. Left: the centres' displacement from step 0, mean of the 54 heads (log-log{lines}). "
        "Right: the heads with over half their mass on one key. Runs whose lines lie on one "
        "curve moved their centres by S alone, whatever their batch, learning rate or length."
    )


def analysis_figure(key: str, name: str, steps: int, report: dict) -> list[str]:
    """The caption of one of ``attnconv analyze``'s figures shown inline (INLINE_FIGURES)."""
    run = f"{run_label(name, 'table1_' + name)} after its {steps:,} steps"
    pixel, token = report.get("query_pixel"), report.get("query_token")
    at = f"; pixel {tuple(pixel)}, token {tuple(token)}" if pixel and token else ""
    images = report.get("images", "the")
    if key == "attention_average":
        return caption(
            f"{run}: the attention of each head (columns) of each layer (rows) for one query "
            f"(red +{at}), averaged over {images} test images. A local head is a small bright "
            "spot near the +; Cordonnier et al.'s fig. 4-6 have early layers local and deeper "
            "ones reaching farther."
        )
    if key == "mass_contours":
        centres = "; x = the head's learned centre" if report.get("centers") else ""
        return caption(
            f"{run}: the keys holding 50% (solid) and 90% (dashed) of each head's attention for "
            f"the same query (star{at}), averaged over {images} test images, in tokens from the "
            f"query{centres}. Rings near the star are local heads; contours scattered over the "
            "whole grid are heads spread over it."
        )
    if key == "center_trajectories_gif":
        return caption(
            f"{run}: the head centres of every layer moving over training, one frame per logged "
            "epoch (o = start, arrowhead = the last move, star = the query)."
        )
    return []


def lemma2(conv: str | None, images: int | None) -> list[str]:
    what = f"{conv} ({images} images)" if conv and images else "a convolution"
    return caption(
        f"The relative error of the soft conversion of {what} against the precision alpha of "
        "every head, in float32 and float64 (dotted: the hard limit, `alpha=None`). Look at "
        "where each curve reaches its dotted line: from that alpha on, the soft layer is the "
        "convolution to that precision."
    )
