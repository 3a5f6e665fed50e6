"""Where a DRAW generator reads and writes, step by step: the analysis behind docs/draw.md.

    python scripts/draw_windows.py (--checkpoint PATH | --model NAME) [--split test] [--num 500] [--json FILE]

It encodes the first `--num` images of a split of the Fashion-MNIST variant the model was trained
on (fixed binarization, as the test set) and reports, for every step t:
- kl: KL(q(z_t | ...) || p(z_t)) in nats (eq. 11), the information step t spends;
- write_in_items: the share of the step's canvas change |c_t - c_{t-1}| (eq. 8) that falls inside
  the items' 28x28 frames, next to `items_share`, the share of the canvas the frames cover (what
  a write spread evenly would put there);
- for attention models, the write and read windows: side (N x delta, pixels; eq. 24), sigma
  (pixels), and the share of windows whose centre (gX, gY) (eqs. 22-23) lies inside an item's
  frame.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zoo.guards.errors import UserError  # noqa: E402
from zoo.guards.writes import check_output  # noqa: E402
from zoo.metrics.localization import cells_in_boxes  # noqa: E402
from zoo.results import write_json  # noqa: E402


def centre_inside(params, boxes: np.ndarray) -> np.ndarray:
    """FilterParams (each [n]) and boxes [n, K, 4] (0-based x0, y0, x1, y1, exclusive) ->
    bool [n]: the window centre lies inside one of the boxes. 1-based pixel a spans [a - 1, a]
    in continuous coordinates, so the centre is at (gX - 1/2, gY - 1/2) there."""
    x = params.gx.cpu().numpy()[:, None] - 0.5
    y = params.gy.cpu().numpy()[:, None] - 0.5
    return ((boxes[..., 0] <= x) & (x < boxes[..., 2]) & (boxes[..., 1] <= y) & (y < boxes[..., 3])).any(1)


def analyse(model, images, boxes: np.ndarray, seed: int = 0) -> dict:
    """images [n, C, S, S] in [0, 1], boxes [n, K, 4] -> per-step statistics (see the module doc)."""
    import torch

    n, S, T = len(images), model.S, model.T
    inside = cells_in_boxes(boxes.reshape(-1, 4), (S, S), S).reshape(n, -1, S, S).any(1)  # [n, S, S]
    with torch.no_grad():
        x = model.binarize(images, train=False)
        noise = torch.randn(T, n, model.hparams.z_size, generator=torch.Generator().manual_seed(seed))
        out = model(x, noise=noise, record=True)
    canvas = out["canvas"][:, :, 0].cpu().numpy()  # [T, n, S, S] logits (channel 0)
    change = np.abs(np.diff(canvas, axis=0, prepend=0.0))  # |c_t - c_{t-1}|, c_0 = 0
    steps = []
    for t in range(T):
        moved = change[t].sum((1, 2))
        row = {"step": t + 1, "kl": float(out["kl"][t].mean()),
               "write_in_items": float((change[t] * inside).sum((1, 2)).sum() / max(moved.sum(), 1e-12))}
        for kind, n_filters in (("write", model.hparams.write_n), ("read", model.hparams.read_n)):
            params = out[kind][t]
            if params is None:
                continue
            row[f"{kind}_side"] = float((n_filters * params.delta).median())
            row[f"{kind}_sigma"] = float(params.sigma2.sqrt().median())
            row[f"{kind}_centre_in_items"] = float(centre_inside(params, boxes).mean())
        steps.append(row)
    return {"items_share": float(inside.mean()), "num_images": n, "steps": steps,
            "total_kl": float(out["kl"].sum(0).mean())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint")
    source.add_argument("--model", help="registry name (released weights)")
    parser.add_argument("--split", choices=["val", "test"], default="test")
    parser.add_argument("--num", type=int, default=500, help="images analysed (the first of the split)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the latent noise")
    parser.add_argument("--json", help="write the statistics here")
    parser.add_argument("--overwrite", action="store_true", help="replace the --json file if it exists")
    args = parser.parse_args(argv)
    import torch

    import zoo
    from zoo.commands.sample import model_datamodule

    try:
        if args.num < 1:
            raise UserError(f"--num must be positive, got {args.num}")
        if args.json:
            check_output(args.json, "--json", args.overwrite)  # before any work, as every command's output
        model = (zoo.load_checkpoint(args.checkpoint) if args.checkpoint
                 else zoo.create_model(args.model, pretrained=True)).eval()
        if model.card.output != "sample" or not model.card.attention:
            raise UserError(f"a {model.family} model: this script reads a generator's read and write windows")
        datamodule = model_datamodule(model)
        images = datamodule.datasets[args.split].tensors[0][:args.num].float() / 255
        boxes = datamodule.boxes[args.split][:args.num].numpy().reshape(len(images), -1, 4)
    except UserError as exc:
        print(f"draw_windows.py: error: {exc}", file=sys.stderr)
        return 2
    torch.set_grad_enabled(False)
    stats = analyse(model, images, boxes, args.seed)
    has_windows = "write_side" in stats["steps"][0]
    print(f"items cover {stats['items_share']:.1%} of the canvas; total KL {stats['total_kl']:.2f} nats")
    header = "step   kl  write in items" + ("  write side sigma centre in items | read side sigma centre in items"
                                            if has_windows else "")
    print(header)
    for r in stats["steps"]:
        line = f"{r['step']:4d} {r['kl']:5.2f}  {r['write_in_items']:13.1%}"
        if has_windows:
            line += (f"  {r['write_side']:10.1f} {r['write_sigma']:5.2f} {r['write_centre_in_items']:15.1%}"
                     f" | {r['read_side']:9.1f} {r['read_sigma']:5.2f} {r['read_centre_in_items']:15.1%}")
        print(line)
    if args.json:
        write_json(args.json, {"checkpoint": args.checkpoint, "model": args.model, "split": args.split,
                               "seed": args.seed, **stats})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
