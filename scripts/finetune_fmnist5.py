"""Fine-tune the vit_fmnist release to a new label set vs train the same ViT from scratch, at the
same small budget (docs/finetune.md), over a few seeds: both runs use configs/vit/fmnist.yaml's hyperparameters on
a 5-class Fashion-MNIST ImageFolder tree (scripts/fmnist_imagefolder.py), select their checkpoint
on validation accuracy and report test accuracy.

    python scripts/fmnist_imagefolder.py data/fmnist5
    python scripts/finetune_fmnist5.py data/fmnist5 --epochs 15 --out results/finetune_vit_fmnist5.json"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from zoo.results import write_json  # noqa: E402

RUNS = {"finetune": ["--init_from", "vit_fmnist"], "scratch": []}


def run(name: str, extra: list[str], seed: int, args) -> dict:
    root = args.runs / f"{name}_seed{seed}"
    fit = [sys.executable, "train.py", "fit", "--config", "configs/vit/fmnist.yaml",
           "--config", "configs/vit/_fmnist5_imagefolder.yaml", "--data.init_args.root", str(args.data),
           "--trainer.max_epochs", str(args.epochs), "--trainer.logger", "false",
           "--seed_everything", str(seed), "--trainer.default_root_dir", str(root), *extra]
    start = time.perf_counter()
    subprocess.run(fit, cwd=REPO, check=True)
    train_s = time.perf_counter() - start
    best = sorted((root / "checkpoints").glob("best*.ckpt"))[-1]  # the recipe keeps the best on val/acc
    out = root / "test.json"
    subprocess.run([sys.executable, "eval.py", "--checkpoint", str(best), "--split", "test", "--json", str(out),
                    "--overwrite"],
                   cwd=REPO, check=True)
    metrics = json.loads(out.read_text())["metrics"]
    return {"command": " ".join(fit[1:]), "checkpoint": best.name, "train_wall_s": round(train_s, 1),
            "test_acc": metrics.get("test/acc"), "test_loss": metrics.get("test/loss")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data", type=Path)
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--runs", type=Path, default=Path("runs/finetune_fmnist5"))
    parser.add_argument("--out", type=Path, default=REPO / "results/finetune_vit_fmnist5.json")
    args = parser.parse_args()
    args.data, args.runs = args.data.resolve(), args.runs.resolve()
    results = {}
    for name, extra in RUNS.items():
        runs = [run(name, extra, seed, args) for seed in args.seeds]
        acc = torch.tensor([r["test_acc"] for r in runs], dtype=torch.float64)
        results[name] = {"test_acc_mean": round(acc.mean().item(), 4),
                         "test_acc_std": round(acc.std().item(), 4) if len(runs) > 1 else 0.0,
                         "seeds": dict(zip(map(str, args.seeds), runs))}
    counts = {split: sum(1 for _ in (args.data / split).rglob("*.png")) for split in ("train", "val", "test")}
    write_json(args.out, {"task": "vit_fmnist fine-tuned to 5 Fashion-MNIST classes vs the same ViT from scratch",
                          "classes": sorted(p.name for p in (args.data / "train").iterdir()), "images": counts,
                          "epochs": args.epochs, "seeds": args.seeds, "selection": "best val/acc checkpoint",
                          "runs": results})
    for name, r in results.items():
        print(f"{name:9s} test acc {r['test_acc_mean']:.4f} ± {r['test_acc_std']:.4f} ({len(args.seeds)} seeds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
