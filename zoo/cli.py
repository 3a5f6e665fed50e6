"""The `zoo` command. Each subcommand lives in zoo/commands/<name>.py with
`add_arguments(parser)` and `run(args) -> int`; this file only dispatches.

Exit codes: 0 success, 2 user error (one line on stderr), 1 a partly failed batch."""
from __future__ import annotations

import argparse
import importlib
import sys

from zoo.errors import UserError

SUBCOMMANDS = {
    "list": ("zoo.commands.list_models", "list registered models and released weights"),
    "caption": ("zoo.commands.caption", "caption images with a Show-Attend-Tell model"),
    "glimpses": ("zoo.commands.glimpses", "draw a RAM model's glimpse trajectories"),
    "sample": ("zoo.commands.sample", "sample images (and canvas animations) from DRAW"),
    "attention": ("zoo.commands.attention", "ViT attention maps and rollout"),
}


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's usage errors: one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="zoo", description="attention-zoo: visual attention models")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name, (module_path, help_text) in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_path)
        except ModuleNotFoundError as exc:
            if exc.name == module_path:
                continue  # subcommand not built yet
            raise
        p = sub.add_parser(name, help=help_text, description=help_text)
        module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args._run(args) or 0)
    except UserError as exc:
        print(f"zoo {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
