"""A results run: train a recipe for several seeds, select on validation, evaluate on test.

    python scripts/results_run.py configs/baseline/cnn_cluttered60.yaml --seeds 0 1 2 [-- --trainer.max_epochs 5]

For each seed it runs `train.py fit --config CONFIG --seed_everything N` (the best checkpoint is
chosen on the recipe's validation metric), then `eval.py` on val and on test with that checkpoint,
and writes
results/<family>_<recipe>_seed<N>.json. The summary results/<family>_<recipe>.json holds every
metric's mean, std and per-seed values over all seeds run so far with the same recipe and
arguments, the recipe, the extra arguments, the commit, the device
and the wall time. Arguments after `--` go to train.py (say so when you quote the numbers).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zoo.runs import holder  # noqa: E402
from zoo.hub import sha256_file  # noqa: E402
from zoo.results import git_commit, write_json  # noqa: E402


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--name", help="results name (default <family>_<recipe>)")
    parser.add_argument("--eval-arg", action="append", default=[], help="extra eval.py argument")
    parser.add_argument("--eval-only", action="store_true",
                        help="resume an interrupted results run: skip training and evaluate each seed's "
                             "existing best checkpoint, reusing an eval_<split>.json already written for it")
    args = parser.parse_args(argv)
    config = Path(args.config)
    name = args.name or f"{config.parent.name}_{config.stem}"
    per_seed = []
    started = time.perf_counter()
    commit = git_commit()  # the code that trains, not whatever HEAD is when the run ends
    for seed in args.seeds:
        root = f"runs/results/{name}/seed{seed}"
        t0 = time.perf_counter()
        if not args.eval_only:
            # A checkpoint left by an earlier invocation must not be taken for this run's best; one
            # of a run still training there is that run's, not ours to remove.
            training = holder(ROOT / root)
            if training:
                raise SystemExit(f"{root} is in use by another training run (pid {training})")
            shutil.rmtree(ROOT / root / "checkpoints", ignore_errors=True)
            run([sys.executable, "train.py", "fit", "--config", str(config), "--seed_everything", str(seed),
                 "--trainer.default_root_dir", root, *extra])
        train_wall = time.perf_counter() - t0
        trained_at = commit
        if args.eval_only:  # keep what an earlier, interrupted invocation recorded of its training
            previous = ROOT / "results" / f"{name}_seed{seed}.json"
            earlier = json.loads(previous.read_text()) if previous.is_file() else {}
            train_wall, trained_at = earlier.get("train_wall_time_s"), earlier.get("git_commit", commit)
        best = sorted((ROOT / root / "checkpoints").glob("best-*.ckpt"))
        if not best:
            raise SystemExit(f"no best checkpoint under {root}/checkpoints")
        metrics = {}
        for split in ("val", "test"):
            out = ROOT / root / f"eval_{split}.json"
            done = (args.eval_only and out.is_file()
                    and json.loads(out.read_text()).get("checkpoint_sha256") == sha256_file(best[-1]))
            if not done:
                run([sys.executable, "eval.py", "--checkpoint", str(best[-1]), "--split", split,
                     "--seed", str(seed), "--json", str(out), *args.eval_arg])
            evaluated = json.loads(out.read_text())
            metrics.update(evaluated["metrics"])
        record = {"name": name, "recipe": str(config), "train_args": extra, "seed": seed,
                  "checkpoint": str(best[-1].relative_to(ROOT)), "metrics": metrics,
                  "config": evaluated["config"], "parameters": evaluated.get("parameters"),
                  "train_wall_time_s": None if train_wall is None else round(train_wall, 1),
                  "git_commit": trained_at}
        write_json(ROOT / "results" / f"{name}_seed{seed}.json", record)
        per_seed.append(record)
    # The summary covers every seed run so far with this recipe and these arguments, so seeds
    # can be added in later invocations.
    runs = {r["seed"]: r for r in per_seed}
    for path in sorted((ROOT / "results").glob(f"{name}_seed*.json")):
        record = json.loads(path.read_text())
        if record.get("recipe") == str(config) and record.get("train_args") == extra:
            runs.setdefault(record["seed"], record)
    per_seed = [runs[s] for s in sorted(runs)]
    keys = sorted(set().union(*(r["metrics"] for r in per_seed)))
    times = [r["train_wall_time_s"] for r in per_seed if r.get("train_wall_time_s") is not None]
    summary = {k: {"mean": statistics.fmean(r["metrics"][k] for r in per_seed if k in r["metrics"]),
                   "std": statistics.stdev([r["metrics"][k] for r in per_seed if k in r["metrics"]])
                   if len(per_seed) > 1 else 0.0,
                   "per_seed": [r["metrics"].get(k) for r in per_seed]} for k in keys}
    path = write_json(ROOT / "results" / f"{name}.json", {
        "name": name, "recipe": str(config), "train_args": extra, "seeds": sorted(runs),
        "selection": "best checkpoint on the recipe's validation metric", "metrics": summary,
        "config": per_seed[-1]["config"], "parameters": per_seed[-1].get("parameters"),
        "train_wall_time_s": {"mean": statistics.fmean(times), "per_seed": times} if times else None,
        "wall_time_s": round(time.perf_counter() - started, 1),
        "git_commit": per_seed[-1].get("git_commit", commit)})
    print(f"wrote {path}")
    for k in keys:
        print(f"{k:32s} {summary[k]['mean']:.4f} ± {summary[k]['std']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
