#!/usr/bin/env bash
# The GPU checks, in one command, for whoever has a machine with one CUDA GPU:
#   1. the CUDA tests (tests/test_accel.py -k test_cuda: compiled and reduce-overhead steps equal
#      eager and make no host sync; the CPU tests of that file run in CI);
#   2. benchmarks/accel.py on CUDA (eager, compile, reduce-overhead), into
#      results/bench_accel_<device>.json, rewritten after every family;
#   3. the ViT MFU benchmark (benchmarks/vit.py --gpu), into results/bench_vit_<device>.json.
# Run it unchanged: bash scripts/gpu_check.sh. Commit the two JSON files; docs/acceleration.md says
# what they decide (which mode `--accel auto` picks on CUDA). Each stage has its own time limit, and
# together they fit in under 10 minutes (a short GPU lease): GPU_CHECK_SCALE=4 gives each stage four
# times as long and the benchmark every family at two batch sizes. The exit code is the number of
# stages that failed.
#   PY=python3              the interpreter (default .venv/bin/python, made by `make setup`)
#   ZOO_COMMIT=<sha>        the commit to record when the tree is a copy without .git
#   OUT=<dir>               also copy the logs and JSON files there
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
SCALE=${GPU_CHECK_SCALE:-1}
if [ ! -x "$PY" ] && ! command -v "$PY" >/dev/null; then
  make setup >/dev/null || { echo "gpu_check.sh: error: make setup failed" >&2; exit 2; }
fi
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check.sh: error: no CUDA device here (this check needs one GPU)" >&2
  exit 2
fi
device=$("$PY" -c "import re, torch; print(re.sub(r'[^a-z0-9]+', '_', torch.cuda.get_device_name(0).lower()).strip('_'))")
"$PY" -c "import torch; print('torch', torch.__version__, 'on', torch.cuda.get_device_name(0))"
batches="recipe"
if [ "$SCALE" -gt 1 ]; then batches="recipe 1000"; fi
logs=$(mktemp -d)
failed=0
stage() {  # stage NAME SECONDS COMMAND...
  local name=$1 limit=$(( $2 * SCALE )); shift 2
  echo "== $name (at most ${limit}s): $*"
  local start=$SECONDS
  if timeout "$limit" "$@" 2>&1 | tee "$logs/${name// /_}.log"; then
    echo "== $name: passed in $((SECONDS - start))s"
  else
    echo "== $name: FAILED after $((SECONDS - start))s"; failed=$((failed + 1))
  fi
}
workers=$("$PY" -c "import xdist" 2>/dev/null && echo "-n 6")  # compiling is CPU work: one GPU, six processes
# shellcheck disable=SC2086
stage "CUDA tests" 180 "$PY" -m pytest -q -rs -p no:cacheprovider $workers tests/test_accel.py -k test_cuda
# shellcheck disable=SC2086
stage "accel benchmark" 250 "$PY" benchmarks/accel.py --device cuda --batches $batches \
  --rounds 3 --steps 10 --out "results/bench_accel_${device}.json"
stage "ViT MFU benchmark" 150 "$PY" benchmarks/vit.py --gpu --out "results/bench_vit_${device}.json"
if [ -n "${OUT:-}" ]; then
  cp "$logs"/*.log "$OUT"/ 2>/dev/null
  cp "results/bench_accel_${device}.json" "results/bench_vit_${device}.json" "$OUT"/ 2>/dev/null
fi
echo "gpu_check.sh: $failed stage(s) failed; results in results/bench_accel_${device}.json, results/bench_vit_${device}.json"
exit "$failed"
