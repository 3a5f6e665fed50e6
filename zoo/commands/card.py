"""zoo card: write a release as a Hugging Face hub repository (zoo/hf.py), ready for
`huggingface-cli upload ORG/NAME DIR`; `--checkpoint hf-hub:ORG/NAME` loads it back.

    zoo card ram_fmnist_centered --out cards/ram_fmnist_centered
    zoo card sat_soft_scenes --out cards/sat_soft_scenes --repo-id my-lab/sat_soft_scenes
"""
from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("name", help="a release (`zoo list --pretrained` shows them)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="folder for the card: new, empty, or an earlier card (replaced whole)")
    parser.add_argument("--repo-id", metavar="ORG/NAME",
                        help="the hub repository the card's usage lines name (default: attention-zoo/NAME)")


def run(args) -> int:
    from zoo.hf import check_card_target, write_card
    from zoo.info import check_known
    from zoo.io import check_writable

    check_known(args.name)  # an unknown name first: did-you-mean
    out = check_writable(args.out, "--out", directory=True)
    check_card_target(out)
    for path in write_card(args.name, out, args.repo_id):
        print(f"wrote {path}")
    return 0
