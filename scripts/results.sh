#!/usr/bin/env bash
# The results runs behind the tables of README.md, docs/results.md, docs/attention.md and
# docs/captioning.md, exactly as the tables report them (seeds, names and arguments;
# docs/tables.yaml names each results file):
# `make results`, or pick lines. Each line trains per seed, selects on validation and evaluates on
# val and test (scripts/results_run.py), writing results/<name>_seed<N>.json and results/<name>.json.
# Budget: the recipes' own epochs; hours on 2 CPU cores. Then `python scripts/results_tables.py`.
#
# Two rows are earlier recipes kept for comparison; they come from the recipe file as it was at
# their commit, not from today's: `vit_fmnist` (configs/vit/fmnist.yaml at 07e0a93) and
# `draw_cluttered100_classifier` (lr 1e-3, at 543891a). Check them out to rerun them.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
run() { $PY scripts/results_run.py "$@"; }

# Fashion-MNIST classification: baselines, RAM (Mnih et al. 2014), ViT, DRAW's classifier
run configs/baseline/mlp_centered.yaml      --seeds 0 1 2
run configs/baseline/cnn_centered.yaml      --seeds 0 1 2
run configs/baseline/mlp_cluttered60.yaml   --seeds 0 1 2
run configs/baseline/cnn_cluttered60.yaml   --seeds 0 1 2
run configs/ram/fmnist_centered.yaml        --seeds 0 1 2
run configs/ram/fmnist_cluttered60.yaml     --seeds 0 1
run configs/ram/fmnist_cluttered100.yaml    --seeds 0
run configs/ram/fmnist_cluttered60_4glimpses.yaml  --seeds 0 1 2
run configs/ram/fmnist_cluttered100_4glimpses.yaml --seeds 0 1
run configs/vit/fmnist.yaml                 --seeds 0 --name vit_fmnist_convstem
run configs/vit/fmnist_cluttered60.yaml     --seeds 0 -- --trainer.max_epochs 7
# (the name of the run that set the recipe's lr; the recipe has lr 5e-4 now, the argument repeats it)
run configs/draw/cluttered100_classifier.yaml    --seeds 0 --name draw_cluttered100_classifier_lr5e-4 -- --model.init_args.lr 0.0005
run configs/draw/cluttered100_classifier_t4.yaml --seeds 0 1

# RAM's ablation of issue 33 (docs/attention.md, "What made RAM find the item"); then score each with
# `python scripts/attention_results.py --results-run ram_fmnist_<recipe> --seeds ...`. "H200": those
# seeds ran on a GPU (scripts/gpu_runs_ram.sh, which also scores them); the 4-paths lines take hours here.
run configs/ram/fmnist_cluttered60_context.yaml          --seeds 0 1 2   # H200
run configs/ram/fmnist_cluttered60_shaped.yaml           --seeds 0 1 2   # seed 0 on the H200
run configs/ram/fmnist_cluttered60_dram.yaml             --seeds 0 1 2   # H200
run configs/ram/fmnist_cluttered60_dram_paths4.yaml      --seeds 0 1 2   # H200
run configs/ram/fmnist_cluttered60_dram_curriculum.yaml  --seeds 0 1 2
run configs/ram/fmnist_cluttered60_dram_boxes.yaml       --seeds 0 1 2   # labelled: learns from boxes
run configs/ram/fmnist_cluttered100_dram.yaml            --seeds 0 1 2   # H200
run configs/ram/fmnist_cluttered100_dram_2scales.yaml    --seeds 0 1 2   # H200
run configs/ram/fmnist_cluttered100_dram_curriculum.yaml --seeds 0 1 2

# DRAW (Gregor et al. 2015), attention vs none: binarized Fashion-MNIST at T=16, two items on 60x60
run configs/draw/fmnist_t16.yaml            --seeds 0
run configs/draw/fmnist_t16_noattn.yaml     --seeds 0
run configs/draw/two_items60.yaml           --seeds 0 1
run configs/draw/two_items60_noattn.yaml    --seeds 0 1

# Show, Attend and Tell on FashionScenes over the shared pretrained backbone
run configs/backbone/fmnist_stem.yaml       --seeds 0
run configs/sat/soft_scenes.yaml            --seeds 0 1
run configs/sat/hard_scenes.yaml            --seeds 0 1
run configs/sat/soft_scenes_supervised.yaml --seeds 0
run configs/sat/hard_scenes_supervised.yaml --seeds 0 1
