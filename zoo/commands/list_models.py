"""zoo list: registered models, with their released weights and metrics."""
from __future__ import annotations

# the metrics `zoo list` shows first, when a release has them
HEADLINE = ("test/acc", "test/acc_mc10", "test/CIDEr", "test/Bleu_4", "test/localization", "test/nelbo", "test/item_acc")


def add_arguments(parser) -> None:
    parser.add_argument("pattern", nargs="?", default="*", help="glob, e.g. 'ram_*'")
    parser.add_argument("--pretrained", action="store_true", help="only models with released weights")
    parser.add_argument("--json", action="store_true", help="print JSON with metadata")


def run(args) -> int:
    import difflib

    from zoo.commands.info import description, stored_facts
    from zoo.guards.errors import UserError, printable
    from zoo.guards.text import number_text
    from zoo.guards.writes import json_text
    from zoo.registry import family_of, find_entries

    entries = find_entries(args.pattern, pretrained=args.pretrained)
    names = sorted(entries)
    if not names and args.pattern != "*":
        every = find_entries(pretrained=args.pretrained)
        close = difflib.get_close_matches(args.pattern, list(every), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else f" (`zoo list` shows all {len(every)})"
        raise UserError(f"no model matches '{args.pattern}'{hint}")
    if args.json:
        listing = {}
        for n in names:
            family_of(entries[n])
            facts = stored_facts(entries[n]) or {}  # the model index: no model is built here
            listing[n] = {"pretrained": entries[n].weights is not None, "description": description(entries[n]),
                          "num_params": facts.get("num_params"), **entries[n].metadata}
        print(json_text(listing, indent=2, default=str))
        return 0
    if names:
        print(f"{'name':32s} {'weights':10s} headline metrics of the release; where it looks (`zoo info NAME`)")
    for n in names:
        e = entries[n]
        metrics = e.metadata.get("metrics")
        metrics = metrics if isinstance(metrics, dict) else {}
        headline = [k for k in HEADLINE if k in metrics] or list(metrics)[:3]
        shown = ", ".join(f"{k}={number_text(metrics[k])}" for k in headline)  # a number only where it is one
        looks = attention_brief(((stored_facts(e) or {}) if e.weights else {}).get("attention"))
        print(printable(f"{n:32s} {'pretrained' if e.weights else '-':10s} {shown}{'; ' + looks if looks else ''}"))
    return 0


def attention_brief(scores: dict | None) -> str:
    """Whether a release's attention lands, from its stored attention scores (docs/attention.md):
    the pointing game beside the centre prior's, and the deletion gap (above 0: faithful)."""
    from zoo.guards.text import is_number

    if not isinstance(scores, dict) or not is_number(scores.get("pointing")) \
            or not is_number(scores.get("pointing_uniform", 0)) or scores.get("pointing_uniform", 0) >= 1:
        return ""  # none, or the target is the whole image (centred data): every map points at it
    centre = scores.get("pointing_centre")
    gap = scores.get("deletion_gap")
    return (f"pointing {100 * scores['pointing']:.1f}%" + (f" (centre prior {100 * centre:.1f}%)" if is_number(centre) else "")
            + (f", deletion gap {gap:+.3f}" if is_number(gap) else ""))
