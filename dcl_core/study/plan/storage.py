"""Where a study's files live: Ray storage URIs (local paths, ``file://``, ``s3://``, ``gs://``) and the
summary folder, through pyarrow's filesystems so every scheme Ray accepts works the same way."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import posixpath
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePath
from typing import Any, TypeVar
from urllib.parse import urlsplit, urlunsplit

import pyarrow.fs

from dcl_core.config import ConfigError
from dcl_core.files import disk_full, file_kind, loads_json, no_space, open_fd, read_bounded, real_path, write_text

T = TypeVar("T")


def storage_join(storage: str, name: str) -> str:
    """``storage/name`` for a local path or a URI (``s3://``, ``gs://``, ``file://``), keeping a URI's query
    (``s3://b/p?region=x`` -> ``s3://b/p/name?region=x``); pathlib would fold ``s3://`` into a folder ``s3:``."""
    if "://" not in storage:
        return f"{storage.rstrip('/')}/{name}"
    parts = urlsplit(storage)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{name}"))


def absolute_storage(storage: str) -> str:
    """A URI as given; a local path made absolute (Tune runs each trial in its own working directory)."""
    return storage if "://" in storage else str(real_path(storage))


def _filesystem(uri: str) -> tuple[pyarrow.fs.FileSystem, str]:
    """PyArrow's filesystem for ``uri``; ConfigError (one line) for a scheme it cannot open (``foo://``,
    ``hdfs://`` without Hadoop)."""
    try:
        return pyarrow.fs.FileSystem.from_uri(uri)
    except (pyarrow.ArrowException, OSError, ValueError) as err:
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ConfigError(f"storage {uri} is not a filesystem Ray can use: {reason[:200]}") from None


STORAGE_TIMEOUT_S = 20.0  # a remote store that has not answered by then will not (offline, no credentials)


def _bounded(fn: Callable[[], T], what: str, timeout: float = STORAGE_TIMEOUT_S) -> T:
    """``fn()``, or ConfigError when it has not returned within ``timeout`` seconds. pyarrow's GCS and S3 clients
    retry for many minutes without network or credentials, and a blocking C++ call cannot be interrupted: it is
    left in a daemon thread, which does not keep the process alive."""
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["value"] = fn()
        except BaseException as err:  # re-raised in the caller's thread
            result["error"] = err

    thread = threading.Thread(target=run, daemon=True, name="storage-probe")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ConfigError(f"{what} did not answer within {timeout:g} s (no network, no such bucket, or no "
                          "credentials on this machine)")
    if "error" in result:
        raise result["error"]
    return result["value"]


def check_storage(uri: str) -> None:
    """ConfigError (one line, within :data:`STORAGE_TIMEOUT_S`) unless pyarrow can open ``uri``'s filesystem and
    answer for the path (a local one must not be a file)."""
    fs, path = _filesystem(uri)
    if isinstance(fs, pyarrow.fs.LocalFileSystem) and Path(path).exists() and not Path(path).is_dir():
        raise ConfigError(f"storage {uri} is a file, not a folder")
    storage_exists(uri)


def storage_exists(uri: str) -> bool:
    """Whether anything is at the storage URI; ConfigError (one line) when it cannot be read."""
    fs, path = _filesystem(uri)
    try:
        info = _bounded(lambda: fs.get_file_info(path), f"storage {redact_uri(uri)}")
    except (pyarrow.ArrowException, OSError) as err:
        raise ConfigError(f"storage {uri} cannot be read: {str(err).splitlines()[0][:200]}") from None
    return info.type != pyarrow.fs.FileType.NotFound


def _inside(uri: str, root: str) -> bool:
    """Whether ``uri`` lies strictly inside ``root`` (both local paths, or URIs of one scheme and host)."""
    if "://" not in uri and "://" not in root:
        path, base = Path(uri).resolve(), Path(root).resolve()
        return base in path.parents
    a, b = urlsplit(uri), urlsplit(root)
    if (a.scheme, a.netloc) != (b.scheme, b.netloc):
        return False
    inner, outer = posixpath.normpath(a.path or "/"), posixpath.normpath(b.path or "/")
    return inner != outer and inner.startswith(outer.rstrip("/") + "/")


def storage_delete(uri: str, root: str) -> None:
    """Delete the folder ``uri``, which must lie strictly inside the storage ``root`` (``--overwrite`` never
    deletes anything else, whatever a study name says)."""
    if not _inside(uri, root):
        raise ConfigError(f"refusing to delete {uri}: it is not inside the study storage {root}")
    fs, path = _filesystem(uri)
    fs.delete_dir(path)


# the path a study's own files add below its output folder (MLflow's artifacts, Tune's trial folders): a few hundred
# bytes with a study name of 100 characters, the longest there is
OUTPUT_PATH_ROOM = 1024


def check_output_dir(output_dir: Path) -> None:
    """ConfigError (one line) unless ``output_dir`` is, or can be made, a writable folder: a name of it longer than
    its filesystem allows, or a path leaving less than :data:`OUTPUT_PATH_ROOM` bytes of the system's limit for
    the study's own files, is refused here rather than by the first file written."""
    existing = output_dir
    try:
        while not _exists(existing) and existing != existing.parent:
            existing = existing.parent
        name_max, path_max = os.pathconf(existing, "PC_NAME_MAX"), os.pathconf(existing, "PC_PATH_MAX")
    except OSError as err:  # a folder on the way this user may not look into
        raise ConfigError(f"--output-dir {output_dir}: {err.strerror or err}") from None
    if not existing.is_dir():
        raise ConfigError(f"--output-dir {output_dir}: {existing} is a file, not a folder")
    for name in output_dir.relative_to(existing).parts:
        if 0 < name_max < len(os.fsencode(name)):  # pathconf's -1: no limit
            raise ConfigError(f"--output-dir {output_dir}: a name of {len(os.fsencode(name))} bytes, longer than "
                              f"the {name_max} its filesystem allows")
    if 0 < path_max - OUTPUT_PATH_ROOM < len(os.fsencode(output_dir)):
        raise ConfigError(f"--output-dir {output_dir}: a path of {len(os.fsencode(output_dir))} bytes leaves the "
                          f"study's own files too little of the system's {path_max}: pass a shorter one")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"--output-dir {output_dir}: {existing} is not writable")


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; False for a name too long to exist (which :meth:`Path.exists` raises for)."""
    try:
        return path.exists()
    except OSError as err:
        if err.errno == errno.ENAMETOOLONG:
            return False
        raise


OPTUNA_DB = "optuna.db"  # the Optuna searches' storage, in the output folder


def check_no_links(output_dir: Path, entries: Iterable[str]) -> None:
    """ConfigError (one line) if one of ``entries`` (paths relative to ``output_dir`` where a study writes: its
    summary folder, Tune's, MLflow's store and artifacts) is a symbolic link: every file written there would land
    wherever the link points. The output folder itself may be a link; what is planted inside it may not. A FIFO, a
    device or a socket there is refused too: MLflow's SQLite store on a FIFO retried for minutes, a read of one
    blocks forever."""
    for entry in entries:
        path = output_dir / entry
        if path.is_symlink():
            raise ConfigError(f"{path} is a symbolic link; a study writes only inside its output folder, never "
                              "through a link planted in it: remove the link (or pass the real folder as --output-dir)")
        kind = file_kind(path)
        if kind not in ("a regular file", "a folder", "nothing"):
            raise ConfigError(f"{path} is {kind}, not a file or folder a study makes: not opened; remove it")


def check_output(output_dir: Path, storage: str, entries: Iterable[str]) -> None:
    """ConfigError (one line) for the first of: ``output_dir`` not a writable folder (:func:`check_output_dir`),
    the Ray ``storage`` unusable (:func:`check_storage`), a link or special file where the study writes inside
    the folder (``entries``, :func:`check_no_links`)."""
    check_output_dir(output_dir)
    check_storage(storage)
    check_no_links(output_dir, entries)


def study_entries(study: str, experiments: Iterable[str] = ()) -> list[str]:
    """What a study writes inside its output folder, for :func:`check_no_links`."""
    return ["summary", f"summary/{study}", "ray_results", *(f"ray_results/{e}" for e in experiments), "mlartifacts",
            "mlflow.db", OPTUNA_DB]


@contextlib.contextmanager
def study_lock(output_dir: Path, study: str, reanalysis: bool = False) -> Iterator[Path]:
    """Hold an exclusive lock on one study of an output folder for the whole run: a second run of the same
    study into the same folder (which would mix Tune state and log every trial twice) stops with ConfigError
    naming the holder. The lock is the kernel's (``flock``): a killed run (even ``kill -9``) releases it. The lock
    file is never opened through a link planted at its name (one line instead), is readable by its owner only, and
    records the holder's command with credentials redacted. ``reanalysis``: a re-analysis asks for the lock (its
    refusal says to wait, not to pick another folder)."""
    path = output_dir / f".{study}.lock"
    new_dir = not output_dir.exists()
    new_lock = not path.exists() and not path.is_symlink()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_fd(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as err:
        if no_space(err):
            _remove_new(path if new_lock else None, output_dir if new_dir else None)
            raise disk_full(output_dir) from None
        raise
    refused = False
    try:
        os.fchmod(fd, 0o600)  # a lock file an older version left readable by all
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "another process"
            then = ("wait for it to finish, then re-analyse it" if reanalysis else
                    "wait for it, or use another --name or --output-dir")
            raise ConfigError(f"study {study} in {output_dir} is already running ({holder}); {then}") from None
        info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "command": " ".join(redact_args(sys.argv))[:300]}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        except OSError as err:
            if not no_space(err):
                raise
            refused = True  # nothing began: leave the folder as it was found
            raise disk_full(output_dir) from None
        try:
            yield path
        except ConfigError:
            refused = True  # bad input found under the lock: leave the folder as it was found
            raise
    finally:
        if refused and new_lock:
            with contextlib.suppress(OSError):
                path.unlink()
        os.close(fd)  # releases the lock
        if refused and new_dir:
            with contextlib.suppress(OSError):
                output_dir.rmdir()  # only if empty


def _remove_new(lock: Path | None, folder: Path | None) -> None:
    """Remove a lock file and an (empty) output folder that a refused start created."""
    with contextlib.suppress(OSError):
        if lock is not None:
            lock.unlink()
        if folder is not None:
            folder.rmdir()  # only if empty


def default_tracking_uri(output_dir: Path) -> str:
    """A local SQLite MLflow store under the study output directory (absolute: Tune changes each trial's
    working directory)."""
    return f"sqlite:///{(output_dir / 'mlflow.db').resolve()}"


def redact_uri(uri: str) -> str:
    """``uri`` safe to print or store: credentials (everything between ``scheme://`` and the last ``@``, so a
    password with an unencoded ``/``, ``#`` or ``?`` is hidden whole, and query values named like a token,
    password, secret or key) become ``***``."""
    out = re.sub(r"^([A-Za-z][A-Za-z0-9+.-]*://)(?!/)\S*@", r"\1***@", uri)  # "///": no host, no credentials
    return re.sub(r"([?&][^=&#]*(?:token|passw|secret|key|sig)[^=&#]*=)[^&#]*", r"\1***", out, flags=re.I)


def redact_args(args: list[str]) -> list[str]:
    """A command line safe to print or store: every URI in it (``--tracking-uri http://u:p@h``, or
    ``--tracking-uri=...``) through :func:`redact_uri`."""
    out = []
    for a in args:
        key, eq, value = a.partition("=") if a.startswith("--") else ("", "", a)
        out.append(f"{key}={redact_uri(value)}" if eq else redact_uri(a))
    return out


def atomic_write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file in the same folder and a rename: a full disk or a
    crash leaves the previous file (or none), never half a file, and a link planted at either name is never
    followed (:func:`dcl_core.files.write_text`)."""
    return write_text(path, text)


