"""The one module that talks to Ray's reporting API and to MLflow, so their API churn stays here. Only public
APIs of both are used (``ray.tune.Callback``, ``tune.report`` / ``ray.train.report``, ``MlflowClient``).

- :class:`TuneReporter` / :class:`TrainReporter`: epoch callbacks for the trainer that report metrics and the
  checkpoint to Ray Tune (in-process trials) or Ray Train (DDP workers under a TorchTrainer);
  :func:`restore_latest_checkpoint` puts the checkpoint Ray hands back after a failure or a resumed study where
  the trainer's resume finds it; :func:`report_diverged`, :func:`trial_context`.
- :func:`preflight` checks a tracking URI in seconds, before Ray starts; :func:`redact_uri` hides its
  credentials wherever it is printed or stored.
- :class:`StudyTracker`: one ``MlflowClient`` and the study's experiment. A study is one parent run (the
  summary lives on it) with one nested child run per trial (``mlflow.parentRunId``), so MLflow's UI folds a
  study's trials under one row. A resumed study finds its parent and children again by their tags. MLflow
  being down never stops a study: what it does not take is journaled on disk and replayed later
  (:meth:`StudyTracker.sync`, ``python -m dcl_core.study.sync``).
- :class:`MLflowTrialCallback`: a public ``ray.tune.Callback`` that logs each trial through the tracker, from
  the driver: every config value as a param, per-epoch curves, the q_B histograms, the final status.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import math
import os
import re
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit
from urllib.request import url2pathname

import pyarrow.fs
import ray.train
from mlflow.entities import Metric, Param
from mlflow.environment_variables import MLFLOW_ALLOW_FILE_STORE
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from ray import tune

from dcl_core import metrics as M
from dcl_core.config import ConfigError
from dcl_core.files import open_append, write_text
from dcl_core.study.report import plot_q_hist_epochs, q_hist_edges
from dcl_core.study.storage import redact_uri

try:
    import fcntl
except ImportError:  # not POSIX: the journal is not locked against a concurrent `sync`
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

METRIC_PREFIXES = ("train/", "eval/", "time/")
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # MLflow 3: custom_model_development or genai_development
SUMMARY_TAG = "dcl.summary"  # "true" on a study's parent run, which holds its summary
TRIAL_TAG = "trial_id"  # a trial's Tune id on its child run: a resumed study logs to the same run
_BATCH = 100  # MLflow's log_batch accepts at most 100 params per call


def metric_name(name: str) -> str:
    """An MLflow-valid metric name: characters MLflow rejects (``+ ( ) =`` …) become ``_``."""
    return re.sub(r"[^/\w.\- :]", "_", name)


# ------------------------------------------------------------------------------------------------------------
# Ray Tune / Ray Train reporting


def _report_dir(checkpoint: Path) -> tempfile.TemporaryDirectory:
    """A temporary directory holding (a hard link to) the checkpoint file, for Checkpoint.from_directory."""
    tmp = tempfile.TemporaryDirectory(prefix="dcl-ckpt-")
    target = Path(tmp.name) / checkpoint.name
    try:
        target.hardlink_to(checkpoint)
    except OSError:
        shutil.copy2(checkpoint, target)
    return tmp


class _Reporter:
    """Shared by both reporters: Tune needs the study metric in every result.

    With ``eval.knn_every > 1`` the kNN monitor does not run every epoch; the last measurement is carried
    forward and ``eval/knn_fresh`` says whether this epoch measured it (0 before the first measurement).
    """

    def __init__(self) -> None:
        self.last_knn = float("nan")

    def _complete(self, metrics: dict[str, float]) -> dict[str, float]:
        out = dict(metrics)
        fresh = M.KNN_TOP1 in out
        if fresh:
            self.last_knn = out[M.KNN_TOP1]
        out[M.KNN_TOP1] = self.last_knn
        out[M.KNN_FRESH] = float(fresh)
        return out


class TuneReporter(_Reporter):
    """Epoch callback for a trainer running inside a Tune function trainable (one process)."""

    def __call__(self, epoch: int, metrics: dict[str, float], checkpoint: Path | None) -> None:
        if checkpoint is None:
            tune.report(self._complete(metrics))
            return
        with _report_dir(checkpoint) as d:
            tune.report(self._complete(metrics), checkpoint=tune.Checkpoint.from_directory(d))


class TrainReporter(_Reporter):
    """Epoch callback inside Ray Train workers; rank 0 attaches the checkpoint (forwarded to Tune)."""

    def __call__(self, epoch: int, metrics: dict[str, float], checkpoint: Path | None) -> None:
        if checkpoint is None:
            ray.train.report(self._complete(metrics))
            return
        with _report_dir(checkpoint) as d:
            ray.train.report(self._complete(metrics), checkpoint=ray.train.Checkpoint.from_directory(d))


def restore_latest_checkpoint(target: Path, in_train_worker: bool = False) -> bool:
    """Copy the latest checkpoint Ray reported for this trial (if any) to ``target`` (the trainer's checkpoint
    path). Returns whether one was restored, i.e. whether the trainer should resume."""
    ckpt = ray.train.get_checkpoint() if in_train_worker else tune.get_checkpoint()
    if ckpt is None:
        return False
    target.parent.mkdir(parents=True, exist_ok=True)
    with ckpt.as_directory() as d:
        src = Path(d) / target.name
        if not src.exists():
            return False
        shutil.copy2(src, target)
    log.info("restored checkpoint from Ray into %s", target.parent)
    return True


def report_diverged(metrics: Mapping[str, float], message: str, in_train_worker: bool = False) -> None:
    """Final report of a trial whose loss became NaN/inf: it stops, and the table marks it diverged.

    It carries the last epoch's metrics (so the row and the MLflow curves end where training did); inside Ray
    Train every worker calls it, as every ``ray.train.report``."""
    final = {**metrics, M.DIVERGED: 1.0, M.KNN_TOP1: math.nan}
    if in_train_worker:
        ray.train.report(final)
    else:
        tune.report(final)
    log.warning("trial diverged: %s", message)


def report_failed(metrics: Mapping[str, float], cause: str) -> None:
    """Final report of a trial that failed the same way twice (not retried): the table and its MLflow run
    mark it failed with ``cause`` (one plain line)."""
    tune.report({**metrics, M.FAILED: 1.0, M.ERROR: cause, M.KNN_TOP1: math.nan})


def trial_context() -> tuple[str, Path, Path]:
    """(trial id, trial directory, working directory) of the current Tune trial, both absolute.

    The trial directory is Tune's driver-side staging folder, uploaded to the study's storage at every
    experiment snapshot (every epoch here); the working directory is the trial's local scratch space, never
    uploaded. The trainer's own files (its checkpoint copy, metrics.jsonl) go to the scratch space: the
    checkpoint already reaches storage through ``tune.report``, and would otherwise be uploaded twice.
    """
    ctx = tune.get_context()
    trial_dir = Path(ctx.get_trial_dir()).resolve()
    try:
        work_dir = Path(ctx.get_storage().trial_working_directory).resolve()
    except (AttributeError, RuntimeError):  # an older or newer Ray without this storage context
        work_dir = trial_dir
    return ctx.get_trial_id(), trial_dir, work_dir


def git_commit() -> str:
    """The repository's HEAD commit (``unknown`` outside a git checkout, e.g. under ``ray job submit``)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# ------------------------------------------------------------------------------------------------------------
