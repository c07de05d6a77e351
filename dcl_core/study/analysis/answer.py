"""A study's answer to its question: per-cell confidence intervals, paired gaps, each question's statistic with a
calibrated interval, the verdict, the NPC regime the cells ran in, and the paper's numbers beside ours.

A study declares its :class:`Question` s (what the paper claims, as a statistic of the cell means and the sign
the paper found); :func:`build_answer` computes everything from the results rows. The verdict's words are
decided by the interval alone (:func:`dcl_core.study.analysis.verdicts.verdict`).

:mod:`dcl_core.study.analysis.answer_output` prints it and turns it into the summary run's metrics and tags.
``python -m dcl_core.study answer OUTPUT_DIR`` recomputes the answers of finished studies from their stored rows
(:mod:`dcl_core.study.execution.reanalysis`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dcl_core.study.analysis import intervals, measures, sequential, verdicts
from dcl_core.study.analysis.columns import CELL_COLUMNS, KNN_TOP1, LOSS, Q_MEAN, SEED, SERIES, STATUS, Status, fmt_x
from dcl_core.study.analysis.intervals import Means, nan
from dcl_core.study.analysis.measures import Statistic
from dcl_core.study.analysis.paper import PaperClaim, paper_claim
from dcl_core.study.analysis.tables import gap_pairs
from dcl_core.study.analysis.verdicts import VerdictWord

NPC_REGIME = 0.6  # mean q_B at or below which a cell counts as in the regime the paper is about (DCL Fig. 1)


@dataclass(frozen=True)
class Question:
    """One claim of the paper, as a statistic of the study's cell means (``{series: {x: mean}}``).

    Attributes:
        claim: the claim in words, e.g. ``"DCL flatter across τ than InfoNCE"``.
        statistic: a :class:`~dcl_core.study.analysis.measures.Statistic` (or its registered name, looked up
            in :data:`~dcl_core.study.analysis.measures.STATISTICS`): ``STD_DIFFERENCE`` (std across x of
            ``base`` minus that of ``better``), ``GAP_AT`` (``better`` at ``at_x`` minus ``base`` at
            ``baseline_x``, or at ``at_x`` when that is None), ``GAP_AT_SMALLEST`` (``better − base`` at the
            smallest x both have), ``GAP_SLOPE`` (slope of ``better − base`` vs log2 x), ``BEST_MARGIN`` (the
            best x of series ``better`` minus its ``baseline_x``) or ``BEST_GAP`` (the best cell of ``better``
            minus the best of ``base``: tuned against tuned). The first four (:class:`.measures.Smooth`) get a
            t-interval over seeds of each seed's own statistic, the "best" ones (:class:`.measures.Best`)
            paired t bounds corrected for picking the best cell (:func:`.intervals.max_min_interval`).
        better, base: the series compared (``base`` unused by ``best_margin``).
        label: the statistic's short name in the verdict line (``Δstd``).
        paper_sign: +1 if the paper finds the statistic positive, −1 if negative.
        paper_key: ``None`` for the study's headline question (the paper's reported figure,
            :attr:`PaperClaim.headline`, is printed beside the value computed over the shared grid); any other
            value for a further question, whose paper value is only computed.
        x_min: the smallest x within the range the paper claims its result for (``None``: every x); cells below
            it are shown but left out of the statistic.
        range_note: where the paper states that range, e.g. ``"K ≥ 16, EqCo Sec. 1"``.
        effect_of_interest: δ, the size of effect the question is about (``--effect-of-interest``); None: the
            paper's like-for-like value (:meth:`paper`), or none when the paper has no number.
        own: the user's claim (``--compare``, ``--statistic``, ``--claim``), not the paper's: no paper value, and
            the verdict's words speak of "the claim" (:attr:`Verdict.said`); ``paper_sign`` is the claim's sign.
    """

    claim: str
    statistic: Statistic
    better: str
    base: str = ""
    label: str = "gap"
    paper_sign: int = 1
    baseline_x: Any = None
    paper_key: str | None = None
    at_x: Any = None
    x_min: Any = None
    range_note: str = ""
    effect_of_interest: float | None = None
    own: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "statistic", measures.statistic(self.statistic))

    def in_range(self, x: Any) -> bool:
        """Whether ``x`` is within the question's range (at or above ``x_min``)."""
        return self.x_min is None or x >= self.x_min

    def _restrict(self, means: Mapping[str, Mapping[Any, float]]) -> Means:
        if self.x_min is None:
            return {s: dict(by_x) for s, by_x in means.items()}
        return {s: {x: m for x, m in by_x.items() if self.in_range(x)} for s, by_x in means.items()}

    def function(self) -> Callable[[Means], float]:
        """The statistic as a function of cell means (cells outside the claimed range left out)."""
        return lambda means: self.statistic.of(self, self._restrict(means))

    def inputs(self, means: Mapping[str, Mapping[Any, float]]) -> set[intervals.Cell]:
        """The cells of ``means`` the statistic reads (within the claimed range)."""
        return self.statistic.inputs(self, self._restrict(means))

    def estimate(self, data: intervals.Data, design: sequential.Design | None = None) -> intervals.Estimate:
        """The statistic on the study's cells with its 95% interval (smooth: t over seeds of each seed's own
        statistic; best-of: paired t bounds corrected for the selection). With a sequential ``design`` the
        interval is that design's at this look (:class:`~dcl_core.study.analysis.sequential.Sequential`; a
        :class:`~dcl_core.study.analysis.sequential.GroupSequential` look adds its futility bounds)."""
        function = self.function()
        if isinstance(design, sequential.GroupSequential):
            return sequential.group_look(lambda b: self.statistic.estimate(self, data, function, self.inputs, b),
                                         design, self.paper_sign, sequential.look_seeds(data))
        return self.statistic.estimate(self, data, function, self.inputs, design)

    def paper(self, claim: PaperClaim | None, xs: Sequence[Any], x_label: str) -> PaperValue:
        """The paper's value of this statistic, like for like: computed from its table over the x values both
        grids share (within the claimed range), with its reported figure beside it when that differs; over
        the paper's own x, said so, when the grids share none."""
        if self.own:
            return PaperValue(None, "your claim, not the paper's")
        if claim is None or not claim.comparable:
            return PaperValue(None, "no number in the paper")
        curves = paper_curves(claim, [self.better, self.base or self.better])
        if self.better not in curves or (self.base or self.better) not in curves:
            return PaperValue(None, "no number in the paper")
        theirs = sorted({x for c in curves.values() for x in c if self.in_range(x)})
        ours = sorted({x for x in xs if self.in_range(x)})
        shared = [x for x in ours if x in theirs]
        f = self.function()
        value = f({s: {x: v for x, v in c.items() if x in shared} for s, c in curves.items()}) if shared else nan
        like_for_like = math.isfinite(value)
        if like_for_like:
            missing = [x for x in ours if x not in theirs]
            where = f"over {x_label} {_xs(shared)}" + (f"; it has no {x_label} {_xs(missing)}" if missing else "")
        else:
            value = f({s: {x: v for x, v in c.items() if self.in_range(x)} for s, c in curves.items()})
            if not math.isfinite(value):
                return PaperValue(None, "no number in the paper")
            few = f"only {x_label} {_xs(shared)} shared with ours" if shared else "none shared with ours"
            where = f"over its own {x_label} {_xs(theirs)}, {few}"
        used = {s: {x: v for x, v in c.items() if (x in shared if like_for_like else self.in_range(x))}
                for s, c in curves.items()}
        spread = self.statistic.lipschitz(self, self._restrict(used)) * claim.rounding
        value = round(value, 9)
        text = f"{value:+.2f} {where}"
        if claim.compares:
            text += f"; {claim.compares}"
        reported = claim.headline if self.paper_key is None else None
        if reported is not None and abs(reported - value) > 0.005:
            text += f"; it reports {reported:+.2f}: {claim.headline_source}"
        return PaperValue(value, text, like_for_like, spread if math.isfinite(spread) else 0.0)


