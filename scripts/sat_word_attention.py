"""Where a FashionScenes captioner looks, by kind of word: the analysis behind the README's
localisation discussion.

    python scripts/sat_word_attention.py (--checkpoint PATH | --model NAME) [--num-test 300] [--beam-size 3] [--out FILE.json]

It captions the first `--num-test` test scenes (free-running beam search, as eval.py does) and,
for every generated colour word and item word whose item is in the scene, reports:
- where the attention peak lands: on the item the word belongs to (`own`; for a colour word, the
  item named next), on another item (`other`), or on the background (`bg`);
- the attention mass inside the item's box(es), next to the share of cells those boxes cover
  (what uniform attention would put there);
- the attention's entropy in nats (uniform over the grid: log L);
- the gate beta_t the word was emitted with (0: the context is shut out, 1: fully let in).
Rows are split by the number of items in the scene. `own` on item words over all scenes is the
issue's localisation metric (up to the subset of scenes).
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zoo.data.scene_grammar import COLOUR_NAMES, HEAD_WORDS  # noqa: E402
from zoo.data.scenes import FashionScenesDataModule  # noqa: E402
from zoo.guards.errors import UserError  # noqa: E402
from zoo.guards.writes import check_output  # noqa: E402
from zoo.metrics.localization import cells_in_boxes  # noqa: E402
from zoo.results import write_json  # noqa: E402

KINDS = ("colour", "item")


def referent(words: list[str], t: int) -> str | None:
    """The item word a colour or item word at position t belongs to (a colour word: the next item word)."""
    if words[t] in HEAD_WORDS:
        return words[t]
    if words[t] in COLOUR_NAMES:
        return next((w for w in words[t + 1:] if w in HEAD_WORDS), None)
    return None


def analyse(model, dm, beam_size: int) -> tuple[dict, int]:
    """-> (table {"<kind>/<items in scene or all>": statistics}, grid cells L)."""
    rows: dict[tuple[str, int], dict[str, list]] = defaultdict(lambda: defaultdict(list))
    cells = 0
    for batch in dm.test_dataloader():
        for result, boxes, box_words in zip(model.caption(batch["images"], beam_size=beam_size),
                                            batch["boxes"], batch["box_words"]):
            alpha = result["alpha"].numpy()  # [T, h, w]
            _, h, w = alpha.shape
            cells = h * w
            in_box = cells_in_boxes(boxes, (h, w), tuple(batch["images"].shape[-2:]))  # [n, h, w]
            words = result["words"]
            for t, word in enumerate(words):
                kind = "item" if word in HEAD_WORDS else "colour" if word in COLOUR_NAMES else None
                ref = referent(words, t) if kind else None
                if ref is None or ref not in box_words:
                    continue
                own = np.array([label == ref for label in box_words])
                own_cells, other_cells = in_box[own].any(0), in_box[~own].any(0)
                peak = np.unravel_index(alpha[t].argmax(), (h, w))
                row = rows[(kind, len(box_words))]
                row["where"].append("own" if own_cells[peak] else "other" if other_cells[peak] else "bg")
                row["mass"].append(float(alpha[t][own_cells].sum()))
                row["area"].append(float(own_cells.mean()))
                p = alpha[t].ravel()
                row["entropy"].append(float(-(p * np.log(p + 1e-12)).sum()))
                row["beta"].append(float(result["beta"][t]))
    table = {}
    for kind in KINDS:
        for n_items in (1, 2, 3, "all"):
            keys = [(kind, n) for n in (1, 2, 3)] if n_items == "all" else [(kind, n_items)]
            merged = defaultdict(list)
            for key in keys:
                for name, values in rows.get(key, {}).items():
                    merged[name] += values
            if not merged:
                continue
            where = merged["where"]
            table[f"{kind}/{n_items}"] = {
                "words": len(where), **{f"peak_{x}": where.count(x) / len(where) for x in ("own", "other", "bg")},
                "mass_in_box": float(np.mean(merged["mass"])), "box_area": float(np.mean(merged["area"])),
                "entropy": float(np.mean(merged["entropy"])), "beta_median": float(np.median(merged["beta"]))}
    return table, cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--checkpoint")
    source.add_argument("--model")
    parser.add_argument("--num-test", type=int, default=300)
    parser.add_argument("--beam-size", type=int, default=3)
    parser.add_argument("--out", help="also write the table as JSON")
    parser.add_argument("--overwrite", action="store_true", help="replace the --out file if it exists")
    args = parser.parse_args()
    import zoo

    try:
        if args.out:
            check_output(args.out, "--out", args.overwrite)  # before any work, as every command's output
        model = zoo.load_checkpoint(args.checkpoint) if args.checkpoint else zoo.create_model(args.model, pretrained=True)
        if not hasattr(model, "caption"):
            raise UserError("this script analyses captioners; the model given is not one")
        # the scenes the model was trained for (its data config, as eval.py uses), cut to --num-test
        dm = zoo.build_datamodule(model, num_test=args.num_test)
        if not isinstance(dm, FashionScenesDataModule):
            raise UserError("this script needs a captioner trained on FashionScenes (its data config names "
                            f"{zoo.data_config(model)['class_path']})")
    except UserError as err:
        sys.exit(f"sat_word_attention: error: {err}")
    dm.prepare_data()
    dm.setup("test")
    model.eval()
    table, L = analyse(model, dm, args.beam_size)
    print(f"{'words':>12} {'n':>5} {'own':>6} {'other':>6} {'bg':>6} {'mass':>6} {'area':>6} "
          f"{'entropy':>8} {'beta':>6}   (uniform entropy {np.log(L):.2f})")
    for key, r in table.items():
        print(f"{key:>12} {r['words']:5d} {r['peak_own']:6.3f} {r['peak_other']:6.3f} {r['peak_bg']:6.3f} "
              f"{r['mass_in_box']:6.3f} {r['box_area']:6.3f} {r['entropy']:8.2f} {r['beta_median']:6.3f}")
    if args.out:
        write_json(args.out, {"analysis": "sat_word_attention", "source": args.checkpoint or args.model,
                              "num_test": args.num_test, "beam_size": args.beam_size, "grid_cells": L,
                              "table": table})
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
