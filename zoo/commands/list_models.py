"""zoo list: registered models, with their released weights and metrics."""
from __future__ import annotations

# the metrics `zoo list` shows first, when a release has them
HEADLINE = ("test/acc", "test/acc_mc10", "test/CIDEr", "test/Bleu_4", "test/localization", "test/nelbo")


def add_arguments(parser) -> None:
    parser.add_argument("pattern", nargs="?", default="*", help="glob, e.g. 'ram_*'")
    parser.add_argument("--pretrained", action="store_true", help="only models with released weights")
    parser.add_argument("--json", action="store_true", help="print JSON with metadata")


def run(args) -> int:
    import difflib

    from zoo.errors import UserError, printable
    from zoo.io import json_text
    from zoo.registry import family_of, find_entries

    entries = find_entries(args.pattern, pretrained=args.pretrained)
    names = sorted(entries)
    if not names and args.pattern != "*":
        every = find_entries(pretrained=args.pretrained)
        close = difflib.get_close_matches(args.pattern, list(every), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else f" (`zoo list` shows all {len(every)})"
        raise UserError(f"no model matches '{args.pattern}'{hint}")
    if args.json:
        for entry in entries.values():
            family_of(entry)
        print(json_text({n: {"pretrained": entries[n].weights is not None, **entries[n].metadata}
                         for n in names}, indent=2, default=str))
        return 0
    if names:
        print(f"{'name':32s} {'weights':10s} headline metrics of the release")
    for n in names:
        e = entries[n]
        metrics = e.metadata.get("metrics")
        metrics = metrics if isinstance(metrics, dict) else {}
        headline = [k for k in HEADLINE if k in metrics] or list(metrics)[:3]
        shown = ", ".join(f"{k}={metrics[k]:.4g}" if isinstance(metrics[k], float) else f"{k}={metrics[k]}"
                          for k in headline)
        print(printable(f"{n:32s} {'pretrained' if e.weights else '-':10s} {shown}"))
    return 0
