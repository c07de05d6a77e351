"""What a question measures: its statistic as an object, with what it computes from the cell means, which cells it
reads, which kind of interval it gets, and the name records and MLflow know it by.

Two kinds (:class:`Kind`), two intervals (:mod:`dcl_core.study.analysis.intervals`):

- :class:`Smooth` (a std difference across x, a gap at one x, a slope): computed on each seed's own cells, then a
  t-interval over seeds (:func:`.intervals.seed_interval`), over the cells :attr:`Smooth.inputs` declares;
- :class:`Best` (the best σ against DCL, tuned against tuned): a max/min of paired contrasts, whose groups
  :attr:`Best.contrasts` declares, with t bounds corrected for the selection (:func:`.intervals.max_min_interval`).

:data:`STATISTICS` is the registry: every statistic by its name (the string a study's records, its MLflow
metrics ``verdict/<name>_<i>`` and re-analysis use). :class:`~dcl_core.study.analysis.answer.Question` takes one
of these objects, or its name (looked up here). Adding a question kind is one more instance here (its function
of cell means, its inputs or contrasts) and its case in ``tests/study/analysis/test_measures.py``; the simulated
calibration (:mod:`.calibration`) then wants its truth.

Every function of cell means takes ``{series: {x: mean}}`` and the question's parameters (:class:`Compared`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import numpy as np

from dcl_core.study.analysis import intervals, sequential
from dcl_core.study.analysis.intervals import Cell, Means, nan

CellMeans = Mapping[str, Mapping[Any, float]]
Cells = Mapping[str, Mapping[Any, object]]  # a study's cells, whatever they hold (means, or values by seed)
Contrast = tuple[Cell, Cell]  # (a, b): E[a − b]


class Kind(Enum):
    """How a statistic's interval is made."""

    SMOOTH = "smooth"  # t over seeds of each seed's own statistic
    BEST = "best"  # a max over cells: paired t bounds corrected for the selection


class Compared(Protocol):
    """What a statistic reads of its question (:class:`~dcl_core.study.analysis.answer.Question`, frozen)."""

    @property
    def better(self) -> str:
        """The series the paper finds better."""

    @property
    def base(self) -> str:
        """The series it is compared with ("" for a statistic of one series)."""

    @property
    def at_x(self) -> Any:
        """The x a gap is taken at (None: the statistic's own choice)."""

    @property
    def baseline_x(self) -> Any:
        """The x a series is compared with itself at (best margin), or the base's x of a gap."""

    def in_range(self, x: Any) -> bool:
        """Whether x is within the range the paper claims its result for."""


# ---------------------------------------------------------------- functions of cell means


def std_across(means: Mapping[Any, float], ddof: int = 1) -> float:
    """The std over x of one series' cell means (nan with ddof or fewer finite means)."""
    v = [m for m in means.values() if math.isfinite(m)]
    return float(np.std(v, ddof=ddof)) if len(v) > ddof else nan


def std_difference(cell_means: CellMeans, worse: str, better: str, ddof: int = 1) -> float:
    """``std_across(worse) − std_across(better)`` over the x present in both series."""
    if worse not in cell_means or better not in cell_means:
        return nan
    common = set(cell_means[worse]) & set(cell_means[better])
    return (std_across({x: cell_means[worse][x] for x in common}, ddof)
            - std_across({x: cell_means[better][x] for x in common}, ddof))


def gap_between(cell_means: CellMeans, better: Cell, base: Cell) -> float:
    """``means[better] − means[base]`` for two cells ``(series, x)``; nan when either is missing."""
    a, b = cell_means.get(better[0], {}).get(better[1]), cell_means.get(base[0], {}).get(base[1])
    return nan if a is None or b is None else a - b


def gap_at(cell_means: CellMeans, better: str, base: str, x: Any) -> float:
    """``better[x] − base[x]``; nan when either cell is missing."""
    return gap_between(cell_means, (better, x), (base, x))


def _common(cell_means: CellMeans, better: str, base: str) -> list[Any]:
    return sorted(set(cell_means.get(better, {})) & set(cell_means.get(base, {})))


def gap_at_smallest(cell_means: CellMeans, better: str, base: str) -> float:
    """``better − base`` at the smallest x both series have; nan when they share none."""
    common = _common(cell_means, better, base)
    return gap_at(cell_means, better, base, common[0]) if common else nan


def best_gap(cell_means: CellMeans, better: str, base: str) -> float:
    """The best cell of ``better`` minus the best cell of ``base`` (tuned against tuned, DCL Table 3)."""
    if not cell_means.get(better) or not cell_means.get(base):
        return nan
    return max(cell_means[better].values()) - max(cell_means[base].values())


def _slope_xs(cell_means: CellMeans, better: str, base: str, log2_x: bool = True) -> list[Any]:
    """The x a gap slope is fitted over: in both series, finite gap, x > 0 for log2."""
    return [x for x in set(cell_means.get(better, {})) & set(cell_means.get(base, {}))
            if math.isfinite(gap_at(cell_means, better, base, x)) and (not log2_x or x > 0)]


