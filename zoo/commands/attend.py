"""zoo attend: where any model looked, the same way for every family whose card names an attention
kind. Per image DIR/<name>_attend.png (the input and a panel per step, zoo/viz/record.py) and the
prediction; `--json` the attention record (`--maps` with the per-pixel maps), `--html FILE` one page
with a step slider, `--boxes FILE` scores of known targets per step (zoo/commands/boxes.py).
`--record KEY=VALUE` is an option of the family's `attention_record` (RAM's `policy`, ViT's `heads`).
Coordinates are the prepared image's pixels (`zoo.preprocessing(model)`); docs/attention.md says more.

    zoo attend --model ram_fmnist_cluttered60 canvas.png --out figures/ --record policy=sample
    zoo attend --model sat_soft_scenes scene.png --out out/ --html report.html --json
    zoo attend --model vit_fmnist shirt.png --out out/ --boxes boxes.json --record heads=true
"""
from __future__ import annotations

import sys

from zoo.commands.boxes import FRAME, read_boxes, summary, to_input
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

    from zoo.guards.writes import (atomic_save_image, atomic_write_bytes, check_output, check_writable, json_text,
                                   output_in)
    from zoo.metrics.attention import mass_in_box, pointing_game
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
    given = read_boxes(args.boxes, good, sizes) if args.boxes else {}
    targets = to_input(spec, given, good, sizes)
    names = unique_names(good, "_attend.png")  # the readable images' figures (numbered among themselves)
    for name in names:
        output_in(out_dir, name, "--out", args.overwrite)
    report_bad_files(errors, "attend", notes)  # after what may refuse the whole command
    if not good:
        return exit_code(0, errors)
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
            entry = {"image": path, "summary": prediction_text(record, i), "figure": str(figure),
                     "degenerate_steps": int(bad[i].sum()), **plain["images"][i]}
            if boxes is not None:
                entry["target_boxes"] = {"frame": f"{FRAME} {spec.resize!r}", "input": boxes.tolist(),
                                         "original": given[path].tolist()}
                steps = record.step_mask[i].nonzero().flatten()
                maps, each = record.maps[i, steps], boxes[None].expand(len(steps), -1, -1)
                hits, mass = pointing_game(maps, each), mass_in_box(maps, each)
                for k, step in enumerate(entry["steps"]):
                    step["pointing"], step["mass_in_box"] = bool(hits[k]), round(float(mass[k]), 4)
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
