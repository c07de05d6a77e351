"""The EqCo MI toy's answer (EqCo Table 5) as pure functions of its rows: the table beside the paper's, its figure,
and the verdict on the slope of I_NCE − I_EqCo per doubling of K. The toy itself (training the critics on Ray) is
:mod:`dcl_core.study.execution.mi_toy_runs`; ``python -m dcl_core.study answer`` recomputes this from
``mi_toy.parquet``.
"""

from __future__ import annotations

import math
from typing import Any

from dcl_core.study.analysis import intervals
from dcl_core.study.analysis.answer import Question, Verdict, judge
from dcl_core.study.analysis.answer_output import verdict_metrics, verdict_tags
from dcl_core.study.analysis.figures import pyplot
from dcl_core.study.analysis.measures import GAP_SLOPE
from dcl_core.study.analysis.paper import PAPER_KS, PAPER_TABLE5, paper_claim

TOY = "eqco_mi_toy"  # the study's name: its summary folder and MLflow experiment
TABLE_STEM = "mi_toy"  # summary/eqco_mi_toy/mi_toy.parquet (.csv)
COLUMNS = ("true_mi", "k", "method", "mi_estimate")  # what a stored toy table must have


def _cell_means(rows: list[dict[str, Any]]) -> dict[tuple[str, float, int], float]:
    """``{(method, true MI, K): mean estimate over the cell's critics (seeds)}``."""
    cells: dict[tuple[str, float, int], list[float]] = {}
    for r in rows:
        cells.setdefault((r["method"], r["true_mi"], r["k"]), []).append(r["mi_estimate"])
    return {key: sum(v) / len(v) for key, v in cells.items()}


def format_table5(rows: list[dict[str, Any]], ks: tuple[int, ...]) -> str:
    """Our estimates (the mean over a cell's critics when it has several) beside EqCo Table 5's, one block per
    true MI."""
    est = _cell_means(rows)
    mis = sorted({r["true_mi"] for r in rows})
    lines = ["K".ljust(22) + "".join(f"{k:>14}" for k in ks), " " * 22 + "".join(f"{'ours (paper)':>14}" for _ in ks)]
    for mi in mis:
        lines.append(f"Mutual Information = {mi:g}")
        for method, label in (("infonce", "I_NCE"), ("eqco", "I_EqCo")):
            cells = []
            for k in ks:
                paper = PAPER_TABLE5[method].get(int(mi))
                ref = f"({paper[PAPER_KS.index(k)]:.1f})" if paper and k in PAPER_KS else "(-)"
                cells.append(f"{est.get((method, mi, k), math.nan):.2f} {ref}".rjust(14))
            lines.append(f"  {label:<20}" + "".join(cells))
    return "\n".join(lines)


def table5_figure(rows: list[dict[str, Any]]) -> Any:
    """Estimated MI vs K for each true MI, InfoNCE dashed, EqCo solid; unsaved."""
    fig, ax = pyplot().subplots(figsize=(6, 4), dpi=120)
    for i, mi in enumerate(sorted({r["true_mi"] for r in rows})):
        ax.axhline(mi, color=f"C{i}", lw=0.6, alpha=0.4)  # the true MI
        for method, style in (("infonce", "--"), ("eqco", "-")):  # one colour per true MI
            pts = sorted((k, v) for (m, t, k), v in _cell_means(rows).items() if t == mi and m == method)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=f"C{i}", marker="o",
                    label=f"{'InfoNCE' if method == 'infonce' else 'EqCo'}, MI={mi:g}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("K (pairs per batch)")
    ax.set_ylabel("estimated MI (nats)")
    ax.set_title("EqCo Table 5: MI bound vs K (thin lines: true MI)")
    ax.legend(fontsize=6, ncol=2, loc="upper left")
    return fig


def toy_verdict(rows: list[dict[str, Any]]) -> Verdict:
    """EqCo's claim at the largest true MI run: InfoNCE's bound grows with K, EqCo's does not, i.e. the slope of
    (I_NCE − I_EqCo) vs log2 K is positive. Each seed trains its own critics (one per K and method; both methods
    of a seed and K see the same batches), so the interval, a t-interval over seeds of each seed's slope, covers
    the variance of training a critic, not only that of the evaluation batches; one seed: no interval. The paper's
    value is the same slope of Table 5's row at that MI."""
    mi = max(r["true_mi"] for r in rows)
    series = {m: f"{m}/MI={mi:g}" for m in ("infonce", "eqco")}
    data: intervals.Data = {name: {} for name in series.values()}
    for r in rows:
        if r["true_mi"] == mi and r.get("mi_estimate") is not None:
            data[series[r["method"]]].setdefault(r["k"], {})[int(r.get("seed") or 0)] = r["mi_estimate"]
    q = Question(f"InfoNCE's MI bound grows with K, EqCo's does not (true MI {mi:g})", GAP_SLOPE,
                 series["infonce"], series["eqco"], label="slope of I_NCE − I_EqCo per doubling of K (nats)")
    est = q.estimate(data)
    ks = sorted({k for by_k in data.values() for k in by_k})
    return judge(q, est, q.paper(paper_claim("eqco_mi_toy"), ks, "K"))


def toy_answer(rows: list[dict[str, Any]], ks: tuple[int, ...]) -> tuple[str, dict[str, float], dict[str, str]]:
    """What the toy study prints, writes to ``table.txt`` and logs on its summary run: (the table beside EqCo
    Table 5 with the verdict last, the summary metrics, the verdict tags). A pure function of the rows, so
    ``python -m dcl_core.study answer`` recomputes it from ``mi_toy.parquet``."""
    found = toy_verdict(rows)
    mi = max(r["true_mi"] for r in rows)
    seeds = len({r.get("seed") or 0 for r in rows if r["true_mi"] == mi})
    head = (f"Verdict (t-interval over {seeds} critic(s) per cell at true MI {mi:g}, trained from different seeds: "
            "each seed's slope, its bound averaged over its evaluation batches; decided by its 95% CI alone)")
    table = "\n\n".join([format_table5(rows, ks), f"{head}\n{found.line()}"])
    metrics = {f"{m}/mi{t:g}/K{k}": v for (m, t, k), v in _cell_means(rows).items()}
    return table, metrics | verdict_metrics(0, found), verdict_tags([found])