def _xs(xs: Sequence[Any]) -> str:
    return ", ".join(fmt_x(x) for x in xs)


@dataclass(frozen=True)
class PaperValue:
    """The paper's value of a question's statistic (None: the paper prints none) and how it was obtained;
    ``like_for_like``: computed over x values both grids share (only then is it a default effect of interest);
    ``spread``: how far the rounding of the table's cells leaves it open (the statistic's
    :meth:`~dcl_core.study.analysis.measures.Statistic.lipschitz` constant times the table's rounding): the paper's
    measured cells give a value within ±spread of ``value``."""

    value: float | None
    text: str
    like_for_like: bool = False
    spread: float = 0.0


@dataclass(frozen=True)
class Verdict:
    """A question's answer: its estimate, the words that say it, the paper's value and the seeds it needs.

    ``delta`` is the effect of interest the words weigh the interval against (the question's given
    ``effect_of_interest``, else the paper's like-for-like value; None: neither), ``size`` where a supporting
    interval lies against it."""

    question: Question
    estimate: intervals.Estimate
    words: VerdictWord
    paper: PaperValue
    seeds_needed: int | None
    delta: float | None = None
    size: verdicts.Size | None = None
    spread: float = 0.0  # δ is known to within ±spread (the paper's table's rounding; 0 for a given δ)

    @property
    def paper_value(self) -> float | None:
        """The paper's value of the statistic, or None when the paper gives none."""
        return self.paper.value

    @property
    def delta_given(self) -> bool:
        """Whether δ was given (``--effect-of-interest``) rather than taken from the paper."""
        return self.question.effect_of_interest is not None

    @property
    def said(self) -> str:
        """The words as printed and tagged: the paper's claims' :class:`VerdictWord`; a claim of the user's own
        (:attr:`Question.own`) ``supports the claim``, ``contradicts the claim``, ``rules out an effect of +1.00``
        (its δ) or ``not resolved``."""
        if not self.question.own:
            return str(self.words)
        if self.words is VerdictWord.RULES_OUT and self.delta is not None:
            return f"rules out an effect of {self.delta:+.2f}"
        return {VerdictWord.SUPPORTS: "supports the claim",
                VerdictWord.CONTRADICTS: "contradicts the claim"}.get(self.words, str(self.words))

    def phrase(self) -> str:
        """The verdict's words with what they say of δ: ``supports the paper, smaller than the paper's``."""
        if self.size is None:
            return self.said
        if not self.delta_given:
            return f"{self.said}, {self.size}"
        smaller = self.size is verdicts.Size.SMALLER
        return f"{self.said}, {'smaller' if smaller else 'larger'} than the effect of interest"

    def line(self) -> str:
        """The verdict in one line, e.g. ``DCL flatter across τ than InfoNCE: not resolved — Δstd +0.60, 95% CI
        [−0.90, +2.10] (paper: +1.38 over tau 0.07, 0.2, 0.5, 1; ...)``; a verdict that rules out δ says so:
        ``…: rules out the paper's size — no effect as large as the paper's +1.38 at this scale: Δstd …``."""
        value = self.value_text()
        if self.words is VerdictWord.RULES_OUT and self.delta is not None:
            whose = "the effect of interest" if self.delta_given else "the paper's"
            value = f"no effect as large as {whose} {self.delta:+.2f} at this scale: {value}"
        scope = f" [{self.question.range_note}]" if self.question.range_note else ""
        given = (f"; effect of interest {self.delta:+.2f} (--effect-of-interest)"
                 if self.delta_given and self.delta is not None else "")
        source = self.paper.text if self.question.own else f"paper: {self.paper.text}"
        if self.rounding_decided and self.delta is not None:
            given += (f"; its table's rounding allows {self.delta - self.spread:+.2f} to "
                      f"{self.delta + self.spread:+.2f}")
        return f"{self.question.claim}{scope}: {self.phrase()} — {value} ({source}{given})"

    @property
    def rounding_decided(self) -> bool:
        """Whether the words differ from those an exact δ would give: the interval excludes the paper's value
        but not every value its rounded table allows (the line then names that range)."""
        e, sign = self.estimate, self.question.paper_sign
        return self.spread > 0 and (self.words, self.size) != (verdicts.verdict(e, sign, self.delta),
                                                              verdicts.size(e, sign, self.delta))

    def deciding_bound(self) -> str | None:
        """Where a bound other than the 95% interval's decided the verdict (a group-sequential look rules δ out by
        its futility bound, which the 95% interval may not), that bound with its level:
        ``the design's futility bound Δstd < +0.45 (one-sided 98.9% at this look) excludes +0.51`` (a paper's δ:
        ``… excludes +1.38 and every value its table's rounding allows (from +1.27)``); else None."""
        e = self.estimate
        if self.words is not VerdictWord.RULES_OUT or self.delta is None or e.futility is None:
            return None
        bound, side = (e.futility[1], "<") if self.delta > 0 else (e.futility[0], ">")
        level = ""
        if math.isfinite(e.futility_tail) and 0 < e.futility_tail < 1:
            pct = 100 * e.futility_tail
            digits = 1 if pct >= 0.1 else math.ceil(-math.log10(pct)) + 1  # 98.9%, 99.95%: the tail shows
            level = f" (one-sided {100 - 100 * e.futility_tail:.{digits}f}% at this look)"
        excluded = f"{self.delta:+.2f}"
        near = verdicts.nearest(self.delta, self.spread)
        if self.spread > 0 and near is not None:
            excluded += f" and every value its table's rounding allows (from {near:+.2f})"
        return f"the design's futility bound {self.question.label} {side} {bound:+.2f}{level} excludes {excluded}"

    def value_text(self) -> str:
        """The statistic, its estimate and interval as every place that states the verdict writes them (its line,
        the study's figure, MLflow), e.g. ``Δstd -0.05, 95% CI [-1.30, +1.21]``: one rounding everywhere; followed
        by the bound that decided the verdict where that is not the 95% interval (:meth:`deciding_bound`)."""
        value = self._interval_text()
        deciding = self.deciding_bound()
        return f"{value}; {deciding}" if deciding else value

    def _interval_text(self) -> str:
        e = self.estimate
        if e.has_interval:
            value = f"{self.question.label} {e.estimate:+.2f}, 95% CI [{e.lo:+.2f}, {e.hi:+.2f}]"
        elif math.isnan(e.estimate):
            value = f"{self.question.label} not measurable (a cell it needs has no finished trial)"
        elif e.n < 2:
            value = f"{self.question.label} {e.estimate:+.2f}, no interval (n = {e.n} seed per cell)"
        elif math.isinf(e.lo) or math.isinf(e.hi):  # a sequential design's early look: a tail past float precision
            value = (f"{self.question.label} {e.estimate:+.2f}, no finite interval at this look (the sequential "
                     f"design's bound at {e.n} seeds per cell is beyond any t quantile; its later looks are wider)")
        else:  # intervals.t_interval: the seeds' values were identical
            value = f"{self.question.label} {e.estimate:+.2f}, no interval (its {e.n} seeds gave identical values)"
        return value

    def power_line(self) -> str | None:
        """How many seeds per cell would resolve the observed effect at the observed spread (unresolved only)."""
        if self.words.settled or math.isnan(self.estimate.estimate):
            return None
        if self.seeds_needed is None:
            if self.estimate.n < 2:
                return f"  {self.question.label}: fewer than 2 seeds per cell give no interval; run --seeds 3 or more"
            if math.isinf(self.estimate.lo) or math.isinf(self.estimate.hi):
                return (f"  {self.question.label}: this look's bound (the sequential design's, at "
                        f"{self.estimate.n} seeds per cell) is too strict for a finite interval; its later looks "
                        "are not")
            if not self.estimate.has_interval:
                return (f"  {self.question.label}: its {self.estimate.n} seeds gave identical values, so there is no "
                        "spread to build an interval from (a measurement in coarse steps, e.g. kNN on few test "
                        "images); more seeds or more test images")
            if self.estimate.estimate == 0:
                return f"  {self.question.label}: an effect of 0 cannot be resolved by more seeds"
            return (f"  {self.question.label}: not resolvable at this spread within {sequential.MAX_SEEDS_PROJECTED} "
                    "seeds per cell (the effect is small for its seed-to-seed spread)")
        return (f"  {self.question.label}: ≈{self.seeds_needed} seeds per cell would resolve an effect of this size "
                f"at this spread (now {self.estimate.n}; a projection, not a promise)")


