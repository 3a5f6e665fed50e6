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

# RAM (Mnih et al. 2014): the paper's tasks; the random-glimpse control is logged as test/acc_random
run configs/ram/fmnist_centered.yaml        --seeds 0 1 2
run configs/ram/fmnist_cluttered60.yaml     --seeds 0 1 2
run configs/ram/fmnist_translated.yaml      --seeds 0
run configs/ram/fmnist_cluttered100.yaml    --seeds 0

# DRAW (Gregor et al. 2015): attention vs none at equal T, sizes and budget; the cluttered100 classifier
run configs/draw/fmnist_t16.yaml                   --seeds 0      # the CPU budget (T=16, 15 epochs)
run configs/draw/fmnist_t16_noattn.yaml            --seeds 0
run configs/draw/fmnist.yaml                       --seeds 0 1 2  # the paper's T=64: GPU work
run configs/draw/fmnist_noattn.yaml                --seeds 0 1 2
# (the 8-glimpse results carry the name of the run that set the recipe's lr; the recipe has it now)
run configs/draw/cluttered100_classifier.yaml      --seeds 0 --name draw_cluttered100_classifier_lr5e-4 -- --model.init_args.lr 0.0005
run configs/draw/cluttered100_classifier_t4.yaml   --seeds 0 1

# Vision Transformer
run configs/vit/fmnist.yaml                 --seeds 0 1 2
run configs/vit/fmnist_cluttered60.yaml     --seeds 0

# Show, Attend and Tell on FashionScenes (the README's budget)
SAT_BUDGET=(-- --trainer.max_epochs 4 --data.init_args.num_train 8000 --data.init_args.batch_size 64 --model.init_args.lr 0.003)
run configs/sat/soft_scenes.yaml --seeds 0 1 2 "${SAT_BUDGET[@]}"
run configs/sat/hard_scenes.yaml --seeds 0 1 2 "${SAT_BUDGET[@]}"
run configs/sat/soft_scenes_rf15.yaml --seeds 0 1 "${SAT_BUDGET[@]}"   # a more local encoder
run configs/sat/hard_scenes_rf15.yaml --seeds 0 1 "${SAT_BUDGET[@]}"
# ablations of the 15 px models: weak doubly stochastic regularisation; no image in h_0, c_0
for kind in soft hard; do
  run configs/sat/${kind}_scenes_rf15.yaml --seeds 0 --name sat_${kind}_scenes_rf15_ac001 "${SAT_BUDGET[@]}" --model.init_args.alpha_c 0.01
  run configs/sat/${kind}_scenes_rf15.yaml --seeds 0 --name sat_${kind}_scenes_rf15_init0 "${SAT_BUDGET[@]}" --model.init_args.init_layers 0
done
run configs/sat/soft_scenes_rf15.yaml --seeds 0 1 --name sat_soft_scenes_rf15_init0_ac0_drop05 "${SAT_BUDGET[@]}" \
  --model.init_args.init_layers 0 --model.init_args.alpha_c 0.0 --model.init_args.dropout 0.5
# where the seed-0 models look, by kind of word (the README's per-word table)
for name in sat_soft_scenes sat_hard_scenes sat_soft_scenes_rf15 sat_hard_scenes_rf15 \
            sat_soft_scenes_rf15_init0 sat_soft_scenes_rf15_ac001; do
  $PY scripts/sat_word_attention.py --checkpoint runs/results/$name/seed0/checkpoints/best-*.ckpt \
    --num-test 300 --out results/sat_word_attention_$name.json
done
