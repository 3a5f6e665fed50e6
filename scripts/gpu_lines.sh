# Sourced by scripts/gpu_runs_<name>.sh: what every GPU results script does with its lines. The
# caller sets PREFIX (its results' prefix, results/<PREFIX>_<recipe>_seed<N>.json, and its recipes'
# folder, configs/<PREFIX>) and JOBS before sourcing, then TIER1, TIER2, ... ("recipe seed seed ..."
# per line), and may define `after_summary NAME RECIPE SEEDS` (more scoring per recipe, in the background);
# SCORE_ATTENTION=0 leaves out the attention scoring (recipes that do not attend).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
EXTRA=${EXTRA:-}
CONFIGS=configs/$PREFIX LOGS=logs/gpu_runs_$PREFIX
export WANDB_MODE=disabled OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1 PYTHONUNBUFFERED=1
mkdir -p "$LOGS" results

lines() {  # the "recipe seed" lines of the given tiers
  local tier text
  for tier in "$@"; do
    text=$(eval "echo \"\${TIER$tier-}\"")
    [ -n "$text" ] || { echo "$(basename "$0"): error: no tier $tier" >&2; exit 2; }
    echo "$text"
  done | sed '/^$/d' | while read -r recipe seeds; do for seed in $seeds; do echo "$recipe $seed"; done; done
}

train_one() {  # recipe seed
  local name; name=${PREFIX}_$(basename "$1" .yaml)
  "$PY" scripts/results_run.py "$1" --seeds "$2" ${EXTRA:+-- $EXTRA} >"$LOGS/${name}_seed$2.log" 2>&1
  echo "$name seed $2: exit $?"
}
export -f train_one
export PY LOGS EXTRA PREFIX

score() {  # each recipe trained here: its summary over the seeds that finished, then their attention
  for log in "$LOGS/${PREFIX}"_*_seed*.log; do
    [ -e "$log" ] || continue
    base=$(basename "$log" .log); base=${base%_resume}; echo "${base%_seed*} ${base##*_seed}"
  done | sort -u | awk '{seeds[$1] = seeds[$1] " " $2} END {for (n in seeds) print n seeds[n]}' | {
  while read -r name seeds; do
    recipe=$CONFIGS/${name#"${PREFIX}"_}.yaml
    ok=""
    for s in $seeds; do [ -f "results/${name}_seed$s.json" ] && ok="$ok $s"; done
    [ -n "$ok" ] || { echo "$name: no seed finished"; continue; }
    # the summary once more, after every seed has written its own JSON (parallel seeds race for it)
    "$PY" scripts/results_run.py "$recipe" --seeds $ok --eval-only ${EXTRA:+-- $EXTRA} >"$LOGS/${name}_summary.log" 2>&1
    echo "$name seeds$ok: summary exit $?"
    [ "${SCORE_ATTENTION:-1}" = 0 ] || ( "$PY" scripts/attention_results.py --results-run "$name" --seeds $ok --n 500 >"$LOGS/${name}_attention.log" 2>&1
      echo "$name: attention exit $?" ) &
    if declare -F after_summary >/dev/null; then after_summary "$name" "$recipe" "$ok"; fi
  done
  wait  # (inside the pipeline's shell, whose children the scoring jobs are)
  }
}

pack() {  # with OUT=<dir>: the results JSON and logs in one archive
  [ -n "${OUT:-}" ] || return 0
  tar czf "$OUT/${PREFIX}_results.tgz" results/"${PREFIX}"_*.json results/attention_"${PREFIX}"_*.json "$LOGS" 2>/dev/null
  echo "packed $OUT/${PREFIX}_results.tgz"
}

run_stage() {  # stage [tiers...]; the caller's own stages go before it in its case
  local stage=$1; shift
  case $stage in
    list) lines "$@" | while read -r recipe seed; do echo "$PY scripts/results_run.py $recipe --seeds $seed"; done ;;
    train) lines "$@" | xargs -P "$JOBS" -L 1 bash -c 'train_one "$0" "$1"' ;;
    score) score; pack ;;
    all) lines "$@" | xargs -P "$JOBS" -L 1 bash -c 'train_one "$0" "$1"'; score; pack ;;
    *) echo "$(basename "$0"): error: stage is all, train, score or list${EXTRA_STAGES:-}" >&2; exit 2 ;;
  esac
}
