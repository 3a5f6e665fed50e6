"""Writing a user's file whole or not at all, and the one lock behind every temporary.

`atomic_write_bytes` / `atomic_save_image`, or `with writing(path) as tmp:` (write `tmp`, then
`os.replace(tmp, path)`) for anything else; `swap_in_folder` puts a finished set of files (an export,
a model card) in place at once. A temporary sits beside its target with a lock file its writer holds
(an flock); `sweep_stale` / `sweep_folder` remove only a dead writer's temporaries of the target being
written, never a file by its name's look or a pid. `held_lock`: one process at a time on a path;
`check_writable`: an unwritable target refused before any work; `json_text`: strict JSON (NaN as null).
"""
from __future__ import annotations

import fcntl
import json
import math
import os
import re
import shutil
import signal
import socket
import sys
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import Image

from zoo.guards.errors import UserError


def check_writable(path: str | os.PathLike, flag: str, directory: bool = False) -> Path:
    """Fail before any work when the file (with `directory`, the folder) `path` that a command will
    write, named `flag` in the message, cannot be written. Missing parents are fine (created on write)
    when the nearest existing one is writable: a file is really created (and removed) there, since
    permission bits say nothing to root, nor about read-only or pseudo file systems."""
    import tempfile

    path = Path(path)
    if path.exists() and path.is_dir() != directory:
        problem = "exists and is not a directory" if directory else "is a directory"
        raise UserError(f"{flag} {path}: {problem}")
    folder = path if directory else path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise UserError(f"{flag} {path}: {folder} is not a directory")
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".zoo-write-check-"):
            pass
    except OSError as exc:
        raise UserError(f"{flag} {path}: cannot write in {folder} ({exc.strerror or exc})") from None
    return path


# ----------------------------------------------------------------------------- what a command may write
# Every command treats an output file the same way: a file that exists is replaced only with
# --overwrite, and a symbolic link is neither written through nor replaced (a link in an output
# folder may lead anywhere; the zoo writes only where the user pointed it). The folder or file the
# user names may itself be a link: that is where the user points it. Below it, nothing is followed.
OVERWRITE_HINT = "--overwrite replaces it"


def _link_problem(path: Path) -> str:
    return f"is a symbolic link (to {os.readlink(path)}); the zoo writes through no link and replaces none"


def check_output(path: str | os.PathLike, flag: str, overwrite: bool = False) -> Path:
    """The file `path` a command writes (named `flag` in the message), checked before any work:
    writable (`check_writable`), not a symbolic link, and, unless `overwrite`, not there yet.
    One line (UserError) otherwise."""
    path = Path(path)
    if path.is_symlink():
        raise UserError(f"{flag} {path}: {_link_problem(path)}; give another name")
    check_writable(path, flag)
    if path.exists() and not overwrite:
        raise UserError(f"{flag} {path}: the file exists; {OVERWRITE_HINT}")
    return path


def output_in(root: str | os.PathLike, name: str, flag: str, overwrite: bool = False) -> Path:
    """The file `name` (plain names joined by "/") that a command writes inside its output folder
    `root` (named `flag`), checked before it is written: no folder on the way and not the file
    itself is a symbolic link (whatever links a folder holds, the zoo writes nothing outside
    `root`), the folders on the way are folders, and an existing file is replaced only with
    `overwrite`. One line (UserError) otherwise."""
    root, parts = Path(root), name.split("/")
    if not name or any(part in ("", ".", "..") for part in parts) or any("\0" in part for part in parts):
        raise ValueError(f"{name!r} is not a plain relative name")  # the caller builds names: a bug
    current = root
    for i, part in enumerate(parts):
        current = current / part
        where = f"{flag} {root}: {'/'.join(parts[:i + 1])}"
        if current.is_symlink():
            raise UserError(f"{where} {_link_problem(current)}; move it or give another {flag}")
        last = i == len(parts) - 1
        if current.exists() and current.is_dir() == last:
            raise UserError(f"{where} is {'a directory' if last else 'not a directory'}; move it or give another "
                            f"{flag}")
    if current.exists() and not overwrite:
        raise UserError(f"{flag} {root}: {name} exists; {OVERWRITE_HINT}")
    return current


