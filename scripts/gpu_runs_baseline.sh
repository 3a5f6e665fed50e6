#!/usr/bin/env bash
# The scale issue's CNN reference lines (issue 43; docs/scaling.md), for one machine with a GPU and
# many cores: every training line is independent (one recipe, one seed), so they run side by side;
# then each recipe's seeds are summarised. The CNNs do not attend: no attention scoring.
#
#   bash scripts/gpu_runs_baseline.sh                 # tier 1: train in parallel, then summarise
#   bash scripts/gpu_runs_baseline.sh train 1         # only train that tier
#   bash scripts/gpu_runs_baseline.sh list 1          # print the lines, do nothing
#
#   PY=python3   the interpreter (default .venv/bin/python)     JOBS=3   training processes at a time
#   OUT=<dir>    also pack the results JSON and logs into $OUT/baseline_results.tgz
# Fashion-MNIST must be readable: $ZOO_DATA_DIR/fashion-mnist or data/fashion-mnist.
#
# Each line is `scripts/results_run.py RECIPE --seeds N`, the plain recipe (what a release needs).
# Why a GPU: a training step of the small CNN on 32 canvases of 400 px takes ~16 s on one core of the
# 2-core dev machine (2.8 h an epoch of the recipe's 20,000 canvases; 15 epochs ~42 h). The canvases
# are drawn in the loader (~1,200 a second per process at 400 px), which bounds a line on a GPU.
PREFIX=baseline JOBS=${JOBS:-3} SCORE_ATTENTION=0
source "$(dirname "$0")/gpu_lines.sh"

# tier 1: the modern small CNN at 400 px, the issue's reference (3 seeds, a headline row)
TIER1="
configs/baseline/smallcnn_scale400.yaml 0 1 2
"

stage=${1:-all}
[ $# -gt 0 ] && shift
run_stage "$stage" ${*:-1}
