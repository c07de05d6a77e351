"""The one module that talks to Ray's reporting API and to MLflow, so their API churn stays here.

- :class:`TuneReporter` / :class:`TrainReporter`: epoch callbacks for the trainer that report metrics and the
  checkpoint to Ray Tune (in-process trials) or Ray Train (DDP workers under a TorchTrainer).
- :func:`restore_latest_checkpoint`: put the checkpoint Tune/Train hands back after a failure or a resumed
  study where the trainer's ``--resume`` finds it.
- :class:`StudyMLflowCallback`: Ray's ``MLflowLoggerCallback`` (one MLflow run per trial, logged from the
  driver), which also reuses a trial's run when a study resumes, adds per-trial tags and logs only our metrics.
- :func:`ensure_experiment`, :func:`log_summary_run`, :func:`default_tracking_uri`: the study summary run.
"""

from __future__ import annotations

import logging
import math
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dcl_core.training.checkpoint import CHECKPOINT_NAME

log = logging.getLogger(__name__)

METRIC_PREFIXES = ("train/", "eval/", "time/")
SUMMARY_TAG = "dcl.summary"
Q_HIST_KEY = "train/q_hist"  # a list (fractions per bin): logged as an artifact, not a metric


def metric_name(name: str) -> str:
    """An MLflow-valid metric name: characters MLflow rejects (``+ ( ) =`` …) become ``_``."""
    return re.sub(r"[^/\w.\- :]", "_", name)


# ------------------------------------------------------------------------------------------------------------
# Ray Tune / Ray Train reporting


def _report_dir(checkpoint: Path) -> tempfile.TemporaryDirectory:
    """A temporary directory holding (a hard link to) the checkpoint file, for Checkpoint.from_directory."""
    tmp = tempfile.TemporaryDirectory(prefix="dcl-ckpt-")
    target = Path(tmp.name) / CHECKPOINT_NAME
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
        fresh = "eval/knn_top1" in out
        if fresh:
            self.last_knn = out["eval/knn_top1"]
        out["eval/knn_top1"] = self.last_knn
        out["eval/knn_fresh"] = float(fresh)
        return out


class TuneReporter(_Reporter):
    """Epoch callback for a trainer running inside a Tune function trainable (one process)."""

    def __call__(self, epoch: int, metrics: dict[str, float], checkpoint: Path | None) -> None:
        from ray import tune

        if checkpoint is None:
            tune.report(self._complete(metrics))
            return
        with _report_dir(checkpoint) as d:
            tune.report(self._complete(metrics), checkpoint=tune.Checkpoint.from_directory(d))


class TrainReporter(_Reporter):
    """Epoch callback inside Ray Train workers; rank 0 attaches the checkpoint (forwarded to Tune)."""

    def __call__(self, epoch: int, metrics: dict[str, float], checkpoint: Path | None) -> None:
        import ray.train

        if checkpoint is None:
            ray.train.report(self._complete(metrics))
            return
        with _report_dir(checkpoint) as d:
            ray.train.report(self._complete(metrics), checkpoint=ray.train.Checkpoint.from_directory(d))


def restore_latest_checkpoint(output_dir: Path, in_train_worker: bool = False) -> bool:
    """Copy the latest reported checkpoint (if Ray has one for this trial) into ``output_dir``.

    Returns whether a checkpoint was restored, i.e. whether the trainer should resume.
    """
    if in_train_worker:
        import ray.train

        ckpt = ray.train.get_checkpoint()
    else:
        from ray import tune

        ckpt = tune.get_checkpoint()
    if ckpt is None:
        return False
    output_dir.mkdir(parents=True, exist_ok=True)
    with ckpt.as_directory() as d:
        src = Path(d) / CHECKPOINT_NAME
        if not src.exists():
            return False
        shutil.copy2(src, output_dir / CHECKPOINT_NAME)
    log.info("restored checkpoint from Ray into %s", output_dir)
    return True


def report_diverged(metrics: Mapping[str, float], message: str, in_train_worker: bool = False) -> None:
    """Final report of a trial whose loss became NaN/inf: it stops, and the table marks it diverged.

    It carries the last epoch's metrics (so the row and the MLflow curves end where training did); inside Ray
    Train every worker calls it, as every ``ray.train.report``."""
    final = {**metrics, "diverged": 1.0, "eval/knn_top1": math.nan}
    if in_train_worker:
        import ray.train

        ray.train.report(final)
    else:
        from ray import tune

        tune.report(final)
    log.warning("trial diverged: %s", message)


