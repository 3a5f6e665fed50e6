"""Writing a user's file whole or not at all, and the one lock protocol (an flock) behind it:
`atomic_write_bytes` / `atomic_save_image`, or `with writing(path) as tmp:` (write `tmp`, then
`os.replace(tmp, path)`); `swap_in_folder` for a set of files; `sweep_stale` / `sweep_folder`;
`try_lock` / `lock_note` / `held_lock`; `check_writable`, `check_output`, `output_in` before any
work; `json_text`. Why: docs/design-notes.md, "Writes".
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
import uuid
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from PIL import Image

from zoo.guards.errors import UserError


def check_writable(path: str | os.PathLike, flag: str, directory: bool = False) -> Path:
    """Fail before any work when the file (with `directory`, the folder) `path`, named `flag`, cannot
    be written: a file is really created in the nearest existing folder (permission bits lie to root)."""
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
# An existing output is replaced only with --overwrite; a link below what the user names is never followed
OVERWRITE_HINT = "--overwrite replaces it"


def _link_problem(path: Path) -> str:
    return f"is a symbolic link (to {os.readlink(path)}); the zoo writes through no link and replaces none"


def check_output(path: str | os.PathLike, flag: str, overwrite: bool = False) -> Path:
    """The file `path` a command writes (`flag`): writable, no link, and there only with `overwrite`."""
    path = Path(path)
    if path.is_symlink():
        raise UserError(f"{flag} {path}: {_link_problem(path)}; give another name")
    check_writable(path, flag)
    if path.exists() and not overwrite:
        raise UserError(f"{flag} {path}: the file exists; {OVERWRITE_HINT}")
    return path


def output_folder(given: str | os.PathLike, flag: str = "--out") -> Path:
    """The folder a command replaces whole (an export, a card), a symlink followed; never a file."""
    given = Path(given)
    if given.is_symlink() and not given.exists():
        raise UserError(f"{flag} {given}: a symlink to {os.readlink(given)}, which does not exist; give a folder")
    target = Path(os.path.realpath(given))
    if target.exists() and not target.is_dir():
        raise UserError(f"{flag} {given}: exists and is not a directory")
    return target


def output_in(root: str | os.PathLike, name: str, flag: str, overwrite: bool = False) -> Path:
    """The file `name` ("/"-joined plain names) inside the output folder `root` (`flag`): no link on the
    way, folders that are folders, an existing file replaced only with `overwrite`."""
    root, parts = Path(root), name.split("/")
    if not name or any(part in ("", ".", "..") or "\0" in part for part in parts):
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
# A temporary `.<target>.<token>.<kind>` comes with `.<target>.<token>.lock`, flocked by its writer
# for the whole write: a sweeper proves the writer gone by taking that lock, never by a pid
TEMP_KINDS = ("tmp", "part", "old")
_LOCK_MARK = b"attention-zoo temporary\n"  # a lock file's first line: the zoo wrote it
_TOKEN = "[0-9a-f]{16}"


def companion(temp: Path, kind: str) -> Path:
    """The same writer's temporary of another kind (an export's `old` beside its staging `tmp`)."""
    return temp.with_name(f"{temp.name.rsplit('.', 1)[0]}.{kind}")


@contextmanager
def writing(path: str | os.PathLike, kind: str = "tmp") -> Iterator[Path]:
    """A temporary name beside `path`, this process's while the block runs: write it, then rename it
    over `path`. Dead writers' temporaries of `path` go first, this writer's leftovers on the way out."""
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
    """Remove one writer's temporaries of `path`; its `old` goes back to `path` if nothing took its place."""
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
    """Remove what killed writers of `path` left beside it (temporaries whose zoo lock file is free)."""
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


# per folder this process writes in, the targets with lock files at its first write there (listed once)
_LOCKED_AT_FIRST_WRITE: dict[str, set[str]] = {}


def sweep_folder(directory: str | os.PathLike) -> list[Path]:
    """`sweep_stale` for every target in `directory`, a folder of the zoo's own (the weights folder)."""
    targets = sorted({target for target, _ in _locks(directory)})
    return [entry for name in targets for entry in sweep_stale(Path(directory) / name)]


def try_lock(path: str | os.PathLike) -> int | None:
    """The exclusive flock on `path` (created, never removed; "<pid> on <host>" written in it) without
    waiting: its descriptor, held until closed; None while another process holds it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} on {socket.gethostname()}".encode(), 0)
    return fd


def lock_note(path: str | os.PathLike) -> str | None:
    """What the process holding the flock on `path` wrote there ("?": nothing), or None where none does."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return None
    except BlockingIOError:
        return os.pread(fd, 200, 0).decode(errors="replace").strip() or "?"
    except OSError:
        return None  # no locks on this file system: nothing to go by
    finally:
        os.close(fd)


@contextmanager
def held_lock(path: str | os.PathLike, holder: str) -> Iterator[None]:
    """`try_lock` for the block, else waiting for it after saying once for whom (`holder`)."""
    fd = try_lock(path)
    if fd is None:
        print(f"waiting for {holder} ({path})", file=sys.stderr, flush=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        yield
    finally:
        os.close(fd)


@contextmanager
def replacing(path: str | os.PathLike, kind: str = "tmp") -> Iterator[Path]:
    """`writing(path)`, and the temporary renamed over `path` when the block ends without an error."""
    with writing(path, kind) as tmp:
        yield tmp
        os.replace(tmp, path)


def discard(path: str | os.PathLike) -> None:
    """Remove a file this process wrote itself (a refused download, a link in its own cache), if there."""
    Path(path).unlink(missing_ok=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temporary file beside `path`, then rename: never a half-written file."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def share_file(source: str | os.PathLike, path: str | os.PathLike) -> bool:
    """Make `path` a hard link of `source` (same bytes, stored once), renamed over `path` so that it is
    never missing or half-made. A later atomic write of either name renames a new file over that name
    and leaves the other's bytes as they were. False, and `path` untouched, where the file system
    makes no hard links."""
    with writing(path) as tmp:
        try:
            os.link(source, tmp)
        except OSError:
            return False
        os.replace(tmp, path)
    return True


def atomic_save_image(img: Image.Image, path: str | os.PathLike, **save_kwargs) -> None:
    import io

    buffer = io.BytesIO()
    fmt = save_kwargs.pop("format", None) or Path(path).suffix.lstrip(".").upper().replace("JPG", "JPEG")
    img.save(buffer, format=fmt, **save_kwargs)
    atomic_write_bytes(path, buffer.getvalue())


# ----------------------------------------------------------------------------- strict JSON out
def finite(value):
    """`value` with every non-finite number as None: strict JSON (RFC 8259) has no NaN."""
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
    """Put the finished set `staging` at `target` (an atomic renameat2 exchange, else two renames); the
    old set is removed where `problem_of(folder)` is None, else kept beside `target` with a warning."""
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
    """Remove the earlier set moved aside from `target`, or, where `problem_of` objects, keep it beside."""
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
