"""Pieces every subcommand shares: choosing the model, reporting bad files, naming outputs, KEY=VALUE flags."""
from __future__ import annotations

import sys
from pathlib import Path

from zoo.guards.errors import UserError, printable, shorten


def add_model_arguments(parser, default_model: str | None = None) -> None:
    source = parser.add_mutually_exclusive_group(required=default_model is None)
    # no parser default: the command tells a typed name from the default it takes (caption's notice)
    source.add_argument("--model", default=None,
                        help="registered model name (pretrained weights are loaded)"
                             + (f"; default: {default_model}" if default_model else ""))
    source.add_argument("--checkpoint", help="a .ckpt or .safetensors file (path or URL) of this model family")
    parser.add_argument("--sha256", metavar="HASH",
                        help="pin --checkpoint: its sha256 (or first 8+ hex digits); a URL without a pin "
                             "is fetched with a warning")


def resolve_model(args, fits=lambda card: True, what: str = "a zoo model", **overrides):
    """The model of --checkpoint or the pretrained --model (with hyperparameter `overrides`), refused
    where its card does not `fits` (`what`)."""
    import zoo

    if args.sha256 and not args.checkpoint:
        raise UserError("--sha256 pins a --checkpoint; a --model release is pinned by its manifest")
    source = args.checkpoint or args.model
    model = (zoo.load_checkpoint(source, sha256=args.sha256, **overrides) if args.checkpoint
             else zoo.create_model(source, pretrained=True, **overrides))
    if not fits(model.card):
        raise UserError(f"{source} is a {model.family} model, not {what}")
    return model.eval()


def report_bad_files(errors: list[str], command: str, notes: list[str] = ()) -> None:
    """The bad files, one line each, and the notes on what was done to the good ones (stderr)."""
    for line in [*errors, *notes]:
        print(f"zoo {command}: {printable(line)}", file=sys.stderr)


def exit_code(n_good: int, errors: list[str]) -> int:
    """All bad -> 2 (user error); some bad -> 1; none bad -> 0."""
    return (1 if n_good else 2) if errors else 0


def unique_names(paths: list[str], suffix: str) -> list[str]:
    """`<stem><suffix>` per input path, numbered (`<stem>_2<suffix>`) where stems repeat."""
    names, used = [], set()
    for path in paths:
        stem = Path(path).stem or "image"
        name, k = f"{stem}{suffix}", 1
        while name in used:
            k += 1
            name = f"{stem}_{k}{suffix}"
        used.add(name)
        names.append(name)
    return names


def key_values(items: list[str], flag: str) -> dict:
    """`KEY=VALUE` items (YAML values) as a dict."""
    import yaml

    from zoo.guards.budget import check_tree

    parsed = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UserError(f"{flag} expects KEY=VALUE, got '{item}'")
        try:
            parsed[key] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise UserError(f"{flag} {shorten(item, 60)}: not a YAML value ({str(exc).splitlines()[0]})") from None
        except RecursionError:
            raise UserError(f"{flag} {shorten(item, 60)}: refused, nested too deep") from None
        check_tree(parsed[key], f"{flag} {shorten(item, 60)}")
    return parsed
