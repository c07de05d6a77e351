"""The one module that talks to Ray's reporting API and to MLflow, so their API churn stays here. Only public
APIs of both are used (``ray.tune.Callback``, ``tune.report`` / ``ray.train.report``, ``MlflowClient``).

- :class:`TuneReporter` / :class:`TrainReporter`: epoch callbacks for the trainer that report metrics and the
  checkpoint to Ray Tune (in-process trials) or Ray Train (DDP workers under a TorchTrainer);
  :func:`restore_latest_checkpoint` puts the checkpoint Ray hands back after a failure or a resumed study where
  the trainer's resume finds it; :func:`report_diverged`, :func:`trial_context`.
- :class:`StudyTracker`: one ``MlflowClient`` and the study's experiment. A study is one parent run (the
  summary lives on it) with one nested child run per trial (``mlflow.parentRunId``), so MLflow's UI folds a
  study's trials under one row. A resumed study finds its parent and children again by their tags.
- :class:`MLflowTrialCallback`: a public ``ray.tune.Callback`` that logs each trial through the tracker, from
  the driver: every config value as a param, per-epoch curves, the q_B histograms, the final status.
"""

from __future__ import annotations

import logging
import math
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow.fs
import ray.train
from mlflow.entities import Metric, Param
from mlflow.tracking import MlflowClient
from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID
from ray import tune

from dcl_core import metrics as M
from dcl_core.study.report import plot_q_hist_epochs, q_hist_edges

log = logging.getLogger(__name__)

METRIC_PREFIXES = ("train/", "eval/", "time/")
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
# MLflow