@dataclass
class Answer:
    """Everything a study prints and logs beyond its table."""

    x_label: str
    cells: dict[str, dict[Any, intervals.Estimate]]  # {series: {x: t-interval over seeds}}
    pairs: dict[str, dict[Any, intervals.Estimate]]  # {"dcl − infonce": {x: paired gap}}
    q_b: dict[str, dict[Any, float]]  # {series: {x: mean q_B over seeds}}
    regime: str
    verdicts: list[Verdict] = field(default_factory=list)
    claim: PaperClaim | None = None
    questions: list[Question] = field(default_factory=list)
    design: sequential.Design | None = None  # the verdicts' sequential design (--until-resolved), None: one look

    @property
    def resolved(self) -> bool:
        """Every question is settled either way, i.e. has a verdict other than "not resolved" (False for a study
        that asks none)."""
        return bool(self.verdicts) and all(v.words.settled for v in self.verdicts)

    def outside(self) -> list[str]:
        """``K=4: outside the paper's claimed range for simclr+eqco(α=256) (K ≥ 16, EqCo Sec. 1)``, one line per
        x and question whose cells are shown but not counted."""
        lines = []
        for q in self.questions:
            names = [n for n in dict.fromkeys((q.better, q.base)) if n in self.cells]
            for x in sorted({x for n in names for x in self.cells[n] if not q.in_range(x)}):
                note = f" ({q.range_note})" if q.range_note else ""
                lines.append(f"{self.x_label}={fmt_x(x)}: outside the paper's claimed range for "
                             f"{' vs '.join(names)}{note}; shown, not counted in its verdict")
        return lines


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
    return [(better, base) for _, better, base in gap_pairs(list(names))]