def trial_context() -> tuple[str, Path, Path]:
    """(trial id, trial directory, working directory) of the current Tune trial, both absolute.

    The trial directory is Tune's driver-side staging folder, uploaded to the study's storage at every
    experiment snapshot (every epoch here); the working directory is the trial's local scratch space, never
    uploaded. The trainer's own files (its checkpoint copy, metrics.jsonl) go to the scratch space: the
    checkpoint already reaches storage through ``tune.report``, and would otherwise be uploaded twice.
    """
    from ray import tune

    ctx = tune.get_context()
    trial_dir = Path(ctx.get_trial_dir()).resolve()
    try:
        work_dir = Path(ctx.get_storage().trial_working_directory).resolve()
    except (AttributeError, RuntimeError):  # an older or newer Ray without this storage context
        work_dir = trial_dir
    return ctx.get_trial_id(), trial_dir, work_dir


# ------------------------------------------------------------------------------------------------------------
# MLflow


def default_tracking_uri(output_dir: Path) -> str:
    """A local SQLite store under the study output directory (absolute, so Tune's chdir cannot break it)."""
    return f"sqlite:///{(output_dir / 'mlflow.db').resolve()}"


def ensure_experiment(tracking_uri: str, name: str, artifact_root: Path | None = None) -> str:
    """Get or create the MLflow experiment; local stores get an absolute artifact folder."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    location = None
    if artifact_root is not None and not tracking_uri.startswith(("http://", "https://", "databricks")):
        location = (artifact_root / name).resolve().as_uri()
    return client.create_experiment(name, artifact_location=location)


def delete_runs(tracking_uri: str, experiment_name: str) -> int:
    """Soft-delete every run of an experiment (``--overwrite``: the new study's trials replace the old ones);
    returns how many. ``mlflow gc`` purges them, ``MlflowClient.restore_run`` brings one back."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment_name)
    if exp is None:
        return 0
    runs = client.search_runs([exp.experiment_id], max_results=50_000)
    for run in runs:
        client.delete_run(run.info.run_id)
    if runs:
        log.info("--overwrite: deleted %d earlier MLflow runs of %s", len(runs), experiment_name)
    return len(runs)


def git_commit() -> str:
    """The repository's HEAD commit (``unknown`` outside a git checkout, e.g. under ``ray job submit``)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _make_logger_callback_class() -> type:
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    class _StudyMLflowCallback(MLflowLoggerCallback):
        """MLflowLoggerCallback with resume-safe runs, per-trial tags, and only training metrics.

        After a killed driver, Tune restores the trials but this callback starts empty; without the lookup
        below a resumed trial would get a second MLflow run. The trial id is stored as a tag and reused.
        """

        def __init__(self, *args: Any, tag_keys: Mapping[str, str] | None = None, save_checkpoint: bool = False,
                     storage: str | None = None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.tag_keys = dict(tag_keys or {})
            self.save_checkpoint = save_checkpoint
            self.storage = storage
            self.q_hists: dict[str, dict[int, list[float]]] = {}

        def log_trial_start(self, trial: Any) -> None:
            if trial not in self._trial_runs:
                client = self.mlflow_util._get_client()
                found = client.search_runs(
                    [self.mlflow_util.experiment_id], filter_string=f"tags.trial_id = '{trial.trial_id}'"
                )
                if found:
                    self._trial_runs[trial] = found[0].info.run_id
                    client.update_run(found[0].info.run_id, status="RUNNING")
                else:
                    tags = dict(self.tags)
                    tags["trial_id"] = trial.trial_id
                    for tag, key in self.tag_keys.items():
                        tags[tag] = str(trial.config.get(key))
                    self._saved_tags, self.tags = self.tags, tags
                    try:
                        super().log_trial_start(trial)
                    finally:
                        self.tags = self._saved_tags
                    return
            super().log_trial_start(trial)

        def log_trial_result(self, iteration: int, trial: Any, result: dict) -> None:
            metrics = {k: v for k, v in result.items() if k.startswith(METRIC_PREFIXES) or k == "diverged"}
            metrics = {k: v for k, v in metrics.items() if isinstance(v, int | float) and math.isfinite(v)}
            step = int(result.get("epoch", result.get("training_iteration", iteration)))
            run_id = self._trial_runs[trial]
            self.mlflow_util.log_metrics(run_id=run_id, metrics_to_log=metrics, step=step)
            hist = result.get(Q_HIST_KEY)
            if isinstance(hist, list) and hist:
                # DCL Fig. 1: the NPC multiplier's distribution this epoch, one small JSON per epoch.
                from dcl_core.reporting import q_hist_edges

                self.q_hists.setdefault(trial.trial_id, {})[step] = hist
                self.mlflow_util._get_client().log_dict(
                    run_id, {"epoch": step, "bin_edges": q_hist_edges(len(hist)), "fraction": hist},
                    f"npc/q_hist_epoch{step:04d}.json",
                )

        def log_trial_end(self, trial: Any, failed: bool = False) -> None:
            diverged = bool(trial.last_result.get("diverged")) if trial.last_result else False
            hists = self.q_hists.pop(trial.trial_id, None)
            client = self.mlflow_util._get_client()
            if hists and trial in self._trial_runs:
                from dcl_core.reporting import plot_q_hist_epochs

                with tempfile.TemporaryDirectory() as d:
                    png = plot_q_hist_epochs(hists, Path(d) / "q_hist.png", f"NPC multiplier q_B: {trial}")
                    client.log_artifact(self._trial_runs[trial], str(png), "npc")
            checkpoint = self._final_checkpoint(trial) if self.save_checkpoint else None
            if checkpoint is not None and trial in self._trial_runs:
                # The checkpoint Tune keeps in the study's storage (Ray's own save_artifact logs the driver's
                # staging folder, which holds no checkpoint).
                with checkpoint.as_directory() as d:
                    client.log_artifacts(self._trial_runs[trial], d, "checkpoint")
            super().log_trial_end(trial, failed=failed or diverged)

        def _final_checkpoint(self, trial: Any) -> Any:
            """Tune's checkpoint of an in-process trial; for a DDP trial, the Ray Train run's last checkpoint,
            whose path (on the storage's filesystem) ``TuneReportCallback`` forwarded with the metrics."""
            if trial.checkpoint is not None:
                return trial.checkpoint
            path = (trial.last_result or {}).get("checkpoint_path")
            if not path or not self.storage:
                return None
            import pyarrow.fs
            from ray import tune

            fs, _ = pyarrow.fs.FileSystem.from_uri(self.storage)
            return tune.Checkpoint(path, filesystem=fs)

    return _StudyMLflowCallback


def StudyMLflowCallback(  # noqa: N802 - a factory standing in for the class (keeps ray import lazy)
    tracking_uri: str, experiment_name: str, tags: Mapping[str, str], tag_keys: Mapping[str, str],
    save_artifact: bool = False, storage: str | None = None,
) -> Any:
    """One MLflow run per trial: every config value as a param, per-epoch metrics as curves, tags; with
    ``save_artifact`` the trial's final checkpoint (read from the study's Ray ``storage``)."""
    cls = _make_logger_callback_class()
    return cls(
        tracking_uri=tracking_uri, experiment_name=experiment_name, tags=dict(tags), tag_keys=tag_keys,
        save_checkpoint=save_artifact, storage=storage,
    )


def log_summary_run(
    tracking_uri: str, experiment_name: str, run_name: str, metrics: Mapping[str, float],
    artifacts: list[Path], tags: Mapping[str, str], params: Mapping[str, Any] | None = None,
) -> str:
    """The study summary run: robustness metrics, the results table (Parquet + CSV) and the plot.

    It replaces the experiment's earlier summary run (a resumed or re-run study summarizes all its trials
    again), which is deleted (MLflow's soft delete: ``mlflow gc`` purges it, ``restore_run`` brings it back).
    """
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    exp = client.get_experiment_by_name(experiment_name)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment_name)
    for old in client.search_runs([exp_id], filter_string=f"tags.`{SUMMARY_TAG}` = 'true'", max_results=1000):
        client.delete_run(old.info.run_id)
    run = client.create_run(exp_id, run_name=run_name, tags={SUMMARY_TAG: "true", **tags})
    rid = run.info.run_id
    for key, value in (params or {}).items():
        client.log_param(rid, key, value)
    for key, value in metrics.items():
        if isinstance(value, int | float) and math.isfinite(value):
            client.log_metric(rid, metric_name(key), float(value))
    for path in artifacts:
        client.log_artifact(rid, str(path))
    client.set_terminated(rid)
    return rid
