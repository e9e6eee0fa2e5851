"""The pretrained models the package ships, written from finished experiment runs.

    python benchmarks/experiments.py ship [NAME ...] [--runs DIR] [--data ZIP]

For each entry of benchmarks/pretrained_cards.yaml (all, or the NAMEs given): the final
checkpoint of its run (in the run root) becomes a weights-only attnconv checkpoint in
src/attnconv/weights/NAME/ (the weight file byte for byte; the metadata without optimizer or
training state, the data path as the recipes name it, ``cifar10-jpeg.zip``), is evaluated on the
10,000 CIFAR-10 test images by `attnconv eval` on the folder written, and gets its card
(card.json): the measured accuracy and loss, the steps, seed and parameters the checkpoint
records, the sha256 of the weight file, and the texts of pretrained_cards.yaml. Nothing on a
card is typed by hand but those texts. The docs' model cards page is generated from the cards
(docs/pretrained.md, between its markers).
"""

from __future__ import annotations

import csv
import json
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

from attnconv.catalog import CARD, CIFAR_ZIP, WEIGHT_FILE, WEIGHTS, file_digest
from experiments_archive import weights_only
from experiments_runs import ROOT

CARDS = ROOT / "benchmarks" / "pretrained_cards.yaml"
PAGE = ROOT / "docs" / "pretrained.md"
ARCHIVE = ROOT / "benchmarks" / "results" / "experiment_runs"
BEGIN, END = "<!-- cards:begin -->", "<!-- cards:end -->"


def card_texts() -> dict[str, dict]:
    return yaml.safe_load(CARDS.read_text())


