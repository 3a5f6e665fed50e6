#!/usr/bin/env bash
# The STN results runs (issue 32; docs/results.md and docs/attention.md), for one machine with a GPU
# and many cores: every training line is independent (one recipe, one seed), so they run side by
# side; then each recipe's seeds are summarised and their attention scored.
#
#   bash scripts/gpu_runs_stn.sh                 # tier 1: train in parallel, then score
#   bash scripts/gpu_runs_stn.sh train 1 2       # only train those tiers
#   bash scripts/gpu_runs_stn.sh score           # only score what has been trained
#   bash scripts/gpu_runs_stn.sh list 1 2        # print the lines, do nothing
#
#   PY=python3   the interpreter (default .venv/bin/python)     JOBS=8   training processes at a time
#   OUT=<dir>    also pack the results JSON and logs into $OUT/stn_results.tgz
# Fashion-MNIST must be readable: $ZOO_DATA_DIR/fashion-mnist or data/fashion-mnist.
#
# Each line is `scripts/results_run.py RECIPE --seeds N`, the plain recipe (what a release needs).
# Minutes per line on one core of the 2-core dev machine, eager (compiling does not pay there), when
# it is not shared: cluttered60 ~45 (about 75 s an epoch, 30 epochs), cluttered100 ~60; under the
# load of other jobs x3-4. On a GPU a line is a few minutes.
# Scoring: attention_results on 500 test canvases per seed, ~1 minute a seed on one core.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
JOBS=${JOBS:-8}
export WANDB_MODE=disabled OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
LOGS=logs/gpu_runs_stn
mkdir -p "$LOGS" results

# tier 1: the two recipes of the tables, 3 seeds each
TIER1="
configs/stn/fmnist_cluttered60.yaml 0 1 2
configs/stn/fmnist_cluttered100.yaml 0 1 2
"
# tier 2: cluttered100's plain recipe never leaves the identity transform: does a distractor
# curriculum (with the six-parameter or the attention transform) or a second, recurrent glimpse find the item?
TIER2="
configs/stn/fmnist_cluttered100_curriculum.yaml 0 1
configs/stn/fmnist_cluttered100_attention_curriculum.yaml 0 1
configs/stn/fmnist_cluttered100_2glimpses.yaml 0 1
"

lines() {  # "recipe seed" per line, for the given tiers
  for tier in "$@"; do
    case $tier in 1) echo "$TIER1" ;; 2) echo "$TIER2" ;;
      *) echo "gpu_runs_stn.sh: error: no tier $tier (1 or 2)" >&2; exit 2 ;; esac
  done | sed '/^$/d' | while read -r recipe seeds; do for seed in $seeds; do echo "$recipe $seed"; done; done
}

train_one() {  # recipe seed
  local name; name=stn_$(basename "$1" .yaml)
  "$PY" scripts/results_run.py "$1" --seeds "$2" >"$LOGS/${name}_seed$2.log" 2>&1
  echo "$name seed $2: exit $?"
}
export -f train_one
export PY LOGS

score() {  # each recipe's summary over the seeds that finished, then their attention
  for log in "$LOGS"/stn_*_seed*.log; do
    [ -e "$log" ] || continue
    base=$(basename "$log" .log); echo "${base%_seed*} ${base##*_seed}"
  done | sort -u | awk '{seeds[$1] = seeds[$1] " " $2} END {for (n in seeds) print n seeds[n]}' |
  while read -r name seeds; do
    ok=""
    for s in $seeds; do [ -f "results/${name}_seed$s.json" ] && ok="$ok $s"; done
    [ -n "$ok" ] || { echo "$name: no seed finished"; continue; }
    "$PY" scripts/results_run.py "configs/stn/${name#stn_}.yaml" --seeds $ok --eval-only >"$LOGS/${name}_summary.log" 2>&1
    echo "$name seeds$ok: summary exit $?"
    "$PY" scripts/attention_results.py --results-run "$name" --seeds $ok --n 500 >"$LOGS/${name}_attention.log" 2>&1
    echo "$name: attention exit $?"
  done
}

pack() {
  [ -n "${OUT:-}" ] || return 0
  tar czf "$OUT/stn_results.tgz" results/stn_*.json results/attention_stn_*.json "$LOGS" 2>/dev/null
  echo "packed $OUT/stn_results.tgz"
}

stage=${1:-all}
[ $# -gt 0 ] && shift
tiers=${*:-1}
case $stage in
  list) lines $tiers | while read -r recipe seed; do echo "$PY scripts/results_run.py $recipe --seeds $seed"; done ;;
  train) lines $tiers | xargs -P "$JOBS" -L 1 bash -c 'train_one "$0" "$1"' ;;
  score) score; pack ;;
  all) lines $tiers | xargs -P "$JOBS" -L 1 bash -c 'train_one "$0" "$1"'; score; pack ;;
  *) echo "gpu_runs_stn.sh: error: stage is all, train, score or list" >&2; exit 2 ;;
esac
