"""A study's answer as people and MLflow see it: the per-cell table, the paper's numbers beside it and the
verdicts as text (``table.txt``, what ``-q`` prints), and the summary run's metrics and tags."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from dcl_core.study.analysis import intervals, sequential
from dcl_core.study.analysis.answer import Answer, Verdict, paper_curves
from dcl_core.study.analysis.columns import fmt_x
from dcl_core.study.analysis.paper import PaperClaim
from dcl_core.study.analysis.verdicts import VerdictWord


def _ci(e: intervals.Estimate, signed: bool = False) -> str:
    if e.n == 0 or math.isnan(e.estimate):
        return "-"
    def f(v: float) -> str:
        return intervals.format_number(v, 1, signed)

    if not e.has_interval:  # one seed, or seeds with identical values (intervals.t_interval)
        return f"{f(e.estimate)} (n={e.n}{', identical' if e.n > 1 else ''})"
    return f"{f(e.estimate)} [{f(e.lo)}, {f(e.hi)}]"


def format_estimate(est: intervals.Estimate, digits: int = 1, signed: bool = True) -> str:
    """``+0.6 [-0.9, +2.1]``, or ``+0.6 (n=1, no interval)``; ``nan (n=0, no interval)`` when undefined."""
    def f(v: float) -> str:
        return intervals.format_number(v, digits, signed)

    if not est.has_interval:
        return f"{f(est.estimate)} (n={est.n}, no interval)"
    return f"{f(est.estimate)} [{f(est.lo)}, {f(est.hi)}]"


def figure_note(v: Verdict) -> str:
    """A verdict as the study's figure states it, its numbers as its line rounds them: ``DCL flatter across τ than
    InfoNCE: Δstd -0.05, 95% CI [-1.30, +1.21], rules out the paper's size``."""
    return f"{v.question.claim}: {v.value_text()}, {v.said}"


def format_cells(answer: Answer) -> str:
    """One line per x: each series' mean and 95% t-interval over seeds, each paired gap, the cells' mean q_B, and
    the paper's value of each series at that x (``-`` where the paper has none)."""
    names = list(answer.cells)
    if not names:
        return "Per cell: no finished trial, nothing to estimate"
    xs = sorted({x for by_x in answer.cells.values() for x in by_x})
    paper = paper_curves(answer.claim, names)
    cols = [*names, *answer.pairs]
    width = max([22, *(len(c) + 2 for c in cols)])
    q_cols = [(f"q_B {s}", max(12, len(s) + 6)) for s in names]
    p_cols = [(f"paper {s}", max(10, len(s) + 8)) for s in paper]
    ns = sorted({e.n for by_x in answer.cells.values() for e in by_x.values()})
    n_text = f"n = {ns[0]}" if len(ns) == 1 else f"n = {ns[0]}–{ns[-1]}"
    lines = [f"Per cell: kNN top-1 (%), mean [95% CI, t over seeds], {n_text} seed(s) per cell; gaps paired by seed; "
             "q_B = mean NPC multiplier (DCL Eq. 4, the coupling InfoNCE would apply) on each series' own model, "
             "last epoch" + ("; paper = its value at this x" if paper else ""),
             f"{answer.x_label:<8}" + "".join(f"{c:>{width}}" for c in cols)
             + "".join(f"{c:>{w}}" for c, w in (*q_cols, *p_cols))]
    if len(lines[1]) > WIDE:  # many or long series names (EqCo's framework+method): one line per cell instead
        return "\n".join([lines[0], *_long_cells(answer, xs, names, paper), *answer.outside()])
    for x in xs:
        line = f"{fmt_x(x):<8}"
        line += "".join(f"{_ci(answer.cells[s][x]) if x in answer.cells[s] else '-':>{width}}" for s in names)
        line += "".join(f"{_ci(g[x], signed=True) if x in g else '-':>{width}}" for g in answer.pairs.values())
        for s, (_, w) in zip(names, q_cols, strict=True):
            q = answer.q_b.get(s, {}).get(x, math.nan)
            line += f"{'-' if math.isnan(q) else format(q, '.2f'):>{w}}"
        for s, (_, w) in zip(paper, p_cols, strict=True):
            line += f"{format(paper[s][x], '.1f') if x in paper[s] else '-':>{w}}"
        lines.append(line)
    return "\n".join([*lines, *answer.outside()])


WIDE = 150  # characters: a per-cell table wider than this is printed one cell per line