def _mean(values: Sequence[float | None]) -> float:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return sum(finite) / len(finite) if finite else math.nan


def _one_per_seed(rows: Sequence[Mapping[str, Any]], x_key: str) -> list[Mapping[str, Any]]:
    """At most one finished row per (series, x, seed): a search can run one cell twice; its best row stands."""
    best: dict[tuple[Any, ...], Mapping[str, Any]] = {}
    for r in rows:
        if r.get(STATUS) != Status.OK or r.get(KNN_TOP1) is None:
            continue
        key = (r.get(SERIES), r.get(x_key), r.get(SEED))
        if key not in best or r[KNN_TOP1] > best[key][KNN_TOP1]:
            best[key] = r
    return list(best.values())


def _paired(data: intervals.Data, better: str, base: str, base_x: Any = None) -> dict[Any, intervals.Estimate]:
    """``better − base`` per x, paired by seed; with ``base_x``, every x of ``better`` against ``base`` at
    ``base_x`` (DCLW's σ against σ = 1000, i.e. DCL)."""
    if better not in data or base not in data:
        return {}
    if base_x is None:
        return {x: intervals.paired_difference(data[better][x], data[base][x])
                for x in sorted(set(data[better]) & set(data[base]))}
    if base_x not in data[base]:
        return {}
    return {x: intervals.paired_difference(data[better][x], data[base][base_x]) for x in sorted(data[better])
            if x != base_x}


