"""A study's answer to its question: per-cell confidence intervals, paired gaps, the headline statistic with a
bootstrap interval, the verdict, the NPC regime the cells ran in, and the paper's numbers beside ours.

A study declares its :class:`Question` s (what the paper claims, as a statistic of the cell means and the sign
the paper found); :func:`build_answer` computes everything from the results rows, and the ``format_*``
functions print it. The verdict's words are decided by the interval alone (:func:`dcl_core.study.stats.verdict`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from dcl_core.study import stats
from dcl_core.study.paper import EXTRA_HEADLINES, PaperClaim, paper_claim

Means = dict[str, dict[Any, float]]
BOOTSTRAP_DRAWS = 2000
BOOTSTRAP_SEED = 0
NPC_REGIME = 0.6  # mean q_B at or below which a cell counts as in the regime the paper is about (DCL Fig. 1)


@dataclass(frozen=True)
class Question:
    """One claim of the paper, as a statistic of the study's cell means (``{series: {x: mean}}``).

    Attributes:
        claim: the claim in words, e.g. ``"DCL flatter across τ than InfoNCE"``.
        statistic: ``std_difference`` (std across x of ``base`` minus that of ``better``), ``gap_at_smallest``
            (``better − base`` at the smallest x both have), ``gap_slope`` (slope of ``better − base`` vs
            log2 x), ``best_margin`` (the best x of series ``better`` minus its ``baseline_x``) or ``best_gap``
            (the best cell of ``better`` minus the best of ``base``: a search's tuned results).
        better, base: the series compared (``base`` unused by ``best_margin``).
        label: the statistic's short name in the verdict line (``Δstd``).
        paper_sign: +1 if the paper finds the statistic positive, −1 if negative.
        paper_key: the paper's value: ``None`` = the study's headline in :mod:`dcl_core.study.paper`, else a key
            of its ``EXTRA_HEADLINES``.
    """

    claim: str
    statistic: str
    better: str
    base: str = ""
    label: str = "gap"
    paper_sign: int = 1
    baseline_x: Any = None
    paper_key: str | None = None

    def function(self) -> Callable[[Means], float]:
        if self.statistic == "std_difference":
            return partial(stats.std_difference, worse=self.base, better=self.better)
        if self.statistic == "gap_at_smallest":
            return partial(stats.gap_at_smallest, better=self.better, base=self.base)
        if self.statistic == "gap_slope":
            return partial(stats.gap_slope, better=self.better, base=self.base)
        if self.statistic == "best_margin":
            return partial(stats.best_margin, series=self.better, baseline_x=self.baseline_x)
        if self.statistic == "best_gap":
            return partial(stats.best_gap, better=self.better, base=self.base)
        raise ValueError(f"unknown statistic {self.statistic!r}")

    def paper_value(self, claim: PaperClaim | None, study: str | None) -> float | None:
        if claim is None:
            return None
        if self.paper_key is None:
            return claim.headline
        return EXTRA_HEADLINES.get(study or "", {}).get(self.paper_key)


@dataclass(frozen=True)
class Verdict:
    question: Question
    estimate: stats.Estimate
    words: str  # supports the paper / contradicts the paper / not resolved
    paper_value: float | None
    seeds_needed: int | None

    def line(self) -> str:
        """``DCL flatter across τ than InfoNCE: not resolved — Δstd +0.60, 95% CI [−0.90, +2.10] (paper: +0.46)``"""
        e = self.estimate
        paper = "no number in the paper" if self.paper_value is None else f"{self.paper_value:+.2f}"
        if e.has_interval:
            value = f"{self.question.label} {e.estimate:+.2f}, 95% CI [{e.lo:+.2f}, {e.hi:+.2f}]"
        elif math.isnan(e.estimate):
            value = f"{self.question.label} not measurable (a cell it needs has no finished trial)"
        else:
            value = f"{self.question.label} {e.estimate:+.2f}, no interval (n = {e.n} seed per cell)"
        return f"{self.question.claim}: {self.words} — {value} (paper: {paper})"

    def power_line(self) -> str | None:
        """How many seeds per cell would resolve the observed effect at the observed spread (unresolved only)."""
        if self.words != "not resolved" or math.isnan(self.estimate.estimate):
            return None
        if self.seeds_needed is None:
            if self.estimate.n < 2:
                return f"  {self.question.label}: one seed per cell gives no interval; run --seeds 3 or more"
            return f"  {self.question.label}: an effect of 0 cannot be resolved by more seeds"
        return (f"  {self.question.label}: ≈{self.seeds_needed} seeds per cell would resolve an effect of this size "
                f"at this spread (now {self.estimate.n}; CI width ∝ 1/√n)")


@dataclass
class Answer:
    """Everything a study prints and logs beyond its table."""

    x_label: str
    cells: dict[str, dict[Any, stats.Estimate]]  # {series: {x: t-interval over seeds}}
    pairs: dict[str, dict[Any, stats.Estimate]]  # {"dcl − infonce": {x: paired gap}}
    q_b: dict[str, dict[Any, float]]  # {series: {x: mean q_B over seeds}}
    regime: str
    verdicts: list[Verdict] = field(default_factory=list)
    claim: PaperClaim | None = None


def paper_curves(claim: PaperClaim | None, names: Sequence[str]) -> dict[str, dict[Any, float]]:
    """The paper's series under our series names: the same name, or ours without its ``simclr+`` prefix (the
    paper's plain rows are SimCLR's)."""
    if claim is None:
        return {}
    out = {}
    for name in names:
        key = name if name in claim.series else name.removeprefix("simclr+")
        if key in claim.series:
            out[name] = dict(claim.series[key].values)
    return out


def default_pairs(names: Sequence[str]) -> list[tuple[str, str]]:
    """``(better, base)``: every DCL/InfoNCE pair of series that differ only in their last part."""
    from dcl_core.study.report import gap_pairs

    return [(better, base) for _, better, base in gap_pairs(list(names))]


def _mean(values: Sequence[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return sum(values) / len(values) if values else math.nan


def _one_per_seed(rows: Sequence[Mapping[str, Any]], x_key: str) -> list[Mapping[str, Any]]:
    """At most one finished row per (series, x, seed): a search can run one cell twice; its best row stands."""
    best: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for r in rows:
        if r.get("status") != "ok" or r.get("knn_top1") is None:
            continue
        key = (r.get("series"), r.get(x_key), r.get("seed"))
        if key not in best or r["knn_top1"] > best[key]["knn_top1"]:
            best[key] = r
    return list(best.values())


def _paired(data: stats.Data, better: str, base: str, base_x: Any = None) -> dict[Any, stats.Estimate]:
    """``better − base`` per x, paired by seed; with ``base_x``, every x of ``better`` against ``base`` at
    ``base_x`` (DCLW's σ against σ = 1000, i.e. DCL)."""
    if better not in data or base not in data:
        return {}
    if base_x is None:
        return {x: stats.paired_difference(data[better][x], data[base][x])
                for x in sorted(set(data[better]) & set(data[base]))}
    if base_x not in data[base]:
        return {}
    return {x: stats.paired_difference(data[better][x], data[base][base_x]) for x in sorted(data[better])
            if x != base_x}


def build_answer(rows: Sequence[Mapping[str, Any]], x_key: str, x_label: str, questions: Sequence[Question],
                 pairs: Sequence[tuple[Any, ...]] | None = None, paper: str | None = None,
                 draws: int = BOOTSTRAP_DRAWS, seed: int = BOOTSTRAP_SEED) -> Answer:
    """The answer from results rows (``series``, ``x_key``, ``seed``, ``knn_top1``, ``q_mean``, ``status``).

    ``pairs``: ``(better, base)`` series compared at each x, or ``(better, base, base_x)`` compared with
    ``base`` at one x; ``None`` = every DCL/InfoNCE pair of series."""
    rows = _one_per_seed(rows, x_key)
    data = stats.collect(rows, x_key)
    cells = {s: {x: stats.t_interval(list(by_seed.values())) for x, by_seed in sorted(by_x.items())}
             for s, by_x in sorted(data.items())}
    pairs = default_pairs(list(data)) if pairs is None else list(pairs)
    paired = {}
    for pair in pairs:
        better, base, *rest = pair
        base_x = rest[0] if rest else None
        name = f"{better} − {base}" + (f"@{_fmt_x(base_x)}" if base_x is not None else "")
        if gaps := _paired(data, better, base, base_x):
            paired[name] = gaps
    q_data = stats.collect(rows, x_key, value_key="q_mean")
    q_b = {s: {x: _mean(list(by_seed.values())) for x, by_seed in by_x.items()} for s, by_x in q_data.items()}
    claim = paper_claim(paper) if paper else None
    verdicts = []
    for q in questions:
        est = stats.bootstrap(data, q.function(), draws=draws, seed=seed)
        words = stats.verdict(est, q.paper_sign)
        verdicts.append(Verdict(q, est, words, q.paper_value(claim, paper), stats.seeds_needed(est, est.n)))
    bases = [pair[1] for pair in pairs if pair[1] in q_b] or list(q_b)
    return Answer(x_label, cells, paired, q_b, regime_line(q_b, bases), verdicts, claim)


def regime_line(q_b: Mapping[str, Mapping[Any, float]], series: Sequence[str]) -> str:
    """Where the baseline's cells ran: ``InfoNCE cells: mean q_B 0.88–0.97 → ...``."""
    values = [q for s in series for q in q_b.get(s, {}).values() if not math.isnan(q)]
    if not values:
        return "NPC regime: no q_B measured (no finished trial reports train/q_mean)"
    lo, hi = min(values), max(values)
    who = "InfoNCE cells" if any("infonce" in s or "α=K" in s for s in series) else "cells"
    reached = sum(q <= NPC_REGIME for q in values)
    where = (f"{reached} of {len(values)} cells reach q_B ≤ {NPC_REGIME}" if reached
             else f"no cell reaches q_B ≤ {NPC_REGIME}")
    q_range = f"{lo:.2f}" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}–{hi:.2f}"
    weaker = (f"{100 * (1 - lo):.0f}" if f"{100 * (1 - lo):.0f}" == f"{100 * (1 - hi):.0f}"
              else f"{100 * (1 - hi):.0f}–{100 * (1 - lo):.0f}")
    return (f"NPC regime: {who}: mean q_B {q_range} → InfoNCE's gradients are {weaker}% weaker than DCL's; "
            f"{where}; the paper's effect is predicted where q_B ≪ 1 (DCL Eq. 4, Fig. 1)")


