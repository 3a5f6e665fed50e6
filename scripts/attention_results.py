"""Where did each release look, and was it right? The attention results behind docs/attention.md.

    python scripts/attention_results.py                      # every release that attends
    python scripts/attention_results.py ram_fmnist_cluttered60 --n 200
    python scripts/attention_results.py --checkpoint runs/x/checkpoints/last.ckpt --out /tmp   # any checkpoint
    python scripts/attention_results.py vit_fmnist --data variant=cluttered60 \
        --model-arg "backbone={dynamic_img_size: true}" --tag cluttered60_probe   # a probe on other data

For each release: its attention record on the first `--n` examples of its own data's test split
(the data it was trained on, rebuilt from the release's data config, with the item boxes known),
scored by `zoo.metrics.attention.evaluate` (pointing game, mass in box, window overlap, deletion and
insertion, each with chance levels), then the same with the model's weights randomised (Adebayo et
al. 2018: a faithful explanation must change when the model does). Writes
results/attention_<name>.json with the release's recipe, seed, git commit, device and wall time.
"""
from __future__ import annotations

import argparse
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
        model_args: dict | None = None, tag: str | None = None) -> Path:
    """`data_args` / `model_args` make a probe: the release on other data than its own (e.g. the
    centred ViT on cluttered canvases, with `dynamic_img_size`); `tag` names its JSON."""
    started = time.perf_counter()
    model = _load(name, model_args)
    data = registry.build_datamodule(model, **(data_args or {}))
    examples = data.boxed_examples(split, n)
    torch.manual_seed(seed)
    trained = evaluate(model, examples, seed=seed)
    randomised = evaluate(randomise(_load(name, model_args), seed), examples, seed=seed)
    release = Path(name).suffix not in (".ckpt", ".safetensors")
    metadata = registry.get_entry(name).metadata if release else {}
    name = name if release else Path(name).stem
    def flow(value) -> str:  # a YAML value as the command line takes it
        return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip().removesuffix("\n...").strip()

    probe = "".join(f" --data {k}={flow(v)}" for k, v in (data_args or {}).items()) + "".join(
        f" --model-arg '{k}={flow(v)}'" for k, v in (model_args or {}).items()) + (f" --tag {tag}" if tag else "")
    payload = {"name": name, "family": model.family, "split": split, "examples": len(examples["images"]),
               "seed": seed, "recipe": metadata.get("recipe"), "data": registry.data_config(model),
               "probe": {"data": data_args, "model": model_args} if probe else None,
               "release_metrics": metadata.get("metrics"), "trained": trained, "randomised": randomised,
               "wall_time_s": round(time.perf_counter() - started, 1),
               "command": f"python scripts/attention_results.py {name} --n {n} --split {split} --seed {seed}{probe}"}
    return write_json(out_dir / f"attention_{name}{'_' + tag if tag else ''}.json", payload)


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
    args = parser.parse_args(argv)
    try:
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
