#!/usr/bin/env bash
# make demo: train the soft-attention captioner on FashionScenes from its recipe, caption held-out
# scenes from the CLI with per-word attention overlays, evaluate on the test split, and say where
# everything went. Runs in minutes on 2 CPU cores; W&B logs offline under ./wandb.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${DEMO_DIR:-runs/demo}
start=$(date +%s)
rm -rf "$OUT"
mkdir -p "$OUT"

echo "== 1/4 train: configs/sat/soft_scenes.yaml (a few minutes on 2 CPU cores; one line per epoch, or a"
echo "   progress bar in a terminal)"
$PY train.py fit --config configs/sat/soft_scenes.yaml --trainer.default_root_dir "$OUT"
ckpt=$(ls "$OUT"/checkpoints/best-*.ckpt | tail -n 1)
[ -f "$ckpt" ] || { echo "demo: training produced no checkpoint" >&2; exit 1; }

echo "== 2/4 held-out test scenes -> $OUT/scenes"
$PY - "$OUT/scenes" <<'PYEOF'
import sys
import yaml
from zoo.registry import instantiate
recipe = yaml.safe_load(open("configs/sat/soft_scenes.yaml"))
dm = instantiate(recipe["data"], "data")
for path in dm.export_pngs("test", sys.argv[1], 8):
    print(" ", path)
PYEOF

echo "== 3/4 zoo caption (beam 3) with attention overlays -> $OUT/attention"
.venv/bin/zoo caption "$OUT"/scenes/*.png --checkpoint "$ckpt" --beam-size 3 --attention-dir "$OUT/attention"

echo "== 4/4 evaluate on the test split -> $OUT/eval_test.json"
$PY eval.py --checkpoint "$ckpt" --split test --json "$OUT/eval_test.json"

echo
echo "demo finished in $(( $(date +%s) - start )) s"
echo "  checkpoint:        $ckpt"
echo "  captioned scenes:  $OUT/scenes/"
echo "  attention overlays $OUT/attention/"
echo "  test metrics:      $OUT/eval_test.json"
echo "  W&B offline run:   $(ls -dt wandb/offline-run-* 2>/dev/null | head -n 1)  (upload later: wandb sync <dir>)"
