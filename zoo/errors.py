"""One exception type for mistakes a user can fix, and the pieces every entry point (the `zoo`
command, train.py, eval.py, scripts) shares to report them: one line on stderr, exit code 2.
Anything else is a bug and keeps its traceback."""
from __future__ import annotations

import argparse
import sys
import warnings
from collections.abc import Callable


class UserError(Exception):
    """A mistake in the user's input (file, name, config, image), reported as one clear line."""


class OneLineParser(argparse.ArgumentParser):
    """argparse's usage errors as one line (`prog: error: ...`) and exit code 2, not a usage dump."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def one_line_warnings() -> None:
    """Show warnings as `Category: message`, one line each (not file:line plus source)."""
    warnings.formatwarning = lambda message, category, *args, **kwargs: f"{category.__name__}: {message}\n"


def report_user_errors(prog: str, main: Callable[[], int | None]) -> int:
    """Run `main`; a UserError becomes `prog: error: <message>` on stderr and exit code 2."""
    one_line_warnings()
    try:
        return int(main() or 0)
    except UserError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
