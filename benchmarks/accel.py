"""Acceleration modes (zoo.models.accel) against eager: training images/s of every family's whole
step (random draws, forward, loss, backward, gradient clipping, optimizer step), at the recipe's
batch and at batch 1000, with the compile time beside it.

    python benchmarks/accel.py                                   # every family, CPU (+ CUDA when present)
    python benchmarks/accel.py --families ram draw --batches recipe --rounds 3 --threads 1

Modes: eager, compile, and on CUDA reduce-overhead (torch.compile(mode="reduce-overhead"),
inductor's own CUDA graphs), each as `accel` runs it. (Results from before the removal of our own
whole-step CUDA-graph mode also hold "graph", and call reduce-overhead "compile-ro".) The JSON is rewritten after every family ("complete": false until the
last), so a run cut short by a time limit keeps what it measured.

Each family runs the recipes its card names (`bench_recipes`) on its own example batch at the
batch size (`example_batch`: random images of the recipe's size; a captioner's captions are a few
words), with the recipe's optimizer and gradient clipping. Per batch size one model per mode is built from the
same seed; the first step of each non-eager mode is timed alone (it compiles or captures:
`first_step_s`, and `compile_s` = first step minus a steady step), with torch.compile's on-disk
caches off unless `--warm-cache` (a first run on a machine compiles from scratch). Then rounds
alternate the modes (in a rotating order) in this one process, `--steps` timed steps each, so
that load from other processes on a shared machine hits every mode alike; throughput is batch /
median step time, and each ratio to eager is the median over rounds of the per-round ratios.

`default` names the mode `accel: auto` picks for the recipe's run on this device; on CPU compiling
pays off after `break_even_steps` = compile_s / (eager step - compiled step) optimizer steps, to
be compared with the recipe's own number of steps (`recipe_steps`).

Writes results/bench_accel_<cpu|cuda>.json (device, torch version, commit).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zoo import registry  # noqa: E402
from zoo.models.card import families  # noqa: E402
from zoo.registry import resolve_class  # noqa: E402
from zoo.results import write_json  # noqa: E402

MODES = ("eager", "compile", "reduce-overhead")
TRAIN_SIZE = 55000  # Fashion-MNIST train minus the recipes' 5000 validation images (FashionScenes: num_train)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def load_recipe(name: str) -> dict:
    """The registry entry `name` (a family card's `bench_recipes`): its model and its run's budget."""
    entry = registry.get_entry(name)
    config = yaml.safe_load(entry.recipe.read_text())
    data = registry.instantiate(entry.data, "data").hparams  # the recipe's and the class defaults
    return {"path": str(entry.recipe.relative_to(ROOT)), "model": entry.recipe_config(),
            "batch_size": int(data["batch_size"]), "train_size": int(data.get("num_train") or TRAIN_SIZE),
            "clip": (config.get("trainer") or {}).get("gradient_clip_val"),
            "max_epochs": int((config.get("trainer") or {}).get("max_epochs") or 10)}


def build(recipe: dict, mode: str, device: torch.device):
    """The recipe's model in `mode`, seeded, on `device`, with the recipe's optimizer."""
    torch.manual_seed(0)
    cls = resolve_class(recipe["model"]["class_path"], "model")
    filled = {k: v for k, v in cls.card.filled_by_data.items() if recipe["model"]["init_args"].get(k) is None}
    model = registry.build(recipe["model"], **filled).to(device).train()
    model.accel.force(mode)
    configured = model.configure_optimizers()
    optimizer = configured["optimizer"] if isinstance(configured, dict) else configured
    return model, optimizer


def make_batch(model, batch_size: int, device: torch.device):
    """The family's example batch at this size, on `device`."""
    batch = model.example_batch(batch_size)
    move = (lambda t: t.to(device) if isinstance(t, torch.Tensor) else t)
    return {k: move(v) for k, v in batch.items()} if isinstance(batch, dict) else tuple(map(move, batch))


def bench(recipe: dict, batch_size: int, modes: list[str], device: torch.device, steps: int, rounds: int) -> dict:
    torch._dynamo.reset()  # a fresh static compile for this batch size
    runs, failed = {}, {}
    for mode in modes:
        try:
            model, optimizer = build(recipe, mode, device)
            batch = make_batch(model, batch_size, device)

            def step(model=model, optimizer=optimizer, batch=batch):
                model.accel.fit_step(model, batch, optimizer, recipe["clip"])

            _sync(device)
            start = time.perf_counter()
            step()  # eager: warm-up; compiled modes: compile
            _sync(device)
            first = time.perf_counter() - start
            if mode == "reduce-overhead":
                step()  # inductor records its CUDA graphs on the second call
        except Exception as exc:  # a mode that breaks on this family is a finding, not the end of the run
            failed[mode] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            print(f"  {mode:8s} FAILED: {failed[mode]}", flush=True)
            continue
        runs[mode] = {"step": step, "first_step_s": first, "times": []}
        print(f"  {mode:8s} first step {first:8.2f} s", flush=True)
    modes = [m for m in modes if m in runs]
    per_round = []
    for r in range(rounds):
        order = modes[r % len(modes):] + modes[:r % len(modes)]
        this_round = {}
        for mode in order:
            times = []
            for _ in range(steps):
                _sync(device)
                start = time.perf_counter()
                runs[mode]["step"]()
                _sync(device)
                times.append(time.perf_counter() - start)
            runs[mode]["times"] += times
            this_round[mode] = batch_size / statistics.median(times)
        per_round.append(this_round)
        print(f"  round {r}: " + ", ".join(f"{m} {v:9.1f} img/s" for m, v in this_round.items()), flush=True)
    out = {"batch_size": batch_size, "steps_per_round": steps, "rounds": per_round, "modes": {}, "failed": failed}
    eager_step = statistics.median(runs["eager"]["times"]) if "eager" in runs else None
    for mode, run in runs.items():
        median = statistics.median(run["times"])
        row = {"images_per_s": batch_size / median, "step_s": median, "first_step_s": run["first_step_s"]}
        if mode != "eager":
            row["compile_s"] = max(0.0, run["first_step_s"] - median)
            if eager_step is not None:
                row["ratio_to_eager"] = statistics.median(r[mode] / r["eager"] for r in per_round)
                saved = eager_step - median
                row["break_even_steps"] = math.ceil(row["compile_s"] / saved) if saved > 0 else None
        out["modes"][mode] = row
    return out


def main(argv=None) -> int:
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    timed = [name for name, cls in families().items() if cls.card.bench_recipes]
    parser.add_argument("--families", nargs="+", default=timed, choices=timed,
                        help="families whose card names recipes to time (default: all)")
    parser.add_argument("--batches", nargs="+", default=["recipe", "1000"], help="'recipe' and/or integers")
    parser.add_argument("--device", choices=["cpu", "cuda", "all"], default="all")
    parser.add_argument("--modes", nargs="+", choices=MODES, help="default: eager compile (+ reduce-overhead on CUDA)")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per mode per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch CPU threads (on a shared machine: 1)")
    parser.add_argument("--out", help="JSON path (default results/bench_accel_<device>.json)")
    parser.add_argument("--warm-cache", action="store_true",
                        help="let torch.compile reuse its on-disk caches (default: off, so compile_s is a "
                             "first run's cost)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.warm_cache:
        import torch._inductor.config as inductor_config

        inductor_config.force_disable_caches = True
    devices = ["cpu"] if args.device == "cpu" else ["cuda"] if args.device == "cuda" else (
        ["cpu", "cuda"] if torch.cuda.is_available() else ["cpu"])
    if "cuda" in devices and not torch.cuda.is_available():
        print("accel benchmark: error: --device cuda needs a CUDA device", file=sys.stderr)
        return 2
    for name in devices:
        device = torch.device(name)
        modes = args.modes or ["eager", "compile"] + (["reduce-overhead"] if device.type == "cuda" else [])
        if device.type != "cuda" and "reduce-overhead" in modes:
            print("accel benchmark: error: mode reduce-overhead needs --device cuda", file=sys.stderr)
            return 2
        results = {}
        out = Path(args.out or ROOT / "results" / f"bench_accel_{name}.json")
        start = time.perf_counter()

        def save(complete: bool) -> None:  # after every family, so a run cut short keeps what it measured
            record = {"benchmark": "accel", "device_type": name, "threads": torch.get_num_threads(),
                      "compile_caches": "warm" if args.warm_cache else "disabled (cold compile times)",
                      "torch": torch.__version__, "modes": modes, "families": results,
                      "complete": complete, "wall_s": round(time.perf_counter() - start, 1),
                      "load_average": list(os.getloadavg()),
                      "note": "ratios are medians of per-round ratios measured in one process, modes alternating; "
                              "the machine may have been shared"}
            write_json(out, record)

        for family in args.families:
            cls = families()[family]
            for name in cls.card.bench_recipes:
                recipe = load_recipe(name)
                steps = math.ceil(recipe["train_size"] / recipe["batch_size"]) * recipe["max_epochs"]
                min_steps = cls.card.compile.cpu_min_steps
                entry = {"family": family, "recipe": recipe["path"], "recipe_batch_size": recipe["batch_size"],
                         "recipe_steps": steps, "gradient_clip_val": recipe["clip"],
                         "cpu_compile_min_steps": min_steps, "cuda_default": "compile", "batches": [],
                         "default": ("compile" if device.type == "cuda" else
                                     "compile" if min_steps is not None and steps >= min_steps else "eager")}
                for batch in args.batches:
                    size = recipe["batch_size"] if batch == "recipe" else int(batch)
                    print(f"{name} ({recipe['path']}) on {device.type}, batch {size}:", flush=True)
                    entry["batches"].append(bench(recipe, size, modes, device, args.steps, args.rounds))
                results[name] = entry
                save(complete=False)
        save(complete=True)
        print(f"-> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
