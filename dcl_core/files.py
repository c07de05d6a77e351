"""Files the project creates in an output folder, opened without following symbolic links.

A link planted where a lock, config, metrics, journal or summary file goes (``ln -s ~/precious.txt
outputs/.temperature_sweep.lock``) is refused with one line, never followed: nothing outside the folder is
created, truncated or appended to through it. Whole files are written to a fresh temporary name (``O_EXCL``,
so never through an existing name or link) and renamed over the target; ``rename`` replaces a link itself, not
what it points to. Nothing the project writes ever replaces a device, a FIFO or a socket (``-o /dev/null`` would
otherwise turn the device into a file), and a file it reads from a folder a user can plant things in is read with
:func:`read_bounded`: a regular file only, its size checked before reading. Pure standard library, for every layer.
"""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, BinaryIO

from dcl_core.config import ConfigError, RunFailedError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
# How a full disk reads when the OSError is not at hand: pyarrow's and SQLite's own messages
_FULL_TEXT = re.compile(r"\[errno (28|122|27)\]|No space left on device|Disk quota exceeded|database or disk is full",
                        re.IGNORECASE)


class DiskFullError(RunFailedError):
    """A write failed because the disk (or the quota) is full: exit code 1 and one line saying so."""


def no_space(err: BaseException | str | None) -> bool:
    """Whether ``err`` (or an exception it was raised from, or its text) is a full disk or quota."""
    seen: set[int] = set()
    while isinstance(err, BaseException) and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError) and err.errno in _FULL:
            return True
        if _FULL_TEXT.search(str(err)):
            return True
        err = err.__cause__ or err.__context__
    return isinstance(err, str) and bool(_FULL_TEXT.search(err))


def disk_full(where: Path | str, resume: bool = False, then: str = "") -> DiskFullError:
    """The one line for a full disk under ``where``; ``resume``: a study that stopped and can go on; ``then``: what
    to do once space is freed, where it is something else (``, then run ...``)."""
    then = then or (", then run the same command with --resume (finished trials are kept)" if resume else "")
    return DiskFullError(f"no space left on the device holding {where}: free some space{then}")


class UnsafePathError(ConfigError):
    """A path the project would write is a symbolic link, a folder, a device, a FIFO or a socket: refused (one
    line, exit code 2)."""


def _node_kind(mode: int) -> str | None:
    """What a file of ``mode`` (``st_mode``) is when it is a node no output may replace, else None."""
    kinds = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
             (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), None)


def file_kind(path: Path | str) -> str:
    """What is at ``path`` itself, never followed or opened: "a regular file", "a symbolic link", "a folder", "a
    FIFO", "a character device", "a block device", "a socket", or "nothing"."""
    try:
        return _described(os.lstat(path).st_mode)
    except OSError:
        return "nothing"


def _described(mode: int) -> str:
    """A file of ``mode`` (``st_mode``) in words (:func:`file_kind`)."""
    if stat.S_ISREG(mode):
        return "a regular file"
    return ("a symbolic link" if stat.S_ISLNK(mode) else "a folder" if stat.S_ISDIR(mode)
            else _node_kind(mode) or "not a file")


def check_replaceable(path: Path | str) -> Path:
    """``path``, where a command will write a whole file later (:func:`write_with`: a link there is replaced, never
    followed), checked before the work that makes the file: UnsafePathError (one line) for a folder, a device, a
    FIFO or a socket there, which the write would refuse only after all that work."""
    _refuse_node(path)
    return Path(path)


