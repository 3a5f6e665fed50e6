"""zoo export: write a model as ONNX (or a torch.export .pt2 program) for serving without the zoo.

    zoo export --model vit_fmnist --out exported/                 # exported/model.onnx
    zoo export --model sat_soft_scenes --out exported/            # encoder, decoder_step, greedy .onnx
    zoo export --checkpoint runs/x/checkpoints/best.ckpt --format torch --out exported/

zoo/weights/export.py says what each program takes and returns."""
from __future__ import annotations

from zoo.commands.common import add_model_arguments, resolve_model


def add_arguments(parser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for the exported programs")
    parser.add_argument("--format", choices=["onnx", "torch"], default="onnx",
                        help="onnx (default) or torch (torch.export ExportedProgram, .pt2)")
    parser.add_argument("--max-len", type=int, default=None,
                        help="captioners: words in the unrolled greedy program (default: the model's)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier export in --out (only while its files are the ones its "
                             "export.json records)")


def run(args) -> int:
    import sys

    from zoo.guards.budget import check_flags
    from zoo.weights.export import MANIFEST, check_target, export

    check_flags({"--max-len": args.max_len}, limit_name="export_max_len")
    def progress(line: str) -> None:  # each stage takes seconds (a captioner's three programs, ~40 s)
        print(f"zoo export: {line}", file=sys.stderr, flush=True)

    check_target(args.out, args.overwrite)  # before the model loads: someone else's folder is refused at once
    model = resolve_model(args)
    try:
        paths = export(model, args.out, args.format, args.max_len, args.overwrite, progress)
    except SystemExit as exc:
        if exc.code != 143:
            raise
        print(f"zoo export: stopped by SIGTERM: --out {args.out} is as it was", file=sys.stderr)
        return 143
    for path in paths:
        print(f"wrote {path}")
    print(f"wrote {paths[0].parent / MANIFEST} (the set: sha256 of each file, preprocessing, labels or vocabulary)")
    return 0
