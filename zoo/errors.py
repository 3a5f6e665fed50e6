"""One exception type for mistakes a user can fix, and the pieces every entry point (the `zoo`
command, train.py, eval.py, scripts) shares to report them: one line on stderr, exit code 2.
Anything else is a bug and keeps its traceback."""
from __future__ import annotations

import argparse
import errno
import logging
import re
import sys
import warnings
from collections.abc import Callable


class UserError(Exception):
    """A mistake in the user's input (file, name, config, image), reported as one clear line: a
    message that quotes a file (or a library quoting it) is cut at MAX_LENGTH characters."""

    MAX_LENGTH = 1000

    def __init__(self, message: object = "", *args):
        text = str(message)
        if len(text) > self.MAX_LENGTH:
            text = text[:self.MAX_LENGTH - 3] + "..."
        super().__init__(text, *args)


class OneLineParser(argparse.ArgumentParser):
    """argparse's usage errors as one line (`prog: error: ...`) and exit code 2, not a usage dump."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def one_line_warnings() -> None:
    """Show warnings as `Category: message`, one line each (not file:line plus source)."""
    warnings.formatwarning = lambda message, category, *args, **kwargs: f"{category.__name__}: {printable(message)}\n"
    # straight to stderr, also where a caller (a test harness) had been recording warnings
    warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: print(
        f"{category.__name__}: {printable(message)}", file=file or sys.stderr)


#: lines of Lightning's info log that are noise here: an advert for cloud products ("💡 Tip: ...
#: litlogger") at every start; a Ctrl-C that train.py reports in its own one line; the seed (the
#: run's config.yaml holds it); and, at every checkpoint save, "`weights_only` was not set,
#: defaulting to `False`", which is about what a SAVE keeps (the optimizer state, for resuming) but
#: reads like an unsafe load right under our promise that every load is weights_only=True
NOISE = ("💡", "Detected KeyboardInterrupt", "`weights_only` was not set", "Seed set to")


def _not_noise(record: logging.LogRecord) -> bool:
    return not any(part in str(record.msg) for part in NOISE)


def quiet_lightning() -> None:
    """Drop the lines of Lightning that are not ours to fix and say nothing to a user (training
    and evaluation alike): its adverts, and torch's LeafSpec deprecation inside Lightning 2.6."""
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    # validate/test/predict leave the checkpoint callback out on purpose: they write no checkpoints
    warnings.filterwarnings("ignore", message=r"(?s)Be aware that when using `ckpt_path`, callbacks used to create")
    for name in ("lightning.pytorch", "pytorch_lightning", "lightning.pytorch.utilities.rank_zero",
                 "lightning.pytorch.trainer.connectors.checkpoint_connector",
                 "lightning.pytorch.trainer.connectors.logger_connector.logger_connector",
                 "lightning.pytorch.trainer.connectors.callback_connector", "lightning.pytorch.trainer.call",
                 "lightning.fabric.utilities.seed"):
        logging.getLogger(name).addFilter(_not_noise)  # added once; it acts on its own logger's records only


# C0 and C1 control characters (ESC starts the sequences that recolour, move the cursor or retitle a
# terminal; CR and BS overwrite what was printed) and the Unicode line separators and bidirectional
# overrides that reorder what a reader sees
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """Text that came from a file (a class name, a word, a path) made inert for a terminal: every
    control character becomes its escape (\\x1b, \\n, \\u202e), so it is shown, not obeyed, and
    one line stays one line."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


#: errors of the machine or its folders (full, read-only, a file where a folder should be), which a
#: user fixes: one line naming the path, never a traceback
ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR,
                      errno.EISDIR, errno.EEXIST, errno.ENOENT, errno.ENAMETOOLONG, errno.ELOOP, errno.EMFILE,
                      errno.EIO, errno.EFBIG}


def environment_error(exc: BaseException) -> str | None:
    """'<path>: <reason>' for an OSError of the machine or its folders, else None (a bug)."""
    if not isinstance(exc, OSError) or exc.errno not in ENVIRONMENT_ERRNOS:
        return None
    where = exc.filename if exc.filename is not None else "a file"
    return f"cannot use {where}: {exc.strerror or exc}"


def report_user_errors(prog: str, main: Callable[[], int | None]) -> int:
    """Run `main`; a UserError (or the machine's OSError: a full disk, a read-only or missing
    folder) becomes `prog: error: <message>` on stderr, one line, and exit code 2."""
    one_line_warnings()
    try:
        return int(main() or 0)
    except (UserError, OSError) as exc:
        message = str(exc) if isinstance(exc, UserError) else environment_error(exc)
        if message is None:
            raise
        print(f"{prog}: error: {printable(message)}", file=sys.stderr)
        return 2
