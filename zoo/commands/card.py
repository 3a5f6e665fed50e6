"""zoo card: write a release as a Hugging Face hub repository (zoo/hf.py), ready for
`huggingface-cli upload ORG/NAME DIR`; `--checkpoint hf-hub:ORG/NAME` loads it back.

    zoo card ram_fmnist_centered --out cards/ram_fmnist_centered
    zoo card sat_soft_scenes --out cards/sat_soft_scenes --repo-id my-lab/sat_soft_scenes
"""
from __future__ import annotations


def add_arguments(parser) -> None:
    parser.add_argument("name", help="a release (`zoo list --pretrained` shows them)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="folder for the card: new, empty, or (with --overwrite) an earlier card (replaced whole)")
    parser.add_argument("--overwrite", action="store_true", help="replace an earlier card in --out")
    parser.add_argument("--repo-id", metavar="ORG/NAME",
                        help="the hub repository the card's usage lines name (default: attention-zoo/NAME)")


def run(args) -> int:
    from zoo.hf import write_card
    from zoo.info import check_known

    check_known(args.name)  # an unknown name first: did-you-mean
    out = check_output_folder(args.out, args.overwrite)
    for path in write_card(args.name, out, args.repo_id):
        print(f"wrote {path}")
    return 0


def check_output_folder(given: str, overwrite: bool):
    """The card's folder, checked before any work: a symlink is followed to the folder it names
    (the card replaces that folder, never the link), and an earlier card is replaced only with
    --overwrite."""
    import os
    from pathlib import Path

    from zoo.errors import UserError
    from zoo.hf import check_card_target
    from zoo.io import OVERWRITE_HINT, check_writable

    if Path(given).is_symlink() and not Path(given).exists():
        raise UserError(f"--out {given}: a symlink to {os.readlink(given)}, which does not exist; give a folder")
    out = check_writable(os.path.realpath(given), "--out", directory=True)
    check_card_target(out)  # someone's folder, or a card whose files changed, is refused whatever the flags
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise UserError(f"--out {given}: holds an earlier card; {OVERWRITE_HINT}")
    return out
