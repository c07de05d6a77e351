"""The journal of MLflow operations a study could not deliver: ``summary/<study>/pending_mlflow.jsonl``, one
JSON object a line, appended while MLflow is down and replayed (in order) when it is back.

It is replayed with the owner's MLflow rights, so it holds only what a study's tracker can have written:
:func:`journal_problem` checks every line's schema, its experiment, and that an artifact lies inside the study's
summary folder; other lines are skipped with one warning. Appends and replays take an exclusive ``flock`` on the
folder's ``.pending_mlflow.lock`` (a study and ``python -m dcl_core.study sync`` may share a journal). A line cut
short by a crash is skipped; files are written without following planted links (:mod:`dcl_core.files`).

The only thing a replay deletes is a copy the study staged itself, ``pending_mlflow_files/<32 hex>/``, found from
the line's path only when that path has exactly this shape inside the journal's own folder (:meth:`Journal.staged`);
no path read from the file is ever deleted otherwise, whatever the line says.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import stat
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from dcl_core.config import ConfigError
from dcl_core.files import file_kind, is_regular_file, loads_json, open_append, read_bounded, write_text

try:
    import fcntl
except ImportError:  # not POSIX: the journal is not locked against a concurrent `sync`
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

JOURNAL_FILE = "pending_mlflow.jsonl"  # tracking operations MLflow has not taken yet, one JSON object a line
IDS_FILE = "pending_mlflow_ids.json"  # placeholder run id of a run created offline -> its MLflow run id
FILES_DIR = "pending_mlflow_files"  # copies of temporary artifacts (a plot in a temporary folder) still to log
LOCK_FILE = ".pending_mlflow.lock"
LOCAL_ID = "offline-"  # prefix of a placeholder run id
_MAX_COPY = 1 << 30  # a temporary artifact larger than this is journaled by its path, not copied
# A journal is ~1 KB an operation: a 1,000-trial study of 200 epochs with MLflow down throughout writes ~120 MB
MAX_JOURNAL_BYTES = 256 << 20
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own tag name (mlflow.utils.mlflow_tags.MLFLOW_PARENT_RUN_ID)


SUMMARIZE = "summarize"  # a marker: the study's answer did not reach MLflow, `sync` recomputes it from the results
# Each operation with the fields a tracker writes for it (StudyTracker's methods, Journal.keep_copy's "owned"): a
# line with any other field was not written by a tracker.
_FIELDS: dict[str, frozenset[str]] = {op: frozenset(("op", *fields)) for op, fields in {
    "open": ("id", "experiment", "overwrite", "tags", "time"),
    "trial_run": ("id", "experiment", "trial_id", "name", "tags", "params", "time"),
    "metrics": ("run", "metrics"),
    "params": ("run", "params"),
    "tag": ("run", "key", "value"),
    "dict": ("run", "data", "path"),
    "artifact": ("run", "path", "artifact_path", "owned"),
    "end": ("run", "status", "time"),
    SUMMARIZE: ("experiment",),
}.items()}
_OPS = tuple(_FIELDS)
_STAGED = re.compile(r"[0-9a-f]{32}")  # the folder keep_copy stages one copy in: uuid4().hex


def _str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())


def _relative(value: Any) -> bool:
    """An artifact path inside the run: relative, no ``..``."""
    return isinstance(value, str) and bool(value) and not value.startswith("/") and ".." not in value.split("/")


def _inside(path: str, root: Path) -> bool:
    """``path`` (every link resolved) lies inside ``root``, and a folder there holds no link."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    if not real.startswith(base.rstrip(os.sep) + os.sep):
        return False
    return not (os.path.isdir(real) and any(p.is_symlink() for p in Path(real).rglob("*")))


