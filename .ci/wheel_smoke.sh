#!/usr/bin/env bash
# The package as a new user meets it: the wheel built from this checkout, installed into a fresh
# venv outside it, used from an empty folder with no data but what the wheel holds. Run by .ci/run.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
python3 -m pip wheel --no-deps -q -w "$WORK/dist" "$ROOT"
WHEEL="$(ls "$WORK"/dist/attnconv-*.whl)"
SIZE=$(stat -c %s "$WHEEL")
echo "wheel: $(basename "$WHEEL"), $((SIZE / 1000)) kB"
[ "$SIZE" -le 25000000 ] || { echo "the wheel is over 25 MB"; exit 1; }
python3 -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -q torch==2.13.0  # the CPU build, as the README's first line
"$WORK/venv/bin/python" -m pip install -q "$WHEEL"
mkdir "$WORK/empty" && cd "$WORK/empty"
unset ATTNCONV_CIFAR_ZIP
A="$WORK/venv/bin/attnconv"
# a wrong name: one line naming the closest, before torch is imported
if "$A" train cpu/sa_quadratc 2>err.txt; then echo "a wrong recipe name was accepted"; exit 1; fi
grep -q "did you mean cpu/sa_quadratic" err.txt && [ "$(wc -l < err.txt)" -eq 1 ] || { cat err.txt; exit 1; }
"$A" train --list > list.txt  # whole, then read (grep -q would close the pipe early)
grep -q "experiments/grid_long" list.txt
"$A" train cpu/sa_quadratic --set train.epochs=1 --set train.steps_per_epoch=3 --set data.max_per_class=20 --set data.eval_max_per_class=5
"$A" eval runs/sa_quadratic --max-per-class 5
"$A" demo --minutes 1 --out demo_run --no-figures | tail -6
"$WORK/venv/bin/python" -c "import attnconv; names = attnconv.list_pretrained(); print(names); assert names"
NAME="$("$WORK/venv/bin/python" -c "import attnconv; print(attnconv.list_pretrained('sa_quadratic.*')[0])")"
"$A" eval "$NAME" --max-per-class 10
"$A" explore "$NAME" --out grid.html --average 10
[ -s grid.html ]
"$A" convert resnet18_cifar --num-images 8
echo "wheel smoke: passed"