def build_answer(rows: Sequence[Mapping[str, Any]], x_key: str, x_label: str, questions: Sequence[Question],
                 pairs: Sequence[tuple[Any, ...]] | None = None, paper: str | None = None,
                 design: sequential.Design | None = None) -> Answer:
    """The answer from results rows (``series``, ``x_key``, ``seed``, ``knn_top1``, ``q_mean``, ``status``).

    ``pairs``: ``(better, base)`` series compared at each x, or ``(better, base, base_x)`` compared with
    ``base`` at one x; ``None`` = every DCL/InfoNCE pair of series. ``design``: the verdicts are looks of this
    sequential design (their intervals at its nominal level); ``None``: one look at 95%."""
    rows = _one_per_seed(rows, x_key)
    data = intervals.collect(rows, x_key)
    cells = {s: {x: intervals.t_interval(list(by_seed.values())) for x, by_seed in sorted(by_x.items())}
             for s, by_x in sorted(data.items())}
    pairs = default_pairs(list(data)) if pairs is None else list(pairs)
    paired = {}
    for pair in pairs:
        better, base, *rest = pair
        base_x = rest[0] if rest else None
        name = f"{better} − {base}" + (f"@{fmt_x(base_x)}" if base_x is not None else "")
        if gaps := _paired(data, better, base, base_x):
            paired[name] = gaps
    q_data = intervals.collect(rows, x_key, value_key=Q_MEAN)
    q_b = {s: {x: _mean(list(by_seed.values())) for x, by_seed in by_x.items()} for s, by_x in q_data.items()}
    claim = paper_claim(paper) if paper else None
    verdicts = []
    xs = sorted({x for by_x in data.values() for x in by_x})
    for q in questions:
        verdicts.append(judge(q, q.estimate(data, design), q.paper(claim, xs, x_label)))
    bases = [pair[1] for pair in pairs if pair[1] in q_b] or list(q_b)
    return Answer(x_label, cells, paired, q_b, regime_line(q_b, bases), verdicts, claim, list(questions), design)