class StudyTracker:
    """A study's MLflow experiment through one ``MlflowClient``: the parent run, a child run per trial, the
    summary on the parent.

    Picklable (Tune saves its callbacks with the experiment, and restores them on ``--resume``): the client is
    dropped when pickled and made again on first use.
    """

    def __init__(self, tracking_uri: str, experiment: str, artifact_root: Path | None = None,
                 tags: Mapping[str, str] | None = None) -> None:
        self.tracking_uri = tracking_uri
        self.experiment = experiment
        self.artifact_root = artifact_root
        self.tags = dict(tags or {})
        self.experiment_id: str | None = None
        self.parent_run_id: str | None = None
        self._client: MlflowClient | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_client": None}

    @property
    def client(self) -> MlflowClient:
        if self._client is None:
            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    def open(self, overwrite: bool = False) -> StudyTracker:
        """Get or create the experiment (local stores get an absolute artifact folder); with ``overwrite``
        soft-delete its earlier runs; then find (a resumed study) or create the parent run."""
        exp = self.client.get_experiment_by_name(self.experiment)
        if exp is not None:
            self.experiment_id = exp.experiment_id
        else:
            location = None
            if self.artifact_root is not None and not self.tracking_uri.startswith(
                    ("http://", "https://", "databricks")):
                location = (self.artifact_root / self.experiment).resolve().as_uri()
            self.experiment_id = self.client.create_experiment(self.experiment, artifact_location=location)
        if overwrite:
            self.delete_runs()
        found = self._search(f"tags.`{SUMMARY_TAG}` = 'true'")
        if found:
            self.parent_run_id = found[0].info.run_id
            self.client.update_run(self.parent_run_id, status="RUNNING")
        else:
            run = self.client.create_run(self.experiment_id, run_name=self.experiment,
                                         tags={SUMMARY_TAG: "true", **self.tags})
            self.parent_run_id = run.info.run_id
        return self

    def _search(self, filter_string: str) -> list[Any]:
        return self.client.search_runs([self.experiment_id], filter_string=filter_string, max_results=1000)

    def delete_runs(self) -> int:
        """Soft-delete every run of the experiment (``--overwrite``: the new trials replace the old ones);
        returns how many. ``mlflow gc`` purges them, ``MlflowClient.restore_run`` brings one back."""
        runs = self.client.search_runs([self.experiment_id], max_results=50_000)
        for run in runs:
            self.client.delete_run(run.info.run_id)
        if runs:
            log.info("--overwrite: deleted %d earlier MLflow runs of %s", len(runs), self.experiment)
        return len(runs)

    def trial_run(self, trial_id: str, name: str, tags: Mapping[str, str], params: Mapping[str, Any]) -> str:
        """The child run of a trial: found by its trial id (a resumed or retried trial), else created with
        the study's tags, ``tags`` and every param."""
        found = self._search(f"tags.{TRIAL_TAG} = '{trial_id}'")
        if found:
            run_id = found[0].info.run_id
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        all_tags = {**self.tags, **tags, TRIAL_TAG: trial_id, MLFLOW_PARENT_RUN_ID: self.parent_run_id or ""}
        run = self.client.create_run(self.experiment_id, run_name=name, tags=all_tags)
        items = [Param(k, str(v)) for k, v in params.items()]
        for i in range(0, len(items), _BATCH):
            self.client.log_batch(run.info.run_id, params=items[i : i + _BATCH])
        return run.info.run_id

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        """Finite numbers only (a NaN marks a missing measurement, not a value to plot)."""
        now = _now_ms()
        items = [Metric(metric_name(k), float(v), now, step) for k, v in metrics.items()
                 if isinstance(v, int | float) and math.isfinite(v)]
        if items:
            self.client.log_batch(run_id, metrics=items)

    def log_dict(self, run_id: str, data: Mapping[str, Any], path: str) -> None:
        self.client.log_dict(run_id, dict(data), path)

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None) -> None:
        if path.is_dir():
            self.client.log_artifacts(run_id, str(path), artifact_path)
        else:
            self.client.log_artifact(run_id, str(path), artifact_path)

    def end_run(self, run_id: str, failed: bool = False) -> None:
        self.client.set_terminated(run_id, status="FAILED" if failed else "FINISHED")

    def log_summary(self, metrics: Mapping[str, float], artifacts: list[Path],
                    params: Mapping[str, Any] | None = None) -> str:
        """The study summary on the parent run (metrics, the results table, the plots), which then finishes.

        A resumed study summarizes all its trials again: metrics get a new point, artifacts are replaced."""
        if self.parent_run_id is None:
            self.open()
        rid = self.parent_run_id
        assert rid is not None
        existing = self.client.get_run(rid).data.params
        new = [Param(k, str(v)) for k, v in (params or {}).items() if k not in existing]
        if new:
            self.client.log_batch(rid, params=new)
        self.log_metrics(rid, metrics)
        for path in artifacts:
            self.log_artifact(rid, path)
        self.end_run(rid)
        return rid


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
        self.q_hists: dict[str, dict[int, list[float]]] = {}

    def _run_of(self, trial: Any) -> str:
        if trial.trial_id not in self.runs:
            tags = {tag: str(trial.config.get(key)) for tag, key in self.tag_keys.items()}
            tags["trial_name"] = str(trial)
            self.runs[trial.trial_id] = self.tracker.trial_run(trial.trial_id, str(trial), tags, trial.config)
        return self.runs[trial.trial_id]

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._run_of(trial)

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict, **info: Any) -> None:
        run_id = self._run_of(trial)
        step = int(result.get(M.EPOCH, result.get("training_iteration", iteration)))
        metrics = {k: v for k, v in result.items() if k.startswith(METRIC_PREFIXES) or k == M.DIVERGED}
        self.tracker.log_metrics(run_id, metrics, step)
        hist = result.get(M.Q_HIST)
        if isinstance(hist, list) and hist:
            # DCL Fig. 1: the NPC multiplier's distribution this epoch, one small JSON per epoch.
            self.q_hists.setdefault(trial.trial_id, {})[step] = hist
            self.tracker.log_dict(run_id, {"epoch": step, "bin_edges": q_hist_edges(len(hist)), "fraction": hist},
                                  f"npc/q_hist_epoch{step:04d}.json")

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._end(trial, failed=False)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self._end(trial, failed=True)

    def _end(self, trial: Any, failed: bool) -> None:
        run_id = self._run_of(trial)
        diverged = bool((trial.last_result or {}).get(M.DIVERGED))
        hists = self.q_hists.pop(trial.trial_id, None)
        if hists:
            with tempfile.TemporaryDirectory() as d:
                png = plot_q_hist_epochs(hists, Path(d) / "q_hist.png", f"NPC multiplier q_B: {trial}")
                self.tracker.log_artifact(run_id, png, "npc")
        checkpoint = self._final_checkpoint(trial) if self.save_checkpoint else None
        if checkpoint is not None:
            # The checkpoint Tune keeps in the study's storage (the trial's driver-side folder holds none).
            with checkpoint.as_directory() as d:
                self.tracker.log_artifact(run_id, Path(d), "checkpoint")
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
