"""Calibrate `zoo caption`'s trust check on a released captioner's test split: caption the first
`--num-test` test scenes (the model's own beam), measure each caption's median word spread and score
per word (zoo/metrics/trust.py) and store the thresholds, with their provenance (commit, split, n,
percentiles), under the model's name in zoo/metrics/caption_trust.json.

    OMP_NUM_THREADS=1 python scripts/caption_trust.py --model sat_soft_scenes --num-test 300

A caption is flagged when its median word spread lies above the test split's `--percentile`th
percentile (near uniform on most words) or its score per word below the (100 - `--percentile`)th.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zoo.guards.writes import atomic_write_bytes  # noqa: E402
from zoo.metrics.trust import THRESHOLDS, caption_stats  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="sat_soft_scenes")
    parser.add_argument("--num-test", type=int, default=300)
    parser.add_argument("--percentile", type=float, default=99.0)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--out", default=str(THRESHOLDS))
    args = parser.parse_args()
    import torch

    import zoo

    torch.set_num_threads(1)
    model = zoo.create_model(args.model, pretrained=True).eval()
    dm = zoo.build_datamodule(model, num_test=args.num_test, batch_size=args.batch_size)
    dm.prepare_data()
    dm.setup("test")
    beam = int(model.hparams.get("beam_size", 3))
    stats = [caption_stats(r) for batch in dm.test_dataloader() for r in model.caption(batch["images"], beam_size=beam)]
    spreads = np.array([s["median_spread"] for s in stats])
    scores = np.array([s["score_per_word"] for s in stats])
    p = args.percentile
    percentiles = (1, 5, 50, 95, 99)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                            cwd=Path(__file__).parent).stdout.strip()
    entry = {
        "median_spread_max": round(float(np.percentile(spreads, p)), 4),
        "score_per_word_min": round(float(np.percentile(scores, 100 - p)), 4),
        "percentile_high": p,
        "provenance": {"model": args.model, "commit": commit, "split": "test", "n": len(stats),
                       "beam_size": beam, "script": "scripts/caption_trust.py",
                       "command": f"python scripts/caption_trust.py --model {args.model} --num-test {args.num_test} "
                                  f"--percentile {p}",
                       "median_spread_percentiles": {str(q): round(float(np.percentile(spreads, q)), 4)
                                                     for q in percentiles},
                       "score_per_word_percentiles": {str(q): round(float(np.percentile(scores, q)), 4)
                                                      for q in percentiles}},
    }
    out = Path(args.out)
    table = json.loads(out.read_text()) if out.exists() else {}
    table[args.model] = entry
    atomic_write_bytes(out, (json.dumps(table, indent=1, sort_keys=True) + "\n").encode())
    print(json.dumps(entry, indent=1))


if __name__ == "__main__":
    main()
