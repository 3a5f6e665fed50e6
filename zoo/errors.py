"""One exception type for mistakes a user can fix, and the pieces every entry point (the `zoo`
command, train.py, eval.py, scripts) shares to report them: one line on stderr, exit code 2.
Anything else is a bug and keeps its traceback."""
from __future__ import annotations

import argparse
import logging
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
    # straight to stderr, also where a caller (a test harness) had been recording warnings
    warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: print(
        f"{category.__name__}: {message}", file=file or sys.stderr)


class _NoAdverts(logging.Filter):
    """Lines of Lightning's info log that are noise here: an advert for cloud products ("💡 Tip:
    ... litlogger") at every start; a Ctrl-C that train.py reports in its own one line; the seed
    (the run's config.yaml holds it); and, at
    every checkpoint save, "`weights_only` was not set, defaulting to `False`", which is about
    what a SAVE keeps (the optimizer state, for resuming) but reads like an unsafe load right under
    our promise that every load is weights_only=True."""

    QUIET = ("💡", "Detected KeyboardInterrupt", "`weights_only` was not set", "Seed set to")

    def filter(self, record: logging.LogRecord) -> bool:
        message = str(record.msg)
        return not any(part in message for part in self.QUIET)


def quiet_lightning() -> None:
    """Drop the lines of Lightning that are not ours to fix and say nothing to a user (training
    and evaluation alike): its adverts, and torch's LeafSpec deprecation inside Lightning 2.6."""
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    for name in ("lightning.pytorch", "pytorch_lightning", "lightning.pytorch.utilities.rank_zero",
                 "lightning.pytorch.trainer.connectors.checkpoint_connector",
                 "lightning.pytorch.trainer.connectors.logger_connector.logger_connector",
                 "lightning.pytorch.trainer.connectors.callback_connector", "lightning.pytorch.trainer.call",
                 "lightning.fabric.utilities.seed"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoAdverts) for f in logger.filters):
            logger.addFilter(_NoAdverts())  # a filter acts on its own logger's records only


def report_user_errors(prog: str, main: Callable[[], int | None]) -> int:
    """Run `main`; a UserError becomes `prog: error: <message>` on stderr and exit code 2."""
    one_line_warnings()
    try:
        return int(main() or 0)
    except UserError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
