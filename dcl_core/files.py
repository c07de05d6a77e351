"""Files the project creates in an output folder, opened without following symbolic links.

A link planted where a lock, config, metrics, journal or summary file goes (``ln -s ~/precious.txt
outputs/.temperature_sweep.lock``) is refused with one line, never followed: nothing outside the folder is
created, truncated or appended to through it. Whole files are written to a fresh temporary name (``O_EXCL``,
so never through an existing name or link) and renamed over the target; ``rename`` replaces a link itself, not
what it points to. Pure standard library, for every layer.
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, BinaryIO

from dcl_core.config import ConfigError, RunFailedError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


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


def disk_full(where: Path | str, resume: bool = False) -> DiskFullError:
    """The one line for a full disk under ``where``; ``resume``: a study that stopped and can go on."""
    then = ", then run the same command with --resume (finished trials are kept)" if resume else ""
    return DiskFullError(f"no space left on the device holding {where}: free some space{then}")


class UnsafePathError(ConfigError):
    """A path the project would write is a symbolic link or a folder: refused (one line, exit code 2)."""


def open_fd(path: Path | str, flags: int, mode: int = 0o666) -> int:
    """``os.open`` that never follows a link at ``path`` (UnsafePathError) and says plainly when ``path`` is a
    folder; other OSErrors (a full disk, permissions) propagate."""
    try:
        return os.open(path, flags | _NOFOLLOW | _CLOEXEC, mode)
    except OSError as err:
        if err.errno == errno.ELOOP or os.path.islink(path):
            raise UnsafePathError(f"{path} is a symbolic link: refusing to write through it (remove the link; "
                                  "the project writes only regular files inside its output folder)") from None
        if err.errno == errno.EISDIR or (err.errno in (errno.EACCES, errno.EPERM) and os.path.isdir(path)):
            raise UnsafePathError(f"{path} is a folder where a file belongs: remove or rename it") from None
        raise


def write_with(path: Path | str, write: Callable[[BinaryIO], object], mode: int = 0o666) -> Path:
    """Write ``path`` atomically without following links: ``write`` fills a fresh temporary file in the same
    folder (``O_EXCL``, binary), which is then renamed over ``path``. A full disk or a crash leaves the previous
    file, never half of one; a link at ``path`` is replaced, never written through; a folder at ``path`` is
    refused."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        raise UnsafePathError(f"{path} is a folder where a file belongs: remove or rename it")
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = open_fd(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def write_text(path: Path | str, text: str, mode: int = 0o666) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically without following links (:func:`write_with`)."""
    return write_with(path, lambda f: f.write(text.encode()), mode)


def is_regular_file(path: Path | str) -> bool:
    """Whether ``path`` is a regular file itself, not a link to one (``Path.is_file`` follows links)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


@contextmanager
def open_append(path: Path | str, mode: int = 0o666) -> Iterator[IO[str]]:
    """``open(path, "a")`` that never follows a link at ``path``."""
    with os.fdopen(open_fd(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode), "a") as f:
        yield f
