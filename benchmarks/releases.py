"""The cost of every release, in timm's benchmark CSV columns: inference and training throughput at
batch 1 and a large batch, eager and compiled where compiled is what the release runs by default.

    python benchmarks/releases.py      # results/benchmark-{infer,train}-cpu-fp32-bs{1,256}-torch<version>.csv
    python benchmarks/releases.py --device cuda --batch-sizes 1 1024 --max-seconds 170
                                       # results/benchmark-{infer,train}-nvidia-h200-fp32-bs{1,1024}-torch<version>.csv

One CSV per configuration, named as timm names its benchmark files: the kind, the device, the
precision (float32: nothing here autocasts), the batch size and the torch release
(tools/result_csvs.py); scripts/results_tables.py rewrites them from the JSON record, so the
record is what the CSVs say.

Columns (timm's benchmark.py names; `*_mode` is ours):
- infer: model, infer_samples_per_sec, infer_step_time (ms per batch), infer_batch_size,
  infer_img_size, infer_gmacs (per image), param_count (millions), infer_mode;
- train: model, train_samples_per_sec, train_step_time (ms per step), train_batch_size,
  train_img_size, param_count, train_mode.
One inference is the release's `zoo export` program (zoo/commands/cost.py: logits; a greedy caption unrolled
to its maximum length; DRAW generators: samples from the prior). One training step is the
family's own (zoo.models.accel `fit_step`: its random draws, forward, loss, backward, the
recipe's gradient clipping, its optimizer) on the family's example batch (`example_batch`; the
captioners' has three-word captions, shorter than FashionScenes' eight to twelve, so their
training rate is an upper bound). GMACs are counted by torch.utils.flop_counter.FlopCounterMode:
MACs = FLOPs / 2 (it counts a multiply-add as two FLOPs).

Modes: an eager row always; a compiled row ("compile": torch.compile of the same function) where
`--accel auto` compiles the release: on CUDA its training and evaluation, on CPU the training of
families that compile long runs (their cards' `compile.cpu_min_steps`: RAM and DRAW; their release recipes
run more steps than that threshold), never CPU inference.

Timing: a first call (which compiles, for a compiled row; `first_call_s` in the JSON) and
`--warmup` more calls, then `--repeats` timed repeats of enough calls to last `--min-repeat-s`;
the step time is the median over repeats, with the device synchronised before each clock read
(CUDA runs asynchronously). `--max-seconds` caps the whole run: every release's eager rows come
first, compiled rows follow while time is left, and whatever did not fit is listed as skipped in
the JSON (results/bench_releases_<device>.json, e.g. bench_releases_nvidia_h200.json: provenance,
settings, the rows with each first call's seconds, failures). Each
CSV is rewritten after every release, so a run cut short keeps what it measured.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zoo import registry  # noqa: E402
from zoo.commands import cost  # noqa: E402
from zoo.guards.writes import atomic_write_bytes  # noqa: E402
from zoo.models.accel import compile_backend, compile_unavailable  # noqa: E402
from zoo.results import write_json  # noqa: E402
from tools.result_csvs import INFER_COLUMNS, TRAIN_COLUMNS, benchmark_name, csv_text  # noqa: E402


def device_slug(device: torch.device) -> str:
    """'cpu', or the GPU's name as a file name ('nvidia-h200')."""
    if device.type != "cuda":
        return device.type
    return re.sub(r"[^a-z0-9]+", "-", torch.cuda.get_device_name(device).lower()).strip("-")


