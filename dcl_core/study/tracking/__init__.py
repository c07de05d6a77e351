"""The one place that talks to Ray's reporting API and to MLflow, so their API churn stays here; public APIs of
both only (``ray.tune.Callback``, ``tune.report`` / ``ray.train.report``, ``MlflowClient``).

A job a module:

- :mod:`.reporting`: the trainer's epoch callbacks reporting to Ray Tune / Ray Train, checkpoints Ray hands back,
  a trial's final report, where a trial's files go.
- :mod:`.preflight`: a tracking URI checked in seconds, before Ray starts.
- :mod:`.runs`: the study's runs in MLflow (its experiment, the parent run, a nested child run per trial, found
  again by their tags) and one tracking operation applied to MLflow.
- :mod:`.tracker`: :class:`StudyTracker`, the study's tracking operations, applied now or journaled: MLflow
  being down never stops a study.
- :mod:`.journal`: what MLflow did not take, on disk (``summary/<study>/pending_mlflow.jsonl``), replayed later
  (:meth:`StudyTracker.sync`, ``python -m dcl_core.study sync``); only lines a tracker can have written.
- :mod:`.transport`: short timeouts, credentials out of the URI, transient vs refused failures.
- :mod:`.callback`: :class:`MLflowTrialCallback`, the Tune callback logging every trial through the tracker.

The names below are the package's interface (a study pickled by Tune names ``dcl_core.study.tracking.X``).
"""

from dcl_core.study.plan.storage import redact_uri
from dcl_core.study.tracking.callback import METRIC_PREFIXES, MLflowTrialCallback
from dcl_core.study.tracking.journal import FILES_DIR, IDS_FILE, JOURNAL_FILE, LOCAL_ID, Journal, journal_problem
from dcl_core.study.tracking.preflight import check_store_in_folder, preflight
from dcl_core.study.tracking.reporting import (
    TrainReporter,
    TuneReporter,
    report_diverged,
    report_failed,
    restore_latest_checkpoint,
    trial_context,
)
from dcl_core.study.tracking.runs import SUMMARY_TAG, TRIAL_TAG, local_ui_port, runs_page
from dcl_core.study.tracking.tracker import StudyTracker, git_commit, metric_name

__all__ = [
    "FILES_DIR",
    "IDS_FILE",
    "JOURNAL_FILE",
    "LOCAL_ID",
    "METRIC_PREFIXES",
    "SUMMARY_TAG",
    "TRIAL_TAG",
    "Journal",
    "MLflowTrialCallback",
    "StudyTracker",
    "TrainReporter",
    "TuneReporter",
    "check_store_in_folder",
    "git_commit",
    "journal_problem",
    "local_ui_port",
    "metric_name",
    "preflight",
    "redact_uri",
    "report_diverged",
    "report_failed",
    "restore_latest_checkpoint",
    "runs_page",
    "trial_context",
]
