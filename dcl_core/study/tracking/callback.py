"""The Tune side of MLflow: :class:`MLflowTrialCallback`, a public ``ray.tune.Callback`` that logs each trial of an
experiment through the study's :class:`~dcl_core.study.tracking.tracker.StudyTracker`, from the driver."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pyarrow.fs
from ray import tune

from dcl_core import metric_names as M
from dcl_core.config import LossSource, loss_label
from dcl_core.study.analysis.figures import q_hist_edges, q_hist_epochs_figure
from dcl_core.study.analysis.rows import trial_row
from dcl_core.study.plan.spec import TrialTags
from dcl_core.study.plan.writers import save_figure
from dcl_core.study.tracking.mlflow_view import trial_look
from dcl_core.study.tracking.notes import NOTE_TAG, literal_markdown
from dcl_core.study.tracking.tracker import StudyTracker

METRIC_PREFIXES = ("train/", "eval/", "time/")
LOSS_SOURCE_TAG = "dcl.loss.source"  # a user loss's source file, as the study found it
LOSS_SHA_TAG = "dcl.loss.source_sha256"  # the SHA-256 of its sources (its folder's or package's Python files)
LOSS_FILES_TAG = "dcl.loss.source_files"  # how many files that hash covers (the study's record lists them)


def trial_values(config: Mapping[str, Any], tag_keys: Mapping[str, str],
                 series: tuple[str, ...] = ("loss",)) -> tuple[dict[str, Any], str]:
    """Each tag's value as the trial's results row shows it (the config key's value, or the derived one:
    ``num_negatives`` is K whichever key set it, not the other, unused key's 0), and the trial's series value
    (``dcl``, ``simclr+eqco(α=K)``: its ``series`` columns joined as the study's summary joins them)."""
    row = trial_row(dict(config), {})
    values = {tag: row[tag] if tag in row else config.get(key) for tag, key in tag_keys.items()}
    return values, "+".join(loss_label(str(row.get(c))) if c == "loss" else str(row.get(c)) for c in series)


def run_tags(config: Mapping[str, Any], tag_keys: Mapping[str, str], cell: tuple[str, ...] = (),
             series: tuple[str, ...] = ("loss",)) -> dict[str, str]:
    """A trial run's tags (:func:`trial_values`), its ``cell`` and its series' colour, the plot's line's
    (:func:`~dcl_core.study.tracking.mlflow_view.trial_look`)."""
    values, series_value = trial_values(config, tag_keys, series)
    return {tag: str(v) for tag, v in values.items()} | trial_look(values, cell, series_value)


class MLflowTrialCallback(tune.Callback):
    """Logs every trial of a Tune experiment as a child run of the study (see :class:`StudyTracker`).

    Args:
        tracker: the study's tracker (opened: its parent run exists).
        tag_keys: per-trial tags from config keys, e.g. ``{"loss": "loss.name"}``; a study's
            :class:`~dcl_core.study.plan.spec.TrialTags` also give each run its ``cell`` tag and its series' colour
            (:func:`~dcl_core.study.tracking.mlflow_view.trial_look`; a plain mapping: coloured by the loss, no cell).
        save_checkpoint: log the trial's final checkpoint as an artifact, read from the study's Ray
            ``storage`` (a DDP trial's checkpoint lives in its Ray Train run there).
        loss_sources: what each user loss is made of
            (:attr:`~dcl_core.study.plan.spec.StudySpec.loss_sources`): a trial of one carries its file, as the
            artifact ``loss_source/<file>``, and its hash and path as tags.
        cause_of: the cause of a trial Tune failed (one plain line), for its run's ``error`` tag; a trial that
            reported its own failure carries its cause in its last result.
    """

    # Defaults for a callback pickled before these existed (Tune restores its callbacks on --resume).
    cell: tuple[str, ...] = ()
    series: tuple[str, ...] = ("loss",)
    loss_sources: tuple[LossSource, ...] = ()
    cause_of: Callable[[Any], str | None] | None = None

    def __init__(self, tracker: StudyTracker, tag_keys: Mapping[str, str], save_checkpoint: bool = False,
                 storage: str | None = None, loss_sources: tuple[LossSource, ...] = (),
                 cause_of: Callable[[Any], str | None] | None = None) -> None:
        self.tracker = tracker
        self.tag_keys = dict(tag_keys)
        self.cell = tag_keys.cell if isinstance(tag_keys, TrialTags) else ()
        self.series = tag_keys.series if isinstance(tag_keys, TrialTags) else ("loss",)
        self.save_checkpoint = save_checkpoint
        self.storage = storage
        self.loss_sources = loss_sources
        self.cause_of = cause_of
        self.runs: dict[str, str] = {}  # trial id -> run id
        self.logged: dict[str, int] = {}  # trial id -> last epoch its run already holds (a resumed trial)
        self.q_hists: dict[str, dict[int, list[float]]] = {}

    def _run_of(self, trial: Any) -> str:
        if trial.trial_id not in self.runs:
            tags = run_tags(trial.config, self.tag_keys, self.cell, self.series)
            tags["trial_name"] = str(trial)
            source = next((s for s in self.loss_sources if s.name == trial.config.get("loss.name")), None)
            if source is not None:
                tags |= {LOSS_SOURCE_TAG: source.file, LOSS_SHA_TAG: source.digest,
                         LOSS_FILES_TAG: str(len(source.files))}
            run_id = self.tracker.trial_run(trial.trial_id, str(trial), tags, trial.config)
            if source is not None:
                self.tracker.log_artifact(run_id, Path(source.file), "loss_source")
            self.runs[trial.trial_id] = run_id
            self.logged[trial.trial_id] = self.tracker.last_step(run_id, M.TRAIN_LOSS)
        return self.runs[trial.trial_id]

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Create (or find again) the trial's child run (Tune callback)."""
        self._run_of(trial)

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict, **info: Any) -> None:
        """Log the result's metrics, and its q_B histogram, at the result's epoch (Tune callback)."""
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
        """End the trial's child run as finished, or failed when it diverged (Tune callback)."""
        self._end(trial, failed=False)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """End the trial's child run as failed (Tune callback)."""
        self._end(trial, failed=True)

    def _end(self, trial: Any, failed: bool) -> None:
        run_id = self._run_of(trial)
        last = trial.last_result or {}
        diverged = bool(last.get(M.DIVERGED)) or bool(last.get(M.FAILED))
        cause = last.get(M.ERROR) or (self.cause_of(trial) if failed and self.cause_of is not None else None)
        if cause:
            self.tracker.set_tag(run_id, "error", str(cause)[:5000])
        knn = last.get(M.KNN_TOP1)
        varied = ", ".join(f"{tag} {value}" for tag, value in trial_values(trial.config, self.tag_keys)[0].items())
        outcome = ("failed" if failed or diverged else
                   f"kNN top-1 {knn:.2f}% after {last.get(M.EPOCH)} epochs" if isinstance(knn, float) else "finished")
        # the run's description (markdown): the swept values are data, so they are shown as literal text
        self.tracker.set_tag(run_id, NOTE_TAG, literal_markdown(f"{varied}: {outcome}"))
        hists = self.q_hists.pop(trial.trial_id, None)
        if hists:
            with tempfile.TemporaryDirectory() as d:
                png = save_figure(q_hist_epochs_figure(hists, f"NPC multiplier q_B: {trial}"), Path(d) / "q_hist.png")
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
