#!/usr/bin/env bash
# Issue 33, item 2: the hard captioner's estimators on FashionScenes, 3 seeds each: the list of runs,
# for any machine with Java (coco-caption scores the captions with it), a GPU machine or a CPU one.
#
#   bash scripts/runs_sat_estimators.sh                 # one job at a time (a CPU: one training per core pair)
#   PARALLEL=12 bash scripts/runs_sat_estimators.sh     # a GPU machine: 12 jobs side by side
#   FROM=8 TO=13 bash scripts/runs_sat_estimators.sh    # only lines 8-13 of the list (1-based, inclusive)
#   PY=python3 ... to pick the interpreter; LOGS=DIR for the logs (default runs/runs_sat_estimators)
#
# One line is one seed of one recipe: `scripts/results_run.py RECIPE --seeds N` (train with the
# committed recipe and nothing else on the command line, select on validation CIDEr, evaluate val and
# test; the summary results/<name>.json gathers every seed of the same recipe), then that seed's
# attention numbers (`scripts/attention_results.py --run`: pointing, mass in box, deletion gap,
# CHAIR_i, each with its bootstrap 95% interval over 500 test scenes, and their summary over the seeds).
# The lines are in priority order, so a budget that runs out leaves the least needed undone:
#   1-3    the release candidate, hard_scenes_marginal_nofeed, seeds 0-2
#   4      the soft reference's third seed (seeds 0 and 1 are in results/sat_soft_scenes.json: same
#          recipe, no arguments, so the summary takes all three; the seeds' attention summary is
#          results/attention_sat_soft_scenes_seeds.json, beside the release's own record)
#   5-10   seed 0 of every other estimator: the K = 4 sampled ones (VIMCO, leave-one-out without feed),
#          straight-through Gumbel, the marginal in var-attn's and in SAT's order, the authors' REINFORCE
#   11-22  seeds 1 and 2 of those
#   23     the released REINFORCE recipe's seed 2 (seeds 0 and 1 are in results/sat_hard_scenes.json)
# Time per line, measured on one thread of the shared 2-core CPU under load (each seed JSON has its
# train_wall_time_s): K = 1 recipes 10-25 min training + 5 min evaluation + 5-9 min attention;
# K = 4 recipes about 2.5x the training. About 12 CPU-hours for the whole list.
# A CPU runs every recipe eager (`accel: auto` compiles only on CUDA, and these recipes say eager where
# they name a mode); the soft and REINFORCE references' earlier seeds were eager too.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
PARALLEL=${PARALLEL:-1}
FROM=${FROM:-1}
TO=${TO:-1000}
export WANDB_MODE=${WANDB_MODE:-disabled} OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
LOGS=${LOGS:-runs/runs_sat_estimators}
mkdir -p "$LOGS"

# pre-flight: caption metrics need Java (coco-caption); the scenes need Fashion-MNIST; build the
# scenes once (cached under data/scenes), so parallel jobs do not all generate them at once
command -v java >/dev/null || { echo "runs_sat_estimators.sh: no java on PATH (coco-caption needs it)" >&2; exit 2; }
$PY - <<'PYTHON'
import yaml
from zoo.data.scenes import FashionScenesDataModule
args = yaml.safe_load(open("configs/sat/soft_scenes.yaml"))["data"]["init_args"]
FashionScenesDataModule(**args).prepare_data()
print("scenes ready")
PYTHON
DEVICE=$($PY -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")

# results name | recipe | seed
LINES=(
  "sat_hard_scenes_marginal_nofeed|configs/sat/hard_scenes_marginal_nofeed.yaml|0"
  "sat_hard_scenes_marginal_nofeed|configs/sat/hard_scenes_marginal_nofeed.yaml|1"
  "sat_hard_scenes_marginal_nofeed|configs/sat/hard_scenes_marginal_nofeed.yaml|2"
  "sat_soft_scenes|configs/sat/soft_scenes.yaml|2"
)
OTHERS=(
  "sat_hard_scenes_vimco|configs/sat/hard_scenes_vimco.yaml"
  "sat_hard_scenes_nofeed_loo|configs/sat/hard_scenes_nofeed_loo.yaml"
  "sat_hard_scenes_gumbel|configs/sat/hard_scenes_gumbel.yaml"
  "sat_hard_scenes_marginal_current|configs/sat/hard_scenes_marginal_current.yaml"
  "sat_hard_scenes_marginal|configs/sat/hard_scenes_marginal.yaml"
  "sat_hard_scenes_authors|configs/sat/hard_scenes_authors.yaml"
)
for seed in 0 1 2; do
  for spec in "${OTHERS[@]}"; do LINES+=("$spec|$seed"); done
done
LINES+=("sat_hard_scenes|configs/sat/hard_scenes.yaml|2")

job() {  # one line: name|recipe|seed
  IFS="|" read -r name recipe seed <<< "$1"
  {
    $PY scripts/results_run.py "$recipe" --seeds "$seed"
    $PY scripts/attention_results.py --run "results/${name}_seed${seed}.json" --device "$DEVICE"
  } > "$LOGS/${name}_seed${seed}.log" 2>&1 && echo "done ${name} seed ${seed}" \
    || echo "FAILED ${name} seed ${seed} (see $LOGS/${name}_seed${seed}.log)"
}
export -f job
export PY LOGS DEVICE
printf '%s\n' "${LINES[@]}" | sed -n "${FROM},${TO}p" | xargs -P "$PARALLEL" -I{} bash -c 'job "$@"' _ {}

# with jobs side by side, two seeds of a recipe may each have written the summaries before the other
# finished: rewrite them from every seed's JSON (--eval-only reuses each seed's evaluation)
if (( PARALLEL > 1 )); then
  RAN=$(printf '%s\n' "${LINES[@]}" | sed -n "${FROM},${TO}p")
  for spec in $(cut -d'|' -f1,2 <<< "$RAN" | sort -u); do
    name=${spec%%|*}; recipe=${spec#*|}
    seeds=$(grep "^$name|" <<< "$RAN" | cut -d'|' -f3 | tr '\n' ' ')
    { $PY scripts/results_run.py "$recipe" --seeds $seeds --eval-only
      $PY scripts/attention_results.py --summarise "$name"; } > "$LOGS/${name}_summary.log" 2>&1 \
      || echo "FAILED summary ${name} (see $LOGS/${name}_summary.log)"
  done
fi
echo "results: results/sat_*.json results/attention_sat_*.json; logs: $LOGS"
