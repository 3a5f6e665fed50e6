"""Release trained weights: checkpoint -> weights/<name>.safetensors + an entry in MANIFEST.json.

    python scripts/release.py --checkpoint runs/ram_fmnist_centered/checkpoints/best-epoch=019.ckpt \\
        --name ram_fmnist_centered --results results/ram_fmnist_centered.json

The manifest records the file's sha256, the model and data config, and metadata: the task, the
dataset, the measured metrics (read from a results JSON written by eval.py or a results script),
the recipe command that produced the weights, and the device it was trained on.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zoo import hub, registry  # noqa: E402
from zoo.errors import UserError  # noqa: E402
from zoo.io import atomic_write_bytes  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--name", required=True, help="registry name, e.g. ram_fmnist_centered")
    parser.add_argument("--results", help="results JSON whose 'metrics' (and device) go in the manifest")
    parser.add_argument("--recipe", help="command that trained it (default: the registry recipe)")
    parser.add_argument("--dataset", help="dataset description (default: from the data config)")
    parser.add_argument("--url", help="where the file will also be downloadable")
    args = parser.parse_args(argv)
    try:
        model = registry.load_checkpoint(args.checkpoint)
        config = model.zoo_config()
        target = registry.weights_dir() / f"{args.name}.safetensors"
        sha256 = hub.save_release(model, config, target)
        results = json.loads(Path(args.results).read_text()) if args.results else {}
        data = config.get("data") or {}
        try:
            entry = registry.get_entry(args.name)
            # the recipe file itself: a previous release's manifest record must not speak for this one
            recipe = args.recipe or (f"python train.py fit --config {entry.recipe.relative_to(registry.REPO_ROOT)}"
                                     if entry.recipe is not None else entry.metadata.get("recipe"))
        except UserError:
            recipe = args.recipe
        metadata = {"task": config["family"],
                    "dataset": args.dataset or f"{data.get('class_path', '?').rsplit('.', 1)[-1]} {data.get('init_args', {}).get('variant', '')}".strip(),
                    "metrics": results.get("metrics", {}), "recipe": recipe,
                    "device": (results.get("device") or {}).get("device"),
                    "results_file": args.results}
        manifest_path = registry.weights_dir() / "MANIFEST.json"
        manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
        manifest[args.name] = {"file": target.name, "sha256": sha256, "config": config,
                               "metadata": metadata, **({"url": args.url} if args.url else {})}
        atomic_write_bytes(manifest_path, (json.dumps(manifest, indent=2, sort_keys=True) + "\n").encode())
    except UserError as exc:
        print(f"release.py: error: {exc}", file=sys.stderr)
        return 2
    print(f"{target} ({target.stat().st_size / 1e6:.2f} MB, sha256 {sha256[:12]}…) -> {manifest_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
