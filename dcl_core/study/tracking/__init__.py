"""The one place that talks to Ray's reporting API and to MLflow, so their API churn stays here; public APIs of
both only (``ray.tune.Callback``, ``tune.report`` / ``ray.train.report``, ``MlflowClient``).

A job a module:

- :mod:`.trial_reporters`: the trainer's epoch callbacks reporting to Ray Tune / Ray Train, checkpoints Ray hands back,
  a trial's final report, where a trial's files go.
- :mod:`.preflight`: a tracking URI checked in seconds, before Ray starts.
- :mod:`.mlflow_runs`: :class:`StudyRuns`, the study's runs in MLflow (its experiment, the parent run, a nested child
  run per trial, found again by their tags), one tracking operation applied to them, and metrics as MLflow takes them.
- :mod:`.tracker`: :class:`StudyTracker`, the study's tracking operations, applied now (through its ``runs``) or
  journaled: MLflow being down never stops a study.
- :mod:`.journal`: what MLflow did not take, on disk (``summary/<study>/pending_mlflow.jsonl``), replayed later
  (:meth:`StudyTracker.sync`, ``python -m dcl_core.study sync``); only lines a tracker can have written.
- :mod:`.transport`: short timeouts, credentials out of the URI, transient vs refused failures.
- :mod:`.callback`: :class:`MLflowTrialCallback`, the Tune callback logging every trial through the tracker.

The names below are the package's interface (a study pickled by Tune names ``dcl_core.study.tracking.X``), each
imported from its module on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Imported now: the function ``preflight`` would otherwise lose its name to its module once that is imported.
from dcl_core.study.tracking.preflight import check_store_in_folder, preflight

if TYPE_CHECKING:
    from dcl_core.study.plan.storage import redact_uri
    from dcl_core.study.tracking.callback import METRIC_PREFIXES, MLflowTrialCallback
    from dcl_core.study.tracking.journal import (
        FILES_DIR,
        IDS_FILE,
        JOURNAL_FILE,
        LOCAL_ID,
        Journal,
        journal_problem,
    )
    from dcl_core.study.tracking.mlflow_runs import SUMMARY_TAG, TRIAL_TAG, local_ui_port, metric_name, runs_page
    from dcl_core.study.tracking.tracker import StudyTracker, git_commit
    from dcl_core.study.tracking.trial_reporters import (
        TrainReporter,
        TuneReporter,
        report_diverged,
        report_failed,
        restore_latest_checkpoint,
        trial_context,
    )

# Each name's module, imported on first use: a Ray trial worker needs only .trial_reporters, and the driver's MLflow
# (~1 s of a worker's start-up on 2 cores) stays out of every trial's process.
_MODULES = {
    "redact_uri": "dcl_core.study.plan.storage",
    **dict.fromkeys(("METRIC_PREFIXES", "MLflowTrialCallback"), "dcl_core.study.tracking.callback"),
    **dict.fromkeys(("FILES_DIR", "IDS_FILE", "JOURNAL_FILE", "LOCAL_ID", "Journal", "journal_problem"),
                    "dcl_core.study.tracking.journal"),
    **dict.fromkeys(("TrainReporter", "TuneReporter", "report_diverged", "report_failed",
                     "restore_latest_checkpoint", "trial_context"), "dcl_core.study.tracking.trial_reporters"),
    **dict.fromkeys(("SUMMARY_TAG", "TRIAL_TAG", "local_ui_port", "metric_name", "runs_page"),
                    "dcl_core.study.tracking.mlflow_runs"),
    **dict.fromkeys(("StudyTracker", "git_commit"), "dcl_core.study.tracking.tracker"),
}


def __getattr__(name: str) -> Any:
    if name in _MODULES:
        return getattr(importlib.import_module(_MODULES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
