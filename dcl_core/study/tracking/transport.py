"""How the tracker talks to an MLflow server: short timeouts and few retries (MLflow's defaults hold a study for
minutes per call on a dead server), credentials moved out of the URI, and which failures are worth retrying."""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from mlflow.exceptions import MlflowException

from dcl_core.study.plan.storage import redact_uri

# MLflow refused the operation itself (a bad value, a deleted run): replaying it would fail again.
_REFUSED = {"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS", "INVALID_STATE"}
TIMEOUT_VAR = "MLFLOW_HTTP_REQUEST_TIMEOUT"


class UnreplayableError(Exception):
    """An operation that can never succeed (its run was never created, its file is gone)."""


def is_refused(exc: BaseException) -> bool:
    """Whether a failed operation should be dropped rather than retried: MLflow refused it, its file is gone,
    or it failed in a way no retry fixes (a bug). Unreachable servers, timeouts, 5xx, 401/403, a locked SQLite
    file are transient: retried."""
    if isinstance(exc, MlflowException):
        return exc.error_code in _REFUSED
    if isinstance(exc, UnreplayableError | FileNotFoundError):
        return True
    return not (isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("sqlalchemy", "requests",
                                                                                  "urllib3"))


def reason(exc: BaseException) -> str:
    """A failure in one short line, credentials redacted (``[Errno 111] Connection refused``, not MLflow's
    three-line ``API request to ... failed with exception HTTPConnectionPool(...)``)."""
    text = str(exc) or type(exc).__name__
    errno = re.search(r"\[Errno -?\d+\][^'\")\]]*", text)
    if errno:
        return errno.group(0).strip()
    if "timed out" in text.lower() or "timeout" in type(exc).__name__.lower():
        return "timed out"
    line = redact_uri(text.strip().splitlines()[0])
    return re.sub(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/\s@]*@", r"\1***@", line)[:300]


def _quiet_db_errors(record: logging.LogRecord) -> bool:
    """False for MLflow's own traceback of a failed SQL statement (the tracker journals and warns instead)."""
    return "SQLAlchemy database error" not in record.getMessage()


@contextlib.contextmanager
def short_http(retries: int, timeout: int) -> Iterator[list[str]]:
    """MLflow's HTTP client reads these on every request: ``retries`` retries and a ``timeout`` in seconds for
    the calls inside (MLflow's defaults, 7 retries with backoff and 120 s, held a study ~250 s per call on a dead
    server), and no waiting out a ``Retry-After``. A variable the user set is left alone; yields those set here."""
    wanted = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(retries),
              "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
              TIMEOUT_VAR: str(timeout),
              "MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER": "false"}
    added = [k for k in wanted if k not in os.environ]
    os.environ.update({k: wanted[k] for k in added})
    urllib3_log = logging.getLogger("urllib3.connectionpool")
    urllib3_log.addFilter(_quiet_retries)  # one warning per outage is the tracker's; no "Retrying ..." per call
    db_log = logging.getLogger("mlflow.store.db.utils")
    db_log.addFilter(_quiet_db_errors)  # a full disk or a locked SQLite file: the tracker's one warning says it
    try:
        yield added
    finally:
        urllib3_log.removeFilter(_quiet_retries)
        db_log.removeFilter(_quiet_db_errors)
        for k in added:
            os.environ.pop(k, None)


@contextlib.contextmanager
def upload_timeout(path: Path, timeout: int, added: list[str]) -> Iterator[None]:
    """A server proxying artifacts to remote storage answers an upload once it has stored it: inside
    :func:`short_http` (whose ``added`` variables these are), the ``timeout`` grows by 1 s per MB for a large
    artifact (a checkpoint)."""
    if TIMEOUT_VAR not in added:
        yield
        return
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    os.environ[TIMEOUT_VAR] = str(timeout + sum(p.stat().st_size for p in files) // 1_000_000)
    try:
        yield
    finally:
        os.environ[TIMEOUT_VAR] = str(timeout)


def move_credentials(uri: str) -> str:
    """An http(s) URI without its ``user:password@``, which go to ``MLFLOW_TRACKING_USERNAME``/``_PASSWORD``
    (unless those are set): MLflow would print the URI with them after every run ("View run ... at"), and Tune
    would pickle them with the tracker into the study's storage."""
    parts = urlsplit(uri)
    if parts.scheme.lower() not in ("http", "https") or "@" not in parts.netloc:
        return uri
    if parts.username:
        os.environ.setdefault("MLFLOW_TRACKING_USERNAME", unquote(parts.username))
        os.environ.setdefault("MLFLOW_TRACKING_PASSWORD", unquote(parts.password or ""))
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _quiet_retries(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith("Retrying")
