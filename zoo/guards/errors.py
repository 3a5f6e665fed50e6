"""One exception type for mistakes a user can fix, reported by every entry point as one line on stderr
and exit code 2 (anything else is a bug and keeps its traceback); `shorten` and `printable`."""
from __future__ import annotations

import argparse
import errno
import logging
import re
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class UserError(Exception):
    """A mistake in the user's input, reported as one clear line of at most MAX_LENGTH characters."""

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
    warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: print(
        f"{category.__name__}: {printable(message)}", file=file or sys.stderr)


#: Lightning's info lines that say nothing a user can act on: adverts, a Ctrl-C train.py reports
#: itself, the seed (config.yaml holds it), and a save's `weights_only` note (it reads like an unsafe load)
NOISE = ("💡", "Detected KeyboardInterrupt", "`weights_only` was not set", "Seed set to")


def quiet_lightning() -> None:
    """Drop Lightning's lines that are not ours to fix: NOISE, and two warnings of no use to a user."""
    warnings.filterwarnings("ignore", message=".*LeafSpec.*")
    warnings.filterwarnings("ignore", message=r"(?s)Be aware that when using `ckpt_path`, callbacks used to create")
    for name in ("lightning.pytorch", "pytorch_lightning", "lightning.pytorch.utilities.rank_zero",
                 "lightning.pytorch.trainer.connectors.checkpoint_connector",
                 "lightning.pytorch.trainer.connectors.logger_connector.logger_connector",
                 "lightning.pytorch.trainer.connectors.callback_connector", "lightning.pytorch.trainer.call",
                 "lightning.fabric.utilities.seed"):
        logging.getLogger(name).addFilter(lambda record: not any(part in str(record.msg) for part in NOISE))


# C0 and C1 control characters (ESC sequences, CR, BS), the Unicode line separators and bidi overrides
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """Text from a file made inert for a terminal: every control character as its escape (\\x1b, \\n)."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


#: errors of the machine or its folders (full, read-only, missing), which a user fixes: one line
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
    """Run `main`; a UserError (or the machine's OSError) becomes `prog: error: <message>`, exit code 2."""
    one_line_warnings()
    try:
        return int(main() or 0)
    except (UserError, OSError) as exc:
        message = str(exc) if isinstance(exc, UserError) else environment_error(exc)
        if message is None:
            raise
        print(f"{prog}: error: {printable(message)}", file=sys.stderr)
        return 2


# ----------------------------------------------------------------------------- stopping
#: exit codes of a stopped command, as a shell reports a process its signal ended (128 + the signal)
EXIT_SIGTERM, EXIT_CTRL_C = 128 + signal.SIGTERM, 128 + signal.SIGINT


class Stopped(SystemExit):
    """SIGTERM, raised where the process is, so `finally` blocks (writers' clean-ups) run; exit 143."""

    def __init__(self):
        super().__init__(EXIT_SIGTERM)


def _raise_stopped(signum, frame) -> None:
    # inside `fit`, Lightning's signal connector calls this too: there the run saves and stops itself
    if signal.getsignal(signal.SIGTERM) is _raise_stopped:
        raise Stopped()


@contextmanager
def sigterm_stops() -> Iterator[None]:
    """While a long write runs, SIGTERM raises `Stopped` even in a library caller, so temporaries go."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def report_stops(prog: str, main: Callable[[], int | None]) -> int:
    """Run an entry point's `main`, SIGTERM and Ctrl-C as one line and exit code 143 or 130."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        return int(main() or 0)
    except Stopped:
        print(f"{prog}: stopped by SIGTERM", file=sys.stderr)
        return EXIT_SIGTERM
    except KeyboardInterrupt:
        print(f"{prog}: stopped by Ctrl-C", file=sys.stderr)
        return EXIT_CTRL_C


#: characters of a file-provided value an error message quotes
QUOTE = 200


def shorten(value: Any, width: int = QUOTE) -> str:
    """A file-provided value as at most `width` characters for an error line."""
    scalar = (int, float, bool, type(None))
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        text = f"<an integer of {value.bit_length():,} bits>"  # Python refuses to format 4,300+ digits
    elif isinstance(value, (list, tuple)) and len(value) <= 16 and all(
            isinstance(v, scalar) and not (isinstance(v, int) and v.bit_length() > 1000) for v in value):
        text = repr(list(value))  # a shape, a size, a box: short, and worth showing
    elif isinstance(value, (list, tuple, dict)):
        text = f"<{type(value).__name__} of {len(value)}>"
    else:
        text = str(value) if isinstance(value, str) else repr(value) if isinstance(value, (int, float, bool)) \
            or value is None else f"<{type(value).__name__}>"
    return text if len(text) <= width else text[: width - 3] + "..."
