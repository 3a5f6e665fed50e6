"""Pieces every subcommand shares: choosing the model, the images given (files and folders),
reporting bad files, naming outputs, KEY=VALUE flags."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from zoo.guards.errors import UserError, printable, shorten


def add_model_arguments(parser, default_model: str | None = None) -> None:
    source = parser.add_mutually_exclusive_group(required=default_model is None)
    # no parser default: the command tells a typed name from the default it takes (caption's notice)
    source.add_argument("--model", default=None,
                        help="registered model name (pretrained weights are loaded)"
                             + (f"; default: {default_model}" if default_model else ""))
    add_checkpoint_arguments(parser, source)


def add_checkpoint_arguments(parser, source) -> None:
    """`--checkpoint` (in the mutually exclusive group `source`) and its `--sha256` pin."""
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


FOLDERS_HELP = ", or folders of them (their image files, sorted by path)"


def add_image_arguments(parser, help: str = "image files (PNG, JPEG, ...)") -> None:
    """The images a command reads (files or folders: expand_images) and `--recursive`."""
    parser.add_argument("images", nargs="+", metavar="IMAGE", help=help + FOLDERS_HELP)
    add_recursive(parser)


def add_recursive(parser) -> None:
    parser.add_argument("--recursive", action="store_true",
                        help="a folder given: the images in its subfolders too (links to folders are not followed)")


def image_suffixes() -> set[str]:
    """The file suffixes of the formats PIL can open (lower case, with the dot)."""
    from PIL import Image

    return {suffix for suffix, kind in Image.registered_extensions().items() if kind in Image.OPEN}


def expand_images(given: list[str], recursive: bool) -> tuple[list[str], list[str]]:
    """(the image paths of `given`, notes): a file as it is (a bad one is reported when read), a folder
    as its image files sorted by path (`recursive`: those of its subfolders too). Files of a folder
    that are no image by their suffix are skipped, counted in one note (report_bad_files prints it,
    after what may refuse the command); a folder without an image is refused in one line (UserError)."""
    suffixes, paths, skipped = image_suffixes(), [], 0
    for item in given:
        folder = Path(item)
        if not folder.is_dir():
            paths.append(item)
            continue
        files = []
        for root, subfolders, names in os.walk(folder):  # links to folders are not followed: no loops
            files += [os.path.join(root, name) for name in names]
            if not recursive:
                break
        images = sorted(f for f in files if Path(f).suffix.lower() in suffixes)
        if not images:
            deeper = "" if recursive or not any(p.is_dir() for p in folder.iterdir()) else \
                "; --recursive reads its subfolders"
            raise UserError(f"{item}: no image files in this folder ({len(files)} other file(s){deeper})")
        skipped += len(files) - len(images)
        paths += images
    notes = [f"skipped {skipped} file(s) in the folder(s) given that are not images by their suffix"] * bool(skipped)
    return paths, notes


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
