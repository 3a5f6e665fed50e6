"""zoo info: what a registered model is, in one record read without torch (zoo/info.py says what
it holds and where each fact comes from).

    zoo info ram_fmnist_centered
    zoo info sat_soft_scenes --json
"""
from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("name", help="a registered model (`zoo list` shows them)")
    parser.add_argument("--json", action="store_true", help="print the record as JSON")


def run(args) -> int:
    from zoo.info import describe, render
    from zoo.io import json_text

    record = describe(args.name)
    # JSON escapes every control character (and a file's NaN is null); the text escapes them too
    print(json_text(record, indent=2, default=str) if args.json else render(record))
    return 0
