#!/usr/bin/env bash
# Issue 33, item 2: the hard captioner's estimators on FashionScenes, 3 seeds each, on one GPU.
#
#   bash scripts/gpu_runs_sat.sh [PARALLEL]        # default 12 jobs at a time; PY=python3 to pick the interpreter
#   OPTIONAL=0 bash scripts/gpu_runs_sat.sh        # without the last 3 jobs (the SAT-order marginal)
#
# With $OUT set (the device tool's output folder), the results JSONs, the logs and the best checkpoints
# of the release candidate (hard_scenes_marginal_nofeed, 3 seeds) are copied there at the end.
#
# Every job is independent: one seed of one recipe (`scripts/results_run.py CONFIG --seeds N`: train,
# select on validation CIDEr, evaluate val and test), then that seed's attention numbers
# (`scripts/attention_results.py --run`: pointing, mass in box, deletion gap, CHAIR_i, each with its
# bootstrap 95% interval over the 500 test scenes). The last step only re-summarises (no training):
# the per-seed JSONs of concurrent jobs are gathered into results/<name>.json and
# results/attention_<name>.json. 27 jobs (9 recipes x 3 seeds). CPU time per job, measured on one
# thread of the shared 2-core machine under load (results/sat_hard_scenes_marginal*_seed0.json):
#   K = 1 recipes (marginal*, gumbel, soft, hard, authors): 16-25 min training + 5 min evaluation
#   K = 4 recipes (vimco, nofeed_loo): about 2.5x the training, 45-60 min
#   attention_results --run: 5-6 min
# so the whole list is about 15 CPU-hours; on the GPU, 12 at a time.
# The reference rows that are not new recipes (soft, the release's REINFORCE recipe, the authors'
# rule) run with `--model.init_args.accel eager` (a speed option, recorded in train_args): 2,000
# steps do not repay compiling (results/bench_accel_nvidia_h200_sat_hard.json: break-even 2,353).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
PARALLEL=${1:-12}
export WANDB_MODE=${WANDB_MODE:-disabled} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
LOGS=${LOGS:-runs/gpu_runs_sat}
mkdir -p "$LOGS"

# pre-flight: caption metrics need Java (coco-caption); the scenes need Fashion-MNIST; build the
# scenes once (cached under data/scenes), so the jobs do not all generate them at once
command -v java >/dev/null || { echo "gpu_runs_sat.sh: no java on PATH (coco-caption needs it)" >&2; exit 2; }
$PY - <<'EOF'
import yaml
from zoo.data.scenes import FashionScenesDataModule
args = yaml.safe_load(open("configs/sat/soft_scenes.yaml"))["data"]["init_args"]
FashionScenesDataModule(**args).prepare_data()
print("scenes ready")
EOF

EAGER="-- --model.init_args.accel eager"
# name | results_run arguments (recipe, and --name for the recipes whose default results name is a
# release's); heaviest first (K = 4 paths); the SAT-order marginal (one CPU seed already) is optional
JOBS=(
  "sat_hard_scenes_vimco|configs/sat/hard_scenes_vimco.yaml"
  "sat_hard_scenes_nofeed_loo|configs/sat/hard_scenes_nofeed_loo.yaml"
  "sat_hard_scenes_marginal_nofeed|configs/sat/hard_scenes_marginal_nofeed.yaml"
  "sat_hard_scenes_marginal_current|configs/sat/hard_scenes_marginal_current.yaml"
  "sat_hard_scenes_gumbel|configs/sat/hard_scenes_gumbel.yaml"
  "sat_soft_scenes_3seeds|configs/sat/soft_scenes.yaml --name sat_soft_scenes_3seeds"
  "sat_hard_scenes_3seeds|configs/sat/hard_scenes.yaml --name sat_hard_scenes_3seeds"
  "sat_hard_scenes_authors|configs/sat/hard_scenes_authors.yaml"
)
[[ ${OPTIONAL:-1} == 1 ]] && JOBS+=("sat_hard_scenes_marginal|configs/sat/hard_scenes_marginal.yaml")
SEEDS=(0 1 2)

job() {  # name, results_run arguments, seed, extra
  local name=$1 args=$2 seed=$3 extra=$4
  {
    $PY scripts/results_run.py $args --seeds "$seed" $extra
    $PY scripts/attention_results.py --run "results/${name}_seed${seed}.json" --device cuda \
      || $PY scripts/attention_results.py --run "results/${name}_seed${seed}.json"   # on the CPU if CUDA fails
  } > "$LOGS/${name}_seed${seed}.log" 2>&1 && echo "done ${name} seed ${seed}" || echo "FAILED ${name} seed ${seed} (see $LOGS/${name}_seed${seed}.log)"
}
export -f job
export PY LOGS

lines=()  # the 24 main jobs seed by seed, heaviest first; the optional recipe's 3 last
for seed in "${SEEDS[@]}"; do
  for spec in "${JOBS[@]:0:8}"; do
    name=${spec%%|*}; args=${spec#*|}
    extra=""
    case $name in sat_soft_scenes_3seeds|sat_hard_scenes_3seeds|sat_hard_scenes_authors) extra=$EAGER ;; esac
    lines+=("$name|$args|$seed|$extra")
  done
done
for seed in "${SEEDS[@]}"; do
  for spec in "${JOBS[@]:8}"; do
    name=${spec%%|*}; args=${spec#*|}
    extra=""
    case $name in sat_soft_scenes_3seeds|sat_hard_scenes_3seeds|sat_hard_scenes_authors) extra=$EAGER ;; esac
    lines+=("$name|$args|$seed|$extra")
  done
done
printf '%s\n' "${lines[@]}" | xargs -P "$PARALLEL" -I{} bash -c 'IFS="|" read -r n a s e <<< "{}"; job "$n" "$a" "$s" "$e"'

# gather: every seed's results and attention JSON into the summaries (no training, no evaluation)
for spec in "${JOBS[@]}"; do
  name=${spec%%|*}; args=${spec#*|}
  extra=""
  case $name in sat_soft_scenes_3seeds|sat_hard_scenes_3seeds|sat_hard_scenes_authors) extra=$EAGER ;; esac
  $PY scripts/results_run.py $args --seeds "${SEEDS[@]}" --eval-only $extra > "$LOGS/${name}_summary.log" 2>&1 || echo "FAILED summary ${name}"
  $PY scripts/attention_results.py --summarise "$name" >> "$LOGS/${name}_summary.log" 2>&1 || echo "FAILED attention summary ${name}"
done
echo "results: results/sat_*.json results/attention_sat_*.json; logs: $LOGS"
if [[ -n ${OUT:-} ]]; then
  mkdir -p "$OUT/results" "$OUT/logs" "$OUT/checkpoints"
  for spec in "${JOBS[@]}"; do
    name=${spec%%|*}
    cp results/"$name".json results/"$name"_seed*.json results/attention_"$name".json results/attention_"$name"_seed*.json \
      "$OUT/results/" 2>/dev/null || echo "some results of $name are missing"
  done
  cp "$LOGS"/*.log "$OUT/logs/"
  for seed in "${SEEDS[@]}"; do
    for ckpt in runs/results/sat_hard_scenes_marginal_nofeed/seed"$seed"/checkpoints/best-*.ckpt; do
      base=$(basename "$ckpt"); [[ -f $ckpt ]] && cp "$ckpt" "$OUT/checkpoints/sat_hard_scenes_marginal_nofeed_seed${seed}_${base//=/-}"
    done
  done
fi
