"""zoo caption IMAGE|FOLDER... : caption images with a Show-Attend-Tell model, optionally with per-word
attention overlays (one PNG per image) or JSON of every word's alpha map and gate beta. Bad files
are one line each on stderr; exit code 0 (all good), 1 (some bad), 2 (all bad, or a bad argument).
A caption not to trust (attention near uniform on most words, or a score far below the test split's:
zoo/metrics/trust.py, calibrated per release) gets one line on stderr and `trust` in the JSON."""
from __future__ import annotations

import sys

from zoo.commands.common import (add_image_arguments, add_model_arguments, exit_code, expand_images, report_bad_files,
                                 resolve_model, unique_names)
from zoo.guards.errors import UserError, printable

DEFAULT_MODEL = "sat_soft_scenes"
CUT_MARK = "cut"  # plain-text output: the caption reached --max-len before its <end>


def add_arguments(parser) -> None:
    add_image_arguments(parser)
    add_model_arguments(parser, default_model=DEFAULT_MODEL)
    parser.add_argument("--beam-size", type=int, default=None,
                        help="beam width (1 = greedy; default: the model's own setting)")
    parser.add_argument("--max-len", type=int, default=None, help="longest caption in words")
    parser.add_argument("--batch-size", type=int, default=32, help="images captioned at once")
    parser.add_argument("--attention-dir", metavar="DIR",
                        help="write one attention overlay PNG per image here")
    parser.add_argument("--overwrite", action="store_true", help="replace overlays that exist already")
    parser.add_argument("--json", action="store_true",
                        help="print JSON with per-word alpha maps and beta gates")


def run(args) -> int:
    from zoo.guards.budget import check_flags
    from zoo.guards.writes import atomic_save_image, check_writable, json_text, output_in
    from zoo.preprocess import for_model, load_batch

    check_flags({"--beam-size": args.beam_size, "--max-len": args.max_len, "--batch-size": args.batch_size})
    args.images, notes = expand_images(args.images, args.recursive)
    attention_dir = args.attention_dir and check_writable(args.attention_dir, "--attention-dir",
                                                          directory=True)
    for name in unique_names(args.images, ".png") if attention_dir else ():  # every overlay, before any work
        output_in(attention_dir, name, "--attention-dir", args.overwrite)

    if not args.checkpoint and args.model is None:  # said only when the default was taken, not typed
        args.model = DEFAULT_MODEL
        print(f"zoo caption: model {DEFAULT_MODEL} (the default; --model NAME or --checkpoint PATH picks another)",
              file=sys.stderr)
    model = resolve_model(args, lambda card: card.output == "caption", "a captioner")
    if getattr(model, "embed", None) is None:
        raise UserError("the model has an empty vocabulary (it was never trained)")
    beam_size = args.beam_size or int(model.hparams.get("beam_size", 3))
    images, good, errors = load_batch(args.images, for_model(model), notes)
    names = unique_names(good, ".png")  # the readable images' overlays (numbered among themselves)
    for name in names if attention_dir else ():  # may refuse the command: before the bad files' lines
        output_in(attention_dir, name, "--attention-dir", args.overwrite)
    report_bad_files(errors, "caption", notes)

    results = []
    for start in range(0, len(good), args.batch_size):
        results += model.caption(images[start:start + args.batch_size], beam_size=beam_size, max_len=args.max_len)

    from zoo.metrics.trust import (SPREAD_UNIT, THRESHOLDS, caption_stats, distrust, load_thresholds, short_reasons,
                                   spread)

    thresholds = None if args.checkpoint else load_thresholds(args.model)
    trust = {}
    for path, result in zip(good, results):
        stats = caption_stats(result)
        if thresholds is None:
            trust[path] = {"trusted": None, **stats,
                           "reasons": ["no calibration for this model (only the releases in "
                                       f"{THRESHOLDS.name} have one)"]}
            continue
        reasons = distrust(stats, thresholds)
        trust[path] = {"trusted": not reasons, **stats, "reasons": reasons,
                       "calibration": {key: thresholds[key] for key in ("median_spread_max", "score_per_word_min")}
                       | {"split": thresholds["provenance"]["split"], "n": thresholds["provenance"]["n"]}}
        if reasons:
            print(f"zoo caption: {printable(path)}: do not trust this caption: {'; '.join(reasons)}", file=sys.stderr)

    overlays = {}
    if attention_dir and good:
        from zoo.viz.record import caption_figure

        for path, name, image, result in zip(good, names, images, results):
            target = attention_dir / name
            warnings = (["do not trust this caption:", *short_reasons(trust[path], thresholds)]
                        if trust[path]["trusted"] is False else [])
            atomic_save_image(caption_figure(image, result, warnings=warnings), target)
            overlays[path] = str(target)

    if args.json:
        records = []
        for path, result in zip(good, results):
            record = {"image": path, "caption": " ".join(result["words"]), "words": result["words"],
                      "beta": [round(float(b), 6) for b in result["beta"]],
                      "alpha": [[[round(float(v), 6) for v in row] for row in word] for word in result["alpha"].tolist()],
                      "grid": list(result["alpha"].shape[1:]) or None, "score": result["score"],
                      "finished": result["finished"], "trust": trust[path],
                      "spread": [round(float(v), 4) for v in spread(result["alpha"][:len(result["words"])])],
                      "spread_unit": SPREAD_UNIT}
            if "locations" in result:
                record["locations"] = result["locations"].tolist()
            if path in overlays:
                record["attention_png"] = overlays[path]
            records.append(record)
        print(json_text({"model": args.checkpoint or args.model, "beam_size": beam_size, "results": records,
                         "errors": errors}, indent=1))
    else:
        for path, result in zip(good, results):
            cut = "" if result["finished"] else f" [{CUT_MARK} at {len(result['words'])} words]"
            print(f"{printable(path)}\t{printable(' '.join(result['words']))}{cut}")
        if overlays:
            print(f"zoo caption: attention overlays in {attention_dir}/", file=sys.stderr)
    return exit_code(len(good), errors)
