"""zoo list: registered models, with their released weights and metrics."""
from __future__ import annotations

import json


def add_arguments(parser) -> None:
    parser.add_argument("pattern", nargs="?", default="*", help="glob, e.g. 'ram_*'")
    parser.add_argument("--pretrained", action="store_true", help="only models with released weights")
    parser.add_argument("--json", action="store_true", help="print JSON with metadata")


def run(args) -> int:
    from zoo.registry import _entries, list_models

    names = list_models(args.pattern, pretrained=args.pretrained)
    entries = _entries()
    if args.json:
        print(json.dumps({n: {"pretrained": entries[n].weights is not None, **entries[n].metadata}
                          for n in names}, indent=2, default=str))
        return 0
    for n in names:
        e = entries[n]
        metrics = e.metadata.get("metrics") or {}
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in list(metrics.items())[:3])
        print(f"{n:32s} {'pretrained' if e.weights else '-':10s} {shown}")
    return 0
