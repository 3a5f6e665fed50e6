"""Where did each release look, and was it right? The attention results behind docs/attention.md.

    python scripts/attention_results.py                      # every release that attends
    python scripts/attention_results.py ram_fmnist_cluttered60 --n 200
    python scripts/attention_results.py --checkpoint runs/x/checkpoints/last.ckpt --out /tmp   # any checkpoint
    python scripts/attention_results.py vit_fmnist --data variant=cluttered60 \
        --model-arg "backbone={dynamic_img_size: true}" --tag cluttered60_probe   # a probe on other data
    python scripts/attention_results.py --results-run ram_fmnist_cluttered60_dram --seeds 0 1 2   # a recipe's seeds

For each release: its attention record on the first `--n` examples of its own data's test split
(the data it was trained on, rebuilt from the release's data config, with the item boxes known),
scored by `zoo.metrics.attention.evaluate` (pointing game, mass in box, window overlap, deletion and
insertion, each with chance levels), then the same with the model's weights randomised (Adebayo et
al. 2018: a faithful explanation must change when the model does). Writes
results/attention_<name>.json with the release's recipe, seed, git commit, device and wall time.

`--results-run NAME --seeds ...` scores every seed of a results run (`scripts/results_run.py`,
whose results/NAME_seed<N>.json names each seed's best checkpoint) before any release exists:
results/attention_NAME_seed<N>.json per seed, and results/attention_NAME.json with, for every
headline number, its mean, spread and per-seed values over the seeds (`seeds_summary`), and each
seed's margin over the centre prior.
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
from zoo.errors import UserError  # noqa: E402
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
    from zoo.io import atomic_save_image
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
        model_args: dict | None = None, tag: str | None = None, json_name: str | None = None,
        recipe: str | None = None) -> Path:
    """`data_args` / `model_args` make a probe: the release on other data than its own (e.g. the
    centred ViT on cluttered canvases, with `dynamic_img_size`); `tag` names its JSON. For a
    checkpoint, `json_name` (default: the file's stem) names it and `recipe` records where it came from."""
    started = time.perf_counter()
    model = _load(name, model_args)
    data = registry.build_datamodule(model, **(data_args or {}))
    examples = data.boxed_examples(split, n)
    torch.manual_seed(seed)
    trained = evaluate(model, examples, seed=seed)
    randomised = evaluate(randomise(_load(name, model_args), seed), examples, seed=seed)
    release = Path(name).suffix not in (".ckpt", ".safetensors")
    metadata = registry.get_entry(name).metadata if release else {"recipe": recipe}
    source = name
    name = name if release else json_name or Path(name).stem
    def flow(value) -> str:  # a YAML value as the command line takes it
        return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()

    probe = "".join(f" --data {k}={flow(v)}" for k, v in (data_args or {}).items()) + "".join(
        f" --model-arg '{k}={flow(v)}'" for k, v in (model_args or {}).items()) + (f" --tag {tag}" if tag else "")
    payload = {"name": name, "family": model.family, "split": split, "examples": len(examples["images"]),
               "seed": seed, "recipe": metadata.get("recipe_file"), "data": registry.data_config(model),
               "probe": {"data": data_args, "model": model_args} if probe else None,
               "release_metrics": metadata.get("metrics"), "trained": trained, "randomised": randomised,
               "wall_time_s": round(time.perf_counter() - started, 1),
               "command": f"python scripts/attention_results.py {name if release else '--checkpoint ' + source} "
                          f"--n {n} --split {split} --seed {seed}{probe}"}
    return write_json(out_dir / f"attention_{name}{'_' + tag if tag else ''}.json", payload)


#: the headline numbers a multi-seed summary carries: name -> dotted path into one seed's JSON
SUMMARISED = {"pointing": "trained.correctness.pointing", "pointing_uniform": "trained.correctness.pointing_uniform",
              "pointing_centre": "trained.correctness.pointing_centre", "mass_in_box": "trained.correctness.mass_in_box",
              "deletion_gap": "trained.faithfulness.deletion_gap",
              "deletion_gap_centre": "trained.faithfulness.deletion_gap_centre",
              "randomised_pointing": "randomised.correctness.pointing"}


def _at(record, path: str):
    for key in path.split("."):
        record = record.get(key) if isinstance(record, dict) else None
    return record


def _spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "per_seed": values}