def evaluate(folder: Path, data: Path) -> dict:
    """`attnconv eval` of a shipped folder on the full test set, as a user runs it."""
    cmd = [sys.executable, "-m", "attnconv.cli", "eval", str(folder), "--data", str(data)]
    out = subprocess.run([*cmd, "--json", "-"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _rows(log: Path) -> list[dict]:
    if not log.is_file():
        return []
    with log.open() as f:
        return list(csv.DictReader(f))


def logged_accuracy(run: str) -> float | None:
    """The last test accuracy of ``run``'s committed log (the run the experiments page reports;
    None: no evaluation logged)."""
    evals = [r for r in _rows(ARCHIVE / run / "metrics.csv") if r["kind"] == "eval"]
    return float(evals[-1]["acc"]) if evals else None


def log_agreement(run: str, folder: Path) -> dict | None:
    """How far the shipped run's log equals the committed one: of the rows both logged (same
    kind and step), how many, and how many from the first on carry the same loss and accuracy
    to every printed digit (None: no committed log to compare)."""
    ours = {(r["kind"], r["step"]): (r["loss"], r["acc"]) for r in _rows(folder / "metrics.csv")}
    theirs = [r for r in _rows(ARCHIVE / run / "metrics.csv") if (r["kind"], r["step"]) in ours]
    if not theirs:
        return None
    same = 0
    for r in theirs:
        if ours[(r["kind"], r["step"])] != (r["loss"], r["acc"]):
            break
        same += 1
    return {"rows": len(theirs), "equal_from_start": same}


def ship_one(name: str, texts: dict, runs: Path, data: Path) -> dict:
    import torch

    from attnconv.cpuinfo import cpu_name
    from attnconv.loading.checkpoint import META, find_checkpoint, load_model, read_meta

    run = runs / texts["run"]
    final = run / "final"  # a run restored from the archive keeps only its final weights
    has_steps = (run / "checkpoints").is_dir()
    src, meta = read_meta(final if not has_steps and final.is_dir() else find_checkpoint(run))
    total = meta["state"].get("total_steps")  # None: a finished run's final/ (its last step)
    if total is not None and meta["state"]["step"] != total:
        raise SystemExit(f"{name}: {src} is step {meta['state']['step']}, not the last ({total})")
    if name.split(".")[0] != meta["model"]:
        raise SystemExit(f"{name}: the run trained {meta['model']!r}; name it {meta['model']}.TAG")
    dest = WEIGHTS / name
    tmp = WEIGHTS / f".{name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    shutil.copyfile(src / WEIGHT_FILE, tmp / WEIGHT_FILE)
    (tmp / META).write_text(json.dumps(weights_only(meta), indent=1))
    model, _ = load_model(tmp)  # the folder loads as a user loads it
    result = evaluate(tmp, data)
    cfg = meta["config"]
    card = {
        "name": name,
        "model": meta["model"],
        "default": bool(texts.get("default", False)),
        "model_kwargs": meta["model_kwargs"],
        "params": sum(p.numel() for p in model.parameters()),
        "test_accuracy": round(result["accuracy"], 6),
        "test_loss": round(result["loss"], 6),
        "test_images": result["images"],
        "steps": meta["state"]["step"],
        "batch_size": cfg["train"]["batch_size"],
        "seed": cfg["train"]["seed"],
        "recipe": f"experiments/{texts['run']}",
        "reproduce": f"attnconv train experiments/{texts['run']} --data PATH/{CIFAR_ZIP}",
        "hardware": texts["hardware"],
        "source": texts["source"],
        "claims": texts.get("claims", []),
        "logged_accuracy": logged_accuracy(texts["run"]),
        "log_agreement": log_agreement(texts["run"], run),
        "sha256": file_digest(tmp / WEIGHT_FILE),
        "bytes": (tmp / WEIGHT_FILE).stat().st_size,
        "evaluated": {
            "date": time.strftime("%Y-%m-%d"),
            "cpu": cpu_name(),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
    }
    (tmp / CARD).write_text(json.dumps(card, indent=1) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    return card


def ship(names: list[str], runs: Path, data: Path) -> None:
    texts = card_texts()
    unknown = [n for n in names if n not in texts]
    if unknown:
        raise SystemExit(f"not in {CARDS.name}: {unknown}; known: {sorted(texts)}")
    for name in names or sorted(texts):
        card = ship_one(name, texts[name], runs, data)
        print(f"{name}: {100 * card['test_accuracy']:.2f}% on {card['test_images']} test images")
    write_page()


def card_table(cards: list[dict]) -> str:
    rows = [
        "| Pretrained name | Test accuracy | Steps | Seed | Parameters | Recipe |",
        "|---|---|---|---|---|---|",
    ]
    for c in cards:
        rows.append(
            f"| `{c['name']}` | {100 * c['test_accuracy']:.2f}% ({c['test_images']:,} images) "
            f"| {c['steps']:,} | {c['seed']} | {c['params'] / 1e6:.2f}M | `{c['recipe']}` |"
        )
    return "\n".join(rows)


def card_section(c: dict) -> str:
    claims = "\n".join(f"- {x}" for x in c["claims"]) or "- (none stated)"
    ev = c["evaluated"]
    return (
        f"### `{c['name']}`\n\n"
        f'`attnconv.create_model("{c["name"]}", pretrained=True)`: `{c["model"]}` '
        f"({c['params']:,} parameters), {100 * c['test_accuracy']:.2f}% on the "
        f"{c['test_images']:,} CIFAR-10 test images (loss {c['test_loss']:.4f}), after "
        f"{c['steps']:,} steps of {c['batch_size']} images, seed {c['seed']}"
        f"{' (the default for ' + repr(c['model']) + ')' if c['default'] else ''}.\n\n"
        f"What it supports:\n\n{claims}\n\n"
        f"- Hardware: {c['hardware']}.\n"
        f"- Where the weights come from: {c['source']}\n"
        f"{logged_line(c)}"
        f"- Reproduce: `{c['reproduce']}`\n"
        f"- Evaluated on {ev['date']}, {ev['cpu']}, torch {ev['torch']}; weights "
        f"sha256 `{c['sha256'][:16]}...` ({c['bytes'] / 1e6:.1f} MB).\n"
    )


def logged_line(c: dict) -> str:
    """The experiments page's figure for the same run (its committed log), when it differs."""
    logged, agree = c.get("logged_accuracy"), c.get("log_agreement")
    if logged is None or round(logged, 4) == round(c["test_accuracy"], 4):
        return ""
    same = ""
    if agree:
        same = (
            f" Of the {agree['rows']:,} rows both logs have, the first "
            f"{agree['equal_from_start']:,} carry the same loss and accuracy to every digit."
        )
    return (
        f"- The run the experiments page reports (its committed log) ended at "
        f"{100 * logged:.2f}%; these weights are the same recipe and seed trained or resumed "
        f"again (above), so their accuracy is this card's.{same}\n"
    )


def write_page() -> None:
    """docs/pretrained.md's block between its markers, from the shipped cards."""
    cards = [
        json.loads((p / CARD).read_text())
        for p in sorted(WEIGHTS.glob("*.*"))
        if (p / CARD).is_file()
    ]
    block = card_table(cards) + "\n\n" + "\n".join(card_section(c) for c in cards)
    text = PAGE.read_text()
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    PAGE.write_text(f"{head}{BEGIN}\n{block}\n{END}{tail}")
