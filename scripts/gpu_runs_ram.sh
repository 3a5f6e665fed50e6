#!/usr/bin/env bash
# The RAM results runs of issue 33 (docs/attention.md, "What made RAM find the item"), for one
# machine with a GPU and many cores: every training line is independent (one recipe, one seed), so
# they run side by side; then each recipe's seeds are summarised and scored.
#
#   bash scripts/gpu_runs_ram.sh                 # tiers 1 and 2: train in parallel, then score
#   bash scripts/gpu_runs_ram.sh train 1 2 3     # only train those tiers
#   bash scripts/gpu_runs_ram.sh resume 1 2      # finish lines a time limit stopped (from last.ckpt), evaluate
#   bash scripts/gpu_runs_ram.sh score           # only score what has been trained
#   bash scripts/gpu_runs_ram.sh list 1 2 3      # print the lines, do nothing
#
# Size a call by this (the first lease, one H200 with 16 CPU cores, torch 2.11.0+cu130, commit 3b24441):
# `JOBS=16 timeout 390 bash scripts/gpu_runs_ram.sh train 1 2` ran 16 lines side by side (tier 1 and
# the first 4 of tier 2): ~50 s of start-up (imports, canvases), a first epoch of 35-44 s (compilation),
# then 13-14 s per epoch each; lines with 4 paths per image or on cluttered100 were about as fast (one
# CPU core per line is the limit there, not the GPU). 390 s was too short: SIGTERM stopped every line
# at epoch 21-23 of 30 (train.py saves last.ckpt), and each was resumed on the same machine with
# `train.py fit --config RECIPE --seed_everything N --trainer.default_root_dir runs/results/NAME/seedN
# --ckpt_path last` (~2 min for the last 7-9 epochs) and evaluated with `results_run.py RECIPE --seeds N
# --eval-only` (~30 s): what `resume` does. Such a run records no training wall time (its results JSON:
# train_wall_time_s null and a "training" account; say so where it is quoted). So 30 epochs of up to 16
# lines need ~8.5 min of training and ~1 min of evaluation, about the whole 10-minute command limit:
# give the call `timeout 590`, at most JOBS=16 lines (no more lines than cores), and keep lease minutes
# for one `resume` call. Score on any machine afterwards (checkpoints travel slimmed to weights,
# hyperparameters and zoo config: the transfer limit is 16 MB a file).
#
#   PY=python3        the interpreter (default .venv/bin/python)
#   JOBS=14           training processes at a time (one core each, OMP_NUM_THREADS=1)
#   ZOO_COMMIT=<sha>  the commit to record when the tree is a copy without .git
#   OUT=<dir>         also pack the results JSON and logs into $OUT/ram_results.tgz
#   EXTRA="..."       train.py arguments for every line (a smoke test only: results_run records them,
#                     and the tables take runs without them)
# Fashion-MNIST must be readable: $ZOO_DATA_DIR/fashion-mnist or data/fashion-mnist (the four .gz
# IDX files of /usr/share/datasets/fashion-mnist, 30 MB).
#
# Each line is `scripts/results_run.py RECIPE --seeds N` (accelerator auto: the GPU when there is
# one; the JSON records the device). Minutes per line on the shared 2-core dev machine (30 epochs,
# one training at a time beside other work): cluttered60 ~11-14 (22-26 s per epoch, compiled), with
# 4 paths per image ~40-50 (0.24 s per step eager); cluttered100 ~30-40 (0.17 s per step eager), with 4
# paths per image 2.5-3.5 hours (1 s per step eager): run that one on a GPU.
# Scoring per recipe: attention_results on 500 test canvases and the policy probe on 2,000, ~1 min
# per seed on one core.
PREFIX=ram JOBS=${JOBS:-14}
source "$(dirname "$0")/gpu_lines.sh"