def _refuse_node(path: Path | str, doing: str = "replace it") -> None:
    """UnsafePathError when ``path`` is a folder, a device, a FIFO or a socket (a link or a regular file passes)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError:  # nothing there (or a file where a folder belongs: what then writes says so)
        return
    if stat.S_ISDIR(mode):
        raise UnsafePathError(f"{path} is a folder where a file belongs: remove or rename it")
    kind = _node_kind(mode)
    if kind is not None:
        raise UnsafePathError(f"{path} is {kind}, not a regular file: refusing to {doing} (name a regular file "
                              "or a new path)")


def open_fd(path: Path | str, flags: int, mode: int = 0o666) -> int:
    """``os.open`` of a regular file that never follows a link at ``path`` (UnsafePathError), never opens a device,
    a FIFO or a socket there (UnsafePathError: a write would reach the device, an open of a FIFO blocks) and says
    plainly when ``path`` is a folder; other OSErrors (a full disk, permissions) propagate."""
    _refuse_node(path, "write to it")
    try:
        fd = os.open(path, flags | _NOFOLLOW | _CLOEXEC | _NONBLOCK, mode)  # a FIFO put there since: never blocks
    except OSError as err:
        if err.errno == errno.ELOOP or os.path.islink(path):
            raise UnsafePathError(f"{path} is a symbolic link: refusing to write through it (remove the link; "
                                  "the project writes only regular files inside its output folder)") from None
        if err.errno == errno.EISDIR or (err.errno in (errno.EACCES, errno.EPERM) and os.path.isdir(path)):
            raise UnsafePathError(f"{path} is a folder where a file belongs: remove or rename it") from None
        if err.errno == errno.ENXIO:  # a FIFO without a reader, opened to write
            _refuse_node(path, "write to it")
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        _refuse_node(path, "write to it")
        raise UnsafePathError(f"{path} is not a regular file: refusing to write to it")
    if not flags & _NONBLOCK:
        os.set_blocking(fd, True)
    return fd


def check_output_file(path: Path | str) -> Path:
    """``path``, a file a user named for a command's output (``-o FILE``), checked before any work is done: a new
    path or an existing regular file. A symbolic link there is refused, neither followed nor replaced (either
    would surprise: name the file itself), as are a folder, a device, a FIFO and a socket (UnsafePathError). The
    folder it goes in is created and must take a new file, under a name short enough for the temporary file it is
    written through: ConfigError (one line) when it cannot, DiskFullError when its disk is full."""
    path = Path(path)
    if os.path.islink(path):
        raise UnsafePathError(f"{path} is a symbolic link: refusing to write through it or replace it (name the "
                              "file itself, or a new path)")
    _refuse_node(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
        name_max = os.pathconf(path.parent, "PC_NAME_MAX")  # -1: no limit
    except OSError as err:
        if no_space(err):
            raise disk_full(path.parent) from None
        why = err.strerror or err
        raise ConfigError(f"cannot write {path}: no file can be made in {path.parent} ({why})") from None
    over = len(os.fsencode(_temporary_name(path.name))) - name_max
    if name_max > 0 and over > 0:  # its temporary sibling, written first, is the longer name
        raise ConfigError(f"cannot write {path}: its name is {over} bytes longer than its folder's filesystem allows "
                          "for the temporary file it is written through; name a shorter file")
    return path


def _temporary_name(name: str) -> str:
    """The name of the temporary file :func:`write_with` writes ``name`` through (the longest it makes)."""
    return f".{name}.{secrets.token_hex(6)}.tmp"


def write_with(path: Path | str, write: Callable[[BinaryIO], object], mode: int = 0o666) -> Path:
    """Write ``path`` atomically without following links: ``write`` fills a fresh temporary file in the same
    folder (``O_EXCL``, binary), which is then renamed over ``path``. A full disk or a crash leaves the previous
    file, never half of one; a link at ``path`` is replaced, never written through; a folder, a device, a FIFO or
    a socket at ``path`` is refused (UnsafePathError), also one that appears there while ``write`` runs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _refuse_node(path)
    tmp = path.with_name(_temporary_name(path.name))
    fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        _refuse_node(path)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_files(files: Mapping[Path, bytes], mode: int = 0o666) -> None:
    """Write several whole files as one (path -> bytes): each to a fresh temporary name beside it first, as
    :func:`write_with` does, and only then all renamed into place, so a write that fails part-way (a full disk)
    leaves every previous file as it was, never a new file beside an old one. A link at a name is replaced, never
    written through; a folder, a device, a FIFO or a socket there is refused (UnsafePathError)."""
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in files.items():
            path = Path(path)
            path.parent.mkdir(parents=True, exist_ok=True)
            _refuse_node(path)
            tmp = path.with_name(_temporary_name(path.name))
            fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            staged.append((tmp, path))
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        for tmp, path in staged:
            _refuse_node(path)
            os.replace(tmp, path)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)


