"""zoo attend: where any model looked, the same way for every family whose card names an attention
kind. Per image DIR/<name>_attend.png (the input and a panel per step, zoo/viz/record.py) and the
prediction; `--json` the attention record (`--maps` with the per-pixel maps), `--html FILE` one page
with a step slider, `--boxes FILE` scores of known targets per step (zoo/commands/boxes.py; a caption's
item words only, each on its own item's boxes, as the localisation metric scores them). Every step's
spread, exp(H)/N (zoo/metrics/trust.py), is in the JSON and under its panel.
`--record KEY=VALUE` is an option of the family's `attention_record` (RAM's `policy`, ViT's `heads`).
Coordinates are the prepared image's pixels (`zoo.preprocessing(model)`); docs/attention.md says more.

    zoo attend --model ram_fmnist_cluttered60 canvas.png --out figures/ --record policy=sample
    zoo attend --model sat_soft_scenes scene.png --out out/ --html report.html --json
    zoo attend --model vit_fmnist shirt.png --out out/ --boxes boxes.json --record heads=true
"""
from __future__ import annotations

import sys

from zoo.commands.boxes import FRAME, item_steps, read_boxes, summary, to_input
from zoo.commands.common import (add_image_arguments, add_model_arguments, exit_code, expand_images, key_values,
                                 report_bad_files, resolve_model, unique_names)
from zoo.guards.errors import UserError, printable

CHUNK = 64  # images per forward pass


