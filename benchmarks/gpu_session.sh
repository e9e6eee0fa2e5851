#!/usr/bin/env bash
# The prepared script for a lent GPU (minutes at a time): within 420 s on one H100/H200, it
# runs the cuda suite's paper-model training step first (the figures most wanted), a smoke test
# of the Triton kernel, its
# content-attention group (the Triton kernel against Flex, dense SDPA + bias and no-bias SDPA)
# and what time allows of its SASA group (Flex, the window function, unfold, the Triton window
# kernel), each case saved as it finishes, then the CUDA tests in the time left: the paper
# models trained, stopped, resumed and evaluated by the CLI on the GPU first, then the GPU
# kernels' (the timeouts add to 390 s, the goals' read after them). Run from the repository root on the GPU machine, whose python3 holds
# torch and triton:  OUT=<folder> bash benchmarks/gpu_session.sh
# Results: $OUT/gpu_session.log, $OUT/cuda_models.{json,md}, $OUT/cuda_layers_content.{json,md},
# $OUT/cuda_layers_local.{json,md} (or cuda_layers_<group>.partial.json when the time ran out),
# $OUT/cuda_tests.log, $OUT/gpu_goals.md (the issue's goals read from them); copy them to
# benchmarks/results/.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=src
OUT=${OUT:-benchmarks/results}
mkdir -p "$OUT"
LOG="$OUT/gpu_session.log"
py=${PYTHON:-python3}
START=$(date +%s)
# DRY_RUN=1: the same steps on a CPU, the script's own code checked before a GPU's minutes are
# spent on it (tests/test_gpu_session_script.py): the suites with --device cpu --quick, the
# Triton kernels through TRITON_INTERPRET=1, one timed call each, 25 s of CUDA tests; no figure of
# it means anything
DRY=""
TESTS_S=60
LOCAL_S=45  # the SASA group's seconds
REPS_MODELS=5; REPS=3; INNER=5  # timed repeats (medians) and calls a timing
if [ "${DRY_RUN:-0}" = 1 ]; then
  export TRITON_INTERPRET=1
  DRY="--device cpu --quick"
  TESTS_S=25
  LOCAL_S=120  # the interpreter on two shared cores: its code run once, whatever their load
  REPS_MODELS=1; REPS=1; INNER=1  # one call of each: the code runs, no figure is kept
  # tests that pass on a CPU in seconds go first, so the step's lines are checked whatever
  # the interpreter's speed (on a GPU the list below keeps its order)
  FIRST_TESTS=tests/test_cuda_models_bench.py
fi
{ date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  $py -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } \
  2>&1 | tee "$LOG"
# Measurements before the long tests: on a GPU every new shape of the Triton tests is a compile
# (their count and compile time: benchmarks/triton_test_compiles.py, docs/benchmarks.md), and
# the suites below record each kernel's error against float64 themselves.
echo "== paper models, full training step" | tee -a "$LOG"
timeout 150 $py -m attnconv.cli bench --suite cuda --repeats $REPS_MODELS --out-dir "$OUT" -- --only models $DRY \
  2>&1 | tail -30 | tee -a "$LOG"
echo "== smoke: the Triton kernel in the layer, float64 and bf16 autocast" | tee -a "$LOG"
timeout 45 $py -m pytest -q -p no:cacheprovider -m "slow or not slow" tests/test_triton_axis.py -k layer_backend_triton \
  2>&1 | tail -15 | tee -a "$LOG"
echo "== content attention kernels" | tee -a "$LOG"
timeout 110 $py -m attnconv.cli bench --suite cuda --repeats $REPS --out-dir "$OUT" -- --only content \
  --inner $INNER $DRY 2>&1 | tail -60 | tee -a "$LOG"
echo "== SASA window kernels, training (as many cases as the time allows; 56x56 first)" | tee -a "$LOG"
timeout $LOCAL_S $py -m attnconv.cli bench --suite cuda --repeats $REPS --out-dir "$OUT" -- --only local \
  --mode train --inner $INNER $DRY 2>&1 | tail -30 | tee -a "$LOG"
echo "== CUDA tests (the time left; each test's line in cuda_tests.log as it ends)" | tee -a "$LOG"
# the time the steps above left unused goes to the tests: 390 s less what has passed (30 s kept
# for the goals), never under 40 s (the whole script then ends within 420 s: a 15-minute device
# budget holds a machine's start, one run and a rerun)
if [ "${DRY_RUN:-0}" != 1 ]; then
  TESTS_S=$((390 - ($(date +%s) - START)))
  [ "$TESTS_S" -lt 40 ] && TESTS_S=40
fi
echo "CUDA tests: ${TESTS_S} s" | tee -a "$LOG"
# -v -rfE: a test's verdict is written when it ends, so a timeout keeps those that ran;
# -m "slow or not slow": the files' slow tests too (slow through the CPU's interpreter, and
# test_cuda_backend.py's GPU property test), which the default -m "not slow" would leave out
# first the paper models trained, stopped, resumed and evaluated by the CLI on the GPU, and the
# Triton kernels queued without a host-device sync (seconds)
timeout ${TESTS_S:-60} $py -m pytest -v -rfE -p no:cacheprovider -m "slow or not slow" ${FIRST_TESTS:-} \
  tests/test_cuda_train.py \
  tests/test_cuda_sync.py \
  tests/test_functional.py::test_on_a_gpu_odd_head_widths_still_take_a_fused_kernel \
  tests/test_data.py::test_a_loader_on_the_gpu_yields_the_cpu_loaders_batches \
  tests/test_hash_dropout.py::test_module_runs_torchs_dropout_on_cuda tests/test_triton_axis.py \
  tests/test_triton_local.py tests/test_cuda_models_bench.py tests/test_cuda_backend.py \
  tests/test_triton_shared.py tests/test_hi_kept_low.py \
  > "$OUT/cuda_tests.log" 2>&1
echo "exit $? (124: the time ran out); $(grep -c ' PASSED' "$OUT/cuda_tests.log") passed," \
  "$(grep -c ' FAILED' "$OUT/cuda_tests.log") failed" | tee -a "$LOG"
grep -E ' FAILED|^E  ' "$OUT/cuda_tests.log" | head -40 | tee -a "$LOG"
echo "== issue 45's goals, read from the files above" | tee -a "$LOG"
$py benchmarks/gpu_goals.py "$OUT" 2>&1 | tail -80 | tee -a "$LOG"
echo "== done $(date -u)" | tee -a "$LOG"