def default_modes(model, device: torch.device, kind: str) -> list[str]:
    """eager, and "compile" where `--accel auto` compiles `kind` ("infer" or "train") steps of this
    release on this device (see the module docstring)."""
    if compile_unavailable(device):
        return ["eager"]
    if device.type == "cuda":
        return ["eager", "compile"]
    compiles = kind == "train" and model.card.compile.cpu_min_steps is not None
    return ["eager", "compile"] if compiles else ["eager"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(fn, device: torch.device, warmup: int, repeats: int, min_repeat_s: float) -> dict:
    """Median seconds per call of `fn` over `repeats` repeats (each long enough to time), and the
    first call's seconds (a compiled function compiles then)."""
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    first = time.perf_counter() - start
    for _ in range(warmup):
        fn()
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    calls = max(1, math.ceil(min_repeat_s / max(time.perf_counter() - start, 1e-6)))
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        _sync(device)
        times.append((time.perf_counter() - start) / calls)
    return {"step_s": statistics.median(times), "first_call_s": first, "calls_per_repeat": calls}


def _to(batch, device: torch.device):
    if isinstance(batch, dict):
        return {k: _to(v, device) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_to(v, device) for v in batch)
    return batch.to(device) if isinstance(batch, torch.Tensor) else batch


def gradient_clip(name: str) -> float | None:
    """The release recipe's trainer.gradient_clip_val (what its training steps clip to)."""
    entry = registry.get_entry(name)
    recipe_file = entry.metadata.get("recipe_file")
    if not recipe_file or not (ROOT / recipe_file).is_file():
        return None
    return ((yaml.safe_load((ROOT / recipe_file).read_text()) or {}).get("trainer") or {}).get("gradient_clip_val")


def infer_step(name: str, mode: str, batch: int, device: torch.device):
    model = registry.create_model(name, pretrained=True).to(device).eval()
    run = cost.inference(model)
    module = torch.compile(run.module, dynamic=False, backend=compile_backend()) if mode == "compile" else run.module
    inputs = run.inputs(batch, device)

    @torch.no_grad()
    def step():
        module(*inputs)

    return model, run, step


def train_step(name: str, mode: str, batch: int, device: torch.device):
    torch.manual_seed(0)
    model = registry.create_model(name, pretrained=True).to(device).train()
    model.accel.force(mode)
    configured = model.configure_optimizers()
    optimizer = configured["optimizer"] if isinstance(configured, dict) else configured
    data = _to(model.example_batch(batch), device)
    clip = gradient_clip(name)

    def step():
        model.accel.fit_step(model, data, optimizer, clip)

    return model, step


def _rounded(value: float, digits: int = 4) -> float:
    return float(f"{value:.{digits}g}")


def write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    """What scripts/results_tables.py writes from the JSON record (tools/result_csvs.py), so the two agree."""
    atomic_write_bytes(path, csv_text(columns, sorted(rows, key=lambda r: (r["model"], r[columns[-1]]))).encode())


def csv_path(csv_dir: Path, kind: str, slug: str, batch: int) -> Path:
    """One file per configuration: kind, device, precision, batch size, torch release."""
    return csv_dir / benchmark_name(kind, slug, batch, torch.__version__)


def main(argv=None) -> int:
    import logging
    import warnings

    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("zoo").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--models", nargs="+", help="releases to run (default: every release)")
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 256])
    parser.add_argument("--kinds", nargs="+", choices=["infer", "train"], default=["infer", "train"])
    parser.add_argument("--modes", nargs="+", choices=["eager", "compile"],
                        help="run exactly these modes (default: eager, and compile where it is the release's default)")
    parser.add_argument("--warmup", type=int, default=3, help="calls after the first, before timing")
    parser.add_argument("--repeats", type=int, default=7, help="timed repeats; the median is reported")
    parser.add_argument("--min-repeat-s", type=float, default=0.05, help="each repeat calls enough times to last this")
    parser.add_argument("--max-seconds", type=float, help="cap on the whole run (eager rows first)")
    parser.add_argument("--threads", type=int, help="torch CPU threads")
    parser.add_argument("--csv-dir", default=str(ROOT / "results"), help="where the CSVs go (one per kind and batch size)")
    parser.add_argument("--out", help="JSON with provenance (default results/bench_releases_<device>.json)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("releases benchmark: error: --device cuda needs a CUDA device", file=sys.stderr)
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    slug = device_slug(device)
    names = args.models or registry.list_models(pretrained=True)
    unknown = [n for n in names if n not in registry.list_models(pretrained=True)]
    if unknown:
        print(f"releases benchmark: error: not releases: {', '.join(unknown)}", file=sys.stderr)
        return 2
    csv_dir = Path(args.csv_dir)
    paths = {(kind, batch): csv_path(csv_dir, kind, slug, batch) for kind in args.kinds for batch in args.batch_sizes}
    out = Path(args.out or ROOT / "results" / f"bench_releases_{slug.replace('-', '_')}.json")
    started = time.perf_counter()
    deadline = started + args.max_seconds if args.max_seconds is not None else math.inf
    rows: dict[str, list[dict]] = {"infer": [], "train": []}
    failed, skipped, details = [], [], []
    facts = {}

    def save(complete: bool) -> None:
        for (kind, batch), path in paths.items():
            write_csv(path, INFER_COLUMNS if kind == "infer" else TRAIN_COLUMNS,
                      [r for r in rows[kind] if r[f"{kind}_batch_size"] == batch])
        write_json(out, {"benchmark": "releases", "device_type": device.type, "device_name": slug,
                         "threads": torch.get_num_threads(), "torch": torch.__version__,
                         "settings": {k: v for k, v in vars(args).items() if k not in ("csv_dir", "out")},
                         "csv": {f"{k}-bs{b}": str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p)
                                 for (k, b), p in paths.items()},
                         "macs": "torch.utils.flop_counter.FlopCounterMode, MACs = FLOPs / 2",
                         "complete": complete, "wall_s": round(time.perf_counter() - started, 1),
                         "load_average": list(os.getloadavg()), "rows": details, "failed": failed,
                         "skipped": skipped})

    # every release's eager rows first, so a capped run has one row per release and batch; then the
    # compiled rows, the large batch's training steps first (what `--accel auto` compiles)
    plan = [("eager", name, kind, batch) for name in names for kind in args.kinds for batch in args.batch_sizes]
    plan += sorted((("compile", name, kind, batch) for name in names for kind in args.kinds for batch in args.batch_sizes),
                   key=lambda p: (-p[3], p[2] != "train", p[1]))
    for phase, name, kind, batch in plan:
        if name not in facts:
            model = registry.create_model(name, pretrained=True)
            facts[name] = {"param_count": round(cost.num_params(model) / 1e6, 3),
                           "gmacs": cost.count_macs(model) / 1e9,
                           "modes": {k: default_modes(model, device, k) for k in ("infer", "train")}}
        if phase not in (args.modes or facts[name]["modes"][kind]):
            continue
        what = f"{name} {kind} {phase} batch {batch}"
        if time.perf_counter() > deadline:
            skipped.append(what)
            continue
        if phase == "compile":  # each release compiles afresh, as in its own training process: the
            torch.compiler.reset()  # cache is per code object, and releases of one family share it
        try:
            if kind == "infer":
                model, run, step = infer_step(name, phase, batch, device)
                size = run.img_size
            else:
                model, step = train_step(name, phase, batch, device)
                size = model.input_size[-1]
            timing = measure(step, device, args.warmup, args.repeats, args.min_repeat_s)
        except Exception as exc:  # a mode that breaks on one release is a finding, not the end of the run
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            failed.append(f"{what}: {type(exc).__name__}: {reason[:200]}")
            print(f"{what}: FAILED {failed[-1]}", flush=True)
            continue
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
        step_s = timing["step_s"]
        row = {"model": name, f"{kind}_samples_per_sec": round(batch / step_s, 2),
               f"{kind}_step_time": round(1000 * step_s, 3), f"{kind}_batch_size": batch, f"{kind}_img_size": size,
               "param_count": facts[name]["param_count"], f"{kind}_mode": phase}
        if kind == "infer":
            row["infer_gmacs"] = _rounded(facts[name]["gmacs"])
        rows[kind].append(row)
        details.append({**row, "first_call_s": round(timing["first_call_s"], 3),
                        "calls_per_repeat": timing["calls_per_repeat"]})
        print(f"{what}: {row[f'{kind}_samples_per_sec']:10.1f} samples/s, {row[f'{kind}_step_time']:9.3f} ms/step"
              f" (first call {timing['first_call_s']:.2f} s)", flush=True)
        save(complete=False)
    save(complete=True)
    for path in paths.values():
        print(f"-> {path}")
    if skipped:
        print(f"skipped by --max-seconds: {len(skipped)} measurements (listed in {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
