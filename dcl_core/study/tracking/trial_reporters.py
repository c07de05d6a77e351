"""The trial side of Ray: the trainer's epoch callbacks that report metrics and checkpoints to Ray Tune (in-process
trials, :class:`TuneReporter`) or Ray Train (DDP workers under a TorchTrainer, :class:`TrainReporter`), the
checkpoint Ray hands back after a failure or on ``--resume`` (:func:`restore_latest_checkpoint`), a trial's final
report when it diverged or failed for good, and where a trial's files go (:func:`trial_context`). Public APIs
only: ``tune.report`` / ``ray.train.report``, ``get_checkpoint``, ``tune.get_context``."""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import ray.train
from ray import tune

from dcl_core import metric_names as M

log = logging.getLogger(__name__)


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
        """Report the epoch's metrics, and the checkpoint when there is one, to Tune."""
        if checkpoint is None:
            tune.report(self._complete(metrics))
            return
        with _report_dir(checkpoint) as d:
            tune.report(self._complete(metrics), checkpoint=tune.Checkpoint.from_directory(d))


class TrainReporter(_Reporter):
    """Epoch callback inside Ray Train workers; rank 0 attaches the checkpoint (forwarded to Tune)."""

    def __call__(self, epoch: int, metrics: dict[str, float], checkpoint: Path | None) -> None:
        """Report the epoch's metrics, and the checkpoint when there is one, to Ray Train."""
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
    # Tune gives a new actor's trial the driver-side staging folder (``…/driver_artifacts/<trial>``), an actor it
    # reuses (reuse_actors) the trial's working directory (``…/working_dirs/<trial>``): a retried trial's attempts
    # saw different folders (its failures file, the note of a fatal signal). The staging folder, where it exists.
    staged = trial_dir.parent.parent / "driver_artifacts" / trial_dir.name
    if trial_dir.parent.name == "working_dirs" and staged.is_dir() and not staged.is_symlink():
        trial_dir = staged
    # Tune makes the trial's working directory the process's current one (documented on ``tune.Trainable``, also
    # for a reused actor) unless RAY_CHDIR_TO_TRIAL_DIR=0, which leaves the driver's folder: then the trial folder.
    chdir = os.environ.get("RAY_CHDIR_TO_TRIAL_DIR", "1") != "0"
    work_dir = Path.cwd().resolve() if chdir else trial_dir
    return ctx.get_trial_id(), trial_dir, work_dir


