"""A study's tables: the per-trial table read back, and the paper-shaped summaries of its rows (each cell's mean
and spread over seeds, the robustness across x, the gaps between series) as text.

Pure functions over a list of row dicts (one per trial), so they are tested without Ray;
:mod:`dcl_core.study.plan.writers` writes the table. The figures of the same rows: :mod:`.figures`.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dcl_core.study.analysis.columns import (
    KNN_TOP1,
    STATUS,
    Row,
    Status,
    fmt_x,
)
from dcl_core.study.analysis.intervals import format_number
from dcl_core.study.analysis.measures import gap_between, std_across
from dcl_core.study.analysis.stored_table import read_stored_table


def read_table(path: Path) -> list[Row]:
    """The rows of a results table written as Parquet, read within the bounds of a study's table
    (:func:`~dcl_core.study.analysis.stored_table.read_stored_table`: ConfigError in one line otherwise)."""
    return read_stored_table(path)


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def cells(rows: Sequence[Row], x_key: str, series: str = "loss") -> dict[str, dict[Any, dict[str, float]]]:
    """``{series: {x: {"mean", "std", "n", "failed"}}}`` of final kNN top-1 over seeds (failed runs excluded).

    ``series`` is the column naming a line of the table (the loss, or e.g. ``framework+method``)."""
    groups: dict[tuple[str, Any], list[Row]] = defaultdict(list)
    for r in rows:
        groups[(r[series], r[x_key])].append(r)
    out: dict[str, dict[Any, dict[str, float]]] = defaultdict(dict)
    for (loss, x), members in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        ok = [m[KNN_TOP1] for m in members if m[STATUS] == Status.OK and m[KNN_TOP1] is not None]
        mean, std = _mean_std(ok)
        out[loss][x] = {"mean": mean, "std": std, "n": len(ok), "failed": len(members) - len(ok)}
    return dict(out)


def robustness(rows: Sequence[Row], x_key: str, series: str = "loss") -> dict[str, dict[str, float]]:
    """Per series, across x (e.g. τ): mean, std and range of the per-x mean accuracy (Table 18's Std column).

    The std is :func:`.measures.std_across` of the row's cell means (0 for a single cell), i.e. the std of the
    mean curve. It is not what a verdict's Δstd estimates (:data:`.measures.STD_DIFFERENCE`: the mean over
    seeds of each seed's own std difference); the table's caption says "across the row's cell means"."""
    out = {}
    for loss, by_x in cells(rows, x_key, series).items():
        finite = {x: c["mean"] for x, c in by_x.items() if not math.isnan(c["mean"])}
        means = list(finite.values())
        mean = statistics.fmean(means) if means else math.nan
        std = (std_across(finite) if len(means) > 1 else 0.0) if means else math.nan
        out[loss] = {
            "mean": mean, "std": std,
            "range": (max(means) - min(means)) if means else math.nan,
            "best": max(means) if means else math.nan,
        }
    return out


def gaps(rows: Sequence[Row], x_key: str, better: str = "dcl", base: str = "infonce",
         series: str = "loss") -> dict[Any, float]:
    """``better − base`` mean accuracy per x (Table 1's DCL-vs-baseline gap per batch size): the difference of the
    two cells' means over all their finished seeds (:func:`.measures.gap_between`), unpaired; the answer's
    paired gaps (:attr:`.answer.Answer.pairs`) differ from it when a seed finished one cell and not the other."""
    c = cells(rows, x_key, series)
    if better not in c or base not in c:
        return {}
    means = {s: {x: cell["mean"] for x, cell in by_x.items()} for s, by_x in c.items()}
    return {x: gap_between(means, (better, x), (base, x)) for x in c[better] if x in c[base]}


def gap_pairs(names: Sequence[str], better: str = "dcl", base: str = "infonce") -> list[tuple[str, str, str]]:
    """``(prefix, better_name, base_name)`` for every series pair that differs only in its last part being
    ``better`` vs ``base``: ``dcl``/``infonce``, or ``moco+dcl``/``moco+infonce`` (prefix ``moco``)."""
    pairs = []
    for name in sorted(names):
        prefix, _, last = str(name).rpartition("+")
        other = f"{prefix}+{base}" if prefix else base
        if last == better and other in names:
            pairs.append((prefix, str(name), other))
    return pairs


def all_gaps(rows: Sequence[Row], x_key: str, series: str = "loss") -> dict[str, dict[Any, float]]:
    """``{prefix: {x: dcl − infonce}}`` for every DCL/InfoNCE pair of series (prefix ``""`` for plain losses)."""
    names = list(cells(rows, x_key, series))
    return {prefix: gaps(rows, x_key, better, base, series) for prefix, better, base in gap_pairs(names)}


def format_table(rows: Sequence[Row], x_key: str, x_label: str, with_robustness: bool = True,
                 gap: bool = False, series: str = "loss") -> str:
    """A paper-shaped text table: one row per series, one column per x, ``mean±std`` over seeds per cell."""
    c = cells(rows, x_key, series)
    xs = sorted({x for by_x in c.values() for x in by_x})
    rob = robustness(rows, x_key, series)
    width = 12
    # a gap row names its pair (`dcl−infonce`, `moco dcl−infonce`): which two series it is, whatever the question
    gap_rows = ({f"{prefix} dcl−infonce".strip(): g for prefix, g in all_gaps(rows, x_key, series).items()}
                if gap else {})
    lw = max([10, len(x_label) + 1, *(len(str(name)) + 2 for name in [*c, *gap_rows])])
    header = f"{x_label:<{lw}}" + "".join(f"{fmt_x(x):>{width}}" for x in xs)
    if with_robustness:
        header += f"{'Std':>8}{'Range':>8}"
    lines = [header]
    for loss, by_x in c.items():
        line = f"{loss:<{lw}}"
        for x in xs:
            cell = by_x.get(x)
            if cell is None or math.isnan(cell["mean"]):
                text = "failed" if cell and cell["failed"] else "-"
            else:
                text = f"{format_number(cell['mean'])}±{format_number(cell['std'])}"
                if cell["failed"]:
                    text += "*"
            line += f"{text:>{width}}"
        if with_robustness:
            line += f"{rob[loss]['std']:>8.2f}{rob[loss]['range']:>8.1f}"
        lines.append(line)
    for label, g in gap_rows.items():
        lines.append(f"{label:<{lw}}" + "".join(f"{g.get(x, math.nan):>+{width}.1f}" for x in xs))
    if any(cell["failed"] for by_x in c.values() for cell in by_x.values()):
        lines.append("* some seeds failed (diverged or crashed) and are excluded; 'failed' = every seed failed")
    return "\n".join(lines)
