"""zoo sample: draw images from a DRAW generator, as a grid and optionally an animated canvas.

    zoo sample --model draw_fmnist --n 64 --out samples.png --gif
    zoo sample --checkpoint runs/draw_fmnist/checkpoints/last.ckpt --out s.png

The GIF (beside --out, suffix .gif) shows the canvas at every step with the write box in red
(border width proportional to sigma); sampling uses no encoder, so there is no read box. The
read (green) and write boxes of reconstructions are logged at validation (attention_figures).
"""
from __future__ import annotations

from pathlib import Path

from zoo.commands.common import add_model_arguments, resolve_model
from zoo.errors import UserError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
MAX_SAMPLES = 4096


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--n", type=int, default=64, help="number of samples (default 64)")
    parser.add_argument("--out", required=True, help="sample grid image (.png, .jpg, ...)")
    parser.add_argument("--gif", action="store_true", help="also write the animated canvas beside --out (.gif)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the latent draws")
    parser.add_argument("--scale", type=int, default=2, help="pixel upscaling of the figures")
    parser.add_argument("--frame-ms", type=int, default=80, help="GIF frame duration in ms")


def run(args) -> int:
    import torch

    from zoo.io import atomic_save_image
    from zoo.viz import draw as viz

    if not 1 <= args.n <= MAX_SAMPLES:
        raise UserError(f"--n must be between 1 and {MAX_SAMPLES}, got {args.n}")
    if not 1 <= args.scale <= 16:
        raise UserError(f"--scale must be between 1 and 16, got {args.scale}")
    if args.frame_ms < 1:
        raise UserError(f"--frame-ms must be positive, got {args.frame_ms}")
    out = Path(args.out)
    if out.suffix.lower() not in IMAGE_SUFFIXES:
        raise UserError(f"--out {out}: use an image suffix ({', '.join(IMAGE_SUFFIXES)})")
    if out.exists() and out.is_dir():
        raise UserError(f"--out {out}: is a directory")
    model = resolve_model(args, "draw", "a DRAW generator (family 'draw'); sampling needs one")
    result = model.sample(args.n, generator=torch.Generator().manual_seed(args.seed))
    grid = viz.sample_grid(result["images"], scale=args.scale)
    try:
        atomic_save_image(grid, out)
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
    print(f"wrote {out} ({args.n} samples, T={model.T})")
    if args.gif:
        write_n = model.hparams.write_n if model.hparams.attention == "filterbank" else None
        frames = viz.canvas_frames(result["canvases"], write=result["write"], write_n=write_n, scale=args.scale)
        gif = out.with_suffix(".gif")
        try:
            viz.save_gif(frames, gif, duration_ms=args.frame_ms)
        except OSError as exc:
            raise UserError(f"{gif}: cannot write ({exc.strerror or exc})") from None
        print(f"wrote {gif} ({len(frames)} frames)")
    return 0
