"""Where did each release look, and was it right? The attention results behind docs/attention.md.

    python scripts/attention_results.py                      # every release that attends
    python scripts/attention_results.py ram_fmnist_cluttered60 --n 200
    python scripts/attention_results.py --checkpoint runs/x/checkpoints/last.ckpt --out /tmp   # any checkpoint
    python scripts/attention_results.py vit_fmnist --data variant=cluttered60 \
        --model-arg "backbone={dynamic_img_size: true}" --tag cluttered60_probe   # a probe on other data
    python scripts/attention_results.py --run results/sat_hard_scenes_marginal_seed{0,1,2}.json   # seeds of a results run
    python scripts/attention_results.py --results-run ram_fmnist_cluttered60_dram --seeds 0 1 2   # the same, by name

For each release: its attention record on the first `--n` examples of its own data's test split
(the data it was trained on, rebuilt from the release's data config, with the item boxes known),
scored by `zoo.metrics.attention.evaluate` (pointing game, mass in box, window overlap, deletion and
insertion, each with chance levels), then the same with the model's weights randomised (Adebayo et
al. 2018: a faithful explanation must change when the model does). Every number carries its
bootstrap 95% interval over the test examples (zoo.metrics.attention.bootstrap_ci). Writes
results/attention_<name>.json with the release's recipe, seed, git commit, device and wall time.

`--run` scores the best checkpoint of one seed of a results run (results/<name>_seed<N>.json, from
scripts/results_run.py) as results/attention_<name>_seed<N>.json, and summarises every seed of
<name> scored so far as results/attention_<name>.json (attention_<name>_seeds.json where a release
is called <name>: attention_<name>.json is then the release's own): each headline number's mean,
std over the seeds, per-seed values and per-seed intervals (`SUMMARY`), and each step's pointing (glimpse, word)
per seed with its mean over seeds. `--results-run NAME --seeds ...` is `--run results/NAME_seed<N>.json ...`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import zoo  # noqa: E402
from zoo import registry  # noqa: E402
from zoo.guards.errors import UserError  # noqa: E402
from zoo.metrics.attention import evaluate  # noqa: E402
from zoo.results import write_json  # noqa: E402


def attending_releases() -> list[str]:
    return [name for name in zoo.list_models(pretrained=True) if zoo.create_model(name).card.attention]


def randomise(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every layer re-initialised as at construction (the cascade's last step: all weights random)."""
    torch.manual_seed(seed)
    for module in model.modules():
        if module is not model and hasattr(module, "reset_parameters"):
            module.reset_parameters()
    return model


def figure(name: str, split: str, index: int, out_dir: Path) -> Path:
    """The attention strip of test example `index` (its target boxes in white) as out_dir/attention_<name>.png."""
    from zoo.guards.writes import atomic_save_image
    from zoo.viz.record import strip

    model = zoo.create_model(name, pretrained=True).eval()
    examples = registry.build_datamodule(model).boxed_examples(split, index + 1)
    image = examples["images"][index:index + 1]
    record = model.attention_record(image)
    path = out_dir / f"attention_{name}.png"
    atomic_save_image(strip(record, 0, image[0], examples["targets"][index], size=96, columns=9), path)
    return path


def _load(name: str, model_args: dict | None = None):
    """A release by name, or any checkpoint (.ckpt or .safetensors with its config) by path, with
    hyperparameters that do not change its weights overridden (`--model-arg`)."""
    if Path(name).suffix in (".ckpt", ".safetensors"):
        return zoo.load_checkpoint(name, **(model_args or {})).eval()
    return zoo.create_model(name, pretrained=True, **(model_args or {})).eval()