# MLflow: the tracking URI, checked before Ray starts


_DB_SCHEMES = ("postgresql", "mysql", "mssql")  # SQLAlchemy stores (``postgresql+psycopg2://`` too), not probed
_MANAGED_SCHEMES = ("databricks", "databricks-uc", "uc")
_PROBE = "/api/2.0/mlflow/experiments/search?max_results=1"  # the REST API itself: a /health page is not MLflow


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
    folder = path.resolve()
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
        answer = json.loads(result)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise ConfigError(f"{shown} is not a valid MLflow tracking URI: its answer to {_PROBE.split('?')[0]} is "
                          "not MLflow's JSON (a login page or another web service?)")


# ------------------------------------------------------------------------------------------------------------
# MLflow: the study's runs, and a journal of what MLflow did not take

JOURNAL_FILE = "pending_mlflow.jsonl"  # tracking operations MLflow has not taken yet, one JSON object a line
IDS_FILE = "pending_mlflow_ids.json"  # placeholder run id of a run created offline -> its MLflow run id
FILES_DIR = "pending_mlflow_files"  # copies of temporary artifacts (a plot in a temporary folder) still to log
LOCAL_ID = "offline-"  # prefix of a placeholder run id
_MAX_COPY = 1 << 30  # a temporary artifact larger than this is journaled by its path, not copied
_METRICS_PER_BATCH = 1000  # MLflow's log_batch limit
# MLflow refused the operation itself (a bad value, a deleted run): replaying it would fail again.
_REFUSED = {"INVALID_PARAMETER_VALUE", "RESOURCE_DOES_NOT_EXIST", "RESOURCE_ALREADY_EXISTS", "INVALID_STATE"}


class _UnreplayableError(Exception):
    """An operation that can never succeed (its run was never created, its file is gone)."""


_OPS = ("open", "trial_run", "metrics", "params", "tag", "dict", "artifact", "end")


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


def _refused(exc: BaseException) -> bool:
    """Whether a failed operation should be dropped rather than retried: MLflow refused it, its file is gone,
    or it failed in a way no retry fixes (a bug). Unreachable servers, timeouts, 5xx, 401/403, a locked SQLite
    file are transient: retried."""
    if isinstance(exc, MlflowException):
        return exc.error_code in _REFUSED
    if isinstance(exc, _UnreplayableError | FileNotFoundError):
        return True
    return not (isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("sqlalchemy", "requests",
                                                                                  "urllib3"))


def _reason(exc: BaseException) -> str:
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