def results_run(name: str, seeds: list[int], n: int, split: str, seed: int, out_dir: Path) -> Path:
    """Score each seed's best checkpoint of the results run `name`, then summarise over seeds."""
    started = time.perf_counter()
    records = []
    for s in seeds:
        run_json = ROOT / "results" / f"{name}_seed{s}.json"
        if not run_json.is_file():
            raise UserError(f"{run_json.relative_to(ROOT)} does not exist: run scripts/results_run.py for seed {s} first")
        trained = json.loads(run_json.read_text())
        checkpoint = ROOT / trained["checkpoint"]
        if not checkpoint.is_file():
            raise UserError(f"{trained['checkpoint']} (seed {s} of {name}) is not on this machine")
        path = run(str(checkpoint), n, split, seed, out_dir, json_name=f"{name}_seed{s}", recipe=trained["recipe"])
        print(f"{name} seed {s}: {path}", flush=True)
        records.append(json.loads(path.read_text()))
    summary = {key: _spread([_at(r, path) for r in records]) for key, path in SUMMARISED.items()}
    steps = [[step["pointing"] for step in r["trained"]["per_step"]] for r in records]
    summary["per_glimpse_pointing"] = {"mean": [statistics.fmean(col) for col in zip(*steps)], "per_seed": steps}
    margins = [p - c for p, c in zip(summary["pointing"]["per_seed"], summary["pointing_centre"]["per_seed"])]
    summary["margin_over_centre"] = {**_spread(margins), "min": min(margins)}
    payload = {"name": name, "family": records[0]["family"], "split": split, "examples": records[0]["examples"],
               "seed": seed, "seeds": seeds, "recipe": records[0]["recipe"],
               "per_seed_files": [f"results/attention_{name}_seed{s}.json" for s in seeds], "seeds_summary": summary,
               "wall_time_s": round(time.perf_counter() - started, 1),
               "command": f"python scripts/attention_results.py --results-run {name} --seeds {' '.join(map(str, seeds))} "
                          f"--n {n} --split {split} --seed {seed}"}
    return write_json(out_dir / f"attention_{name}.json", payload)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="releases (default: every release that attends)")
    parser.add_argument("--checkpoint", action="append", default=[], metavar="PATH",
                        help="also (or instead) a checkpoint of your own: .ckpt or .safetensors")
    parser.add_argument("--n", type=int, default=500, help="test examples per release")
    parser.add_argument("--split", choices=["val", "test"], default="test")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=str(ROOT / "results"))
    parser.add_argument("--figures", metavar="DIR", help="instead: draw each release's attention on one test example")
    parser.add_argument("--index", type=int, default=0, help="with --figures: which test example")
    parser.add_argument("--data", action="append", default=[], metavar="KEY=VALUE",
                        help="a probe: evaluate on other data (a data module argument, YAML value)")
    parser.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                        help="a probe: a hyperparameter that does not change the weights, e.g. "
                             "'backbone={dynamic_img_size: true}'")
    parser.add_argument("--tag", help="suffix of the JSON's name (attention_<name>_<tag>.json); needed with a probe")
    parser.add_argument("--results-run", metavar="NAME",
                        help="instead: every seed of a results run (results/NAME_seed<N>.json), and their summary")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="with --results-run: which seeds")
    args = parser.parse_args(argv)
    try:
        if args.results_run:
            if args.names or args.checkpoint or args.data or args.model_arg or args.figures:
                raise UserError("--results-run scores a results run's own checkpoints; give it alone")
            print(results_run(args.results_run, args.seeds, args.n, args.split, args.seed, Path(args.out)))
            return 0
        if args.figures:
            for name in args.names or attending_releases():
                print(f"{name}: {figure(name, args.split, args.index, Path(args.figures))}", flush=True)
            return 0
        from zoo.evaluate import key_values

        data_args, model_args = key_values(args.data, "--data"), key_values(args.model_arg, "--model-arg")
        if (data_args or model_args) and not args.tag:
            raise UserError("a probe (--data / --model-arg) needs --tag, so it does not overwrite the release's JSON")
        for name in [*(args.names or ([] if args.checkpoint else attending_releases())), *args.checkpoint]:
            path = run(name, args.n, args.split, args.seed, Path(args.out), data_args, model_args, args.tag)
            print(f"{name}: {path}", flush=True)
    except UserError as exc:
        print(f"attention_results.py: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
