"""zoo info: what a registered model is, in one record (timm's `pretrained_cfg` and torchvision's
`Weights.meta` as one command): input size, channels, normalisation, resize and alpha rules,
classes or vocabulary, parameters, GMACs per image, file, sha256, recipe, seed, metrics with their
spread over seeds, attention scores. Reads the manifest, the recipe and the model index, never
torch (zoo/info.py).

    zoo info ram_fmnist_centered
    zoo info sat_soft_scenes --json
"""
from __future__ import annotations

import json


def add_arguments(parser) -> None:
    parser.add_argument("name", help="a registered model (`zoo list` shows them)")
    parser.add_argument("--json", action="store_true", help="print the record as JSON")


def run(args) -> int:
    from zoo.info import describe, render

    record = describe(args.name)
    print(json.dumps(record, indent=2) if args.json else render(record))
    return 0
