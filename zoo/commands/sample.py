"""zoo sample: draw images from a DRAW generator, or redraw given ones, as a figure and optionally
an animated canvas (the GIF beside --out).

    zoo sample --model draw_fmnist_t16 --n 64 --out samples.png --gif
    zoo sample --model draw_two_items60 --reconstruct-split test --n 8 --out recon.png --gif

Sampling (eqs. 13-14): a grid of the samples, each step's write box (red, width proportional to
sigma). Reconstruction (the test sets' fixed binarization): a strip per image (the input, then the
canvas at STRIP_STEPS steps), with each step's read (green) and write (red) boxes.
"""
from __future__ import annotations

from pathlib import Path

from zoo.commands.common import (FOLDERS_HELP, add_model_arguments, add_recursive, exit_code, expand_images,
                                 report_bad_files, resolve_model)
from zoo.guards.errors import UserError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".tif", ".tiff")
MAX_SAMPLES = 4096
DEFAULT_N = {"sample": 64, "split": 8}
STRIP_STEPS = 8  # canvases shown per reconstruction strip
GIF_GREYS = 16  # grey levels of a grayscale model's GIF (a smaller file)


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--n", type=int, help=f"number of samples (default {DEFAULT_N['sample']}) or of split "
                                              f"images to reconstruct (default {DEFAULT_N['split']})")
    parser.add_argument("--out", required=True, help="figure file (.png, .jpg, ...)")
    parser.add_argument("--gif", action="store_true", help="also write the animated canvas beside --out (.gif)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out (and the GIF) if they exist")
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--reconstruct", nargs="+", metavar="IMAGE",
                        help="encode and redraw these grayscale images of the model's size" + FOLDERS_HELP)
    source.add_argument("--reconstruct-split", choices=["val", "test"],
                        help="encode and redraw the first --n images of this split of the model's data set")
    add_recursive(parser)
    parser.add_argument("--seed", type=int, default=0, help="random seed of the latent draws")
    parser.add_argument("--scale", type=int, default=2, help="pixel upscaling of the figures")
    parser.add_argument("--frame-ms", type=int, default=80, help="GIF frame duration in ms")


def model_datamodule(model):
    """The data module the model was trained with, set up for its test splits."""
    from zoo.registry import build_datamodule

    datamodule = build_datamodule(model)
    datamodule.setup("test")
    return datamodule


def _split_images(model, split: str, n: int):
    """The first n images [n, C, S, S] in [0, 1] of `split` of the model's own data module."""
    import torch

    try:
        datamodule = model_datamodule(model)
    except UserError as exc:
        raise UserError(f"--reconstruct-split: {exc}; give images with --reconstruct") from None
    datamodule.test_split = split
    images = []
    for batch in datamodule.test_dataloader():
        images.append(datamodule.on_after_batch_transfer(batch, 0)[0])
        if sum(len(b) for b in images) >= n:
            break
    return torch.cat(images)[:n]


def run(args) -> int:
    import torch

    from zoo.guards.budget import check_memory
    from zoo.guards.writes import atomic_save_image, check_output
    from zoo.preprocess import for_model, load_batch
    from zoo.viz import draw as viz

    if args.reconstruct is not None and args.n is not None:
        raise UserError("--n does not apply to --reconstruct IMAGE... (every image given is redrawn)")
    notes: list[str] = []
    if args.reconstruct is not None:
        args.reconstruct, notes = expand_images(args.reconstruct, args.recursive)
    n = args.n if args.n is not None else DEFAULT_N["split" if args.reconstruct_split else "sample"]
    if not 1 <= n <= MAX_SAMPLES:
        raise UserError(f"--n must be between 1 and {MAX_SAMPLES}, got {n}")
    if not 1 <= args.scale <= 16:
        raise UserError(f"--scale must be between 1 and 16, got {args.scale}")
    if args.frame_ms < 1:
        raise UserError(f"--frame-ms must be positive, got {args.frame_ms}")
    out = Path(args.out)
    if out.suffix.lower() not in IMAGE_SUFFIXES:
        raise UserError(f"--out {out}: use an image suffix ({', '.join(IMAGE_SUFFIXES)})")
    check_output(out, "--out", args.overwrite)  # before any work; a missing folder is created on write
    if args.gif:
        check_output(out.with_suffix(".gif"), "--gif", args.overwrite)
    model = resolve_model(args, lambda card: card.output == "sample", "a generator (zoo sample draws from one)")
    # every step's canvas of every image is kept for the figures (and thrice over for the GIF's frames)
    height, width = model.input_size
    check_memory({f"--n {n} x T={model.T} canvases of {model.C}x{height}x{width}":
                  float(n) * model.T * model.C * height * width * 4 * (3 if args.gif else 1)}, "sampling")
    generator = torch.Generator().manual_seed(args.seed)
    filterbank = model.hparams.attention == "filterbank"
    read_n, write_n = (model.hparams.read_n, model.hparams.write_n) if filterbank else (None, None)
    errors: list[str] = []
    if args.reconstruct is not None or args.reconstruct_split is not None:
        if args.reconstruct is not None:  # prepared as the model's own data were
            images, _, errors = load_batch(args.reconstruct, for_model(model), notes)
            report_bad_files(errors, "sample", notes)
            if not len(images):
                return exit_code(0, errors)
        else:
            images = _split_images(model, args.reconstruct_split, n)
        with torch.no_grad():
            x = model.binarize(images, train=False)  # the fixed binarization of the test sets
            noise = torch.randn(model.T, len(x), model.hparams.z_size, generator=generator)
            result = model(x, noise=noise, record=True)
        canvases = torch.sigmoid(result["canvas"])  # [T, n, C, S, S]
        figure = viz.reconstruction_strip(x, canvases, result["read"], result["write"], read_n, write_n,
                                          steps=STRIP_STEPS, scale=args.scale)
        what = f"{len(x)} reconstructions"
    else:
        result = model.sample(n, generator=generator)
        canvases, x = result["canvases"], None
        figure = viz.sample_grid(result["images"], scale=args.scale)
        what = f"{n} samples"
    atomic_save_image(figure, out)  # a full or read-only disk: one line (zoo.guards.errors.environment_error)
    print(f"wrote {out} ({what}, T={model.T})")
    if args.gif:
        frames = viz.canvas_frames(canvases, write=result["write"], write_n=write_n,
                                   read=result.get("read"), read_n=read_n, targets=x, scale=args.scale)
        gif = out.with_suffix(".gif")
        greys = GIF_GREYS if model.C == 1 else None  # colour canvases keep GIF's adaptive palette
        viz.save_gif(frames, gif, duration_ms=args.frame_ms, greys=greys)
        print(f"wrote {gif} ({len(frames)} frames)")
    return exit_code(1, errors)
