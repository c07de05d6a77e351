"""A finished study's results: one row per trial (columns from :mod:`dcl_core.study.analysis.columns`), then the
summary: the results table on disk, the paper-shaped text table, the plots, and the MLflow summary on the
study's parent run."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dcl_core import metric_names as M
from dcl_core.files import is_regular_file
from dcl_core.study.analysis import answer, answer_output, figures, tables
from dcl_core.study.analysis.columns import (
    ERROR,
    SEED,
    SERIES,
    STATUS,
    SWEPT,
    Row,
    Status,
    x_column,
)
from dcl_core.study.analysis.rows import series_label, trial_row
from dcl_core.study.execution import memory_loss, trial_failures
from dcl_core.study.execution.search_findings import best_per_cell, format_best, format_trials, write_search_plots
from dcl_core.study.plan.spec import StudySpec
from dcl_core.study.plan.storage import atomic_write_text, redact_uri, summary_dir
from dcl_core.study.plan.writers import save_figure, write_table
from dcl_core.study.tracking import StudyTracker, local_ui_port, metric_name
from dcl_core.study.tracking.mlflow_view import view_query
from search_spaces import keys_of

log = logging.getLogger(__name__)


@dataclass
class StudyOutcome:
    """What a finished study returns: its rows, table, summary metrics, files, MLflow location and verdicts."""

    rows: list[Row]
    table: str
    summary: dict[str, dict[str, float]]
    files: list[Path] = field(default_factory=list)
    experiment: str = ""
    tracking_uri: str = ""
    verdicts: list[str] = field(default_factory=list)
    runs_url: str = ""
    answer_url: str = ""  # the summary run's page: the verdicts in full, the cells' intervals, the figure
    compare_url: str = ""  # the runs page in the study's saved view (cells grouped, kNN and q_B charts)
    answer: str = ""  # the per-cell CIs, the paper, the regime and the verdicts (what -q prints)
    resolved: bool = False  # every question has a verdict other than "not resolved"
    power: list[str] = field(default_factory=list)  # the unresolved questions' projected seeds


def tune_rows(results: Any) -> list[Row]:
    """Rows of a Tune ``ResultGrid``."""
    configs = _trial_configs(results) if any(not r.config for r in results) else {}
    rows = []
    for result in results:
        df = result.metrics_dataframe
        history = [float(v) for v in df[M.KNN_TOP1]] if df is not None and M.KNN_TOP1 in df else []
        config = dict(result.config or configs.get(result.path, {}))
        rows.append(trial_row(config, result.metrics or {}, result.error, history))
        # Tune kept only the text of Ray's memory report; a process that died: its fatal signal, where it struck
        lost = memory_loss.row_error(result.error) or trial_failures.row_error(result.error, result.path)
        if lost:
            rows[-1][ERROR] = lost
    return rows


def _trial_configs(results: Any) -> dict[str, dict[str, Any]]:
    """Each trial's config (by its folder) from the experiment state Tune saved as ``fit`` returned. A ``Result``
    carries its config only with the trial's last reported result: a trial that failed before it reported (one
    killed by Ray's memory monitor on every attempt) has none there, and the ``params.json`` Tune writes as a trial
    starts may never have reached the storage (an experiment restored after a memory kill is not synced from its
    first run's staging folder). Without it the trial's row had no grid point and the summary failed sorting them."""
    from ray import tune  # Ray (seconds): re-analysis imports this module without it

    try:
        analysis = tune.ExperimentAnalysis(results.experiment_path, storage_filesystem=results.filesystem)
    except Exception as err:  # the state Tune just wrote: unreadable only if something else removed it
        log.warning("the configs of trials that never reported could not be read from %s: %s",
                    results.experiment_path, err)
        return {}
    return {trial.path: dict(trial.config) for trial in analysis.trials if trial.path}


def summarize(spec: StudySpec, rows: list[Row], output_dir: Path, tracker: StudyTracker,
              reanalysis: bool = False) -> StudyOutcome:
    """Write the table, the text summary (the answer and its verdicts last) and the plots under
    ``summary/<study>/`` and log them on the study's parent MLflow run. ``reanalysis``: the rows come from the
    stored table (:mod:`.reanalysis`), which holds no q_B histograms: the study's q_B plot is kept
    as it was drawn."""
    x, placed, table, shown, found = _answer_of(spec, rows)
    out_dir = summary_dir(output_dir, spec.name)
    if reanalysis:  # the stored results are the input: kept as they are, columns this version does not know too
        parquet, csv = out_dir / "results.parquet", out_dir / "results.csv"
    else:
        parquet, csv = write_table(rows, out_dir)
    claim = found.claim
    paper_curves = answer.paper_curves(claim, sorted({r[SERIES] for r in shown}))
    figure, rect = figures.knn_figure(shown, x, spec.x_label, spec.title or spec.name, log_x=spec.log_x,
                                     series=SERIES, paper=paper_curves,
                                     paper_label=f"paper: {claim.source}" if claim else "paper",
                                     notes=[answer_output.figure_note(v) for v in found.verdicts])
    png = save_figure(figure, out_dir / f"{spec.name}.png", rect=rect, with_pdf=True)
    stored = [p for p in (parquet, csv) if is_regular_file(p)]
    files = [*stored, png, out_dir / "table.txt", png.with_suffix(".pdf")]
    q_figure = figures.q_hists_figure(placed, x, spec.x_label, series=SERIES)
    q_png = None if q_figure is None else save_figure(q_figure, out_dir / "npc_q_hist.png")
    if q_png is None and reanalysis and is_regular_file(out_dir / "npc_q_hist.png"):  # a link is never uploaded
        q_png = out_dir / "npc_q_hist.png"
    if q_png is not None:
        files.append(q_png)
    points = answer.gap_points({spec.name: placed, **_other_studies(output_dir, spec.name)})
    title = "DCL − InfoNCE gap vs 1 − q_B, every paired cell in this output folder"
    files.append(save_figure(figures.gap_vs_q_figure(points, title), out_dir / "gap_vs_npc.png"))
    if spec.search:
        table += "\n\n" + format_best(placed, spec.search)
        files += write_search_plots(placed, spec.search, out_dir)
    answer_text = answer_output.format_answer(found)
    table += "\n\n" + answer_text
    atomic_write_text(out_dir / "table.txt", table + "\n")
    rob = tables.robustness(shown, x, series=SERIES)
    metrics = _summary_metrics(spec, shown, rows, x, rob) | {
        metric_name(k): v for k, v in answer_output.answer_metrics(found).items()}
    tracker.log_summary(metrics, files, tags=answer_output.answer_tags(found),
                        headline=answer_output.headline(found.verdicts), cells=answer_output.cells_table(found))
    shown_files = [parquet, csv, png, *files[len(stored) + 1:]]
    return StudyOutcome(rows, table, rob, shown_files, spec.name, tracker.tracking_uri,
                        verdicts=[v.line() for v in found.verdicts], runs_url=tracker.runs.runs_url(),
                        answer_url=tracker.runs.run_url(tracker.parent_run_id),
                        compare_url=tracker.runs.runs_url(view_query()), answer=answer_text, resolved=found.resolved,
                        power=[p.strip() for v in found.verdicts if (p := v.power_line())])


def _answer_of(spec: StudySpec, rows: list[Row]) -> tuple[str, list[Row], str, list[Row], answer.Answer]:
    """The x column, the rows placed on the grid, the cell table, the rows it shows and the answer to the spec's
    questions (each row given its series label, and a generic sweep's swept value)."""
    x = x_column(spec.x_key)
    for r in rows:
        if x == SWEPT and r.get(SWEPT) is None:  # a generic sweep's key: its value from the trial's config
            value = (r.get("config") or {}).get(spec.x_key)
            r[SWEPT] = None if value is None else float(value)
        r[SERIES] = series_label(r, spec.series)
    # a row without a grid point (a trial whose config was lost) is in the stored table, in no cell or figure
    placed = [r for r in rows if r.get(x) is not None]
    table, shown = _table(spec, placed, x)
    found = answer.build_answer(shown, x, spec.x_label, spec.questions, spec.pairs, spec.paper, spec.design)
    return x, placed, table, shown, found


def asked(spec: StudySpec, rows: list[Row]) -> str:
    """The cell table and the answer to ``spec``'s questions, as :func:`summarize` prints them, with nothing
    written: a question other than the one the study recorded, asked of its stored rows."""
    _, placed, table, _, found = _answer_of(spec, rows)
    if spec.search:
        table += "\n\n" + format_best(placed, spec.search)
    return table + "\n\n" + answer_output.format_answer(found)


def _other_studies(output_dir: Path, name: str) -> dict[str, list[Row]]:
    """The results tables of the other studies summarized in the same output folder (for the gap-vs-q_B figure);
    a table that cannot be read is skipped with a warning."""
    out = {}
    for path in sorted(summary_dir(output_dir, name).parent.glob("*/results.parquet")):
        if path.parent.name == name:
            continue
        try:
            out[path.parent.name] = tables.read_table(path)
        except Exception as exc:
            log.warning("skipping %s in the gap-vs-q_B figure: %s", path, exc)
    return out


def _table(spec: StudySpec, rows: list[Row], x: str) -> tuple[str, list[Row]]:
    """The text table and the rows it shows (a search's table shows each cell's tuned trial)."""
    if not spec.search:
        return _caption(rows, spec.gap) + tables.format_table(rows, x, spec.x_label, gap=spec.gap, series=SERIES), rows
    searched = {x_column(k) for k in keys_of(spec.search)}
    if x in searched:  # every trial has its own x: list the trials instead of a cell table
        return format_trials(rows, spec.search), rows
    shown = best_per_cell(rows, x)  # cells of a grid key (e.g. batch size): each cell's tuned (best) trial
    return tables.format_table(shown, x, spec.x_label, gap=spec.gap, series=SERIES), shown


def _caption(rows: list[Row], gap: bool) -> str:
    """What the cell table's numbers are: its cells' spread over seeds, its robustness columns, and (when the table
    has one) its dcl−infonce row, which is not the answer's paired gap."""
    seeds = sorted({seed for r in rows if (seed := r.get(SEED)) is not None})
    unpaired = "; dcl−infonce: a difference of cell means, unpaired (the answer below pairs by seed)" if gap else ""
    return (f"kNN top-1 (%), mean±std over {len(seeds)} seed(s) per cell; Std and Range: across the row's cell "
            f"means{unpaired}\n")


def _summary_metrics(spec: StudySpec, shown: list[Row], rows: list[Row], x: str,
                     rob: dict[str, dict[str, float]]) -> dict[str, float]:
    metrics = {f"{name}/{k}": v for name, stats in rob.items() for k, v in stats.items()}
    if spec.gap:
        for prefix, g in tables.all_gaps(shown, x, series=SERIES).items():
            metrics |= {f"gap_dcl_minus_infonce/{prefix + '_' if prefix else ''}{x}_{k}": v for k, v in g.items()}
    metrics["trials"] = len(rows)
    metrics["trials_failed"] = sum(r[STATUS] != Status.OK for r in rows)
    return {metric_name(k): v for k, v in metrics.items()}


def summary_lines(outcome: StudyOutcome) -> Sequence[str]:
    """Where everything is, then the table and the answer: the verdict lines are the last thing printed."""
    uri = redact_uri(outcome.tracking_uri)
    if uri.startswith(("http://", "https://")):
        browse = f"browse: open {uri} in a browser"
    else:
        browse = f"browse: mlflow ui --backend-store-uri {uri} --host 127.0.0.1 --port {local_ui_port()}"
    return [
        f"results: {outcome.files[0]} (+ .csv)",
        f"plot:    {outcome.files[2]}",
        f"MLflow:  experiment {outcome.experiment!r} at {uri}",
        f"         {browse}",
        *([f"         answer:  {outcome.answer_url}"] if outcome.answer_url else []),
        f"         runs:    {outcome.runs_url}",
        f"         compare: {outcome.compare_url}",
        "",
        outcome.table,
    ]
