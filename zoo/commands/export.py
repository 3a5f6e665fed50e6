"""zoo export: write a model as ONNX (or a torch.export .pt2 program) for serving without the zoo.

    zoo export --model vit_fmnist --out exported/                 # exported/model.onnx
    zoo export --model sat_soft_scenes --out exported/            # encoder, decoder_step, greedy .onnx
    zoo export --checkpoint runs/x/checkpoints/best.ckpt --format torch --out exported/

zoo/export.py says what each program takes and returns."""
from __future__ import annotations

from zoo.commands.common import add_model_arguments, resolve_model
from zoo.errors import UserError

FAMILIES = ("baseline", "ram", "draw", "draw_classifier", "vit", "captioner")


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for the exported programs")
    parser.add_argument("--format", choices=["onnx", "torch"], default="onnx",
                        help="onnx (default) or torch (torch.export ExportedProgram, .pt2)")
    parser.add_argument("--max-len", type=int, default=None,
                        help="captioners: words in the unrolled greedy program (default: the model's)")


def run(args) -> int:
    from zoo.export import export
    from zoo.io import check_writable
    from zoo.limits import check_flags

    if args.max_len is not None and args.max_len < 1:
        raise UserError(f"--max-len must be >= 1, got {args.max_len}")
    check_flags({"--max-len": args.max_len}, limit_name="export_max_len")
    from zoo.export import MANIFEST, check_target

    out = check_writable(args.out, "--out", directory=True)
    check_target(out)  # before the model loads: a folder of someone else's files is refused at once
    model = resolve_model(args, FAMILIES, "a zoo model")
    paths = export(model, out, args.format, args.max_len)
    for path in paths:
        print(f"wrote {path}")
    print(f"wrote {out / MANIFEST} (the set: sha256 of each file, preprocessing, labels or vocabulary)")
    return 0
