#!/usr/bin/env bash
# The results runs behind the README's tables, in one place: `make results` (or pick lines).
# Each line trains per seed, selects on validation and evaluates on val and test (scripts/results_run.py),
# writing results/<family>_<recipe>.json. Budget: the recipes' own epochs; hours on 2 CPU cores.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
export WANDB_MODE=${WANDB_MODE:-offline}
run() { $PY scripts/results_run.py "$@"; }

# Foundation baselines (the comparison rows for RAM and DRAW)
run configs/baseline/mlp_centered.yaml      --seeds 0 1 2
run configs/baseline/cnn_centered.yaml      --seeds 0 1 2
run configs/baseline/mlp_cluttered60.yaml   --seeds 0 1 2
run configs/baseline/cnn_cluttered60.yaml   --seeds 0 1 2
run configs/baseline/smallcnn_centered.yaml    --seeds 0
run configs/baseline/smallcnn_cluttered60.yaml --seeds 0
