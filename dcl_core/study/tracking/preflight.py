"""The MLflow tracking URI, checked in seconds before Ray starts (:func:`preflight`): MLflow's own client would
retry an unreachable server for minutes, and a wrong URI would fail only inside the first trial."""

from __future__ import annotations

import base64
import os
import ssl
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit
from urllib.request import url2pathname

from dcl_core.config import ConfigError
from dcl_core.files import loads_json, real_path
from dcl_core.study.plan.storage import redact_uri

_DB_SCHEMES = ("postgresql", "mysql", "mssql")  # SQLAlchemy stores (``postgresql+psycopg2://`` too), not probed
_MANAGED_SCHEMES = ("databricks", "databricks-uc", "uc")
_PROBE = "/api/2.0/mlflow/experiments/search?max_results=1"  # the REST API itself: a /health page is not MLflow


# long: one branch per kind of tracking URI (http(s), sqlite, file, an SQL database, Databricks), a few checks each
def preflight(tracking_uri: str, timeout: float = 5) -> None:
    """Raise :class:`ConfigError` (one line) unless ``tracking_uri`` is an MLflow tracking store this process
    can use, within about ``timeout`` seconds: an http(s) server answering MLflow's REST API (credentials from
    the URI or ``MLFLOW_TRACKING_USERNAME``/``_PASSWORD``/``_TOKEN``), a SQLite file in a writable folder, an
    SQL database URI (not probed) or Databricks. Call it before Ray starts: MLflow's own client would retry an
    unreachable server for minutes."""
    shown = redact_uri(tracking_uri)

    def invalid(why: str) -> ConfigError:
        return ConfigError(f"{shown} is not a valid MLflow tracking URI: {why}")

    try:
        parts = urlsplit(tracking_uri.strip())
        _ = parts.port  # a port that is not a number raises ValueError
    except ValueError:  # its message quotes the "port", which may be the part of a password after a '/' or '#'
        raise invalid("its HOST:PORT cannot be read (a password with '/', '#', '?' or '@' must be "
                      "percent-encoded: %2F, %23, %3F, %40)") from None
    scheme = parts.scheme.lower()
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise invalid("no host (expected http(s)://HOST[:PORT])")
        _probe_http(parts, shown, timeout)
    elif scheme == "sqlite":
        if not tracking_uri.startswith("sqlite:///") or tracking_uri.split("?")[0] in ("sqlite:///", "sqlite:///:memory:"):
            raise invalid("expected sqlite:///RELATIVE/PATH.db or sqlite:////ABSOLUTE/PATH.db (an in-memory "
                          "store would forget every run)")
        db = Path(unquote(tracking_uri[len("sqlite:///"):].split("?")[0])).expanduser()
        if db.exists():
            if not db.is_file() or not os.access(db, os.R_OK | os.W_OK):
                raise invalid(f"{db} is not a writable file")
            with db.open("rb") as f:  # an empty file is a new database; anything else must be one already
                head = f.read(16)
            if head and head != b"SQLite format 3\x00":
                raise invalid(f"{db} is not an SQLite database")
        else:
            _check_creatable(db.parent, invalid)
    elif scheme == "file" or (not scheme and tracking_uri.startswith("/")):
        path = Path(url2pathname(parts.path)) if scheme else Path(tracking_uri)
        if scheme and parts.netloc not in ("", "localhost"):
            raise invalid("a file: URI on another host")
        # MLflow's own reading of its switch; imported here, as the tracking package keeps MLflow out of trial workers
        from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE

        if not MLFLOW_ALLOW_FILE_STORE.get():
            raise invalid("MLflow 3's file store is in maintenance mode and refuses new runs; use sqlite:///PATH.db "
                          "(or set MLFLOW_ALLOW_FILE_STORE=true)")
        if path.exists() and not path.is_dir():
            raise invalid(f"{path} is not a folder")
        _check_creatable(path, invalid)
    elif scheme.split("+")[0] in _DB_SCHEMES:
        if not parts.hostname:
            raise invalid("no database host")
    elif scheme in _MANAGED_SCHEMES or tracking_uri.strip() in _MANAGED_SCHEMES:  # "databricks", "databricks://profile"
        if not (os.environ.get("DATABRICKS_HOST") or (Path.home() / ".databrickscfg").is_file()):
            raise invalid("no Databricks configuration (set DATABRICKS_HOST and DATABRICKS_TOKEN, or write "
                          "~/.databrickscfg); MLflow would fail only after Ray started")
    elif not scheme:
        raise invalid("not a URI; expected http(s)://HOST:PORT, sqlite:///PATH.db or an SQL database URI")
    else:
        raise invalid(f"unknown scheme {parts.scheme!r}; expected http(s)://HOST:PORT, sqlite:///PATH.db or an "
                      "SQL database URI")


def _check_creatable(path: Path, invalid: Any) -> None:
    """The nearest existing folder of ``path`` is a writable folder (MLflow creates the missing ones)."""
    folder = real_path(path)
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise invalid(f"{folder} is not a writable folder")


