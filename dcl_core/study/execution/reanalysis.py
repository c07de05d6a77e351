"""Answers recomputed from a finished study's stored results rows, without training: printed, written and logged
exactly as the study does (``summary/<study>/table.txt``, the plots, the MLflow summary run). The command lines
(``python -m dcl_core.study answer``, a script's ``--reanalyze``) are :mod:`dcl_core.study.cli`'s.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from dcl_core.config import ConfigError, loss_reference
from dcl_core.study.analysis.columns import COLUMNS, KNN_TOP1, Status, x_column
from dcl_core.study.analysis.mi_toy_answer import COLUMNS as TOY_COLUMNS
from dcl_core.study.analysis.mi_toy_answer import TABLE_STEM, TOY, toy_answer
from dcl_core.study.analysis.tables import read_table
from dcl_core.study.execution.results import asked, summarize
from dcl_core.study.plan.record import spec_fingerprint, study_changes
from dcl_core.study.plan.run_options import StudyOptions
from dcl_core.study.plan.spec import StudySpec
from dcl_core.study.plan.storage import (
    OPTIONS_FILE,
    atomic_write_text,
    check_no_links,
    read_options_file,
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
        value = read_options_file(path)  # within its bound, a regular file only (a FIFO is never waited on)
    except ConfigError:
        raise
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path} is not a study's options file (not a JSON object)")
    return value


NAME = re.compile(r"[\w.+\-()=,: ]{1,80}")  # a loss, framework, method or series name as the studies write them
_NAMES = ("status", "series", "loss", "framework", "method")


def _user_loss(value: Any) -> bool:
    """Whether ``value`` is a user loss's reference as a study records it: printable, at most 1024 characters, and
    of the form the config takes (shown everywhere by its class name, an identifier, never as text to render)."""
    if not (isinstance(value, str) and len(value) <= 1024 and value.isprintable()):
        return False
    try:
        return loss_reference(value) is not None
    except ConfigError:
        return False


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A study's results rows as the study summarized them: the table's columns, with each row's ``config`` (read
    by a search's report) rebuilt from the columns that show config keys. Bounded (rows, bytes, decoded text):
    :mod:`dcl_core.study.analysis.stored_table`."""
    if not path.exists() and not path.is_symlink():  # a link, a FIFO or a device: refused by read_table
        raise ConfigError(f"nothing to re-analyse: {path} does not exist (has the study finished there?)")
    rows = read_table(path)
    keyed = [c for c in COLUMNS if c.key is not None]
    for r in rows:
        r["config"] = {c.key: r.get(c.name) for c in keyed}
    return rows


def check_rows(rows: list[dict[str, Any]], path: Path, needed: Iterable[str]) -> None:
    """ConfigError (one line) unless every row holds what a study writes: the ``needed`` columns (the trial id,
    status, seed, kNN, the swept column and the series columns); names of at most 80 plain characters (no markup
    MLflow's or matplotlib's text would read); whole seeds and counts; finite numbers (a kNN in [0, 100], a
    missing value as null or NaN, never ±inf)."""
    columns = {c.name: c for c in COLUMNS}
    missing = [n for n in needed if rows and n not in rows[0]]
    if missing:
        raise ConfigError(f"{path} has no column {missing[0]!r}: not a results table of this study")
    for i, r in enumerate(rows):
        def bad(name: str, why: str, i: int = i, r: dict[str, Any] = r) -> ConfigError:
            return ConfigError(f"{path}, row {i} (trial {str(r.get('trial_id'))[:40]!r}): {name} {why}")

        for name, value in r.items():
            column = columns.get(name)
            if column is None or value is None:
                continue
            if name == "loss" and _user_loss(value):  # a user loss's module:Class or file.py:Class
                continue
            if name in _NAMES and not (isinstance(value, str) and NAME.fullmatch(value)):
                raise bad(name, "must be a name of at most 80 letters, digits and .+-()=,: (got "
                                f"{str(value)[:40]!r})")
            if column.type is int and (not isinstance(value, int) or isinstance(value, bool)):
                raise bad(name, f"must be a whole number, got {str(value)[:40]!r}")
            if column.type is float and (not isinstance(value, int | float) or isinstance(value, bool)
                                         or math.isinf(value)):
                raise bad(name, f"must be a finite number or empty, got {str(value)[:40]!r}")
        if r.get("status") not in {s.value for s in Status}:
            raise bad("status", f"must be one of {', '.join(s.value for s in Status)}")
        knn = r.get(KNN_TOP1)
        if r["status"] == Status.OK and not (isinstance(knn, int | float) and 0 <= knn <= 100):
            raise bad(KNN_TOP1, f"of a finished trial must be an accuracy in [0, 100] %, got {str(knn)[:40]!r}")


# The MI toy's recorded values: K pairs per batch, a true MI and an estimate in nats. Its true MIs are 2-10 and its
# bounds at most log K (13.8 at K = 10**6) and log(1 + α); a critic that failed to train gives a negative estimate of a
# few nats. Beyond these bounds a value was not written by the toy (1e308 printed a slope of 300 digits).
MAX_TOY_K = 1_000_000
MAX_TOY_NATS = 1000.0
TOY_METHODS = ("infonce", "eqco")


