"""A results run: train a recipe for several seeds, select on validation, evaluate on test.

    python scripts/results_run.py configs/baseline/cnn_cluttered60.yaml --seeds 0 1 2 [-- --trainer.max_epochs 5]

For each seed it runs `train.py fit --config CONFIG --seed_everything N` (the best checkpoint is
chosen on the recipe's validation metric), then `eval.py` on val and on test with that checkpoint,
and writes
results/<family>_<recipe>_seed<N>.json. The summary results/<family>_<recipe>.json holds every
metric's mean, std and per-seed values over all seeds run so far with the same recipe and
arguments (a seed whose training commit had another version of the recipe is left out, one line
says why), the recipe, the extra arguments, each seed's commit, the device
and the wall time. Arguments after `--` go to train.py (say so when you quote the numbers).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tools.release import recipe_drift  # noqa: E402
from zoo.results import device_info, git_commit, write_json  # noqa: E402
from zoo.training.runs import holder  # noqa: E402
from zoo.weights.hub import sha256_file  # noqa: E402


def run(cmd: list[str]) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def summarise(name: str, config: str, extra: list[str], per_seed: list[dict], started: float | None,
              commit: str) -> Path:
    """Write results/<name>.json over every seed run so far with this recipe and these arguments
    (so seeds can be added in later invocations): each metric's mean, std and per-seed values, the
    device each seed ran on (a summary of seeds from different machines says so) and any seed's own
    account of how it was trained (its "training" field, e.g. a run stopped and resumed)."""
    runs = {r["seed"]: r for r in per_seed}
    for path in sorted((ROOT / "results").glob(f"{name}_seed*.json")):
        record = json.loads(path.read_text())
        if record["seed"] in runs or record.get("recipe") != config or record.get("train_args") != extra:
            continue
        # an earlier seed counts only if the recipe file at its training commit trains what the
        # file says now (a key since left out at its class default is the same recipe)
        drift = recipe_drift(config, record.get("git_commit"), extra)
        if drift:
            print(f"seed {record['seed']} left out of the summary: its recipe then is not the recipe now "
                  f"({'; '.join(drift)})", flush=True)
            continue
        runs[record["seed"]] = record
    if not runs:
        raise SystemExit(f"no results/{name}_seed<N>.json of {config} with these arguments")
    per_seed = [runs[s] for s in sorted(runs)]
    keys = sorted(set().union(*(r["metrics"] for r in per_seed)))
    times = [r["train_wall_time_s"] for r in per_seed if r.get("train_wall_time_s") is not None]
    def spread(values: list[float]) -> dict:  # a metric an older seed did not record is left out of its mean
        return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}

    summary = {k: {**spread([r["metrics"][k] for r in per_seed if k in r["metrics"]]),
                   "per_seed": [r["metrics"].get(k) for r in per_seed]} for k in keys}
    here = device_info()  # a seed evaluated in this invocation has no JSON device yet
    devices = [r.get("device") or here for r in per_seed]
    names = [d.get("device") for d in devices]
    device = devices[-1] if len(set(names)) == 1 else {"device": "mixed: " + ", ".join(
        f"{n} (seed{'s' if names.count(n) > 1 else ''} {', '.join(str(r['seed']) for r, m in zip(per_seed, names) if m == n)})"
        for n in dict.fromkeys(names))}
    notes = {str(r["seed"]): r["training"] for r in per_seed if r.get("training")}
    path = write_json(ROOT / "results" / f"{name}.json", {
        "name": name, "recipe": config, "train_args": extra, "seeds": sorted(runs),
        "selection": "best checkpoint on the recipe's validation metric", "metrics": summary,
        "config": per_seed[-1]["config"], "parameters": per_seed[-1].get("parameters"),
        "train_wall_time_s": {"mean": statistics.fmean(times), "per_seed": times} if times else None,
        "wall_time_s": None if started is None else round(time.perf_counter() - started, 1),
        "git_commit": per_seed[-1].get("git_commit", commit),
        "seed_commits": {str(r["seed"]): r.get("git_commit", commit) for r in per_seed},
        "device": device, "per_seed_device": names, **({"training": notes} if notes else {})})
    print(f"wrote {path}")
    for k in keys:
        print(f"{k:32s} {summary[k]['mean']:.4f} ± {summary[k]['std']:.4f}")
    return path


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
    parser.add_argument("--summarise", action="store_true",
                        help="only rewrite the summary from the per-seed JSON already in results/ "
                             "(seeds trained elsewhere, copied in); trains and evaluates nothing")
    args = parser.parse_args(argv)
    config = Path(args.config)
    name = args.name or f"{config.parent.name}_{config.stem}"
    per_seed = []
    started = time.perf_counter()
    commit = git_commit()  # the code that trains, not whatever HEAD is when the run ends
    if args.summarise:
        summarise(name, str(config), extra, [], None, commit)  # no wall time: nothing ran here
        return 0
    for seed in args.seeds:
        root = f"runs/results/{name}/seed{seed}"
        t0 = time.perf_counter()
        if not args.eval_only:
            # A folder left by an earlier invocation belongs to that run (zoo/training/runs.py refuses a new
            # fit there, and its best checkpoint must not be taken for this run's): it is moved aside
            # whole, never deleted; one of a run still training there is that run's, not ours to move.
            training = holder(ROOT / root)
            if training:
                raise SystemExit(f"{root} is in use by another training run (pid {training})")
            if (ROOT / root).exists():
                earlier = next(ROOT / f"{root}.earlier{k}" for k in range(1, 10_000)
                               if not (ROOT / f"{root}.earlier{k}").exists())
                os.rename(ROOT / root, earlier)
                print(f"results_run: the earlier {root} is kept as {earlier.relative_to(ROOT)}", flush=True)
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
                     "--seed", str(seed), "--json", str(out), "--overwrite", *args.eval_arg])  # this run's own file
            evaluated = json.loads(out.read_text())
            metrics.update(evaluated["metrics"])
        record = {"name": name, "recipe": str(config), "train_args": extra, "seed": seed,
                  "checkpoint": str(best[-1].relative_to(ROOT)), "metrics": metrics,
                  "config": evaluated["config"], "parameters": evaluated.get("parameters"),
                  "train_wall_time_s": None if train_wall is None else round(train_wall, 1),
                  "git_commit": trained_at}
        write_json(ROOT / "results" / f"{name}_seed{seed}.json", record)
        per_seed.append(record)
    summarise(name, str(config), extra, per_seed, started, commit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
