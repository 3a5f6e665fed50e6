"""zoo glimpses: where a RAM model looks. For each image, writes DIR/<name>_glimpses.png with a
numbered box per glimpse and scale, and the predicted class.

    zoo glimpses --model ram_fmnist_cluttered60 canvas.png --out figures/
    zoo glimpses --checkpoint runs/ram_fmnist_centered/checkpoints/last.ckpt a.png b.png --out out/

RAM's locations are tied to its image size, so images must have exactly the model's size; a
colour image is refused by a grayscale model (a grey image stored as RGB is accepted)."""
from __future__ import annotations


from zoo.commands.common import (add_model_arguments, exit_code, print_records, report_bad_files, resolve_model,
                                 unique_names)


def add_arguments(parser) -> None:
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files of the model's size")
    add_model_arguments(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for the figures")
    parser.add_argument("--policy", choices=["mean", "sample"], default="mean",
                        help="deterministic mean locations (default) or one sampled trajectory")
    parser.add_argument("--json", action="store_true", help="print predictions and locations as JSON")


def run(args) -> int:
    import torch

    from zoo.io import atomic_save_image, check_writable
    from zoo.preprocess import for_model, load_batch
    from zoo.viz.glimpses import draw_glimpses

    out_dir = check_writable(args.out, "--out", directory=True)
    model = resolve_model(args, lambda card: card.attention == "glimpse", "a model with glimpses (zoo glimpses draws their trajectories)")
    notes: list[str] = []
    batch, good, errors = load_batch(args.images, for_model(model), notes)
    report_bad_files(errors, "glimpses", notes)
    if not good:
        return exit_code(0, errors)
    with torch.inference_mode():
        traj = model.glimpse_trajectory(batch, policy=args.policy)
    records = []
    for i, (path, name) in enumerate(zip(good, unique_names(good, "_glimpses.png"))):
        pred = int(traj["predictions"][i])
        confidence = float(traj["probs"][i, pred])
        figure = draw_glimpses(batch[i], traj["boxes"][i], model.class_name(pred), confidence=confidence)
        target = out_dir / name
        atomic_save_image(figure, target)
        records.append({"image": path, "figure": str(target), "predicted": model.class_name(pred),
                        "class_index": pred, "confidence": round(confidence, 4),
                        "locations": [{"x": round(x, 4), "y": round(y, 4)} for x, y in traj["locations"][i].tolist()]})
    print_records(records, args.json,
                  lambda r: f"{r['image']}: {r['predicted']} ({r['confidence']:.0%}) -> {r['figure']}")
    return exit_code(len(good), errors)