def _long_cells(answer: Answer, xs: Sequence[Any], names: Sequence[str], paper: Mapping[str, Mapping[Any, float]]
                ) -> list[str]:
    """``K=4  simclr+eqco(α=256)  12.5 [10.1, 14.9]  q_B 0.99  paper -`` per cell, then each paired gap."""
    lw = max(len(n) for n in [*names, *answer.pairs])
    xw = max(10, *(len(f"{answer.x_label}={fmt_x(x)}") + 1 for x in xs))
    lines = []
    for x in xs:
        label = f"{answer.x_label}={fmt_x(x)}"
        for s in names:
            if x not in answer.cells[s]:
                continue
            q = answer.q_b.get(s, {}).get(x, math.nan)
            p = paper.get(s, {}).get(x)
            q_text = "-" if math.isnan(q) else format(q, ".2f")
            lines.append(f"{label:<{xw}}{s:<{lw + 2}}{_ci(answer.cells[s][x]):>20}  q_B {q_text}"
                         + (f"  paper {p:.1f}" if p is not None else ""))
            label = ""
        for name, g in answer.pairs.items():
            if x in g:
                lines.append(f"{label:<{xw}}{name:<{lw + 2}}{_ci(g[x], signed=True):>20}  (paired by seed)")
    return lines


def format_paper(claim: PaperClaim, x_label: str) -> str:
    """The paper's series in full, with the source: what our table is compared with (its shape, not its level)."""
    xs = sorted({x for s in claim.series.values() for x in s.values})
    width = 7
    metric = next(iter(claim.series.values())).metric if claim.series else ""
    lines = [f"Paper: {claim.source} — {metric}" + (f"; {claim.note}" if claim.note else ""),
             f"{x_label:<16}" + "".join(f"{fmt_x(x):>{width}}" for x in xs)]
    for name, s in claim.series.items():
        lines.append(f"{name:<16}" + "".join(
            f"{s.values[x]:>{width}.1f}" if x in s.values else f"{'-':>{width}}" for x in xs))
    return "\n".join(lines)


def format_answer(answer: Answer) -> str:
    """The cell table, the paper's table, the regime, power estimates; the verdict lines last."""
    parts = [format_cells(answer)]
    if answer.claim is not None and answer.claim.series:
        parts.append(format_paper(answer.claim, answer.x_label))
    parts.append(answer.regime)
    if answer.verdicts:
        power = [p for v in answer.verdicts if (p := v.power_line())]
        decided = ("decided against 0 by the interval and against the effect of interest by the design's futility "
                   "bound" if isinstance(answer.design, sequential.GroupSequential)
                   else "decided by the interval alone, against 0 and against the effect of interest")
        delta = ("the one --effect-of-interest gives" if all(v.question.effect_of_interest is not None
                                                               for v in answer.verdicts)
                 else "which a claim of your own has only if --effect-of-interest gives one"
                 if all(v.question.own for v in answer.verdicts)
                 else "the paper's value unless --effect-of-interest gives one")
        head = ("Verdict (each question's statistic with a 95% interval: a t-interval over seeds of each seed's own "
                f"statistic, or for a best-of statistic paired t bounds corrected for picking the best cell; {decided}"
                f", {delta}; calibrated by simulated studies, docs/statistics.md#calibration)")
        parts.append("\n".join([head, *([design_line(answer)] if answer.design else []),
                                *(["Power:", *power] if power else []), *(v.line() for v in answer.verdicts)]))
    return "\n\n".join(parts)


def design_line(answer: Answer) -> str:
    """``Sequential design (--until-resolved): looks at 5, 6, …, 45 seeds per cell, each interval at a nominal
    two-sided 0.62% …; this answer: 41 seeds per cell``."""
    assert answer.design is not None
    n = max((v.estimate.n for v in answer.verdicts), default=0)
    kind = "group-sequential" if isinstance(answer.design, sequential.GroupSequential) else "Pocock"
    return (f"Sequential design (--until-resolved): {answer.design.describe()} ({kind}; docs/statistics.md, "
            f"--until-resolved); this answer: {n} seeds per cell")