def gap_slope(cell_means: CellMeans, better: str, base: str, log2_x: bool = True) -> float:
    """Least-squares slope of ``better − base`` against log2(x) (or x), over the x in both series (x > 0 for
    log2); nan with fewer than 2 distinct x."""
    pts = [(math.log2(x) if log2_x else float(x), gap_at(cell_means, better, base, x))
           for x in _slope_xs(cell_means, better, base, log2_x)]
    if len({p for p, _ in pts}) < 2:
        return nan
    u, g = np.array(pts).T
    return float(np.sum((u - u.mean()) * (g - g.mean())) / np.sum((u - u.mean()) ** 2))


def std_difference_lipschitz(cell_means: CellMeans, worse: str, better: str) -> float:
    """A bound for Δstd (ddof 1) over the common x: each series' std over its n finite means moves by at most the
    std of the change, whose largest value over a box of half-width 1 is sqrt((n − (n mod 2)/n) / (n − 1)),
    alternating signs; the sum of the two."""
    if worse not in cell_means or better not in cell_means:
        return nan
    common = _common(cell_means, better, worse)

    def one(series: str) -> float:
        n = sum(math.isfinite(cell_means[series][x]) for x in common)
        return math.sqrt((n - (n % 2) / n) / (n - 1)) if n >= 2 else nan

    return one(worse) + one(better)


def gap_slope_lipschitz(cell_means: CellMeans, better: str, base: str, log2_x: bool = True) -> float:
    """The slope is Σ w_x (better_x − base_x) with w = (u − ū) / Σ(u − ū)², u = log2 x: 2 Σ|w_x| (nan with fewer than
    2 distinct x)."""
    u = np.array(sorted({math.log2(x) if log2_x else float(x) for x in _slope_xs(cell_means, better, base, log2_x)}))
    if len(u) < 2:
        return nan
    centred = u - u.mean()
    return float(2 * np.sum(np.abs(centred)) / np.sum(centred**2))


def best_margin(cell_means: CellMeans, series: str, baseline_x: Any) -> float:
    """``max over x != baseline_x of means[series][x] − means[series][baseline_x]``; nan when missing."""
    means = cell_means.get(series, {})
    others = [m for x, m in means.items() if x != baseline_x]
    return max(others) - means[baseline_x] if others and baseline_x in means else nan


# ---------------------------------------------------------------- the statistics


@dataclass(frozen=True, repr=False)
class Statistic:
    """A question's statistic (see the module docstring). ``of(q, means)`` is its value on cell means (already
    restricted to the question's range); ``label`` names it in the calibration table."""

    name: str
    label: str
    of: Callable[[Compared, CellMeans], float]

    kind = Kind.SMOOTH  # overridden by each subclass

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"

    def inputs(self, q: Compared, means: CellMeans) -> set[Cell]:
        """The cells of ``means`` the statistic reads: those whose removal or change can change its value."""
        raise NotImplementedError

    def estimate(self, q: Compared, data: intervals.Data, function: Callable[[Means], float],
                 inputs: Callable[[Means], Iterable[Cell]], design: sequential.Boundary | None) -> intervals.Estimate:
        """The statistic on ``data`` with its 95% interval (or, with a sequential ``design``, that design's at this
        look). ``function`` and ``inputs`` are the statistic and its inputs on cell means restricted to the
        question's range (:meth:`~dcl_core.study.analysis.answer.Question.function`)."""
        raise NotImplementedError

    def lipschitz(self, q: Compared, means: CellMeans) -> float:
        """L such that moving each cell the statistic reads by at most h moves its value by at most L·h (nan where
        the statistic is undefined): how far a paper's table, rounded to ±h a cell, leaves the paper's value open."""
        raise NotImplementedError


@dataclass(frozen=True, repr=False)
class Smooth(Statistic):
    """A smooth statistic: a t-interval over seeds of each seed's own statistic over the cells ``reads`` names."""

    reads: Callable[[Compared, CellMeans], set[Cell]]
    lipschitz_of: Callable[[Compared, CellMeans], float]

    kind = Kind.SMOOTH

    def inputs(self, q: Compared, means: CellMeans) -> set[Cell]:
        """The cells the statistic reads (a seed missing one of them has no value of it)."""
        return self.reads(q, means)

    def lipschitz(self, q: Compared, means: CellMeans) -> float:
        """Its own bound (``lipschitz_of``): the sum of |weights| of a linear statistic, a std's bound for Δstd."""
        return self.lipschitz_of(q, means)

    def estimate(self, q: Compared, data: intervals.Data, function: Callable[[Means], float],
                 inputs: Callable[[Means], Iterable[Cell]], design: sequential.Boundary | None) -> intervals.Estimate:
        """A t-interval over seeds of each seed's own statistic (the design's interval at this look)."""
        level = 0.95 if design is None else 1 - 2 * design.tail(0.025)
        return intervals.seed_interval(data, function, inputs, level)