def write_text(path: Path | str, text: str, mode: int = 0o666) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically without following links (:func:`write_with`)."""
    return write_with(path, lambda f: f.write(text.encode()), mode)


def is_regular_file(path: Path | str) -> bool:
    """Whether ``path`` is a regular file itself, not a link to one (``Path.is_file`` follows links)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read_bounded(path: Path | str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, never more than ``max_bytes``. Refused in one line (ConfigError)
    before anything is read: a missing path, a symbolic link (not followed), a folder, a device, a FIFO or a
    socket (a FIFO's open never blocks), a file larger than ``max_bytes``, also one that grows past it while
    read."""
    path = Path(path)
    try:
        mode = os.lstat(path).st_mode  # look before opening: opening some devices acts (a tape rewinds)
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | _NOFOLLOW | _CLOEXEC) if stat.S_ISREG(mode) else -1
    except OSError as err:
        if err.errno == errno.ELOOP:
            mode = stat.S_IFLNK
        else:
            raise ConfigError(f"cannot read {path}: {err.strerror or err}") from None
    if fd < 0 or not stat.S_ISREG(mode := os.fstat(fd).st_mode):
        if fd >= 0:
            os.close(fd)
        raise ConfigError(f"{path} is {_described(mode)}, not a regular file: not read")
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(fd).st_size
        data = f.read(size + 1) if size <= max_bytes else b""  # not max_bytes + 1: read allocates what it is asked
        if len(data) > size:  # it grew since: the rest, still bounded
            data += f.read(max_bytes + 1 - len(data))
    if size > max_bytes or len(data) > max_bytes:
        raise ConfigError(f"{path} holds more than {max_bytes:,} bytes ({max(size, len(data)):,}), more than such a "
                          "file ever holds: not read")
    return data


def real_path(path: Path | str) -> Path:
    """``path`` with ``~`` expanded, absolute, its links followed (:meth:`Path.resolve`); ConfigError (one line)
    where its links lead into a loop (``resolve``'s RuntimeError; an OSError from Python 3.13), where a name in it
    is longer than its filesystem allows, or where a folder on the way cannot be entered."""
    try:
        resolved = Path(path).expanduser().resolve()
    except (RuntimeError, OSError):
        raise ConfigError(f"{path}: its symbolic links lead into a loop: not followed") from None
    try:
        resolved.exists()  # False where it is missing; raises for what no later step would survive either
    except OSError as err:
        why = "a name in it is longer than its filesystem allows" if err.errno == errno.ENAMETOOLONG else \
            err.strerror or str(err)
        raise ConfigError(f"{path}: {why}") from None
    return resolved


def loads_json(text: str | bytes) -> Any:
    """``json.loads`` for text that comes from outside (a file in a folder others can write, a server's answer): a
    document nested deeper than Python's parser follows is refused as any text that is not JSON is, with a
    ValueError (``json.JSONDecodeError``), not a RecursionError that no reader expects."""
    try:
        return json.loads(text)
    except RecursionError:
        raise json.JSONDecodeError("nested deeper than this reader follows", "", 0) from None


@contextmanager
def open_append(path: Path | str, mode: int = 0o666) -> Iterator[IO[str]]:
    """``open(path, "a")`` that never follows a link at ``path``."""
    with os.fdopen(open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode), "a") as f:
        yield f