def journal_problem(rec: Any, experiment: str, root: Path) -> str | None:
    """Why a journal line is not one this study's tracker can have written (None if it is): an unknown operation
    or wrong fields; another experiment; a run deletion (a journaled ``--overwrite`` never deletes); an artifact
    outside the study's summary folder ``root`` (the journal is replayed with the owner's MLflow rights, so a
    planted line must not upload a file from elsewhere or touch another study)."""
    if not isinstance(rec, dict) or rec.get("op") not in _OPS:
        return f"unknown operation {rec.get('op') if isinstance(rec, dict) else rec!r}"
    op = rec["op"]
    if extra := sorted(str(k)[:40] for k in rec.keys() - _FIELDS[op]):
        return f"a malformed {op} (fields a tracker never writes: {', '.join(extra[:5])})"
    if op == SUMMARIZE:
        return None if rec.get("experiment") == experiment else f"another experiment ({rec.get('experiment')!r})"
    if op in ("open", "trial_run"):
        if rec.get("experiment") != experiment:
            return f"another experiment ({rec.get('experiment')!r})"
        if not (isinstance(rec.get("id"), str) and _str_map(rec.get("tags")) and isinstance(rec.get("time"), int)):
            return f"a malformed {op}"
        if op == "open" and rec.get("overwrite"):
            return "a run deletion (a journaled --overwrite deletes nothing)"
        if op == "trial_run" and not (isinstance(rec.get("trial_id"), str) and isinstance(rec.get("name"), str)
                                      and _str_map(rec.get("params"))):
            return "a malformed trial_run"
        return None
    if not isinstance(rec.get("run"), str):
        return f"a malformed {op} (no run)"
    ok = {
        "metrics": lambda: isinstance(rec.get("metrics"), list) and all(
            isinstance(m, list) and len(m) == 4 and isinstance(m[0], str) and isinstance(m[1], int | float)
            and isinstance(m[2], int) and isinstance(m[3], int) for m in rec["metrics"]),
        "params": lambda: _str_map(rec.get("params")),
        "tag": lambda: isinstance(rec.get("key"), str) and isinstance(rec.get("value"), str),
        "dict": lambda: isinstance(rec.get("data"), dict) and _relative(rec.get("path")),
        "artifact": lambda: isinstance(rec.get("path"), str) and (
            rec.get("artifact_path") is None or _relative(rec.get("artifact_path"))),
        "end": lambda: rec.get("status") in ("FINISHED", "FAILED") and isinstance(rec.get("time"), int | None),
    }[op]
    if not ok():
        return f"a malformed {op}"
    if op == "artifact" and not _inside(rec["path"], root):
        return f"an artifact outside {root} ({rec['path']})"
    return None