def run(name: str, n: int, split: str, seed: int, out_dir: Path, data_args: dict | None = None,
        model_args: dict | None = None, tag: str | None = None, results_run: Path | None = None,
        device: str = "cpu") -> Path:
    """`data_args` / `model_args` make a probe: the release on other data than its own (e.g. the
    centred ViT on cluttered canvases, with `dynamic_img_size`); `tag` names its JSON.
    `results_run`: a results run's seed record; `name` is then its checkpoint. `device`: where the
    model and the examples go (the numbers are the same up to rounding)."""
    started = time.perf_counter()
    model = _load(name, model_args).to(device)
    data = registry.build_datamodule(model, **(data_args or {}))
    examples = {key: value.to(device) if isinstance(value, torch.Tensor) else value
                for key, value in data.boxed_examples(split, n).items()}
    torch.manual_seed(seed)
    trained = evaluate(model, examples, seed=seed)
    randomised = evaluate(randomise(_load(name, model_args), seed).to(device), examples, seed=seed)
    release = Path(name).suffix not in (".ckpt", ".safetensors")
    metadata = registry.get_entry(name).metadata if release else {}
    name = name if release else Path(name).stem
    if results_run is not None:
        seed_record = json.loads(results_run.read_text())
        name = f"{seed_record['name']}_seed{seed_record['seed']}"
        metadata = {"recipe_file": seed_record.get("recipe"), "metrics": seed_record.get("metrics"),
                    "train_args": seed_record.get("train_args")}
    def flow(value) -> str:  # a YAML value as the command line takes it
        return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()

    probe = "".join(f" --data {k}={flow(v)}" for k, v in (data_args or {}).items()) + "".join(
        f" --model-arg '{k}={flow(v)}'" for k, v in (model_args or {}).items()) + (f" --tag {tag}" if tag else "")
    target = f"--run {_relative(results_run)}" if results_run is not None else name
    payload = {"name": name, "family": model.family, "split": split, "examples": len(examples["images"]),
               "seed": seed, "recipe": metadata.get("recipe_file"), "data": registry.data_config(model),
               "probe": {"data": data_args, "model": model_args} if probe else None,
               "release_metrics": metadata.get("metrics"), "trained": trained, "randomised": randomised,
               "wall_time_s": round(time.perf_counter() - started, 1),
               "command": f"python scripts/attention_results.py {target} --n {n} --split {split} --seed {seed}{probe}"}
    if results_run is not None:
        payload.update(results_file=_relative(results_run), train_args=metadata.get("train_args"))
    return write_json(out_dir / f"attention_{name}{'_' + tag if tag else ''}.json", payload)


def _relative(path: Path) -> str:
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


#: the headline numbers a multi-seed summary gathers: name -> where it is in one seed's JSON
SUMMARY = {
    "pointing": "trained.correctness.pointing", "pointing_uniform": "trained.correctness.pointing_uniform",
    "pointing_centre": "trained.correctness.pointing_centre",
    "pointing_minus_centre": "trained.correctness.pointing_minus_centre",
    "pointing_minus_uniform": "trained.correctness.pointing_minus_uniform",
    "mass_in_box": "trained.correctness.mass_in_box", "mass_in_box_uniform": "trained.correctness.mass_in_box_uniform",
    "mass_in_box_centre": "trained.correctness.mass_in_box_centre",
    "mass_in_box_minus_centre": "trained.correctness.mass_in_box_minus_centre",
    "deletion_gap": "trained.faithfulness.deletion_gap", "deletion_gap_centre": "trained.faithfulness.deletion_gap_centre",
    "insertion_gap": "trained.faithfulness.insertion_gap", "chair_i": "trained.hallucination.chair_i",
}


def _interval(record: dict, path: str):
    """The bootstrap interval stored beside the number at `path` (its parent's "ci95")."""
    parent, _, key = path.rpartition(".")
    node = record
    for part in parent.split("."):
        node = (node or {}).get(part) or {}
    return (node.get("ci95") or {}).get(key)


def seeds_summary_name(name: str) -> str:
    """Where the seeds of results run <name> are summarised: attention_<name>.json, except when a
    release has that name (scripts/release.py --remake names the results run after the release):
    that file is the release's own record (with its randomised control), so the seeds go beside it
    in attention_<name>_seeds.json."""
    return f"attention_{name}_seeds.json" if name in zoo.list_models(pretrained=True) else f"attention_{name}.json"