@dataclass(frozen=True, repr=False)
class Best(Statistic):
    """A best-of statistic: max over groups of min over the group's contrasts (``contrasts``), paired t bounds
    corrected for the selection."""

    contrasts: Callable[[Compared, Cells], list[list[Contrast]]]

    kind = Kind.BEST

    def inputs(self, q: Compared, means: CellMeans) -> set[Cell]:
        """Every cell of every contrast."""
        return {cell for group in self.contrasts(q, means) for contrast in group for cell in contrast}

    def lipschitz(self, q: Compared, means: CellMeans) -> float:
        """2: each contrast a − b moves by at most 2h, and so does a max of mins of them."""
        return 2.0 if self.contrasts(q, means) else nan

    def estimate(self, q: Compared, data: intervals.Data, function: Callable[[Means], float],
                 inputs: Callable[[Means], Iterable[Cell]], design: sequential.Boundary | None) -> intervals.Estimate:
        """Paired t bounds over the contrasts, corrected for picking the best (the design's at this look)."""
        cells = {s: {x: v for x, v in by_x.items() if q.in_range(x) and v} for s, by_x in data.items()}
        return intervals.max_min_interval(cells, self.contrasts(q, cells),
                                          adjust=design.tail if design is not None else None)


def _base(q: Compared) -> str:
    return q.base or q.better


def _at_cells(q: Compared) -> tuple[Cell, Cell]:
    """``gap_at``'s two cells: ``better`` at ``at_x``, the base (or ``better``) at ``baseline_x`` (or ``at_x``)."""
    return (q.better, q.at_x), (_base(q), q.at_x if q.baseline_x is None else q.baseline_x)


def _present(means: CellMeans, cells: Iterable[Cell]) -> set[Cell]:
    return {(s, x) for s, x in cells if x in means.get(s, {})}


def _margin_contrasts(q: Compared, means: Cells) -> list[list[Contrast]]:
    """One group per x of ``better`` but ``baseline_x``: that x against ``baseline_x`` (none without it)."""
    cells = means.get(q.better, {})
    if q.baseline_x not in cells:
        return []
    return [[((q.better, x), (q.better, q.baseline_x))] for x in cells if x != q.baseline_x]


def _tuned_contrasts(q: Compared, means: Cells) -> list[list[Contrast]]:
    """max_a μ_a − max_b ν_b = max_a min_b (μ_a − ν_b): one group per cell of ``better``, one contrast per cell of
    ``base``."""
    groups = [[((q.better, a), (q.base, b)) for b in means.get(q.base, {})] for a in means.get(q.better, {})]
    return [g for g in groups if g]


STD_DIFFERENCE = Smooth(
    "std_difference", "Δstd across x", lambda q, m: std_difference(m, worse=q.base, better=q.better),
    reads=lambda q, m: {(s, x) for s in (q.base, q.better) for x in _common(m, q.better, q.base)},
    lipschitz_of=lambda q, m: std_difference_lipschitz(m, worse=q.base, better=q.better))
GAP_AT = Smooth(
    "gap_at", "gap at one x vs baseline x", lambda q, m: gap_between(m, *_at_cells(q)),
    reads=lambda q, m: _present(m, _at_cells(q)),
    lipschitz_of=lambda q, m: 2.0 if len(_present(m, _at_cells(q))) == 2 else nan)
GAP_AT_SMALLEST = Smooth(
    "gap_at_smallest", "gap at smallest x", lambda q, m: gap_at_smallest(m, better=q.better, base=q.base),
    reads=lambda q, m: {(s, x) for s in (q.better, q.base) for x in _common(m, q.better, q.base)[:1]},
    lipschitz_of=lambda q, m: 2.0 if _common(m, q.better, q.base) else nan)
GAP_SLOPE = Smooth(
    "gap_slope", "gap slope per doubling", lambda q, m: gap_slope(m, better=q.better, base=q.base),
    reads=lambda q, m: {(s, x) for s in (q.better, q.base) for x in _slope_xs(m, q.better, q.base)},
    lipschitz_of=lambda q, m: gap_slope_lipschitz(m, better=q.better, base=q.base))
BEST_MARGIN = Best(
    "best_margin", "best margin (max over x)", lambda q, m: best_margin(m, series=q.better, baseline_x=q.baseline_x),
    contrasts=_margin_contrasts)
BEST_GAP = Best(
    "best_gap", "best gap (tuned vs tuned)", lambda q, m: best_gap(m, better=q.better, base=q.base),
    contrasts=_tuned_contrasts)

STATISTICS: Mapping[str, Statistic] = {s.name: s for s in (STD_DIFFERENCE, GAP_AT, GAP_AT_SMALLEST, GAP_SLOPE,
                                                            BEST_MARGIN, BEST_GAP)}


def statistic(name_or_statistic: str | Statistic) -> Statistic:
    """The registered statistic of this name (a :class:`Statistic` is returned as it is); ValueError for an
    unknown name."""
    if isinstance(name_or_statistic, Statistic):
        return name_or_statistic
    try:
        return STATISTICS[name_or_statistic]
    except KeyError:
        raise ValueError(f"unknown statistic {name_or_statistic!r}; one of {', '.join(STATISTICS)}") from None


def of_kind(kind: Kind) -> Sequence[Statistic]:
    """The registered statistics of one kind."""
    return [s for s in STATISTICS.values() if s.kind is kind]
