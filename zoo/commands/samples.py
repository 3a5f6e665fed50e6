"""zoo samples: example inputs to try the zoo on, without training or downloading anything: per
release (a family without one: its first recipe), the first N test images of its data, rebuilt from
its data config, and a boxes.json of their items (what `zoo attend --boxes` reads).

    zoo samples --out samples
    zoo samples --out samples --model sat_soft_scenes     # that release's (or recipe's) folder only
    zoo attend --model ram_fmnist_cluttered60 --out attend samples/ram_fmnist_cluttered60/*.png \
        --boxes samples/ram_fmnist_cluttered60/boxes.json
"""
from __future__ import annotations

import json
import sys


def add_arguments(parser) -> None:
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for the samples (new or empty)")
    parser.add_argument("--model", metavar="NAME",
                        help="only this release's or recipe's folder (default: every release, and each other "
                             "family's first recipe)")
    parser.add_argument("--n", type=int, default=4, help="test images per folder (1-100, default 4)")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a folder that is not empty (files of the same names are replaced; "
                             "symbolic links in it are refused, never followed)")


def _data(entry) -> dict | None:
    """The data config a registry entry was (its release) or would be (its recipe) trained on (its
    paths are scrubbed when it is built: that imports its class)."""
    return (entry.weights["config"].get("data") if entry.weights else None) or entry.data or None


def folders() -> dict[str, tuple[str, dict]]:
    """{folder name: (family, data config)}: every release, and each other family's first recipe."""
    from zoo import registry

    entries = registry.find_entries()
    # the model index's families, as registry.family_of reads them: importing every family (and
    # torch) to list them took 9 of the command's first 11 s; without an index, the cards
    registered = set(registry.index()["families"].values())
    if not registered:
        from zoo.models.card import families

        registered = set(families())
    chosen = {}
    for family in sorted(registered):
        mine = sorted(name for name, entry in entries.items() if registry.family_of(entry) == family)
        for name in [n for n in mine if entries[n].weights] or mine[:1]:
            data = _data(entries[name])
            if data:
                chosen[name] = (family, data)
    return chosen


def folder_of(name: str) -> dict[str, tuple[str, dict]]:
    """{name: (family, data config)} of one release or recipe; an unknown name is one line (did you mean)."""
    from zoo import registry
    from zoo.guards.errors import UserError

    entry = registry.get_entry(name)
    data = _data(entry)
    if not data:
        raise UserError(f"--model {name}: its recipe names no data to take examples from")
    return {name: (registry.family_of(entry), data)}


def run(args) -> int:
    from zoo import registry
    from zoo.guards.errors import UserError
    from zoo.guards.writes import atomic_save_image, atomic_write_bytes, check_writable, output_in

    if not 1 <= args.n <= 100:
        raise UserError(f"--n must be 1 to 100, got {args.n}")
    chosen = folder_of(args.model) if args.model else folders()  # an unknown name: before --out is looked at
    out = check_writable(args.out, "--out", directory=True)
    if out.is_dir() and any(out.iterdir()) and not args.overwrite:
        raise UserError(f"--out {out}: not empty; give --overwrite to write into it, or name a new folder")
    for name in chosen:  # every file, before any work: none through a link, none out of --out
        for file in [*(f"test_{i:05d}.png" for i in range(args.n)), "boxes.json"]:
            output_in(out, f"{name}/{file}", "--out", args.overwrite)
    # seconds before the first folder is written (torch, the first data set): say what it does
    print(f"zoo samples: building the test data of {len(chosen)} model(s), a line per folder as it is written",
          file=sys.stderr, flush=True)
    import torch
    from PIL import Image

    built: dict[str, dict] = {}  # releases trained on the same data share its examples
    for name, (family, data) in chosen.items():  # a line each on stdout as it is written
        data = registry.scrub_paths({"data": data})["data"]
        key = json.dumps(data, sort_keys=True)
        if key not in built:
            few = registry.resolve_class(data.get("class_path"), "data").few_examples(args.n)
            built[key] = registry.instantiate(data, "data", **few).boxed_examples("test", args.n)
        examples, boxes = built[key], {}
        images = (examples["images"] * 255).round().clamp(0, 255).to(torch.uint8)  # [n, C, H, W]
        for i, image in enumerate(images):
            file = f"test_{i:05d}.png"
            pixels = image.permute(1, 2, 0).numpy()
            atomic_save_image(Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels), out / name / file)
            kept = [k for k, box in enumerate(examples["targets"][i].tolist()) if box[2] > box[0] >= 0]
            boxes[file] = {"boxes": [[round(v, 2) if v % 1 else int(v) for v in examples["targets"][i][k].tolist()]
                                     for k in kept]}
            if "target_words" in examples:
                boxes[file]["box_words"] = [examples["target_words"][i][k] for k in kept]
        lines = ",\n".join(f" {json.dumps(file)}: {json.dumps(entry)}" for file, entry in boxes.items())
        atomic_write_bytes(out / name / "boxes.json", f"{{\n{lines}\n}}\n".encode())
        C, H, W = images.shape[1:]
        print(f"{out / name}: {len(images)} test images, {W}x{H} px, {C} channel(s), boxes.json ({family})")
    return 0