class StudyTracker:
    """A study's MLflow experiment through one ``MlflowClient``: the parent run, a child run per trial, the
    summary on the parent.

    MLflow being unreachable never stops the study: every operation that fails (or that comes while the
    tracker knows MLflow is down) is appended to a journal, ``journal_dir/pending_mlflow.jsonl``, with what it
    needs to be replayed; a run created offline gets a placeholder id (``offline-…``), mapped to its MLflow id
    when replayed (``pending_mlflow_ids.json``). One warning per outage; while down, MLflow is not called for
    ``cooldown`` seconds after a failure, and each call gives up after ``http_retries`` retries of
    ``http_timeout`` seconds (MLflow's defaults retry for minutes). The next call after the cool-down, and
    :meth:`sync`, replay the journal first, in order; a replayed run creation first looks the run up by its
    trial id (or the summary tag), so runs are never duplicated, and the journal keeps only what MLflow did
    not take. :meth:`open` (so a ``--resume``) and ``python -m dcl_core.study.sync`` replay it too.
    Without a ``journal_dir`` failed operations are logged and dropped.

    Picklable (Tune saves its callbacks with the experiment, and restores them on ``--resume``): the client is
    dropped when pickled and made again on first use.
    """

    def __init__(self, tracking_uri: str, experiment: str, artifact_root: Path | None = None,
                 tags: Mapping[str, str] | None = None, journal_dir: Path | None = None, *,
                 cooldown: float = 30.0, http_timeout: int = 10, http_retries: int = 1, description: str = "",
                 experiment_tags: Mapping[str, str] | None = None) -> None:
        self.tracking_uri = _move_credentials(tracking_uri)
        self.experiment = experiment
        self.description = description
        self.experiment_tags = dict(experiment_tags or {})
        self.artifact_root = artifact_root
        self.tags = dict(tags or {})
        self.journal_dir = Path(journal_dir).resolve() if journal_dir is not None else None
        self.cooldown = cooldown
        self.http_timeout = http_timeout
        self.http_retries = http_retries
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self.dropped = 0  # operations lost: refused by MLflow, or failed without a journal
        self.last_error: str | None = None
        self._client: MlflowClient | None = None
        self._ids: dict[str, str] = {}
        self._offline_until = 0.0  # time.monotonic() before which MLflow is not called
        self._outage = False  # warned about the current outage
        self._warned_refused: set[str] = set()
        self._mine: set[str] = set()  # run ids known to be in this study's experiment
        self._env_added: list[str] = []  # the MLflow env vars _short_http set (not the user's)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None, "_offline_until": 0.0, "_outage": False, "_env_added": []}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Defaults first: a study started before the journal existed resumes with its pickled tracker.
        StudyTracker.__init__(self, state["tracking_uri"], state["experiment"])
        self.__dict__.update(state)

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    @property
    def journal(self) -> Path | None:
        return None if self.journal_dir is None else self.journal_dir / JOURNAL_FILE

    # -- the study's operations: each is one journal record, applied now or journaled ------------------------

    def open(self, overwrite: bool = False) -> StudyTracker:
        """Replay what an earlier run of the study journaled; get or create the experiment (local stores get an
        absolute artifact folder); with ``overwrite`` soft-delete its runs started before now; then find (a
        resumed study) or create the parent run. If MLflow is unreachable the parent run is a placeholder."""
        rec = {"op": "open", "id": _local_id(), "experiment": self.experiment, "overwrite": overwrite,
               "tags": {SUMMARY_TAG: "true", **self.tags}, "time": _now_ms()}
        self.parent_run_id = self._real(self._run(rec))
        return self

    def trial_run(self, trial_id: str, name: str, tags: Mapping[str, str], params: Mapping[str, Any]) -> str:
        """The child run of a trial: found by its trial id (a resumed or retried trial), else created with
        the study's tags, ``tags`` and every param. A placeholder id while MLflow is unreachable."""
        all_tags = {**self.tags, **tags, TRIAL_TAG: trial_id, MLFLOW_PARENT_RUN_ID: self.parent_run_id or ""}
        rec = {"op": "trial_run", "id": _local_id(), "experiment": self.experiment, "trial_id": trial_id,
               "name": name, "tags": {k: str(v) for k, v in all_tags.items()},
               "params": {k: str(v) for k, v in params.items()}, "time": _now_ms()}
        return self._run(rec)

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        """Finite numbers only (a NaN marks a missing measurement, not a value to plot)."""
        now = _now_ms()
        items = [[metric_name(k), float(v), now, int(step)] for k, v in metrics.items()
                 if isinstance(v, int | float) and math.isfinite(v)]
        if items:
            self._run({"op": "metrics", "run": run_id, "metrics": items})

    def last_step(self, run_id: str, key: str) -> int:
        """The last step of metric ``key`` MLflow holds for the run (0 if none, or if it cannot say now): a
        resumed trial retrains the epochs after its checkpoint, which may already be logged."""
        if time.monotonic() < self._offline_until or run_id.startswith("offline-"):
            return 0
        try:
            with self._short_http():
                history = self.client.get_metric_history(self._real(run_id), metric_name(key))
        except Exception:  # tracking never stops the study; a duplicate point is the worst outcome
            return 0
        return max((m.step for m in history), default=0)

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        """Params the run does not have yet (a resumed study's summary keeps its first values)."""
        if params:
            self._run({"op": "params", "run": run_id, "params": {k: str(v) for k, v in params.items()}})

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        self._run({"op": "tag", "run": run_id, "key": key, "value": str(value)})

    def log_dict(self, run_id: str, data: Mapping[str, Any], path: str) -> None:
        self._run({"op": "dict", "run": run_id, "data": dict(data), "path": path})

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None,
                     temporary: bool = False) -> None:
        """A file or a folder's contents. ``temporary``: ``path`` is deleted soon (a temporary folder), so a
        journaled operation logs a copy kept in the journal folder."""
        rec = {"op": "artifact", "run": run_id, "path": str(Path(path).resolve()), "artifact_path": artifact_path}
        self._run(rec, prepare=self._keep_copy if temporary else None)

    def end_run(self, run_id: str, failed: bool = False) -> None:
        self._run({"op": "end", "run": run_id, "status": "FAILED" if failed else "FINISHED", "time": _now_ms()})

    def log_summary(self, metrics: Mapping[str, float], artifacts: list[Path],
                    params: Mapping[str, Any] | None = None, tags: Mapping[str, str] | None = None) -> str:
        """The study summary on the parent run (metrics, the results table, the plots), which then finishes.

        A resumed study summarizes all its trials again: metrics get a new point, artifacts are replaced. The
        study's last operation: if anything is still journaled, one more :meth:`sync` (cool-down or not), then a
        warning saying what is left and how to push it. Returns the parent run's id (a placeholder if MLflow
        never answered)."""
        if self.parent_run_id is None:
            self.open()
        rid = self.parent_run_id
        assert rid is not None
        self.log_params(rid, params or {})
        for key, value in (tags or {}).items():
            self.set_tag(rid, key, value)
        self.log_metrics(rid, metrics)
        for path in artifacts:
            self.log_artifact(rid, path)
        self.end_run(rid)
        if self.pending():
            self.sync()
        message = self.pending_message()
        if message:
            log.warning("%s", message)
        return self._real(rid)

    def delete_runs(self, before_ms: int | None = None) -> int:
        """Soft-delete every run of the experiment (started before ``before_ms``: ``--overwrite``, the new
        trials replace the old ones); returns how many. ``mlflow gc`` purges them, ``MlflowClient.restore_run``
        brings one back."""
        runs = self.client.search_runs([self._experiment()], max_results=50_000)
        runs = [r for r in runs if before_ms is None or (r.info.start_time or 0) < before_ms]
        for run in runs:
            self.client.delete_run(run.info.run_id)
        if runs:
            log.info("--overwrite: deleted %d earlier MLflow runs of %s", len(runs), self.experiment)
        return len(runs)

    # -- the journal --------------------------------------------------------------------------------------------

    def sync(self) -> int:
        """Replay the journal now, cool-down or not; returns how many operations MLflow took (:meth:`pending`
        counts what is left, :attr:`last_error` says why)."""
        if not self._journal_size():
            return 0
        with self._short_http():
            done, error = self._flush()
        if error is None:
            self._back_online(done)
        else:
            self._went_offline(error)
        return done

    def pending(self) -> int:
        """How many operations the journal holds (0 without a journal)."""
        return len(self._read()) if self._journal_size() else 0

    def pending_runs(self) -> int:
        """How many runs the journaled operations touch."""
        return len({rec.get("run") or rec.get("id") for rec in self._read()}) if self._journal_size() else 0

    def pending_message(self) -> str | None:
        """One line for the end of a study: what is still to be pushed to MLflow and how, else None."""
        n = self.pending()
        if n and self.journal_dir is not None:
            out = self.journal_dir.parent.parent if self.journal_dir.parent.name == "summary" else None
            command = (f"`python -m dcl_core.study.sync {out} --name {self.journal_dir.name}`" if out else
                       f"StudyTracker(..., journal_dir={str(self.journal_dir)!r}).sync()")
            return (f"MLflow was unreachable: {n} operations for {self.pending_runs()} runs are in {self.journal}; "
                    f"{command} (or the study's --resume) pushes them")
        if self.dropped:
            return f"MLflow: {self.dropped} tracking operations were not logged (see the warnings above)"
        return None

    def _run(self, rec: dict[str, Any], prepare: Any = None) -> Any:
        """Apply ``rec`` now, after the journal (so MLflow takes everything in order); if MLflow is down (or
        known to be, within the cool-down) journal it. Returns what the operation returns (a run id; a
        placeholder when journaled)."""
        if time.monotonic() >= self._offline_until:
            try:
                with self._short_http():
                    done = 0
                    if self._journal_size():
                        done, error = self._flush()
                        if error is not None:
                            raise error
                    result = self._apply(rec)
                self._ids.pop(rec.get("id", ""), None)  # only runs made by a replay need the id map
                self._back_online(done)
                return result
            except Exception as exc:  # tracking never stops the study
                if _refused(exc):
                    self._drop(rec, exc)
                    return rec.get("id")
                self._went_offline(exc)
        self._append(rec, prepare)
        return rec.get("id")

    def _apply(self, rec: dict[str, Any]) -> str | None:
        """One journal record against MLflow (live or replayed alike)."""
        op = rec["op"]
        if op == "open":
            return self._apply_open(rec)
        if op == "trial_run":
            return self._apply_trial_run(rec)
        run = self._real(rec["run"])
        if run.startswith(LOCAL_ID):
            raise _UnreplayableError(f"its run ({run}) was never created")
        self._check_mine(run)
        c = self.client
        if op == "metrics":
            items = [Metric(k, v, ts, step) for k, v, ts, step in rec["metrics"]]
            for i in range(0, len(items), _METRICS_PER_BATCH):
                c.log_batch(run, metrics=items[i : i + _METRICS_PER_BATCH])
        elif op == "params":
            existing = c.get_run(run).data.params
            self._log_params(run, {k: v for k, v in rec["params"].items() if k not in existing})
        elif op == "tag":
            c.set_tag(run, rec["key"], rec["value"])
        elif op == "dict":
            c.log_dict(run, rec["data"], rec["path"])
        elif op == "artifact":
            path = Path(rec["path"])
            if not path.exists():
                raise _UnreplayableError(f"{path} no longer exists")
            with self._upload_timeout(path):
                if path.is_dir():
                    c.log_artifacts(run, str(path), rec.get("artifact_path"))
                else:
                    c.log_artifact(run, str(path), rec.get("artifact_path"))
        elif op == "end":
            c.set_terminated(run, status=rec["status"], end_time=rec.get("time"))
        else:
            raise _UnreplayableError(f"unknown operation {op!r}")
        return None

    def _check_mine(self, run: str) -> None:
        """An operation may touch only runs of this study's experiment (a replayed line names any run id)."""
        if run in self._mine:
            return
        if self.client.get_run(run).info.experiment_id != self._experiment():
            raise _UnreplayableError(f"run {run} is not in experiment {self.experiment}")
        self._mine.add(run)

    def _apply_open(self, rec: dict[str, Any]) -> str:
        exp = self._experiment()
        if rec.get("overwrite"):  # only runs older than the study's start: a replay keeps what it made
            self.delete_runs(before_ms=rec["time"])
        found = self._search(f"tags.`{SUMMARY_TAG}` = 'true'")
        if found:
            run_id = found[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
        else:
            run_id = self.client.create_run(exp, start_time=rec["time"], run_name=rec.get("experiment"),
                                            tags=rec["tags"]).info.run_id
        self._ids[rec["id"]] = run_id
        self._mine.add(run_id)
        if self.parent_run_id in (None, rec["id"]):
            self.parent_run_id = run_id
        return run_id

    def _apply_trial_run(self, rec: dict[str, Any]) -> str:
        exp = self._experiment()
        found = self._search(f"tags.{TRIAL_TAG} = '{rec['trial_id']}'")
        params = rec["params"]
        if found:
            run_id = found[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
            params = {k: v for k, v in params.items() if k not in found[0].data.params}
        else:
            tags = dict(rec["tags"])
            if tags.get(MLFLOW_PARENT_RUN_ID):
                parent = self._real(tags[MLFLOW_PARENT_RUN_ID])
                if not parent.startswith(LOCAL_ID):
                    self._check_mine(parent)
                tags[MLFLOW_PARENT_RUN_ID] = "" if parent.startswith(LOCAL_ID) else parent
            run_id = self.client.create_run(exp, start_time=rec["time"], run_name=rec["name"], tags=tags).info.run_id
        self._ids[rec["id"]] = run_id
        self._mine.add(run_id)
        try:
            self._log_params(run_id, params)
        except MlflowException as exc:  # a refused param must not lose the run (its metrics, its status)
            if not _refused(exc):
                raise
            self._drop({"op": "params", "run": run_id}, exc)
        return run_id

    def _log_params(self, run_id: str, params: Mapping[str, str]) -> None:
        items = [Param(k, v) for k, v in params.items()]
        for i in range(0, len(items), _BATCH):
            self.client.log_batch(run_id, params=items[i : i + _BATCH])

    def _experiment(self) -> str:
        """The experiment's id: found by name, else created (local stores get an absolute artifact folder)."""
        if self.experiment_id is None:
            exp = self.client.get_experiment_by_name(self.experiment)
            if exp is not None:
                self.experiment_id = exp.experiment_id
                tags = dict(self.experiment_tags)  # this run's saved view replaces the last run's
                if EXPERIMENT_KIND_TAG not in exp.tags:  # made by an older version: MLflow would guess its kind
                    tags |= self._experiment_tags()
                for key, value in tags.items():
                    self.client.set_experiment_tag(exp.experiment_id, key, value)
            else:
                location = None
                if self.artifact_root is not None and not self.tracking_uri.startswith(
                        ("http://", "https://", "databricks")):
                    location = (self.artifact_root / self.experiment).resolve().as_uri()
                self.experiment_id = self.client.create_experiment(self.experiment, artifact_location=location,
                                                                   tags=self._experiment_tags())
        return self.experiment_id

    def _experiment_tags(self) -> dict[str, str]:
        """A model-training experiment described by the study's question, with the caller's tags (the study's
        saved view, :mod:`dcl_core.study.mlflow_view`). MLflow 3.0-3.x UIs chose an experiment's page by its kind
        tag and guessed GenAI without it; 3.17's follows a per-browser mode instead (README: browse the runs)."""
        tags = {EXPERIMENT_KIND_TAG: "custom_model_development", **self.experiment_tags}
        if self.description:
            tags["mlflow.note.content"] = self.description
        return tags

    def runs_url(self, ui: str = "http://127.0.0.1:5000") -> str:
        """The MLflow UI's runs view of this study's experiment (``ui``: where ``mlflow ui`` serves a local
        store; a tracking server's own address otherwise)."""
        base = self.tracking_uri if self.tracking_uri.startswith(("http://", "https://")) else ui
        # workflowType: MLflow 3's UI otherwise opens in its GenAI mode, on an empty traces overview.
        return f"{base.rstrip('/')}/#/experiments/{self.experiment_id or '?'}/runs?workflowType=machine_learning"

    def _search(self, filter_string: str) -> list[Any]:
        return self.client.search_runs([self._experiment()], filter_string=filter_string, max_results=1000)

    def _real(self, run_id: str) -> str:
        """The MLflow id of a run (a placeholder is looked up, also in what other trackers replayed)."""
        if not run_id.startswith(LOCAL_ID):
            return run_id
        if run_id not in self._ids and self.journal_dir is not None and (self.journal_dir / IDS_FILE).exists():
            with contextlib.suppress(OSError, ValueError):
                self._ids.update(json.loads((self.journal_dir / IDS_FILE).read_text()))
        return self._ids.get(run_id, run_id)

    def _flush(self) -> tuple[int, BaseException | None]:
        """Replay the journal in order until an operation fails transiently; keep only what is left. Returns
        (operations done, the transient error or None)."""
        done, error = 0, None
        with self._lock():
            records = self._read()
            try:
                for rec in records:
                    try:
                        self._apply(rec)
                    except Exception as exc:
                        if not _refused(exc):
                            error = exc
                            break
                        self._drop(rec, exc)
                    self._release(rec)
                    done += 1
            finally:
                self._write(records[done:])
        return done, error

    def _append(self, rec: dict[str, Any], prepare: Any = None) -> None:
        if self.journal_dir is None:
            self.dropped += 1
            return
        if rec["op"] == "open" and rec.get("overwrite"):  # the journal never deletes runs (a planted line could)
            rec = {**rec, "overwrite": False}
            log.warning("--overwrite: MLflow is unreachable, so the earlier runs of %s were not soft-deleted; they "
                        "stay beside the new ones (delete them in the UI, or run with --overwrite again)",
                        self.experiment)
        try:
            if prepare is not None:
                rec = prepare(rec)
            line = json.dumps(rec, default=str) + "\n"
            with self._lock(), open_append(self.journal_dir / JOURNAL_FILE) as f:
                f.write(line)
        except OSError as err:  # a full disk must not stop the study either
            self.dropped += 1
            log.warning("could not journal an MLflow operation in %s: %s", self.journal_dir, err)

    def _read(self) -> list[dict[str, Any]]:
        path = self.journal
        if path is None or not path.exists():
            return []
        records, ignored = [], []
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:  # a line cut short by a crash while it was written
                if line.strip():
                    log.warning("skipping an unreadable line of %s", path)
                continue
            why = journal_problem(rec, self.experiment, path.parent)
            if why is None:
                records.append(rec)
            else:
                ignored.append(why)
        if ignored:  # dropped from the journal at its next rewrite
            log.warning("ignoring %d line(s) of %s that this study cannot have written (the first: %s)",
                        len(ignored), path, ignored[0])
        return records

    def _write(self, records: list[dict[str, Any]]) -> None:
        """The journal after a replay: what is left (run ids made real where known), and the id map."""
        assert self.journal_dir is not None
        path = self.journal_dir / JOURNAL_FILE
        ids_path = self.journal_dir / IDS_FILE
        known: dict[str, str] = {}
        with contextlib.suppress(OSError, ValueError):
            known = json.loads(ids_path.read_text()) if ids_path.exists() else {}
        if any(k not in known for k in self._ids):
            _atomic_write(ids_path, json.dumps({**known, **self._ids}, indent=0))
        if not records:
            path.unlink(missing_ok=True)
            shutil.rmtree(self.journal_dir / FILES_DIR, ignore_errors=True)
            return
        for rec in records:
            if "run" in rec:
                rec["run"] = self._real(rec["run"])
            if rec.get("tags", {}).get(MLFLOW_PARENT_RUN_ID):
                rec["tags"][MLFLOW_PARENT_RUN_ID] = self._real(rec["tags"][MLFLOW_PARENT_RUN_ID])
        _atomic_write(path, "".join(json.dumps(r, default=str) + "\n" for r in records))

    def _journal_size(self) -> int:
        path = self.journal
        try:
            return path.stat().st_size if path is not None else 0
        except OSError:
            return 0

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        """An exclusive lock on the journal (the study and ``python -m dcl_core.study.sync`` may share it)."""
        assert self.journal_dir is not None
        self.journal_dir.mkdir(parents=True, exist_ok=True)
        with open_append(self.journal_dir / ".pending_mlflow.lock") as f:
            if fcntl is not None:
                fcntl.flock(f, fcntl.LOCK_EX)
            yield

    @contextlib.contextmanager
    def _short_http(self) -> Iterator[None]:
        """MLflow's HTTP client reads these on every request: few retries and a short timeout for this
        tracker's calls (MLflow's defaults, 7 retries with backoff and 120 s, held a study ~250 s per call on a
        dead server), and no waiting out a ``Retry-After``. A variable the user set is left alone."""
        wanted = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": str(self.http_retries),
                  "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
                  "MLFLOW_HTTP_REQUEST_TIMEOUT": str(self.http_timeout),
                  "MLFLOW_HTTP_RESPECT_RETRY_AFTER_HEADER": "false"}
        added = [k for k in wanted if k not in os.environ]
        os.environ.update({k: wanted[k] for k in added})
        self._env_added = added
        urllib3_log = logging.getLogger("urllib3.connectionpool")
        urllib3_log.addFilter(_quiet_retries)  # one warning per outage is ours; no "Retrying ..." per call
        try:
            yield
        finally:
            urllib3_log.removeFilter(_quiet_retries)
            self._env_added = []
            for k in added:
                os.environ.pop(k, None)

    @contextlib.contextmanager
    def _upload_timeout(self, path: Path) -> Iterator[None]:
        """A server proxying artifacts to remote storage answers an upload once it has stored it: the short
        timeout grows by 1 s per MB for a large artifact (a checkpoint)."""
        key = "MLFLOW_HTTP_REQUEST_TIMEOUT"
        if key not in self._env_added:
            yield
            return
        files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        os.environ[key] = str(self.http_timeout + sum(p.stat().st_size for p in files) // 1_000_000)
        try:
            yield
        finally:
            os.environ[key] = str(self.http_timeout)

    def _keep_copy(self, rec: dict[str, Any]) -> dict[str, Any]:
        """``rec`` logging a copy of its temporary file (or folder) kept in the journal folder."""
        assert self.journal_dir is not None
        src = Path(rec["path"])
        files = [src] if src.is_file() else [p for p in src.rglob("*") if p.is_file()]
        if sum(p.stat().st_size for p in files) > _MAX_COPY:
            log.warning("%s is too large to keep a copy for MLflow; journaled by its path", src)
            return rec
        dest = self.journal_dir / FILES_DIR / uuid.uuid4().hex / src.name
        dest.parent.mkdir(parents=True)
        if src.is_dir():
            shutil.copytree(src, dest)
        else:
            shutil.copy2(src, dest)
        return {**rec, "path": str(dest), "owned": True}

    def _release(self, rec: dict[str, Any]) -> None:
        if rec.get("owned") and self.journal_dir is not None:
            shutil.rmtree(Path(rec["path"]).parent, ignore_errors=True)

    def _went_offline(self, exc: BaseException) -> None:
        self._offline_until = time.monotonic() + self.cooldown
        self.last_error = _reason(exc)
        if self._outage:
            log.debug("MLflow still unreachable: %s", self.last_error)
            return
        self._outage = True
        where = f"journaled in {self.journal}" if self.journal is not None else "dropped (no journal folder)"
        log.warning("MLflow at %s is unreachable (%s); training goes on, tracking operations are %s and MLflow "
                    "is tried again every %g s", redact_uri(self.tracking_uri), self.last_error, where,
                    self.cooldown)

    def _back_online(self, pushed: int) -> None:
        self._offline_until = 0.0
        self.last_error = None
        if self._outage or pushed:
            log.info("MLflow at %s is reachable: %d journaled operations pushed, %d left",
                     redact_uri(self.tracking_uri), pushed, self.pending())
        self._outage = False

    def _drop(self, rec: dict[str, Any], exc: BaseException) -> None:
        """An operation MLflow will never take: warned once per kind of operation, then counted."""
        self.dropped += 1
        self._release(rec)
        if rec["op"] in self._warned_refused:
            log.debug("MLflow refused %s: %s", rec["op"], _reason(exc))
            return
        self._warned_refused.add(rec["op"])
        log.warning("MLflow refused an operation (%s on run %s): %s; it is dropped", rec["op"],
                    rec.get("run") or rec.get("trial_id") or self.experiment, _reason(exc))


def _move_credentials(uri: str) -> str:
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


def _local_id() -> str:
    return LOCAL_ID + uuid.uuid4().hex


def _atomic_write(path: Path, text: str) -> None:
    write_text(path, text)  # a fresh temporary name and a rename: never through a planted link


def _now_ms() -> int:
    return int(time.time() * 1000)


class MLflowTrialCallback(tune.Callback):
    """Logs every trial of a Tune experiment as a child run of the study (see :class:`StudyTracker`).

    Args:
        tracker: the study's tracker (opened: its parent run exists).
        tag_keys: per-trial tags from config keys, e.g. ``{"loss": "loss.name"}``.
        name_of: the run name of a trial (default: Tune's trial name).
        save_checkpoint: log the trial's final checkpoint as an artifact, read from the study's Ray
            ``storage`` (a DDP trial's checkpoint lives in its Ray Train run there).
    """

    def __init__(self, tracker: StudyTracker, tag_keys: Mapping[str, str], save_checkpoint: bool = False,
                 storage: str | None = None) -> None:
        self.tracker = tracker
        self.tag_keys = dict(tag_keys)
        self.save_checkpoint = save_checkpoint
        self.storage = storage
        self.runs: dict[str, str] = {}  # trial id -> run id
        self.logged: dict[str, int] = {}  # trial id -> last epoch its run already holds (a resumed trial)
        self.q_hists: dict[str, dict[int, list[float]]] = {}

    def _run_of(self, trial: Any) -> str:
        if trial.trial_id not in self.runs:
            tags = {tag: str(trial.config.get(key)) for tag, key in self.tag_keys.items()}
            tags["trial_name"] = str(trial)
            run_id = self.tracker.trial_run(trial.trial_id, str(trial), tags, trial.config)
            self.runs[trial.trial_id] = run_id
            self.logged[trial.trial_id] = self.tracker.last_step(run_id, M.TRAIN_LOSS)
        return self.runs[trial.trial_id]

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._run_of(trial)

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict, **info: Any) -> None:
        run_id = self._run_of(trial)
        step = int(result.get(M.EPOCH, result.get("training_iteration", iteration)))
        metrics = {k: v for k, v in result.items() if k.startswith(METRIC_PREFIXES) and k != M.KNN_FRESH}
        if not result.get(M.KNN_FRESH, 1.0):  # Tune's copy carries the last kNN forward; MLflow's curve has only
            metrics.pop(M.KNN_TOP1, None)  # the epochs that measured it (eval.knn_every)
        hist = result.get(M.Q_HIST)
        if isinstance(hist, list) and hist:
            self.q_hists.setdefault(trial.trial_id, {})[step] = hist
        if step <= self.logged.get(trial.trial_id, 0) and not result.get(M.DIVERGED):
            return  # an epoch retrained after a resume: its run already holds this point
        self.tracker.log_metrics(run_id, metrics, step)
        if result.get(M.DIVERGED):  # a flag, not a curve
            self.tracker.set_tag(run_id, "diverged", f"epoch {step}")
        if isinstance(hist, list) and hist:
            # DCL Fig. 1: the NPC multiplier's distribution this epoch, one small JSON per epoch.
            self.tracker.log_dict(run_id, {"epoch": step, "bin_edges": q_hist_edges(len(hist)), "fraction": hist},
                                  f"npc/q_hist_epoch{step:04d}.json")

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._end(trial, failed=False)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._end(trial, failed=True)

    def _end(self, trial: Any, failed: bool) -> None:
        run_id = self._run_of(trial)
        last = trial.last_result or {}
        diverged = bool(last.get(M.DIVERGED)) or bool(last.get(M.FAILED))
        if last.get(M.ERROR):
            self.tracker.set_tag(run_id, "error", str(last[M.ERROR])[:5000])
        knn = last.get(M.KNN_TOP1)
        varied = ", ".join(f"{tag} {trial.config.get(key)}" for tag, key in self.tag_keys.items())
        outcome = ("failed" if failed or diverged else
                   f"kNN top-1 {knn:.2f}% after {last.get(M.EPOCH)} epochs" if isinstance(knn, float) else "finished")
        self.tracker.set_tag(run_id, "mlflow.note.content", f"{varied}: {outcome}")  # the run's description
        hists = self.q_hists.pop(trial.trial_id, None)
        if hists:
            with tempfile.TemporaryDirectory() as d:
                png = plot_q_hist_epochs(hists, Path(d) / "q_hist.png", f"NPC multiplier q_B: {trial}")
                self.tracker.log_artifact(run_id, png, "npc", temporary=True)
        checkpoint = self._final_checkpoint(trial) if self.save_checkpoint else None
        if checkpoint is not None:
            # The checkpoint Tune keeps in the study's storage (the trial's driver-side folder holds none).
            with checkpoint.as_directory() as d:
                self.tracker.log_artifact(run_id, Path(d), "checkpoint", temporary=True)
        self.tracker.end_run(run_id, failed=failed or diverged)

    def _final_checkpoint(self, trial: Any) -> tune.Checkpoint | None:
        """Tune's checkpoint of an in-process trial; for a DDP trial, the Ray Train run's last checkpoint,
        whose path (on the storage's filesystem) ``TuneReportCallback`` forwarded with the metrics."""
        if trial.checkpoint is not None:
            return trial.checkpoint
        path = (trial.last_result or {}).get("checkpoint_path")
        if not path or not self.storage:
            return None
        fs, _ = pyarrow.fs.FileSystem.from_uri(self.storage)
        return tune.Checkpoint(path, filesystem=fs)
