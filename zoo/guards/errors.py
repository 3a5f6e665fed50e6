"""One exception type for mistakes a user can fix, and what every entry point (the `zoo` command,
train.py, eval.py, scripts) shares to report them: one line on stderr, exit code 2. `shorten` and
`printable` make a file's text fit one inert line. Anything else is a bug and keeps its traceback."""
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


# ----------------------------------------------------------------------------- stopping
#: exit codes of a stopped command, as a shell reports a process its signal ended (128 + the signal)
EXIT_SIGTERM, EXIT_CTRL_C = 128 + signal.SIGTERM, 128 + signal.SIGINT


class Stopped(SystemExit):
    """SIGTERM, raised where the process is (a SystemExit: `finally` blocks, and with them every
    writer's clean-up of its temporaries, run on the way out); the entry point reports it in one
    line, exit code 143. Ctrl-C stays Python's KeyboardInterrupt."""

    def __init__(self):
        super().__init__(EXIT_SIGTERM)


def _raise_stopped(signum, frame) -> None:
    # During `fit`, Lightning's signal connector calls this among its own handlers (it keeps the
    # handler it found): there it saves last.ckpt where the run is and stops the run itself
    # (zoo.training.train reports it), so this handler acts only while it is the process's own.
    if signal.getsignal(signal.SIGTERM) is _raise_stopped:
        raise Stopped()


def stop_on_sigterm() -> None:
    """From now on, SIGTERM raises `Stopped` in the main thread (an entry point's first act)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _raise_stopped)


@contextmanager
def sigterm_stops() -> Iterator[None]:
    """While a long write runs (a download, a card), SIGTERM raises `Stopped` even where no entry
    point installed the handler (the zoo used as a library), so the writer's temporaries go."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def report_stops(prog: str, main: Callable[[], int | None]) -> int:
    """Run an entry point's `main` with SIGTERM and Ctrl-C, at any moment from its imports on, as
    one line on stderr and exit code 143 or 130 (a stop the command reported itself, as a training
    run does with the checkpoint it saved, passes through as its own exit)."""
    stop_on_sigterm()
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
    """A file-provided value as at most `width` characters for an error line (never formats a huge
    or shared structure in full)."""
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