class Journal:
    """The journal of one study: ``folder/pending_mlflow.jsonl`` (operations), ``pending_mlflow_ids.json``
    (placeholder run id -> MLflow run id, for runs a replay created) and ``pending_mlflow_files/`` (copies of
    temporary artifacts). Stateless beyond its paths: cheap to make, safe to pickle."""

    def __init__(self, folder: Path, experiment: str) -> None:
        self.folder = Path(folder)
        self.experiment = experiment
        self.path = self.folder / JOURNAL_FILE

    def size(self) -> int:
        """The file's size in bytes (0 if there is none): the cheap "anything pending?" test."""
        try:
            return self.path.stat().st_size
        except OSError:
            return 0

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """An exclusive lock on the journal (the study and ``python -m dcl_core.study sync`` may share it)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open_append(self.folder / LOCK_FILE) as f:
            if fcntl is not None:
                fcntl.flock(f, fcntl.LOCK_EX)
            yield

    def append(self, rec: Mapping[str, Any]) -> None:
        """Add one operation (one line, written whole under the lock; after a line a crash cut short, on a line
        of its own). Raises OSError (a full disk)."""
        line = json.dumps(rec, default=str) + "\n"
        with self.lock():
            cut_short = not self._ends_with_newline()
            with open_append(self.path) as f:
                f.write("\n" + line if cut_short else line)

    def _ends_with_newline(self) -> bool:
        """Whether the journal is empty or missing, or its last line is whole."""
        if not is_regular_file(self.path):  # none yet; anything else is refused by open_append, never opened here
            return True
        try:
            with self.path.open("rb") as f:
                f.seek(-1, os.SEEK_END)
                return f.read(1) == b"\n"
        except OSError:  # an empty one (seeking before its start)
            return True

    def check(self) -> None:
        """ConfigError (one line) unless the journal is absent or a regular file within :data:`MAX_JOURNAL_BYTES`
        (larger than any study writes): checked before a replay, which reads it whole."""
        kind = file_kind(self.path)
        if kind not in ("nothing", "a regular file"):
            raise ConfigError(f"{self.path} is {kind}, not a regular file: not read")
        if kind == "a regular file" and self.size() > MAX_JOURNAL_BYTES:
            raise ConfigError(f"{self.path} holds more than {MAX_JOURNAL_BYTES:,} bytes ({self.size():,}), more than "
                              "a study journals: not read")

    def read(self) -> list[dict[str, Any]]:
        """The operations in order; unreadable lines (cut short by a crash) and lines this study cannot have
        written (:func:`journal_problem`) are skipped with a warning, and dropped at the next :meth:`rewrite`.
        Read within :data:`MAX_JOURNAL_BYTES`, a regular file only (ConfigError otherwise)."""
        if not self.path.exists():
            return []
        records, ignored = [], []
        for line in read_bounded(self.path, MAX_JOURNAL_BYTES).decode(errors="replace").splitlines():
            try:
                rec = loads_json(line)
            except ValueError:  # a line cut short by a crash while it was written
                if line.strip():
                    log.warning("skipping an unreadable line of %s", self.path)
                continue
            why = journal_problem(rec, self.experiment, self.folder)
            if why is None:
                records.append(rec)
            else:
                ignored.append(why)
        if ignored:  # dropped from the journal at its next rewrite
            log.warning("ignoring %d line(s) of %s that this study cannot have written (the first: %s)",
                        len(ignored), self.path, ignored[0])
        return records

    def known_ids(self) -> dict[str, str]:
        """Placeholder run id -> MLflow run id, as replays (of any tracker of the study) recorded them."""
        ids_path = self.folder / IDS_FILE
        with contextlib.suppress(OSError, ValueError):  # ConfigError is a ValueError: a FIFO, a link, too large
            known = loads_json(read_bounded(ids_path, MAX_JOURNAL_BYTES)) if ids_path.exists() else {}
            if _str_map(known):
                return known
        return {}

    def rewrite(self, records: list[dict[str, Any]], new_ids: Mapping[str, str], real: Callable[[str], str]) -> None:
        """The journal after a replay: ``records`` (what is left, run ids made real by ``real`` where known) and
        the id map grown by ``new_ids``; no records left removes the journal and its kept files."""
        known = self.known_ids()
        if any(k not in known for k in new_ids):
            write_text(self.folder / IDS_FILE, json.dumps({**known, **new_ids}, indent=0))
        if not records:
            self.path.unlink(missing_ok=True)
            shutil.rmtree(self.folder / FILES_DIR, ignore_errors=True)
            return
        for rec in records:
            if "run" in rec:
                rec["run"] = real(rec["run"])
            if rec.get("tags", {}).get(PARENT_TAG):
                rec["tags"][PARENT_TAG] = real(rec["tags"][PARENT_TAG])
        write_text(self.path, "".join(json.dumps(r, default=str) + "\n" for r in records))

    def keep_copy(self, rec: dict[str, Any]) -> dict[str, Any]:
        """``rec`` logging a copy of its temporary file (or folder) kept in the journal folder, staged in a folder
        of its own (``pending_mlflow_files/<uuid4 hex>/``) that :meth:`release` deletes once the copy is
        delivered. Raises OSError (a full disk; a link planted at ``pending_mlflow_files``)."""
        src = Path(rec["path"])
        files = [src] if src.is_file() else [p for p in src.rglob("*") if p.is_file()]
        if sum(p.stat().st_size for p in files) > _MAX_COPY:
            log.warning("%s is too large to keep a copy for MLflow; journaled by its path", src)
            return rec
        staging = self.folder / FILES_DIR
        if staging.is_symlink():  # the copy would land wherever the link points (and be deleted there later)
            raise OSError(f"{staging} is a symbolic link: not staging a copy through it")
        dest = staging / uuid.uuid4().hex / src.name
        dest.parent.mkdir(parents=True)
        if src.is_dir():
            shutil.copytree(src, dest)
        else:
            shutil.copy2(src, dest)
        return {**rec, "path": str(dest), "owned": True}

    def staged(self, rec: Mapping[str, Any]) -> Path | None:
        """The folder :meth:`keep_copy` staged ``rec``'s copy in, if ``rec`` is an artifact operation whose path
        is exactly ``<this journal's folder>/pending_mlflow_files/<32 hex>/<name>`` and that folder is a real
        folder there (no link on the way); else None. Nothing else a line names is ever the study's to delete."""
        if rec.get("op") != "artifact" or not isinstance(rec.get("path"), str):
            return None
        path = Path(rec["path"])
        staging = self.folder / FILES_DIR
        if path.parent.parent != staging or not _STAGED.fullmatch(path.parent.name) or path.name in ("", ".", ".."):
            return None
        for folder in (self.folder, staging, path.parent):
            try:
                if not stat.S_ISDIR(os.lstat(folder).st_mode):  # a link (to a folder elsewhere) or not a folder
                    return None
            except OSError:
                return None
        if os.path.realpath(path.parent) != os.path.join(os.path.realpath(self.folder), FILES_DIR, path.parent.name):
            return None  # a link above the journal's folder is fine; one inside it is not
        return path.parent

    def release(self, rec: Mapping[str, Any]) -> None:
        """Delete the kept copy of a delivered (or dropped) artifact operation: only a folder :meth:`staged`
        finds, never a path the line names otherwise (a planted line must not delete a folder)."""
        folder = self.staged(rec)
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