def judge(question: Question, est: intervals.Estimate, paper: PaperValue) -> Verdict:
    """The verdict on ``question`` of its estimate: the words, weighed against δ (the question's
    ``effect_of_interest``, taken as exact; else the paper's value, to within its table's rounding), and the seeds
    an unresolved one would need."""
    delta, spread = question.effect_of_interest, 0.0
    if delta is None and paper.like_for_like:  # a value over the paper's own x (few epochs: 100/200) is no δ here
        delta, spread = paper.value, paper.spread
    words = verdicts.verdict(est, question.paper_sign, delta, spread)
    return Verdict(question, est, words, paper, sequential.seeds_needed(est, est.n), delta,
                   verdicts.size(est, question.paper_sign, delta, spread), spread)


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


def gap_points(rows_by_study: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Every cell (of every study given) that has both DCL and InfoNCE trials: the paired DCL − InfoNCE gap
    (mean, 95% CI over common seeds), 1 − q_B of its InfoNCE trials and which cell it is (its cell columns, with
    which :func:`~dcl_core.study.analysis.figures.gap_vs_q_figure` labels the point)."""
    points = []
    for study, rows in sorted(rows_by_study.items()):
        by_cell: dict[tuple[Any, ...], dict[str, dict[int, Mapping[str, Any]]]] = {}
        for r in rows:
            if r.get(STATUS) != Status.OK or r.get(LOSS) not in ("dcl", "infonce") or r.get(KNN_TOP1) is None:
                continue
            key = tuple(r.get(c) for c in CELL_COLUMNS)
            by_cell.setdefault(key, {}).setdefault(r[LOSS], {})[int(r.get(SEED) or 0)] = r
        for key, by_loss in by_cell.items():
            if "dcl" not in by_loss or "infonce" not in by_loss:
                continue
            gap = intervals.paired_difference({s: r[KNN_TOP1] for s, r in by_loss["dcl"].items()},
                                              {s: r[KNN_TOP1] for s, r in by_loss["infonce"].items()})
            q = _mean([r.get(Q_MEAN) for r in by_loss["infonce"].values()])
            if gap.n and not math.isnan(q):
                cell = dict(zip(CELL_COLUMNS, key, strict=True))
                points.append({"label": study, "gap": gap.estimate, "lo": gap.lo, "hi": gap.hi,
                               "one_minus_q": 1.0 - q, "n": gap.n, "cell": cell})
    return points