# ----------------------------------------------------------------------------- writing whole things
# Everything written beside its target and renamed into place (a file, a checkpoint, a download, an
# export's staging folder) is named `.<target>.<token>.<kind>` (kind: tmp, part for downloads, old for
# a replaced set moved aside) and comes with `.<target>.<token>.lock`, a lock file that says "the zoo
# is writing <target>" and on which the writer holds an flock for the whole write. flock is the
# kernel's, one lock whatever PID namespace a process runs in, and Linux's NFS client turns it into a
# byte-range lock the server keeps for every client: so a sweeper proves a writer gone by taking its
# lock, never by asking whether a pid is alive (a pid means nothing in another container or on
# another machine). A sweep looks only at the temporaries of the one target being written, and
# removes them only when their lock file is the zoo's and free; a name that merely looks temporary,
# or an entry without its lock, is left alone.
TEMP_KINDS = ("tmp", "part", "old")
_LOCK_MARK = b"attention-zoo temporary\n"  # a lock file's first line: the zoo wrote it
_TOKEN = "[0-9a-f]{16}"


def companion(temp: Path, kind: str) -> Path:
    """The same writer's temporary of another kind (an export's `old` beside its staging `tmp`)."""
    return temp.with_name(f"{temp.name.rsplit('.', 1)[0]}.{kind}")