TIER1="
configs/ram/fmnist_cluttered60_dram.yaml 0 1 2
configs/ram/fmnist_cluttered60_dram_paths4.yaml 0 1 2
configs/ram/fmnist_cluttered100_dram.yaml 0 1 2
configs/ram/fmnist_cluttered100_dram_2scales.yaml 0 1 2
"
# (all 12 on the H200, stopped at the 390 s cap and resumed once)
# tier 2: each remedy alone on cluttered60 (context network; shaped reward), and the curriculum
TIER2="
configs/ram/fmnist_cluttered60_context.yaml 0 1 2
configs/ram/fmnist_cluttered60_shaped.yaml 0 1 2
configs/ram/fmnist_cluttered60_dram_curriculum.yaml 0 1 2
"
# (context 0-2 and shaped 0 on the H200, resumed once; shaped 1-2 and the curriculum on the 2-core CPU)
# tier 3: 60 epochs (twice a line's time), the labelled box-supervised row, and a third seed of the
# earlier 4-glimpse recipes (their seeds 0 and 1 ran on CPU)
TIER3="
configs/ram/fmnist_cluttered60_dram_long.yaml 0 1 2
configs/ram/fmnist_cluttered60_dram_boxes.yaml 0 1 2
configs/ram/fmnist_cluttered60_4glimpses.yaml 2
configs/ram/fmnist_cluttered100_4glimpses.yaml 2
"
# (boxes and fmnist_cluttered60_4glimpses seed 2 on the CPU; dram_long and cluttered100_4glimpses seed 2 not run)
# tier 4: cluttered100 toward 70%: 4 paths per image (~1 s per step on the 2-core CPU, 2.5-3.5 hours
# a seed there: the first thing to run on the next lease) and the distractor curriculum
TIER4="
configs/ram/fmnist_cluttered100_dram_paths4.yaml 0 1 2
configs/ram/fmnist_cluttered100_dram_curriculum.yaml 0 1 2
"
# (the second H200 lease, commit ab2d3f8: `JOBS=6 timeout 505 bash scripts/gpu_runs_ram.sh train 4`, all 6
# lines side by side finished 30 epochs and their evaluation in 452 s, ~330 s of training each)

resume_one() {  # recipe seed: finish a line stopped by a time limit, from its last.ckpt, and evaluate it
  local name root; name=ram_$(basename "$1" .yaml); root=runs/results/$name/seed$2
  [ -f "results/${name}_seed$2.json" ] && { echo "$name seed $2: done already"; return 0; }
  [ -f "$root/checkpoints/last.ckpt" ] || { echo "$name seed $2: no $root/checkpoints/last.ckpt"; return 0; }
  "$PY" train.py fit --config "$1" --seed_everything "$2" --trainer.default_root_dir "$root" --ckpt_path last \
    ${EXTRA:+$EXTRA} >"$LOGS/${name}_seed$2_resume.log" 2>&1 &&
    "$PY" scripts/results_run.py "$1" --seeds "$2" --eval-only ${EXTRA:+-- $EXTRA} >>"$LOGS/${name}_seed$2_resume.log" 2>&1
  echo "$name seed $2: resume exit $?"
}
export -f resume_one

after_summary() {  # name recipe seeds: the policy probe of each seed (scripts/ram_policy_probe.py)
  local s
  for s in $3; do
    ( ckpt=$("$PY" -c "import json; print(json.load(open('results/${1}_seed$s.json'))['checkpoint'])")
      "$PY" scripts/ram_policy_probe.py "$ckpt" --tag "${1#ram_}_seed$s" --n 2000 \
        --trained-with "python scripts/results_run.py $2 --seeds $s" >"$LOGS/${1}_probe$s.log" 2>&1
      echo "$1 seed $s: probe exit $?" ) &
  done
}

stage=${1:-all}
[ $# -gt 0 ] && shift
tiers=${*:-1 2}
case $stage in
  resume) lines $tiers | xargs -P "$JOBS" -L 1 bash -c 'resume_one "$0" "$1"' ;;
  *) EXTRA_STAGES=" (or resume)" run_stage "$stage" $tiers ;;
esac
