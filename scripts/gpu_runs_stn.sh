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
#   OUT=<dir>    also pack the results JSON and logs into $OUT/stn_results.tgz   (scripts/gpu_lines.sh: the shared stages)
# Fashion-MNIST must be readable: $ZOO_DATA_DIR/fashion-mnist or data/fashion-mnist.
#
# Each line is `scripts/results_run.py RECIPE --seeds N`, the plain recipe (what a release needs).
# Minutes per line on one core of the 2-core dev machine, eager (compiling does not pay there), when
# it is not shared: cluttered60 ~45 (about 75 s an epoch, 30 epochs), cluttered100 ~60; under the
# load of other jobs x3-4. On a GPU a line is a few minutes.
# Scoring: attention_results on 500 test canvases per seed, ~1 minute a seed on one core.
PREFIX=stn JOBS=${JOBS:-8}
source "$(dirname "$0")/gpu_lines.sh"

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

stage=${1:-all}
[ $# -gt 0 ] && shift
run_stage "$stage" ${*:-1}
