"""Studies: Ray Tune over the core trainer, grids or Optuna searches, MLflow runs, a summary.

One job a module:

- :mod:`~dcl_core.study.spec`: what a study runs (:class:`StudySpec`) and how (:class:`StudyOptions`),
  validated before Ray starts;
- :mod:`~dcl_core.study.trainable`: one trial, in-process or as a DDP ``TorchTrainer``;
- :mod:`~dcl_core.study.ray_env`: what a study sets in Ray's environment (token auth, every worker's setup);
- :mod:`~dcl_core.study.runner`: Ray, the Tuners, resume/overwrite, concurrency (:func:`run_study`);
- :mod:`~dcl_core.study.record`: what a study records to be resumed, and what a resume may change;
- :mod:`~dcl_core.study.storage`: storage URIs and the summary folder;
- :mod:`~dcl_core.study.columns`: the results table's columns, declared once;
- :mod:`~dcl_core.study.results`: rows of finished trials and the study summary;
- :mod:`~dcl_core.study.report` / :mod:`~dcl_core.study.search_report`: tables and plots over rows (no Ray);
- :mod:`~dcl_core.study.tracking`: the only package using Ray's reporting API and MLflow (a job a module);
  :mod:`~dcl_core.study.sync`: ``python -m dcl_core.study.sync``, what MLflow did not take, pushed later;
  :mod:`~dcl_core.study.mlflow_view`: the study's saved comparison view in MLflow's UI;
- :mod:`~dcl_core.study.console`: the one-line progress of a study on the console;
- :mod:`~dcl_core.study.checks`: what a study checks before Ray starts;
- :mod:`~dcl_core.study.cost` / :mod:`~dcl_core.study.dry_run`: ``--dry-run``, a study's trials and estimated time
  (:mod:`~dcl_core.study.flops`: a model's FLOPs and this machine's measured rate);
- :mod:`~dcl_core.study.presets`: a study script's typed presets;
- :mod:`~dcl_core.study.answer` / :mod:`~dcl_core.study.stats`: a study's answer and the intervals behind its
  verdicts, :mod:`~dcl_core.study.answer_output` the answer as text, metrics and tags;
  :mod:`~dcl_core.study.paper`: the papers' numbers as data, cited;
  :mod:`~dcl_core.study.calibration`: those intervals checked on simulated studies with a known truth;
  :mod:`~dcl_core.study.reanalysis`: answers recomputed from stored rows (``python -m dcl_core.study.answer``).

The names below are the package's public API; importing it does not import Ray (the runner does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dcl_core.study.spec import Resources, StudyOptions, StudySpec, grid_points, validate_spec, with_base
from dcl_core.study.storage import storage_join, summary_dir

if TYPE_CHECKING:
    from dcl_core.study.results import StudyOutcome
    from dcl_core.study.runner import init_ray, run_study

_LAZY = {"run_study": "runner", "init_ray": "runner", "StudyOutcome": "results", "summary_lines": "results"}


def __getattr__(name: str) -> Any:
    # Ray, Optuna and MLflow are imported when a study runs, not when a study script builds its spec.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"dcl_core.study.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'dcl_core.study' has no attribute {name!r}")


__all__ = [
    "Resources", "StudyOptions", "StudyOutcome", "StudySpec", "grid_points", "init_ray", "run_study",
    "storage_join", "summary_dir", "summary_lines", "validate_spec", "with_base",
]