def _fmt_x(x: Any) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _ci(e: stats.Estimate, signed: bool = False) -> str:
    if e.n == 0 or math.isnan(e.estimate):
        return "-"
    sign = "+" if signed else ""
    if not e.has_interval:
        return f"{e.estimate:{sign}.1f} (n=1)"
    return f"{e.estimate:{sign}.1f} [{e.lo:{sign}.1f}, {e.hi:{sign}.1f}]"


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
             "q_B = mean NPC multiplier (InfoNCE's, last epoch)" + ("; paper = its value at this x" if paper else ""),
             f"{answer.x_label:<8}" + "".join(f"{c:>{width}}" for c in cols)
             + "".join(f"{c:>{w}}" for c, w in (*q_cols, *p_cols))]
    if len(lines[1]) > WIDE:  # many or long series names (EqCo's framework+method): one line per cell instead
        return "\n".join([lines[0], *_long_cells(answer, xs, names, paper)])
    for x in xs:
        line = f"{_fmt_x(x):<8}"
        line += "".join(f"{_ci(answer.cells[s][x]) if x in answer.cells[s] else '-':>{width}}" for s in names)
        line += "".join(f"{_ci(g[x], signed=True) if x in g else '-':>{width}}" for g in answer.pairs.values())
        for s, (_, w) in zip(names, q_cols, strict=True):
            q = answer.q_b.get(s, {}).get(x, math.nan)
            line += f"{'-' if math.isnan(q) else format(q, '.2f'):>{w}}"
        for s, (_, w) in zip(paper, p_cols, strict=True):
            line += f"{format(paper[s][x], '.1f') if x in paper[s] else '-':>{w}}"
        lines.append(line)
    return "\n".join(lines)


