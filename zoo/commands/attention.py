"""zoo attention: where a ViT looks. For each image, writes
- DIR/<name>_heads.png: the last layer's CLS-to-patch attention, one map per head;
- DIR/<name>_rollout.png: attention rollout (Abnar & Zuidema 2020) as a heat map and an overlay;
and prints the predicted class.

    zoo attention --model vit_fmnist shirt.png boot.jpg --out figures/
    zoo attention --checkpoint runs/vit_fmnist/checkpoints/last.ckpt *.png --out out/ --json

Images are prepared as the model's evaluation data was (zoo.preprocess): converted to its channel
count (colour to grayscale for a Fashion-MNIST model) and resized (or resized and centre-cropped)
to its input size."""
from __future__ import annotations


from zoo.commands.common import (add_model_arguments, exit_code, print_records, report_bad_files, resolve_model,
                                 unique_names)
from zoo.errors import UserError

CHUNK = 64  # images per forward pass, so that many files do not need much memory


def add_arguments(parser) -> None:
    parser.add_argument("images", nargs="+", metavar="IMAGE", help="image files (any size, colour or gray)")
    add_model_arguments(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for the figures")
    parser.add_argument("--head-fusion", choices=["mean", "max", "min"], default="mean",
                        help="how rollout fuses each layer's heads (the paper: mean)")
    parser.add_argument("--residual", type=float, default=0.5,
                        help="weight of the identity (residual path) in rollout, in [0, 1) (default 0.5)")
    parser.add_argument("--json", action="store_true", help="print predictions and figure paths as JSON")


def run(args) -> int:

    from zoo.io import atomic_save_image, check_writable
    from zoo.preprocess import for_model, load_batch
    from zoo.viz.vit import heads_figure, rollout_figure

    if not 0 <= args.residual < 1:
        raise UserError(f"--residual must be in [0, 1), not {args.residual}")
    out_dir = check_writable(args.out, "--out", directory=True)
    model = resolve_model(args, lambda card: card.attention == "rollout", "a Vision Transformer (zoo attention draws its attention maps)")
    in_chans = model.hparams.in_chans
    if in_chans not in (1, 3):
        raise UserError(f"the model expects {in_chans}-channel images; zoo attention reads 1- or 3-channel images")
    notes: list[str] = []
    batch, good, errors = load_batch(args.images, for_model(model), notes)
    report_bad_files(errors, "attention", notes)
    if not good:
        return exit_code(0, errors)
    records, names = [], unique_names(good, "")
    for start in range(0, len(good), CHUNK):
        images = batch[start:start + CHUNK]
        maps = model.attention_maps(images, head_fusion=args.head_fusion, residual=args.residual)
        probs = maps["logits"].softmax(-1)
        for i in range(images.shape[0]):
            path, name = good[start + i], names[start + i]
            pred = int(probs[i].argmax())
            label = f"{model.class_name(pred)} ({float(probs[i, pred]):.0%})"
            heads_path, rollout_path = out_dir / f"{name}_heads.png", out_dir / f"{name}_rollout.png"
            atomic_save_image(heads_figure(images[i], maps["last"][i], label), heads_path)
            atomic_save_image(rollout_figure(images[i], maps["rollout"][i], label), rollout_path)
            records.append({"image": path, "predicted": model.class_name(pred), "class_index": pred,
                            "confidence": round(float(probs[i, pred]), 4),
                            "heads": str(heads_path), "rollout": str(rollout_path)})
    print_records(records, args.json,
                  lambda r: f"{r['image']}: {r['predicted']} ({r['confidence']:.0%}) -> {r['heads']}, {r['rollout']}")
    return exit_code(len(good), errors)
