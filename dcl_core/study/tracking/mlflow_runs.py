"""A study's runs in MLflow (:class:`StudyRuns`), through one ``MlflowClient``: its experiment (found by name, else
created with its kind, description and saved views), the parent run (found again by the id its tracker recorded,
:mod:`.summary_run`) and each trial's child run (found again by its tag), so a resumed study never duplicates them;
one tracking operation applied to MLflow (live or replayed from the journal alike); metric names and values as
MLflow takes them. What to do when MLflow is down is :class:`~dcl_core.study.tracking.tracker.StudyTracker`'s."""

from __future__ import annotations

import hashlib
import logging
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from dcl_core.config import ConfigError
from dcl_core.study.plan.storage import redact_uri
from dcl_core.study.tracking import summary_run, transport
from dcl_core.study.tracking.journal import LOCAL_ID, Journal
from dcl_core.study.tracking.mlflow_view import CELL_TAG, FIGURE_GROUP, FIGURE_KEY, runs_view, runs_view_query

log = logging.getLogger(__name__)

EXPERIMENT_KIND_TAG = "mlflow.experimentKind"  # MLflow 3: custom_model_development or genai_development
SUMMARY_TAG = "dcl.summary"  # "true" on a study's parent run, which holds its summary
TRIAL_TAG = "trial_id"  # a trial's Tune id on its child run: a resumed study logs to the same run
FIGURE_TAG = "dcl.figure"  # "true" on the run holding the study's figure as an image (the compare view's first chart)
MLFLOW_PORT_ENV = "MLFLOW_PORT"  # what `mlflow ui` / `mlflow server` read for their --port (default 5000)
_BATCH = 100  # MLflow's log_batch accepts at most 100 params per call
_METRICS_PER_BATCH = 1000  # MLflow's log_batch limit


MAX_KEY = 250  # MLflow's longest metric key: one longer fails the whole batch (a study's every summary metric)


def metric_name(name: str) -> str:
    """An MLflow-valid metric name: characters MLflow rejects (``+ ( ) =`` …) become ``_``; a name longer than
    MLflow takes is cut, with a digest of the whole name appended so that two long names stay two metrics."""
    clean = re.sub(r"[^/\w.\- :]", "_", name)
    if len(clean) > MAX_KEY:
        clean = f"{clean[:MAX_KEY - 9]}_{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return clean


SIGNIFICANT_DIGITS = 6  # of a metric value logged to MLflow


def rounded(value: float) -> float:
    """A metric as MLflow should show it: 6 significant digits, integers untouched. MLflow's table and charts print
    the double in full, and a float32 measurement is noise from its 8th digit on: 28.2 arrives as
    28.200000762939453. Float32's own shortest repr would clean that one but not a float32 scaled in float64
    (100 · float32(0.075) = 7.500000298023224, no float32 at all); 6 digits clean both and still resolve more than
    any metric here measures (kNN top-1 on 10,000 images moves in steps of 0.01, its 4th digit)."""
    if not math.isfinite(value) or value.is_integer():
        return value
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")