WIDE = 150  # characters: a per-cell table wider than this is printed one cell per line


def _long_cells(answer: Answer, xs: Sequence[Any], names: Sequence[str], paper: Mapping[str, Mapping[Any, float]]
                ) -> list[str]:
    """``K=4  simclr+eqco(α=256)  12.5 [10.1, 14.9]  q_B 0.99  paper -`` per cell, then each paired gap."""
    lw = max(len(n) for n in [*names, *answer.pairs])
    lines = []
    for x in xs:
        label = f"{answer.x_label}={_fmt_x(x)}"
        for s in names:
            if x not in answer.cells[s]:
                continue
            q = answer.q_b.get(s, {}).get(x, math.nan)
            p = paper.get(s, {}).get(x)
            q_text = "-" if math.isnan(q) else format(q, ".2f")
            lines.append(f"{label:<10}{s:<{lw + 2}}{_ci(answer.cells[s][x]):>20}  q_B {q_text}"
                         + (f"  paper {p:.1f}" if p is not None else ""))
            label = ""
        for name, g in answer.pairs.items():
            if x in g:
                lines.append(f"{label:<10}{name:<{lw + 2}}{_ci(g[x], signed=True):>20}  (paired by seed)")
    return lines


def format_paper(claim: PaperClaim, x_label: str) -> str:
    """The paper's series in full, with the source: what our table is compared with (its shape, not its level)."""
    xs = sorted({x for s in claim.series.values() for x in s.values})
    width = 7
    metric = next(iter(claim.series.values())).metric if claim.series else ""
    lines = [f"Paper: {claim.source} — {metric}" + (f"; {claim.note}" if claim.note else ""),
             f"{x_label:<16}" + "".join(f"{_fmt_x(x):>{width}}" for x in xs)]
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
        head = (f"Verdict (headline statistic: bootstrap over seeds, {BOOTSTRAP_DRAWS} draws, seed {BOOTSTRAP_SEED}, "
                "percentile interval expanded for few seeds; decided by its 95% CI alone)")
        parts.append("\n".join([head, *(["Power:", *power] if power else []),
                                *(v.line() for v in answer.verdicts)]))
    return "\n\n".join(parts)


