"""Studies: Ray Tune over the core trainer, grids or Optuna searches, MLflow runs, a summary.

Five floors, each importing only from the ones below it, and this package's own names on top of them
(``tests/test_layering.py`` checks it; the floors of the whole project and its map of modules are
``docs/architecture.md``):

- :mod:`~dcl_core.study.analysis`: pure functions of results rows: statistics, questions and answers, the papers'
  numbers, calibration, text tables and figures, returned unsaved (no Ray, MLflow or Optuna; no file written);
- :mod:`~dcl_core.study.plan`: what a study is and what it would cost, checked before Ray starts: the spec and
  options (declared once, ``StudyArgs``), the study presets, storage and records (and the writers of its tables and
  figures), the checks, the sequential design, the cost estimate and ``--dry-run``, and a study's plan, prepared
  once (:func:`~dcl_core.study.plan.study_plan.prepare_plan`);
- :mod:`~dcl_core.study.tracking`: MLflow (and Ray's reporting API): the tracker, its journal, the saved view,
  ``sync``;
- :mod:`~dcl_core.study.execution`: Ray Tune: a plan's run and its rounds, the tuning of a study, its trainable,
  results and summary, re-analysis, the MI toy;
- :mod:`~dcl_core.study.cli`: every study command line, a module each (``studies/*.py``: parse, prepare, run;
  ``python -m dcl_core.study answer``, ``sync``, ``export`` and ``calibrate``, the MI toy's).

The names below are the package's public API; importing it does not import Ray (tuning a study does).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dcl_core.study.plan.prepared import PreparedStudy, prepare
from dcl_core.study.plan.run_options import Resources, StudyOptions
from dcl_core.study.plan.spec import StudySpec, grid_points, validate_spec, with_base
from dcl_core.study.plan.storage import storage_join, summary_dir

if TYPE_CHECKING:
    from dcl_core.study.execution.results import StudyOutcome, summary_lines
    from dcl_core.study.execution.tuning import init_ray, run_study

_LAZY = {"run_study": "tuning", "init_ray": "tuning", "StudyOutcome": "results", "summary_lines": "results"}


def __getattr__(name: str) -> Any:
    # Ray, Optuna and MLflow are imported when a study runs, not when a study script builds its spec.
    if name in _LAZY:
        return getattr(importlib.import_module(f"dcl_core.study.execution.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'dcl_core.study' has no attribute {name!r}")


__all__ = [
    "PreparedStudy", "Resources", "StudyOptions", "StudyOutcome", "StudySpec", "grid_points", "init_ray", "prepare",
    "run_study", "storage_join", "summary_dir", "summary_lines", "validate_spec", "with_base",
]