@contextmanager
def writing(path: str | os.PathLike, kind: str = "tmp") -> Iterator[Path]:
    """A temporary name beside `path` that this process owns while the block runs: write it, then
    rename it over `path`. Dead writers' temporaries of `path` are swept first; on the way out
    (finished, failed or SIGTERM'd) whatever is left under this writer's names is removed."""
    path = Path(path)
    if kind not in TEMP_KINDS:
        raise ValueError(f"kind {kind!r} is not one of {TEMP_KINDS}")
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.path.abspath(path.parent)  # see _LOCKED_AT_FIRST_WRITE
    if folder not in _LOCKED_AT_FIRST_WRITE:
        _LOCKED_AT_FIRST_WRITE[folder] = {target for target, _ in _locks(folder)}
    if path.name in _LOCKED_AT_FIRST_WRITE[folder]:
        _LOCKED_AT_FIRST_WRITE[folder].discard(path.name)
        sweep_stale(path)
    token = uuid.uuid4().hex[:16]
    lock = path.with_name(f".{path.name}.{token}.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # blocks only while a sweeper reads the still-empty file
        except OSError:
            pass  # a file system without locks: the write works, and no sweeper can prove it dead
        owner = {"host": socket.gethostname(), "pid": os.getpid(), "target": path.name}
        os.write(fd, _LOCK_MARK + json.dumps(owner).encode() + b"\n")
        yield path.with_name(f".{path.name}.{token}.{kind}")
    finally:
        try:
            _clean(path, token)
            os.unlink(lock)
        finally:
            os.close(fd)  # releases the lock, after the lock file is gone


def _clean(path: Path, token: str) -> list[Path]:
    """Remove one writer's temporaries of `path`; its `old` (the previous set, moved aside just
    before the writer stopped) goes back to `path` if nothing took its place."""
    old = path.with_name(f".{path.name}.{token}.old")
    if os.path.lexists(old) and not os.path.lexists(path):
        os.rename(old, path)
    removed = []
    for kind in TEMP_KINDS:
        entry = path.with_name(f".{path.name}.{token}.{kind}")
        if not os.path.lexists(entry):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def sweep_stale(path: str | os.PathLike) -> list[Path]:
    """Remove what killed writers of `path` left beside it (its temporaries whose lock file is the
    zoo's and free; each one's `old` goes back, as `_clean` says); returns what it removed."""
    path = Path(path)
    removed = []
    for token in [token for target, token in _locks(path.parent) if target == path.name]:
        lock = path.with_name(f".{path.name}.{token}.lock")
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:  # the writer's files go while we hold its lock, if the zoo wrote it and the writer is gone
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                same = os.path.samestat(os.fstat(fd), os.lstat(lock))  # not unlinked by a finishing writer
                dead = same and os.pread(fd, len(_LOCK_MARK), 0) == _LOCK_MARK
            except OSError:  # held (a live writer, in any namespace, on any machine), gone, or not lockable
                dead = False
            if dead:
                removed += _clean(path, token)
                lock.unlink(missing_ok=True)
                removed.append(lock)
        finally:
            os.close(fd)
    return removed


def _locks(directory: str | os.PathLike) -> list[tuple[str, str]]:
    """(target, writer's token) of each zoo lock file in `directory`."""
    lock = re.compile(rf"\.(.+)\.({_TOKEN})\.lock")
    try:
        return [m.groups() for e in os.scandir(directory) if (m := lock.fullmatch(e.name))]
    except OSError:
        return []


# Per folder this process writes in, the targets that had lock files when it first wrote there: a
# folder is listed once, not at every write (a figure folder of 10,000 images would be listed 10,000
# times). A writer that dies there later is swept by the next process that writes its target.
_LOCKED_AT_FIRST_WRITE: dict[str, set[str]] = {}


def sweep_folder(directory: str | os.PathLike) -> list[Path]:
    """`sweep_stale` for every target in `directory` that has a zoo lock file beside it: only for
    folders that hold nothing but what the zoo writes (the weights folder, under its release lock)."""
    targets = sorted({target for target, _ in _locks(directory)})
    return [entry for name in targets for entry in sweep_stale(Path(directory) / name)]


@contextmanager
def held_lock(path: str | os.PathLike, holder: str) -> Iterator[None]:
    """An exclusive flock on `path` (created, never removed) for the block: one process at a time,
    whatever its PID namespace or (over NFS) machine. Waits, saying once for whom (`holder`)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {holder} ({path})", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


@contextmanager
def sigterm_raises() -> Iterator[None]:
    """While a long write runs, SIGTERM raises SystemExit (exit code 143) instead of killing the
    process outright, so `writing` removes its temporaries on the way out."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written file."""
    with writing(path) as tmp:
        tmp.write_bytes(data)
        os.replace(tmp, path)


def atomic_save_image(img: Image.Image, path: str | os.PathLike, **save_kwargs) -> None:
    import io

    buffer = io.BytesIO()
    fmt = save_kwargs.pop("format", None) or Path(path).suffix.lstrip(".").upper().replace("JPG", "JPEG")
    img.save(buffer, format=fmt, **save_kwargs)
    atomic_write_bytes(path, buffer.getvalue())


# ----------------------------------------------------------------------------- strict JSON out
def finite(value):
    """`value` with every non-finite number (NaN, +-inf: a model's output, a diverged score) as None,
    since strict JSON (RFC 8259) has no NaN and strict parsers refuse the bare token."""
    if isinstance(value, (float, np.floating)):
        return float(value) if math.isfinite(value) else None
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def json_text(value, **dumps_kwargs) -> str:
    """Strict JSON of `value` (non-finite numbers as null): what every --json output prints."""
    return json.dumps(finite(value), allow_nan=False, **dumps_kwargs)


def swap_in_folder(staging: Path, target: Path, problem_of: Callable[[Path], str | None]) -> None:
    """Put the finished set `staging` (files that belong together: an export, a model card) at
    `target`: one atomic exchange of the two folders where the kernel offers it (Linux renameat2),
    else two renames (the old set stays whole under this writer's `old` name until the new one is
    in place; if we are killed between, the next sweep of `target` puts it back). SIGTERM waits
    until the set is in place. The set moved aside is removed only where `problem_of(folder)` finds
    nothing wrong with it (it is the kind of set we write, and nothing else is in it); otherwise it
    is kept beside `target`, with a warning."""
    if target.is_symlink():  # renames would move the link, and the old set's clean-up would follow it
        raise UserError(f"--out {target}: is a symbolic link; give the folder it names ({os.path.realpath(target)})")
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        previous = None  # where the old set is now, if any
        try:
            if not target.exists():
                os.rename(staging, target)
            elif _exchange(staging, target):
                previous = staging
            else:
                previous = companion(staging, "old")
                os.rename(target, previous)
                os.rename(staging, target)
        except OSError as exc:
            raise UserError(f"--out {target}: cannot put the new set in place "
                            f"({exc.strerror or exc})") from None
        if previous is not None:
            _remove_set(previous, target, problem_of)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _remove_set(folder: Path, target: Path, problem_of: Callable[[Path], str | None]) -> None:
    """Remove the earlier set (or empty folder) moved aside from `target`: its own files, then the
    folder. Anything else found in it (written there while we worked) is kept: the folder is
    renamed beside `target`, where no sweep removes it."""
    problem = problem_of(folder) if any(folder.iterdir()) else None
    if problem is None:
        for name in os.listdir(folder):
            (folder / name).unlink()
        folder.rmdir()
        return
    kept = target.with_name(f"{target.name}.previous-{uuid.uuid4().hex[:8]}")
    os.rename(folder, kept)
    warnings.warn(f"kept what was in {target} before as {kept}: it {problem}", UserWarning, stacklevel=3)


def _exchange(a: Path, b: Path) -> bool:
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0