class StudyRuns:
    """A study's runs in one MLflow store, through one ``MlflowClient``: its experiment (found by name, else created),
    the summary run, a child run per trial, and :meth:`apply` of one operation record to them (live, or replayed
    from the journal alike). Knows nothing of outages: an operation MLflow does not take raises, and the
    :class:`~dcl_core.study.tracking.tracker.StudyTracker` that holds these runs journals it; a trial's params
    MLflow refuses for good go to ``on_refused`` (the tracker counts and warns), the run stays.

    Args:
        tracking_uri: the store, credentials already moved out (:func:`transport.move_credentials`).
        experiment: the experiment's name (the study's).
        artifact_root: where a local store's new experiment keeps its artifacts (an absolute folder).
        journal_dir: the study's journal folder: where the summary run's id is recorded (:mod:`.summary_run`) and
            the ids of runs a replay made are found.
        description: the experiment's description (the study's question).
        experiment_tags: the caller's tags on the experiment (saved views).
        http_timeout: seconds an upload may take per call (grown for a large artifact).
    """

    def __init__(self, tracking_uri: str, experiment: str, *, artifact_root: Path | None = None,
                 journal_dir: Path | None = None, description: str = "",
                 experiment_tags: Mapping[str, str] | None = None, http_timeout: int = 10) -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.artifact_root = artifact_root
        self.journal_dir = journal_dir
        self.description = description
        self.experiment_tags = dict(experiment_tags or {})
        self.http_timeout = http_timeout
        self.experiment_id: str | None = None
        self.ids: dict[str, str] = {}  # placeholder run id -> MLflow run id, for the runs a replay made
        self.env_added: list[str] = []  # the MLflow env vars the caller's short-HTTP block set (not the user's)
        self.on_refused: Callable[[dict[str, Any], BaseException], None] = _warn_refused
        self._client: MlflowClient | None = None
        self._mine: set[str] = set()  # run ids known to be in this study's experiment
        self._summary_ids: set[str] = set()  # run ids of the study's summary run

    def __getstate__(self) -> dict[str, Any]:
        # the client is made again on first use; the holder sets its own on_refused again
        return {**self.__dict__, "_client": None, "env_added": [], "on_refused": _warn_refused}

    @property
    def client(self) -> MlflowClient:
        """The MLflow client of the tracking URI, made on first use."""
        if self._client is None:
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def delete_runs(self, before_ms: int | None = None) -> int:
        """Soft-delete every run of the experiment (started before ``before_ms``: ``--overwrite``, the new
        trials replace the old ones); returns how many. ``mlflow gc`` purges them, ``MlflowClient.restore_run``
        brings one back."""
        found = self.client.search_runs([self._experiment()], max_results=50_000)
        runs = [r for r in found if before_ms is None or (r.info.start_time or 0) < before_ms]
        for run in runs:
            self.client.delete_run(run.info.run_id)
        if runs:
            log.info("--overwrite: deleted %d earlier MLflow runs of %s", len(runs), self.experiment)
        return len(runs)

    def apply(self, rec: dict[str, Any]) -> str | None:
        """One operation record against MLflow (live or replayed alike): the run id an ``open`` or ``trial_run``
        made or found, else None. Raises what MLflow raises; :class:`transport.UnreplayableError` for a record
        that cannot be applied (its run never created, not in this experiment, its file gone)."""
        op = rec["op"]
        if op == "open":
            return self._apply_open(rec)
        if op == "trial_run":
            return self._apply_trial_run(rec)
        run = self.real(rec["run"])
        if run.startswith(LOCAL_ID):
            raise transport.UnreplayableError(f"its run ({run}) was never created")
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
                raise transport.UnreplayableError(f"{path} no longer exists")
            with transport.upload_timeout(path, self.http_timeout, self.env_added):
                if path.is_dir():
                    c.log_artifacts(run, str(path), rec.get("artifact_path"))
                else:
                    c.log_artifact(run, str(path), rec.get("artifact_path"))
        elif op == "end":
            c.set_terminated(run, status=rec["status"], end_time=rec.get("time"))
        elif op == "figure":
            self._apply_figure(run, Path(rec["path"]), rec["name"])
        else:
            raise transport.UnreplayableError(f"unknown operation {op!r}")
        return None

    def _apply_figure(self, parent: str, path: Path, name: str) -> None:
        """The study's figure as the one image of its own run, nested under the summary run ``parent``: the
        compare view's first chart, an MLflow image grid, shows the images of the runs the view lists, and the
        view leaves the summary run out (its hundred metrics would each get a chart). The previous figure's run is
        deleted (a figure run under ``parent``, never a trial's), so a resumed or re-analysed study shows its latest
        figure only."""
        from PIL import Image  # Pillow (matplotlib's own dependency): only when a figure is logged

        for old in self._search(f"tags.`{FIGURE_TAG}` = 'true'"):
            tags = old.data.tags
            # only a figure run this summary run holds: a tag written onto a trial's or another run never deletes it
            if tags.get(MLFLOW_PARENT_RUN_ID) == parent and TRIAL_TAG not in tags and tags.get(SUMMARY_TAG) != "true":
                self.client.delete_run(old.info.run_id)
        run = self.client.create_run(self._experiment(), run_name=name, tags={
            # a group of its own in the compare view (cells unfold, "Additional runs" stays folded, and the image
            # grid shows only the runs of unfolded groups)
            FIGURE_TAG: "true", MLFLOW_PARENT_RUN_ID: parent, CELL_TAG: FIGURE_GROUP,
            "mlflow.note.content": "The study's figure (also on the study's run, with its table and verdict)."})
        run_id = run.info.run_id
        self._mine.add(run_id)
        with Image.open(path) as image:
            self.client.log_image(run_id, image.convert("RGB"), key=FIGURE_KEY, step=0)
        self.client.set_terminated(run_id)

    def is_summary_run(self, run: str) -> bool:
        """Whether ``run`` (a real id) is the study's summary run: opened here, or tagged so in MLflow."""
        if run in self._summary_ids:
            return True
        if run.startswith(LOCAL_ID) or run in self._mine:
            return False
        if self.client.get_run(run).data.tags.get(SUMMARY_TAG) == "true":
            self._summary_ids.add(run)
            return True
        return False

    def _check_mine(self, run: str) -> None:
        """An operation may touch only runs of this study's experiment (a replayed line names any run id)."""
        if run in self._mine:
            return
        if self.client.get_run(run).info.experiment_id != self._experiment():
            raise transport.UnreplayableError(f"run {run} is not in experiment {self.experiment}")
        self._mine.add(run)

    def _apply_open(self, rec: dict[str, Any]) -> str:
        exp = self._experiment()
        if rec.get("overwrite"):  # only runs older than the study's start: a replay keeps what it made
            self.delete_runs(before_ms=rec["time"])
        found = self._summary_run()
        if found is not None:
            run_id = found.info.run_id
            self.client.update_run(run_id, status="RUNNING")
            self._add_missing_tags(found, rec["tags"])
        else:
            run_id = self.client.create_run(exp, start_time=rec["time"], run_name=rec.get("experiment"),
                                            tags=rec["tags"]).info.run_id
            if self.journal_dir is not None:
                summary_run.record(self.journal_dir, run_id)
        self.ids[rec["id"]] = run_id
        self._mine.add(run_id)
        self._summary_ids.add(run_id)
        return run_id

    def _summary_run(self) -> Any:
        """The study's summary run in this store, or None: a run its tracker recorded (:mod:`.summary_run`, never a
        run found by its tag, which anyone who can write the store can set) that is a live run of the study's
        experiment. A tracker with no folder to record in (a program's own, not a study's) finds it by its tag."""
        if self.journal_dir is None:
            found = self._search(f"tags.`{SUMMARY_TAG}` = 'true'")
            return found[0] if found else None
        for run_id in reversed(summary_run.recorded(self.journal_dir)):
            try:
                run = self.client.get_run(run_id)
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_DOES_NOT_EXIST":  # MLflow down: journaled, tried again later
                    raise
                continue  # a run of another store (the study logs to one, `answer` may log to another)
            if run.info.experiment_id == self._experiment() and run.info.lifecycle_stage == "active":
                return run
        return None

    def _apply_trial_run(self, rec: dict[str, Any]) -> str:
        exp = self._experiment()
        found = self._search(f"tags.{TRIAL_TAG} = '{rec['trial_id']}'")
        params = rec["params"]
        if found:
            run_id = found[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
            params = {k: v for k, v in params.items() if k not in found[0].data.params}
            self._add_missing_tags(found[0], rec["tags"])
        else:
            tags = dict(rec["tags"])
            if tags.get(MLFLOW_PARENT_RUN_ID):
                parent = self.real(tags[MLFLOW_PARENT_RUN_ID])
                if not parent.startswith(LOCAL_ID):
                    self._check_mine(parent)
                tags[MLFLOW_PARENT_RUN_ID] = "" if parent.startswith(LOCAL_ID) else parent
            run_id = self.client.create_run(exp, start_time=rec["time"], run_name=rec["name"], tags=tags).info.run_id
        self.ids[rec["id"]] = run_id
        self._mine.add(run_id)
        try:
            self._log_params(run_id, params)
        except MlflowException as exc:  # a refused param must not lose the run (its metrics, its status)
            if not transport.is_refused(exc):
                raise
            self.on_refused({"op": "params", "run": run_id}, exc)
        return run_id

    def _add_missing_tags(self, run: Any, tags: Mapping[str, str]) -> None:
        """Set the ``tags`` a found run lacks: one made by an older version has none of those added since (its
        cell, its colour), which the saved view needs. The parent link is never rewritten."""
        missing = [RunTag(k, v) for k, v in tags.items() if k not in run.data.tags and k != MLFLOW_PARENT_RUN_ID]
        if missing:
            self.client.log_batch(run.info.run_id, tags=missing)

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
                tags = self._view_tags()  # this run's saved views replace the last run's
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
        """A model-training experiment described by the study's question, with its saved views (the runs view and
        the caller's tags, the study's compare view: :mod:`.mlflow_view`). MLflow 3.0-3.x UIs chose
        an experiment's page by its kind tag and guessed GenAI without it; 3.17's follows a per-browser mode
        instead (docs/outputs.md)."""
        tags = {EXPERIMENT_KIND_TAG: "custom_model_development", **self._view_tags()}
        if self.description:
            tags["mlflow.note.content"] = self.description
        return tags

    def _view_tags(self) -> dict[str, str]:
        """The caller's experiment tags and the runs view :meth:`runs_url` opens: every tracker writes that view
        (not only a study's runner), so every URL it prints opens a view that exists."""
        return dict([runs_view().tag()]) | self.experiment_tags

    def runs_url(self, view: str = "") -> str:
        """The MLflow UI's runs table of this study's experiment, safe to print (:func:`redact_uri`), in the saved
        view that shows each run's Description, a study's verdict (:func:`~.mlflow_view.runs_view`;
        MLflow 3.17 hides that column by default), or in the view whose URL query is ``view``
        (:func:`~dcl_core.study.tracking.mlflow_view.view_query`): on a tracking server, at its own address; for a local
        store, where ``mlflow ui`` serves it (127.0.0.1, :func:`local_ui_port`). Only the address is redacted: the
        query's ``viewStateShareKey`` names a view, not a secret, yet reads as one to :func:`redact_uri`."""
        return self._ui_base() + runs_page(self.experiment_id or "?", view)

    def run_url(self, run_id: str | None) -> str:
        """The MLflow UI's page of one run (for the summary run: its description, the answer: the verdicts in
        full, the cells with their intervals, the study's figure), as :meth:`runs_url` addresses the UI; "" for a
        run MLflow has not created yet (a placeholder of an unreachable server)."""
        real = self.real(run_id) if run_id else ""
        if not real or real.startswith(LOCAL_ID):
            return ""
        return self._ui_base() + run_page(self.experiment_id or "?", real)

    def _ui_base(self) -> str:
        remote = self.tracking_uri.startswith(("http://", "https://"))
        base = redact_uri(self.tracking_uri) if remote else f"http://127.0.0.1:{local_ui_port()}"
        return base.rstrip("/")

    def _search(self, filter_string: str) -> list[Any]:
        return self.client.search_runs([self._experiment()], filter_string=filter_string, max_results=1000)

    def real(self, run_id: str) -> str:
        """The MLflow id of a run (a placeholder is looked up, also in what other trackers of the study replayed:
        the journal folder's id map); a placeholder no replay made real is returned as it is."""
        if not run_id.startswith(LOCAL_ID):
            return run_id
        if run_id not in self.ids and self.journal_dir is not None:
            self.ids.update(Journal(self.journal_dir, self.experiment).known_ids())
        return self.ids.get(run_id, run_id)


def _warn_refused(rec: dict[str, Any], exc: BaseException) -> None:
    """An operation MLflow refused for good, where no holder counts it: a warning."""
    log.warning("MLflow refused an operation (%s on run %s): %s; it is dropped", rec["op"], rec.get("run"),
                transport.reason(exc))


def log_trial_files(tracking_uri: str, experiment: str, trial_id: str, files: Sequence[Path], folder: str) -> str:
    """Log ``files`` into ``folder`` of the MLflow run of a study's trial (found by its ``trial_id`` tag in the
    study's experiment); the run's id. ConfigError (one line) when there is no such run."""
    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment)
    runs = [] if exp is None else client.search_runs([exp.experiment_id], f"tags.{TRIAL_TAG} = '{trial_id}'",
                                                     max_results=2)
    if not runs:
        raise ConfigError(f"{redact_uri(tracking_uri)} has no run of trial {trial_id} in experiment {experiment!r} "
                          "(--tracking-uri names the store the study logged to)")
    run_id = str(runs[0].info.run_id)
    for path in files:
        try:
            client.log_artifact(run_id, str(path), folder)
        except (MlflowException, OSError) as exc:  # e.g. the run's artifact folder linked outside: MLflow refuses
            raise ConfigError(f"cannot log {path.name} to {folder}/ of run {run_id}: {transport.reason(exc)}") from None
    return run_id


def runs_page(experiment_id: str, view: str = "") -> str:
    """The path and query, after the UI's address, of an experiment's runs page in the runs view, or in the view
    whose URL query is ``view`` (what :meth:`StudyRuns.runs_url` prints; the browser check opens the same).
    ``workflowType``: MLflow 3's UI otherwise opens in its GenAI mode, on an empty traces overview."""
    return f"/#/experiments/{experiment_id}/runs?workflowType=machine_learning&{view or runs_view_query()}"


def run_page(experiment_id: str, run_id: str) -> str:
    """The path, after the UI's address, of one run's page (its description first), in the UI's model-training
    mode: in its GenAI mode (a browser's default in MLflow 3.17) the page is an evaluation run's."""
    return f"/#/experiments/{experiment_id}/runs/{run_id}?workflowType=machine_learning"


def local_ui_port() -> int:
    """The port ``mlflow ui`` will serve on: ``MLFLOW_PORT`` if the user set it (``mlflow ui`` reads it too),
    else MLflow's default 5000; a study prints it in its ``mlflow ui`` command and in its URLs, so they agree."""
    value = os.environ.get(MLFLOW_PORT_ENV, "").strip()
    return int(value) if value.isdigit() and 0 < int(value) < 65536 else 5000
