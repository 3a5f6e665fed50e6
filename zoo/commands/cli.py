"""The `zoo` command: dispatches to zoo/commands/<name>.py (`add_arguments(parser)`, `run(args) -> int`);
`zoo train` and `zoo eval` hand their arguments whole to zoo.training.train and zoo.commands.evaluate.
Exit codes: 0 success, 2 user error (one line on stderr), 1 a partly failed batch."""
from __future__ import annotations

import importlib
import os
import sys

from zoo.guards.budget import check_environment
from zoo.guards.errors import OneLineParser, report_stops, report_user_errors

SUBCOMMANDS = {
    "list": ("zoo.commands.list_models", "list registered models and released weights"),
    "caption": ("zoo.commands.caption", "caption images with a Show-Attend-Tell model"),
    "sample": ("zoo.commands.sample", "sample images (and canvas animations) from DRAW (inputs to try: zoo samples)"),
    "samples": ("zoo.commands.samples", "write example inputs per family: test images and their boxes, to try "
                "zoo attend / zoo caption on (not zoo sample, which draws from DRAW)"),
    "attend": ("zoo.commands.attend", "where any model looked: overlays, JSON and an HTML report"),
    "export": ("zoo.commands.export", "export a model as ONNX or a torch.export program"),
    "info": ("zoo.commands.info", "what a model is: input, classes, parameters, GMACs, file, metrics (no torch)"),
    "card": ("zoo.commands.card",
             "write a release or a checkpoint as a Hugging Face hub repository (README, config, weights)"),
}
#: commands that parse their own arguments: name -> (module with main(argv, prog), help)
PASSTHROUGH = {
    "train": ("zoo.training.train", "train from a recipe (LightningCLI: zoo train fit --config RECIPE; fit --help)"),
    "eval": ("zoo.commands.evaluate", "evaluate a checkpoint or a released model on a split, as JSON"),
}


def build_parser(command: str | None = None) -> OneLineParser:
    """The parser, importing only `command`'s module (None: every command's)."""
    parser = OneLineParser(prog="zoo", description="attention-zoo: visual attention models")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    sub.required = True
    for name, (module_path, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if command is None or name == command:
            module = importlib.import_module(module_path)
            module.add_arguments(p)
            p.set_defaults(_run=module.run)
    for name, (_, help_text) in PASSTHROUGH.items():  # listed in --help; main() runs them
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    known = argv[0] if argv and argv[0] in (*SUBCOMMANDS, *PASSTHROUGH) else None
    return report_stops(f"zoo {known}" if known else "zoo", lambda: _main(argv))


def _main(argv: list[str]) -> int:
    if argv and argv[0] in PASSTHROUGH:
        return passthrough(argv[0], argv[1:], f"zoo {argv[0]}")
    parser = build_parser(next((a for a in argv if not a.startswith("-")), None) or "")
    if not argv:
        parser.error(f"give a command: {', '.join([*SUBCOMMANDS, *PASSTHROUGH])}")
    args = parser.parse_args(argv)
    try:
        return report_user_errors(f"zoo {args.command}", lambda: check_environment() or args._run(args))
    except BrokenPipeError:  # `zoo list | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
        return 141


def passthrough(command: str, argv: list[str], prog: str) -> int:
    """`zoo train` / `zoo eval`: the environment checked before the command's module is imported."""
    code = report_user_errors(prog, lambda: check_environment(logging=command == "train"))
    if code:
        return code
    module = importlib.import_module(PASSTHROUGH[command][0])
    return module.main(argv, prog=prog) or 0


def script(command: str, prog: str) -> int:
    """The clone's `python train.py` / `python eval.py`: `zoo train` / `zoo eval` named `prog`."""
    return report_stops(prog, lambda: passthrough(command, sys.argv[1:], prog))


if __name__ == "__main__":
    sys.exit(main())