def add_arguments(parser) -> None:
    add_image_arguments(parser, help="image files (any size, colour or gray)")
    add_model_arguments(parser)
    parser.add_argument("--out", required=True, metavar="DIR", help="directory for the figures")
    parser.add_argument("--json", action="store_true", help="print the attention records as JSON")
    parser.add_argument("--maps", action="store_true", help="with --json: include the per-pixel maps")
    parser.add_argument("--html", metavar="FILE", help="write a self-contained HTML report here")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace figures (and the --html file) that exist already")
    parser.add_argument("--boxes", metavar="FILE",
                        help="JSON {image: [[x0, y0, x1, y1], ...] or {\"boxes\": [...]}} of known targets in the "
                             "original image's pixels (a scene export's references.json as it is); keys are paths "
                             "or basenames; mapped to the model input's pixels by its resize rule, the record's frame")
    parser.add_argument("--record", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the family's attention record, e.g. policy=sample (RAM), heads=true (ViT)")


def run(args) -> int:
    import inspect

    import torch

    from zoo.guards.writes import (atomic_save_image, atomic_write_bytes, check_output, check_writable, json_text,
                                   output_in)
    from zoo.metrics.attention import mass_in_box, pointing_game
    from zoo.metrics.trust import SPREAD_UNIT, spread
    from zoo.preprocess import for_model, load_batch
    from zoo.viz.record import html_report, prediction_text, strip

    args.images, notes = expand_images(args.images, args.recursive)
    out_dir = check_writable(args.out, "--out", directory=True)
    if args.html:
        check_output(args.html, "--html", args.overwrite)
    for name in unique_names(args.images, "_attend.png"):  # every figure, before any work
        output_in(out_dir, name, "--out", args.overwrite)
    if args.maps and not args.json:
        raise UserError("--maps goes with --json")
    options = key_values(args.record, "--record")
    model = resolve_model(args)
    model.check_attends()
    takes = [p for p in inspect.signature(model.attention_record).parameters if p != "images"]
    unknown = sorted(set(options) - set(takes))
    if unknown:
        raise UserError(f"--record {unknown[0]}: {type(model).__name__}'s attention record takes "
                        f"{', '.join(takes) or 'no options'}")
    spec, sizes = for_model(model), []
    batch, good, errors = load_batch(args.images, spec, notes, sizes)
    box_words: dict[str, list[str]] = {}
    given = read_boxes(args.boxes, good, sizes, box_words) if args.boxes else {}
    targets = to_input(spec, given, good, sizes, box_words)
    names = unique_names(good, "_attend.png")  # the readable images' figures (numbered among themselves)
    for name in names:
        output_in(out_dir, name, "--out", args.overwrite)
    report_bad_files(errors, "attend", notes)  # after what may refuse the whole command
    if not good:
        return exit_code(0, errors)
    # a caption is scored on the words that name items (the localisation metric's definition, the
    # documented pointing of a captioner): each on its own item's boxes where the file gives
    # box_words (a scene export's references.json), else on every box of its image
    vocab = {w for words in box_words.values() for w in words}
    source = ("the scene grammar's item words, each on the boxes its box_words name" if vocab
              else "the scene grammar's item words, on every box (the file gives no box_words)")
    if targets:
        from zoo.data.scene_grammar import HEAD_WORDS

        vocab |= set(HEAD_WORDS)
    records, pages = [], []  # pages: each chunk's record, for the report
    for start in range(0, len(good), CHUNK):
        images = batch[start:start + CHUNK]
        try:
            record = model.attention_record(images, **options)
        except ValueError as exc:  # an option's value the family refuses
            raise UserError(f"--record: {exc}") from None
        pages.append(record)
        plain = record.as_dict(maps=args.maps)
        bad = record.degenerate()
        for i in range(images.shape[0]):
            path, name = good[start + i], names[start + i]
            boxes = targets.get(path)
            figure = out_dir / name
            atomic_save_image(strip(record, i, images[i], boxes), figure)
            maps = record.maps[i, record.step_mask[i].nonzero().flatten()]
            entry = {"image": path, "summary": prediction_text(record, i), "figure": str(figure),
                     "degenerate_steps": int(bad[i].sum()), "spread_unit": SPREAD_UNIT, **plain["images"][i]}
            for step, value in zip(entry["steps"], spread(maps).tolist()):
                step["spread"] = round(value, 4)
            if boxes is not None:
                entry["target_boxes"] = {"frame": f"{FRAME} {spec.resize!r}", "input": boxes.tolist(),
                                         "original": given[path].tolist()}
                each: list = [boxes] * len(entry["steps"])
                if "words" in record.prediction:  # a caption: its item words, each on its own item
                    each, kinds = item_steps([s["label"] for s in entry["steps"]], boxes, box_words.get(path), vocab)
                    entry["target_boxes"]["words"] = box_words.get(path)
                    entry["item_words"] = {"source": source, **{kind: [s["label"] for s, k in zip(entry["steps"], kinds)
                                                                       if k == kind] for kind in ("item", "absent", "other")}}
                scored = [k for k, b in enumerate(each) if b is not None]
                for step in entry["steps"]:
                    step["pointing"] = step["mass_in_box"] = None
                if scored:
                    chosen = torch.stack([each[k] for k in scored])
                    hits, mass = pointing_game(maps[scored], chosen), mass_in_box(maps[scored], chosen)
                    for j, k in enumerate(scored):
                        entry["steps"][k]["pointing"] = bool(hits[j])
                        entry["steps"][k]["mass_in_box"] = round(float(mass[j]), 4)
            records.append(entry)
    if args.html:
        from zoo.attention.record import concatenate

        record = concatenate(pages)
        metrics = [[{"step": s["label"], "pointing": s.get("pointing"), "mass in box": s.get("mass_in_box")}
                    for s in r["steps"]] if r["image"] in targets else None for r in records]
        boxes = [targets.get(p) for p in good]
        page = html_report(record, batch, good, f"zoo attend: {args.model or args.checkpoint}", metrics, boxes)
        atomic_write_bytes(args.html, page.encode())
    for entry in records:
        if entry["degenerate_steps"]:
            print(f"zoo attend: {printable(entry['image'])}: {entry['degenerate_steps']} step(s) have a degenerate map "
                  "(all zero or NaN); drawn grey, not as attention", file=sys.stderr)
    if args.json:  # strict JSON: non-finite numbers as null
        print(json_text(records, indent=2))
    else:
        for entry in records:
            print(printable(f"{entry['image']}: {entry['summary']} -> {entry['figure']}"))
    for line in summary(records, len(good)) if args.boxes else ():
        print(f"zoo attend: {line}", file=sys.stderr if args.json else sys.stdout)
    return exit_code(len(good), errors)