def _auth_header(parts: Any) -> dict[str, str]:
    """The Authorization header MLflow's client would send: URI user info, else the MLflow env vars."""
    if parts.username is not None:
        user, password = unquote(parts.username), unquote(parts.password or "")
    elif os.environ.get("MLFLOW_TRACKING_USERNAME"):
        user, password = os.environ["MLFLOW_TRACKING_USERNAME"], os.environ.get("MLFLOW_TRACKING_PASSWORD", "")
    elif os.environ.get("MLFLOW_TRACKING_TOKEN"):
        return {"Authorization": f"Bearer {os.environ['MLFLOW_TRACKING_TOKEN']}"}
    else:
        return {}
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


def _probe_http(parts: Any, shown: str, timeout: float) -> None:
    """GET the REST API's cheapest search in a daemon thread (DNS lookups ignore socket timeouts)."""
    host = parts.netloc.rpartition("@")[2]
    url = urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", "")) + _PROBE
    request = urllib.request.Request(url, headers={"Accept": "application/json", **_auth_header(parts)})
    context = None
    if parts.scheme.lower() == "https":
        context = ssl.create_default_context(cafile=os.environ.get("MLFLOW_TRACKING_SERVER_CERT_PATH") or None)
        if os.environ.get("MLFLOW_TRACKING_INSECURE_TLS", "").lower() == "true":
            context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    outcome: list[BaseException | bytes] = []

    def probe() -> None:
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
                outcome.append(response.read(1 << 20))
        except BaseException as err:  # handed to the caller's thread
            outcome.append(err)

    thread = threading.Thread(target=probe, name="mlflow-preflight", daemon=True)
    thread.start()
    thread.join(timeout + 1)
    if not outcome:
        raise ConfigError(f"MLflow tracking URI {shown} is unreachable: no answer within {timeout:g} s")
    result = outcome[0]
    if isinstance(result, urllib.error.HTTPError):
        if result.code in (401, 403):
            raise ConfigError(f"MLflow tracking URI {shown} refused the credentials (HTTP {result.code}); set "
                              "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)")
        if result.code == 404:
            raise ConfigError(f"{shown} is not a valid MLflow tracking URI: no MLflow REST API there (HTTP 404 "
                              f"for {_PROBE.split('?')[0]})")
        raise ConfigError(f"MLflow tracking URI {shown} is unreachable: HTTP {result.code} {result.reason}")
    if isinstance(result, BaseException):
        reason = result.reason if isinstance(result, urllib.error.URLError) else result
        why = redact_uri(str(reason)) or type(reason).__name__
        raise ConfigError(f"MLflow tracking URI {shown} is unreachable: {why}")
    try:
        answer = loads_json(result)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise ConfigError(f"{shown} is not a valid MLflow tracking URI: its answer to {_PROBE.split('?')[0]} is "
                          "not MLflow's JSON (a login page or another web service?)")


def check_store_in_folder(tracking_uri: str, output_dir: Path) -> None:
    """Raise :class:`ConfigError` (one line) when an SQLite store inside ``output_dir`` would write outside it.

    A store keeps every experiment's artifact folder, and every run's, as absolute locations: a folder copied or
    moved elsewhere (``cp -a OUT OUT2``) keeps pointing at the original, so logging into the copy would write the
    original's artifacts (or recreate its folders), and a crafted ``mlflow.db`` could point them anywhere, another
    host included. Every location a study may write (every experiment's but MLflow's "Default", and their runs')
    must be a folder inside ``output_dir``. A store outside the folder is the
    user's own choice (``--tracking-uri``) and is not inspected."""
    if not tracking_uri.startswith("sqlite:///"):
        return
    db = Path(unquote(tracking_uri[len("sqlite:///"):].split("?")[0])).expanduser()
    root = output_dir.expanduser().resolve()
    if not db.is_file() or db.stat().st_size == 0 or not db.resolve().is_relative_to(root):
        return
    # MLflow's client (seconds): only for a store that exists in the folder
    from mlflow.entities import ViewType
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    # MLflow's own "Default" experiment (id 0, artifacts in ./mlruns of whatever folder made the store) is never
    # written by a study: every study logs to an experiment of its own name.
    experiments = [e for e in client.search_experiments(view_type=ViewType.ALL) if e.experiment_id != "0"]
    runs = client.search_runs([e.experiment_id for e in experiments], run_view_type=ViewType.ALL,
                              max_results=50_000) if experiments else []
    where = [(f"experiment {e.name!r}", e.artifact_location) for e in experiments]
    where += [(f"run {r.info.run_id}", r.info.artifact_uri) for r in runs]
    for what, location in where:
        if not _inside(location or "", root):
            raise ConfigError(
                f"{db} keeps the artifacts of its {what} at {redact_uri(str(location))[:300]}, outside "
                f"{root} (a copied or moved output folder?): logging there would write outside this folder; pass "
                f"--tracking-uri sqlite:///{root / 'mlflow-here.db'} to log to a new store in it")


def _inside(location: str, root: Path) -> bool:
    """Whether an artifact location (a ``file:`` URI or a plain path) is a path inside ``root``."""
    parts = urlsplit(location)
    if parts.scheme == "file" and parts.netloc in ("", "localhost"):
        path = Path(url2pathname(parts.path))
    elif not parts.scheme and location.startswith("/"):
        path = Path(location)
    else:
        return False
    return path.resolve().is_relative_to(root)
