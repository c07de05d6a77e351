"""Answers recomputed from a finished study's stored results rows, without training: printed, written and logged
exactly as the study does (``summary/<study>/table.txt``, the plots, the MLflow summary run). The command lines
(``python -m dcl_core.study answer``, a script's ``--reanalyze``) are :mod:`dcl_core.study.cli`'s.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dcl_core.config import ConfigError
from dcl_core.study.analysis.columns import COLUMNS
from dcl_core.study.analysis.mi_toy import COLUMNS as TOY_COLUMNS
from dcl_core.study.analysis.mi_toy import TABLE_STEM, TOY, toy_answer
from dcl_core.study.analysis.report import read_table
from dcl_core.study.execution.results import summarize
from dcl_core.study.plan.record import spec_fingerprint, study_changes
from dcl_core.study.plan.spec import StudyOptions, StudySpec
from dcl_core.study.plan.storage import (
    OPTIONS_FILE,
    atomic_write_text,
    check_no_links,
    study_entries,
    study_lock,
    summary_dir,
)
from dcl_core.study.tracking import StudyTracker, check_store_in_folder, git_commit, mlflow_view

RESULTS_FILE = "results.parquet"
TOY_FILE = f"{TABLE_STEM}.parquet"  # the MI toy's rows


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object read from ``path``, or ConfigError (one line) when it cannot be read or is not an object."""
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path} is not a study's options file (not a JSON object)")
    return value


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A study's results rows as the study summarized them: the table's columns, with each row's ``config`` (read
    by a search's report) rebuilt from the columns that show config keys."""
    if not path.is_file():
        raise ConfigError(f"nothing to re-analyse: {path} does not exist (has the study finished there?)")
    try:
        rows = read_table(path)
    except Exception as exc:  # pyarrow's errors for a file that is not Parquet
        raise ConfigError(f"{path} is not a results table: {str(exc).splitlines()[0]}") from None
    keyed = [c for c in COLUMNS if c.key is not None]
    for r in rows:
        r["config"] = {c.key: r.get(c.name) for c in keyed}
    return rows


def _check_same_study(spec: StudySpec, recorded: dict[str, Any], path: Path) -> None:
    """The rebuilt spec must be the one that ran (its base config but the data folder, its grids and search)."""
    before = recorded.get("spec")
    if not isinstance(before, dict):
        return
    for change in study_changes(before, spec_fingerprint(spec), exempt=("data.root",)):
        if change.part == "base":
            raise ConfigError(f"--reanalyze must describe the study that ran in {path.parent}: {change.key} was "
                              f"{change.old!r}, now {change.new!r} (give the --preset/--set it ran with)")
        raise ConfigError(f"--reanalyze must describe the study that ran in {path.parent}: its {change.part} differ "
                          "(give the --preset, --losses, --seeds and --search it ran with)")


def reanalyze(spec: StudySpec, options: StudyOptions) -> Any:
    """The study's answer recomputed from ``summary/<study>/results.parquet``: the same summary a finished study
    writes (:func:`dcl_core.study.execution.results.summarize`), on its existing MLflow summary run. Holds the
    study's lock (not while the study runs)."""
    options = options.resolved()
    assert options.tracking_uri is not None
    check_no_links(options.output_dir, study_entries(spec.name))
    check_store_in_folder(options.tracking_uri, options.output_dir)
    out = summary_dir(options.output_dir, spec.name)
    if (out / OPTIONS_FILE).is_file():
        _check_same_study(spec, read_json(out / OPTIONS_FILE), out / OPTIONS_FILE)
    rows = read_rows(out / RESULTS_FILE)
    with study_lock(options.output_dir, spec.name):
        tracker = StudyTracker(options.tracking_uri, spec.name, artifact_root=options.output_dir / "mlartifacts",
                               tags={"study": spec.name, "git_commit": git_commit()}, journal_dir=out,
                               description=spec.description,
                               experiment_tags=dict([mlflow_view.compare_view(spec).tag()])).open()
        return summarize(spec, rows, options.output_dir, tracker, reanalysis=True)


def reanalyze_toy(output_dir: Path, tracking_uri: str) -> str:
    """The MI toy's answer recomputed from ``summary/eqco_mi_toy/mi_toy.parquet``
    (:func:`~dcl_core.study.analysis.mi_toy.toy_answer`), written to its ``table.txt`` and logged on its summary
    run; returns the text."""
    check_no_links(output_dir, study_entries(TOY))
    check_store_in_folder(tracking_uri, output_dir)
    out = summary_dir(output_dir, TOY)
    rows = read_rows(out / TOY_FILE)
    if not rows or not set(TOY_COLUMNS) <= set(rows[0]):
        raise ConfigError(f"{out / TOY_FILE} is not the MI toy's table")
    ks = tuple(sorted({int(r["k"]) for r in rows}))
    table, metrics, tags = toy_answer(rows, ks)
    with study_lock(output_dir, TOY):
        atomic_write_text(out / "table.txt", table + "\n")
        tracker = StudyTracker(tracking_uri, TOY, artifact_root=output_dir / "mlartifacts",
                               tags={"study": TOY, "git_commit": git_commit()}, journal_dir=out).open()
        tracker.log_summary(metrics, [out / "table.txt"], tags=tags)
    return table