OPTIONS_FILE = "study_options.json"  # a study's options and spec, written by the runner into its summary folder
# A study's options file is ~10 KB (a user loss's list of sources: up to ~300 KB); a larger one is not the study's
MAX_OPTIONS_BYTES = 16 << 20


def read_options_file(path: Path) -> Any:
    """The JSON a study's ``study_options.json`` at ``path`` holds, read within :data:`MAX_OPTIONS_BYTES` from a
    regular file only (:func:`dcl_core.files.read_bounded`: a FIFO is never waited on). Raises ConfigError (one
    line) for anything else there or a larger file, ValueError for a file that is not JSON."""
    return loads_json(read_bounded(path, MAX_OPTIONS_BYTES))


def study_began(storage: str, study: str) -> bool:
    """Whether Tune's ``storage`` holds an experiment of ``study`` (its folder ``study``, or ``study+…``): whether
    the study ran far enough for a ``--resume`` to continue it. A storage that cannot be listed counts as holding
    one (its ``--resume`` then says what it finds)."""
    try:
        if "://" not in storage:
            root = Path(storage).expanduser()
            return (root / study).is_dir() or any(root.glob(f"{study}+*"))
        fs, path = _filesystem(storage)
        found = _bounded(lambda: fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True)),
                         f"storage {redact_uri(storage)}")
    except (ConfigError, pyarrow.ArrowException, OSError):
        return True
    return any(i.base_name == study or i.base_name.startswith(f"{study}+") for i in found)


def script_sha256(path: Path) -> str | None:
    """The SHA-256 of a study script's file, what a study records to notice a copy changed since (None: unreadable)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def script_origin(command: Any) -> str | None:
    """Which script a study's recorded ``command`` says made it: ``studies/<name>.py`` for a checkout's own study
    script (in whichever checkout it ran, or recorded before the path was), else the recorded path of the file that
    ran (a copy, or a script of the user's own); None when the record names no script."""
    if not isinstance(command, dict) or not isinstance(command.get("script"), str):
        return None
    name, path = command["script"], command.get("script_path")
    own = f"studies/{name}.py"
    if not isinstance(path, str):
        return own
    ran = PurePath(path)
    return own if ran.name == f"{name}.py" and ran.parent.name == "studies" else path


def summary_dir(output_dir: Path, study: str) -> Path:
    """Where a study's table, plots and Parquet go: one folder per study, so studies sharing an output
    directory (and its MLflow store) never overwrite each other's summaries."""
    return output_dir / "summary" / study