def check_toy_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """ConfigError (one line naming the file, the row and the field) unless every row of the MI toy's table holds
    what the toy writes: its method, a whole K in [1, :data:`MAX_TOY_K`], a whole seed >= 0, a true MI in (0,
    :data:`MAX_TOY_NATS`] and an estimate in [-:data:`MAX_TOY_NATS`, :data:`MAX_TOY_NATS`] nats; never inf, NaN or
    empty, which the verdict would read as "not measurable"."""
    if not rows or not set(TOY_COLUMNS) <= set(rows[0]):
        raise ConfigError(f"{path} is not the MI toy's table")

    def whole(v: Any, low: int, high: int) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and low <= v <= high

    def nats(v: Any, low: float, open_low: bool = False) -> bool:
        return (isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
                and (low < v if open_low else low <= v) and v <= MAX_TOY_NATS)

    checks = (
        ("method", lambda v: v in TOY_METHODS, f"must be one of {', '.join(TOY_METHODS)}"),
        ("k", lambda v: whole(v, 1, MAX_TOY_K), f"must be a whole number of pairs in [1, {MAX_TOY_K:,}]"),
        ("seed", lambda v: v is None or whole(v, 0, 2**31 - 1), "must be a whole number >= 0"),
        ("true_mi", lambda v: nats(v, 0.0, open_low=True), f"must be a number of nats in (0, {MAX_TOY_NATS:g}]"),
        ("mi_estimate", lambda v: nats(v, -MAX_TOY_NATS),
         f"must be a finite number of nats in [-{MAX_TOY_NATS:g}, {MAX_TOY_NATS:g}] (an MI bound)"),
    )
    for i, r in enumerate(rows):
        for name, ok, why in checks:
            if not ok(r.get(name)):
                raise ConfigError(f"{path}, row {i}: {name} {why}, got {str(r.get(name))[:40]!r}")


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


def _stored_rows(spec: StudySpec, options: StudyOptions) -> list[dict[str, Any]]:
    """The study's stored rows, checked, once its folder and record are (``options`` resolved)."""
    assert options.tracking_uri is not None
    check_no_links(options.output_dir, study_entries(spec.name))
    check_store_in_folder(options.tracking_uri, options.output_dir)
    out = summary_dir(options.output_dir, spec.name)
    if os.path.lexists(out / OPTIONS_FILE):  # a FIFO or a link there: read_json refuses it in one line
        _check_same_study(spec, read_json(out / OPTIONS_FILE), out / OPTIONS_FILE)
    rows = read_rows(out / RESULTS_FILE)
    check_rows(rows, out / RESULTS_FILE, ("trial_id", "status", "seed", KNN_TOP1, x_column(spec.x_key),
                                          *spec.series))
    return rows


def ask(spec: StudySpec, options: StudyOptions) -> str:
    """The answer to ``spec``'s questions from the study's stored rows, written nowhere: a question other than the
    one the study recorded (its table.txt and MLflow summary run keep answering that one)."""
    return asked(spec, _stored_rows(spec, options.resolved()))


def reanalyze(spec: StudySpec, options: StudyOptions) -> Any:
    """The study's answer recomputed from ``summary/<study>/results.parquet``: the same summary a finished study
    writes (:func:`dcl_core.study.execution.results.summarize`), on its existing MLflow summary run. Holds the
    study's lock (not while the study runs)."""
    options = options.resolved()
    assert options.tracking_uri is not None
    rows = _stored_rows(spec, options)
    out = summary_dir(options.output_dir, spec.name)
    with study_lock(options.output_dir, spec.name, reanalysis=True):
        tracker = StudyTracker(options.tracking_uri, spec.name, artifact_root=options.output_dir / "mlartifacts",
                               tags={"study": spec.name, "git_commit": git_commit()}, journal_dir=out,
                               description=spec.description,
                               experiment_tags=dict([mlflow_view.compare_view(spec).tag()])).open()
        return summarize(spec, rows, options.output_dir, tracker, reanalysis=True)


def reanalyze_toy(output_dir: Path, tracking_uri: str) -> str:
    """The MI toy's answer recomputed from ``summary/eqco_mi_toy/mi_toy.parquet``
    (:func:`~dcl_core.study.analysis.mi_toy_answer.toy_answer`), written to its ``table.txt`` and logged on its summary
    run; returns the text."""
    check_no_links(output_dir, study_entries(TOY))
    check_store_in_folder(tracking_uri, output_dir)
    out = summary_dir(output_dir, TOY)
    rows = read_rows(out / TOY_FILE)
    check_toy_rows(rows, out / TOY_FILE)
    ks = tuple(sorted({int(r["k"]) for r in rows}))
    table, metrics, tags = toy_answer(rows, ks)
    with study_lock(output_dir, TOY, reanalysis=True):
        atomic_write_text(out / "table.txt", table + "\n")
        tracker = StudyTracker(tracking_uri, TOY, artifact_root=output_dir / "mlartifacts",
                               tags={"study": TOY, "git_commit": git_commit()}, journal_dir=out).open()
        tracker.log_summary(metrics, [out / "table.txt"], tags=tags)
    return table