def summarise_seeds(name: str, out_dir: Path) -> Path:
    """results/attention_<name>.json (`seeds_summary_name`) from every attention_<name>_seed<N>.json
    of the seeds that the results run <name> summarises (results/<name>.json: its recipe, training
    arguments and seeds; else the recipe and arguments of the highest seed): per headline number its
    mean, std over the seeds, per-seed values and per-seed bootstrap intervals."""
    records = {}
    for path in sorted(out_dir.glob(f"attention_{name}_seed*.json")):
        record = json.loads(path.read_text())
        seed_text = path.stem.rpartition("_seed")[2]
        if seed_text.isdigit():
            records[int(seed_text)] = record
    # the recipe and arguments of the results run's own summary (results/<name>.json), else the last seed's
    run_summary = out_dir / f"{name}.json"
    latest = json.loads(run_summary.read_text()) if run_summary.is_file() else records[max(records)]
    summarised = latest.get("seeds") if run_summary.is_file() else None  # the seeds results_run kept
    records = {s: r for s, r in sorted(records.items())
               if r.get("recipe") == latest.get("recipe") and (r.get("train_args") or []) == (latest.get("train_args") or [])
               and (summarised is None or s in summarised)}
    if not records:
        raise UserError(f"no attention_{name}_seed<N>.json of {latest.get('recipe')} with its training arguments")

    def at(record: dict, path: str):
        node = record
        for part in path.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        return node

    metrics = {}
    for key, path in SUMMARY.items():
        values = [at(r, path) for r in records.values()]
        if any(not isinstance(v, (int, float)) or v != v for v in values):
            continue
        metrics[key] = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
                        "per_seed": values, "per_seed_ci95": [_interval(r, path) for r in records.values()]}
    steps = [[step.get("pointing") for step in r["trained"].get("per_step") or []] for r in records.values()]
    if steps and all(steps) and len({len(row) for row in steps}) == 1:  # each step's pointing, per seed
        metrics["per_step_pointing"] = {"mean": [statistics.fmean(col) for col in zip(*steps)], "per_seed": steps}
    first = next(iter(records.values()))
    return write_json(out_dir / seeds_summary_name(name), {
        "name": name, "recipe": latest.get("recipe"), "train_args": latest.get("train_args"), "seeds": list(records),
        "runs": [f"results/attention_{name}_seed{s}.json" for s in records], "metrics": metrics,
        "examples": first.get("examples"), "split": first.get("split")})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="releases (default: every release that attends)")
    parser.add_argument("--checkpoint", action="append", default=[], metavar="PATH",
                        help="also (or instead) a checkpoint of your own: .ckpt or .safetensors")
    parser.add_argument("--run", nargs="+", default=[], metavar="SEED_JSON",
                        help="instead: seeds of a results run (results/<name>_seed<N>.json), each scored "
                             "on its best checkpoint, and their summary results/attention_<name>.json")
    parser.add_argument("--results-run", metavar="NAME", help="the same as --run results/NAME_seed<N>.json for --seeds")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="with --results-run: which seeds")
    parser.add_argument("--summarise", nargs="+", default=[], metavar="NAME",
                        help="instead: only rewrite results/attention_<name>.json from the seeds already scored")
    parser.add_argument("--n", type=int, default=500, help="test examples per release")
    parser.add_argument("--split", choices=["val", "test"], default="test")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="where to run the models (cpu, cuda)")
    parser.add_argument("--out", default=str(ROOT / "results"))
    parser.add_argument("--figures", metavar="DIR", help="instead: draw each release's attention on one test example")
    parser.add_argument("--index", type=int, default=0, help="with --figures: which test example")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                        help="a probe: evaluate on other data (a data module argument, YAML value)")
    parser.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="a probe: a hyperparameter that does not change the weights, e.g. "
                             "'backbone={dynamic_img_size: true}'")
    parser.add_argument("--tag", help="suffix of the JSON's name (attention_<name>_<tag>.json); needed with a probe")
    args = parser.parse_args(argv)
    try:
        if args.figures:
            for name in args.names or attending_releases():
                print(f"{name}: {figure(name, args.split, args.index, Path(args.figures))}", flush=True)
            return 0
        from zoo.commands.common import key_values

        data_args, model_args = key_values(args.data, "--data"), key_values(args.model_arg, "--model-arg")
        if (data_args or model_args) and not args.tag:
            raise UserError("a probe (--data / --model-arg) needs --tag, so it does not overwrite the release's JSON")
        if args.summarise:
            for name in args.summarise:
                if not list(Path(args.out).glob(f"attention_{name}_seed*.json")):
                    raise UserError(f"--summarise {name}: no attention_{name}_seed<N>.json in {args.out}")
                print(f"{name}: {summarise_seeds(name, Path(args.out))}", flush=True)
            return 0
        if args.results_run:
            args.run = [str(ROOT / "results" / f"{args.results_run}_seed{s}.json") for s in args.seeds]
        if args.run:
            summaries = set()
            for seed_json in map(Path, args.run):
                if not seed_json.is_file():
                    raise UserError(f"--run {seed_json}: no such results file (scripts/results_run.py writes them)")
                record = json.loads(seed_json.read_text())
                checkpoint = ROOT / record["checkpoint"]
                if not checkpoint.is_file():
                    raise UserError(f"--run {seed_json}: its checkpoint {record['checkpoint']} is not here")
                path = run(str(checkpoint), args.n, args.split, args.seed, Path(args.out), results_run=seed_json,
                           device=args.device)
                print(f"{seed_json}: {path}", flush=True)
                summaries.add(record["name"])
            for name in sorted(summaries):
                print(f"{name}: {summarise_seeds(name, Path(args.out))}", flush=True)
            return 0
        for name in [*(args.names or ([] if args.checkpoint else attending_releases())), *args.checkpoint]:
            path = run(name, args.n, args.split, args.seed, Path(args.out), data_args, model_args, args.tag,
                       device=args.device)
            print(f"{name}: {path}", flush=True)
    except UserError as exc:
        print(f"attention_results.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