def answer_metrics(answer: Answer) -> dict[str, float]:
    """Flat metrics for the summary run: per-cell CIs and q_B, paired gaps, each verdict's estimate and CI."""
    out: dict[str, float] = {}
    for s, by_x in answer.cells.items():
        for x, e in by_x.items():
            out |= {f"cell/{s}/{fmt_x(x)}/{k}": v for k, v in
                    (("mean", e.estimate), ("ci_lo", e.lo), ("ci_hi", e.hi), ("n", e.n))}
            q = answer.q_b.get(s, {}).get(x)
            if q is not None:
                out[f"cell/{s}/{fmt_x(x)}/q_b"] = q
    for name, by_x in answer.pairs.items():
        for x, e in by_x.items():
            out |= {f"paired_gap/{name.replace(' − ', '-')}/{fmt_x(x)}/{k}": v for k, v in
                    (("mean", e.estimate), ("ci_lo", e.lo), ("ci_hi", e.hi))}
    for i, v in enumerate(answer.verdicts):
        out |= verdict_metrics(i, v)
    return {k: float(v) for k, v in out.items() if v is not None and not math.isnan(float(v))}


def verdict_metrics(i: int, v: Verdict) -> dict[str, float]:
    """The summary run's metrics of the ``i``-th verdict (``verdict/<statistic>_<i>/estimate``, ``ci_lo``,
    ``ci_hi``, ``supports``, ``contradicts``, ``rules_out``, ``paper``, ``effect_of_interest``, ``effect_spread``
    (how far the paper's table's rounding leaves δ open; absent for a given δ), ``seeds_needed``; at a
    group-sequential look also ``futility_lo``/``futility_hi``), finite values only."""
    key = f"verdict/{v.question.statistic.name}_{i}"
    futility = v.estimate.futility or (None, None)
    out = {f"{key}/estimate": v.estimate.estimate, f"{key}/ci_lo": v.estimate.lo, f"{key}/ci_hi": v.estimate.hi,
           f"{key}/supports": float(v.words is VerdictWord.SUPPORTS),
           f"{key}/contradicts": float(v.words is VerdictWord.CONTRADICTS),
           f"{key}/rules_out": float(v.words is VerdictWord.RULES_OUT),
           f"{key}/paper": v.paper_value, f"{key}/effect_of_interest": v.delta,
           f"{key}/effect_spread": v.spread if v.spread > 0 else None, f"{key}/seeds_needed": v.seeds_needed,
           f"{key}/futility_lo": futility[0], f"{key}/futility_hi": futility[1]}
    return {k: float(x) for k, x in out.items() if x is not None and math.isfinite(float(x))}


def verdict_tags(verdicts: Sequence[Verdict]) -> dict[str, str]:
    """The summary run's tags of the verdicts: each one's words and line, and all the words together."""
    tags = {}
    for i, v in enumerate(verdicts):
        tags[f"verdict_{i}"] = v.said
        if v.size is not None:
            tags[f"verdict_{i}_size"] = str(v.size)
        tags[f"verdict_{i}_line"] = v.line()
    if verdicts:
        tags["verdict"] = "; ".join(v.said for v in verdicts)
    return tags


def cells_table(answer: Answer) -> tuple[str, list[list[str]]]:
    """The cells as a caption and table rows (the header first; one row per x, ascending), for the summary run's
    description in MLflow: each series' mean with its 95% t-interval over seeds and each paired gap, as the
    console's per-cell table rounds them; no rows without a finished cell."""
    names = list(answer.cells)
    if not names:
        return "", []
    xs = sorted({x for by_x in answer.cells.values() for x in by_x})
    ns = sorted({e.n for by_x in answer.cells.values() for e in by_x.values()})
    n_text = f"{ns[0]}" if len(ns) == 1 else f"{ns[0]}–{ns[-1]}"
    caption = f"Per cell: kNN top-1 (%), mean [95% CI, t over seeds], {n_text} seed(s) per cell; gaps paired by seed"
    rows = [[answer.x_label, *names, *answer.pairs]]
    for x in xs:
        rows.append([fmt_x(x), *(_ci(answer.cells[s][x]) if x in answer.cells[s] else "-" for s in names),
                     *(_ci(g[x], signed=True) if x in g else "-" for g in answer.pairs.values())])
    return caption, rows


def headline(verdicts: Sequence[Verdict]) -> str:
    """The answer in the few characters MLflow's runs table shows of a description (its first 50): every verdict's
    words, and for a single question its estimate as its line rounds it (``rules out the paper's size, Δstd
    -0.05``)."""
    words = "; ".join(v.said for v in verdicts)
    if len(verdicts) == 1 and not math.isnan(verdicts[0].estimate.estimate):
        v = verdicts[0]
        words += f", {v.question.label} {v.estimate.estimate:+.2f}"
    return words


def answer_tags(answer: Answer) -> dict[str, str]:
    """Tags for the summary run: each verdict's words and line, and the regime line."""
    return {"npc_regime": answer.regime, **verdict_tags(answer.verdicts)}
