"""One trial's row of a study's results table, from its config and its last reported metrics (the columns of
:mod:`.columns`): what the summary tabulates, the Tune callback tags a trial's MLflow run with, and the re-analysis
reads back."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

from dcl_core import metric_names as M
from dcl_core.config import CONFIG_KEYS, ConfigError, derive, from_flat_dict, loss_label
from dcl_core.study.analysis.columns import (
    ALPHA_USED,
    BEST_KNN_TOP1,
    COLUMNS,
    ERROR,
    KNN_TOP1,
    LOSS,
    METHOD,
    NUM_NEGATIVES,
    STATUS,
    TRIAL_ID,
    Row,
    Status,
)

ANSI = re.compile(r"\x1b\[[0-9;]*m")
CAUSE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit)\b.*:")  # "RuntimeError: ...", "ray.x.Error: ..."


def error_text(err: BaseException) -> str:
    """A failure's cause in one plain line: the innermost ``Type: message`` of a (Ray-wrapped) error, without
    the terminal colour codes Ray adds."""
    text = ANSI.sub("", str(err)).strip()
    causes = [line.strip() for line in text.splitlines() if CAUSE.match(line.strip())]
    line = causes[-1] if causes else f"{type(err).__name__}: {text.splitlines()[0] if text else ''}"
    return line[:300]



def _derived(config: dict[str, Any]) -> tuple[int | None, float | None]:
    """(K, α used) of a trial that failed before its first report (the trainer reports them otherwise)."""
    try:
        d = derive(from_flat_dict({k: v for k, v in config.items() if k in CONFIG_KEYS}))
    except (ConfigError, TypeError, ValueError):
        return None, None
    return d.num_negatives, d.eqco_alpha


def _method(config: dict[str, Any]) -> str | None:
    """The loss as a table label; EqCo names its α (``eqco(α=K)`` is InfoNCE over the same K negatives), a user
    loss its class."""
    loss = config.get("loss.name")
    if loss != "eqco":
        return loss_label(loss) if isinstance(loss, str) else loss
    alpha = config.get("loss.alpha")
    return f"eqco(α={'K' if alpha is None else format(alpha, 'g')})"


def series_label(row: Row, series: Iterable[str]) -> str:
    """The line of the study's table and plot a row belongs to: its ``series`` columns' values joined by "+", a
    user loss shown by its class name (``PositiveWeighted``, ``simclr+eqco(α=256)``)."""
    return "+".join(loss_label(str(row.get(c))) if c == LOSS.name else str(row.get(c)) for c in series)


def trial_row(config: dict[str, Any], metrics: dict[str, Any], error: BaseException | None = None,
              history: Iterable[float] = ()) -> Row:
    """One trial's row from its config, its last reported metrics, its error and its kNN history."""
    row: Row = {}
    for c in COLUMNS:
        if c.key is not None:
            row[c.name] = config.get(c.key)
        elif c.metric is not None:
            row[c.name] = metrics.get(c.metric)
    knn = row[KNN_TOP1]
    if isinstance(knn, float) and math.isnan(knn):  # a diverged trial, or no measurement yet
        row[KNN_TOP1] = None
    if M.NUM_NEGATIVES not in metrics:
        row[NUM_NEGATIVES], row[ALPHA_USED] = _derived(config)
    row[TRIAL_ID] = metrics.get("trial_id") or ""  # Tune's id of the trial
    failed = error or metrics.get(M.FAILED)
    row[STATUS] = Status.ERROR if failed else (Status.DIVERGED if metrics.get(M.DIVERGED) else Status.OK)
    row[METHOD] = _method(config)
    best = max((v for v in history if not math.isnan(v)), default=math.nan)
    row[BEST_KNN_TOP1] = None if math.isnan(best) else best
    row[ERROR] = error_text(error) if error else metrics.get(M.ERROR)
    row["q_hist"] = metrics.get(M.Q_HIST)  # not a table column: the q_B plots read it
    row["config"] = config  # not a table column: the search report reads the sampled values from it
    return row
