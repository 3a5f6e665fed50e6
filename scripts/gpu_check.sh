#!/usr/bin/env bash
# The GPU checks, in one command, for whoever has a machine with one CUDA GPU (about 40 minutes at most):
#   1. the CUDA tests (tests/test_accel.py: eager, compiled and graphed steps agree on CUDA);
#   2. benchmarks/accel.py for every family on CUDA (eager, compile, graph), into
#      results/bench_accel_<device>.json;
#   3. the ViT MFU benchmark (benchmarks/vit.py --gpu), into results/bench_vit_<device>.json.
# Run it unchanged: bash scripts/gpu_check.sh. Commit the two JSON files; docs/acceleration.md says
# what they decide (whether `graph` may become a default). Each stage has its own time limit; the
# exit code is the number of stages that failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ ! -x "$PY" ]; then make setup >/dev/null || { echo "gpu_check.sh: error: make setup failed" >&2; exit 2; }; fi
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check.sh: error: no CUDA device here (this check needs one GPU)" >&2
  exit 2
fi
device=$("$PY" -c "import re, torch; print(re.sub(r'[^a-z0-9]+', '_', torch.cuda.get_device_name(0).lower()).strip('_'))")
failed=0
stage() {  # stage NAME SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  echo "== $name (at most ${limit}s): $*"
  local start=$SECONDS
  if timeout "$limit" "$@"; then echo "== $name: passed in $((SECONDS - start))s"
  else echo "== $name: FAILED (exit $?) after $((SECONDS - start))s"; failed=$((failed + 1)); fi
}
stage "CUDA tests" 600 "$PY" -m pytest -q -rs tests/test_accel.py
stage "accel benchmark" 1500 "$PY" benchmarks/accel.py --device cuda --rounds 3 --steps 10 \
  --out "results/bench_accel_${device}.json"
stage "ViT MFU benchmark" 300 "$PY" benchmarks/vit.py --gpu --out "results/bench_vit_${device}.json"
echo "gpu_check.sh: $failed stage(s) failed; results in results/bench_accel_${device}.json, results/bench_vit_${device}.json"
exit "$failed"