def answer_metrics(answer: Answer) -> dict[str, float]:
    """Flat metrics for the summary run: per-cell CIs and q_B, paired gaps, each verdict's estimate and CI."""
    out: dict[str, float] = {}
    for s, by_x in answer.cells.items():
        for x, e in by_x.items():
            out |= {f"cell/{s}/{_fmt_x(x)}/{k}": v for k, v in
                    (("mean", e.estimate), ("ci_lo", e.lo), ("ci_hi", e.hi), ("n", e.n))}
            q = answer.q_b.get(s, {}).get(x)
            if q is not None:
                out[f"cell/{s}/{_fmt_x(x)}/q_b"] = q
    for name, by_x in answer.pairs.items():
        for x, e in by_x.items():
            out |= {f"paired_gap/{name.replace(' − ', '-')}/{_fmt_x(x)}/{k}": v for k, v in
                    (("mean", e.estimate), ("ci_lo", e.lo), ("ci_hi", e.hi))}
    for i, v in enumerate(answer.verdicts):
        key = f"verdict/{v.question.statistic}_{i}"
        out |= {f"{key}/estimate": v.estimate.estimate, f"{key}/ci_lo": v.estimate.lo,
                f"{key}/ci_hi": v.estimate.hi,
                f"{key}/supports": float(v.words == "supports the paper"),
                f"{key}/contradicts": float(v.words == "contradicts the paper")}
        if v.paper_value is not None:
            out[f"{key}/paper"] = v.paper_value
        if v.seeds_needed is not None:
            out[f"{key}/seeds_needed"] = v.seeds_needed
    return {k: float(v) for k, v in out.items() if v is not None and not math.isnan(float(v))}


def answer_tags(answer: Answer) -> dict[str, str]:
    """Tags for the summary run: each verdict's words and line, and the regime line."""
    tags = {"npc_regime": answer.regime}
    for i, v in enumerate(answer.verdicts):
        tags[f"verdict_{i}"] = v.words
        tags[f"verdict_{i}_line"] = v.line()
    if answer.verdicts:
        tags["verdict"] = "; ".join(v.words for v in answer.verdicts)
    return tags


CELL_COLUMNS = ("framework", "temperature", "batch_size", "base_lr", "sigma", "alpha", "num_negatives", "queue_size",
                "epoch_budget")  # what makes two trials the same cell, apart from the loss and the seed


def gap_points(rows_by_study: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Every cell (of every study given) that has both DCL and InfoNCE trials: the paired DCL − InfoNCE gap
    (mean, 95% CI over common seeds) and 1 − q_B of its InfoNCE trials (for :func:`report.plot_gap_vs_q`)."""
    points = []
    for study, rows in sorted(rows_by_study.items()):
        by_cell: dict[tuple[Any, ...], dict[str, dict[int, Mapping[str, Any]]]] = {}
        for r in rows:
            if r.get("status") != "ok" or r.get("loss") not in ("dcl", "infonce") or r.get("knn_top1") is None:
                continue
            key = tuple(r.get(c) for c in CELL_COLUMNS)
            by_cell.setdefault(key, {}).setdefault(r["loss"], {})[int(r.get("seed") or 0)] = r
        for by_loss in by_cell.values():
            if "dcl" not in by_loss or "infonce" not in by_loss:
                continue
            gap = stats.paired_difference({s: r["knn_top1"] for s, r in by_loss["dcl"].items()},
                                          {s: r["knn_top1"] for s, r in by_loss["infonce"].items()})
            q = _mean([r.get("q_mean") for r in by_loss["infonce"].values()])
            if gap.n and not math.isnan(q):
                points.append({"label": study, "gap": gap.estimate, "lo": gap.lo, "hi": gap.hi,
                               "one_minus_q": 1.0 - q, "n": gap.n})
    return points
