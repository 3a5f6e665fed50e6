"""Pieces every subcommand shares: choosing the model, checking its family, reporting bad files."""
from __future__ import annotations

import json
import sys

from zoo.errors import UserError


def add_model_arguments(parser, default_model: str | None = None) -> None:
    source = parser.add_mutually_exclusive_group(required=default_model is None)
    source.add_argument("--model", default=default_model,
                        help="registered model name (pretrained weights are loaded)")
    source.add_argument("--checkpoint", help="a .ckpt or .safetensors file of this model family")


def resolve_model(args, family: str | tuple[str, ...], what: str):
    """Load the model from --checkpoint or the pretrained --model, refusing other families.

    `what` names the command's need for the error line, e.g. "a captioner"."""
    import zoo

    families = (family,) if isinstance(family, str) else family
    if args.checkpoint:
        model = zoo.load_checkpoint(args.checkpoint)
        source = args.checkpoint
    else:
        model = zoo.create_model(args.model, pretrained=True)
        source = args.model
    if getattr(model, "family", None) not in families:
        raise UserError(f"{source} is a {getattr(model, 'family', type(model).__name__)} model, "
                        f"not {what}")
    return model.eval()


def report_bad_files(errors: list[str], command: str) -> None:
    for line in errors:
        print(f"zoo {command}: {line}", file=sys.stderr)


def print_records(records: list[dict], as_json: bool, line) -> None:
    """Print the per-image records as JSON, or one `line(record)` each."""
    if as_json:
        json.dump(records, sys.stdout, indent=2)
        print()
    else:
        for record in records:
            print(line(record))


def exit_code(n_good: int, errors: list[str]) -> int:
    """All bad -> 2 (user error); some bad -> 1; none bad -> 0."""
    if errors and n_good == 0:
        return 2
    return 1 if errors else 0
