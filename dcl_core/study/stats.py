"""Confidence intervals and verdicts for a study's trials: t-intervals over seeds, differences paired by seed id, a
percentile bootstrap over seeds for headline statistics of the cell means, and the verdict those intervals give.

Data is ``{series: {x: {seed: value}}}`` (:func:`collect`). Everything here is pure (numpy and scipy only) and
deterministic: the bootstrap draws from ``numpy.random.default_rng(seed)``.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy import stats as sps

log = logging.getLogger(__name__)

Data = dict[str, dict[Any, dict[int, float]]]  # {series: {x: {seed: value}}}
Means = dict[str, dict[Any, float]]  # {series: {x: mean over seeds}}
Verdict = Literal["supports the paper", "contradicts the paper", "not resolved"]
nan = math.nan


@dataclass(frozen=True)
class Estimate:
    """A point estimate, its 95% CI (``nan`` bounds when there is none) and the observations behind it."""

    estimate: float
    lo: float
    hi: float
    n: int
    std: float = nan

    @property
    def has_interval(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    @property
    def half_width(self) -> float:
        return (self.hi - self.lo) / 2 if self.has_interval else nan


def _finite(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def collect(rows: Sequence[Mapping[str, Any]], x_key: str, series_key: str = "series",
            value_key: str = "knn_top1") -> Data:
    """``{series: {x: {seed: value}}}`` from the rows with ``status == "ok"`` and a finite ``value_key`` (rows
    without a seed are skipped: they cannot be paired). A second row for one (series, x, seed) raises ValueError:
    a pairing by seed would be ambiguous."""
    data: Data = {}
    no_seed = 0
    for r in rows:
        value = _finite(r.get(value_key))
        if r.get("status") != "ok" or value is None:
            continue
        if r.get("seed") is None:
            no_seed += 1
            continue
        cell = data.setdefault(r.get(series_key), {}).setdefault(r.get(x_key), {})
        if r["seed"] in cell:
            raise ValueError(f"two rows for {series_key}={r.get(series_key)!r}, {x_key}={r.get(x_key)!r}, "
                             f"seed={r['seed']!r}: pairing by seed would be ambiguous")
        cell[r["seed"]] = value
    if no_seed:
        log.warning("skipped %d finished row(s) without a seed (%s)", no_seed, value_key)
    return data


def t_interval(values: Sequence[float], level: float = 0.95) -> Estimate:
    """Mean and its t-distribution CI over the finite ``values``: mean ± t_{(1+level)/2, n−1}·s/√n, s with ddof=1.
    n = 1: no interval; n = 0: everything nan."""
    v = np.array([x for x in values if _finite(x) is not None], dtype=float)
    if v.size == 0:
        return Estimate(nan, nan, nan, 0)
    mean = float(v.mean())
    if v.size == 1:
        return Estimate(mean, nan, nan, 1)
    s = float(v.std(ddof=1))
    h = float(sps.t.ppf((1 + level) / 2, v.size - 1)) * s / math.sqrt(v.size)
    return Estimate(mean, mean - h, mean + h, int(v.size), s)


def paired_difference(better: Mapping[int, float], base: Mapping[int, float], level: float = 0.95) -> Estimate:
    """``better − base`` paired by seed id over the seeds present in both (never by position): t-interval of the
    per-seed differences."""
    common = sorted(set(better) & set(base))
    return t_interval([better[s] - base[s] for s in common], level)


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


def _changes(statistic: Callable[[Means], float], means: Means, point: float) -> bool:
    try:
        return not _same(float(statistic({s: by_x for s, by_x in means.items() if by_x})), point)
    except KeyError:  # a statistic that indexes the cell directly needs it
        return True


def _used_cells(means: Means, statistic: Callable[[Means], float], point: float) -> list[tuple[str, Any]]:
    """The cells the statistic depends on: those whose removal or a ±1 change of their mean changes its value."""
    used = []
    for s, by_x in means.items():
        for x in by_x:
            without = {**means, s: {y: m for y, m in by_x.items() if y != x}}
            shifted = [{**means, s: {**by_x, x: by_x[x] + d}} for d in (1.0, -1.0)]
            if any(_changes(statistic, m, point) for m in (without, *shifted)):
                used.append((s, x))
    return used


def bootstrap(data: Data, statistic: Callable[[dict[str, dict[Any, float]]], float], draws: int = 2000,
              seed: int = 0, level: float = 0.95) -> Estimate:
    """Percentile bootstrap over seeds of ``statistic(cell means)``, expanded for few seeds (:func:`expanded_tail`).

    The seed is a study's replication unit: it fixes the images, the initial weights and the data order of every
    cell (``tests/training/test_trainer.py`` checks this across losses), so cells are not independent. Each draw
    resamples the study's seeds (the union over all cells) with replacement and applies the same drawn seeds to
    every cell: cells stay paired by seed within an x (DCL vs InfoNCE) and across x (a statistic across τ sees
    each seed's shared offset cancel, as in the data). A cell's mean counts each drawn seed it has as often as
    drawn; drawn seeds it lacks (a failed trial) are skipped. Draws where the statistic is nan are discarded;
    with fewer than half left there is no interval. The statistic's "cells used" are those it depends on
    (:func:`_used_cells`): ``n`` is their minimum seed count, and there is no interval when each has fewer than
    2 seeds. ``std`` is the std of the bootstrap replicates."""
    cells = {s: {x: v for x, v in by_x.items() if v} for s, by_x in data.items()}
    cells = {s: by_x for s, by_x in cells.items() if by_x}
    means = {s: {x: float(np.mean(list(v.values()))) for x, v in by_x.items()} for s, by_x in cells.items()}
    point = float(statistic(means)) if means else nan
    if math.isnan(point):
        return Estimate(nan, nan, nan, min((len(v) for bx in cells.values() for v in bx.values()), default=0))
    counts = [len(cells[s][x]) for s, x in _used_cells(means, statistic, point)]
    n = min(counts, default=0)
    if max(counts, default=0) < 2:
        return Estimate(point, nan, nan, n)
    xs = list(dict.fromkeys(x for by_x in cells.values() for x in by_x))
    with contextlib.suppress(TypeError):  # unorderable x values keep first-appearance order
        xs = sorted(xs)
    rng = np.random.default_rng(seed)
    seeds = sorted({sd for by_x in cells.values() for v in by_x.values() for sd in v})
    k = len(seeds)
    picks = rng.integers(0, k, size=(draws, k))
    times = np.stack([np.bincount(row, minlength=k) for row in picks])  # (draws, k): how often each seed was drawn
    draw_means: dict[str, dict[Any, np.ndarray]] = {s: {} for s in cells}
    for x in xs:
        for s, by_x in cells.items():
            if x in by_x:
                have = np.array([sd in by_x[x] for sd in seeds], dtype=float)
                vals = np.array([by_x[x].get(sd, 0.0) for sd in seeds], dtype=float)
                w = times * have
                total = w.sum(axis=1)
                with np.errstate(invalid="ignore", divide="ignore"):
                    draw_means[s][x] = np.where(total > 0, (w @ vals) / total, nan)
    reps = []
    for i in range(draws):
        m = {s: {x: float(a[i]) for x, a in by_x.items() if not math.isnan(a[i])} for s, by_x in draw_means.items()}
        reps.append(float(statistic({s: bx for s, bx in m.items() if bx})))
    r = np.array([v for v in reps if not math.isnan(v)])
    if r.size < draws / 2 or r.size < 2:
        log.info("bootstrap: %d of %d draws gave a value; no interval", r.size, draws)
        return Estimate(point, nan, nan, n)
    alpha = expanded_tail(level, k)
    lo, hi = np.percentile(r, [100 * alpha, 100 * (1 - alpha)])
    return Estimate(point, float(lo), float(hi), n, float(r.std(ddof=1)))


def expanded_tail(level: float, k: int) -> float:
    """The tail probability of an *expanded* percentile bootstrap interval over ``k`` resampled units.

    A plain percentile interval over few seeds is too narrow: resampling k seeds sees their spread with divisor k
    instead of k − 1, and uses normal instead of t quantiles; with 3 seeds its nominal 95% covers far less. The
    expansion (Hesterberg, "What teachers should know about the bootstrap", 2015) reads the bootstrap
    distribution at Φ(−√(k/(k−1)) · t_{(1+level)/2, k−1}) instead of (1 − level)/2: the 0.1 and 99.9 percentiles
    for 5 seeds, the extremes for 3, and the usual 2.5/97.5 as k grows."""
    if k < 2:
        return (1 - level) / 2
    return float(sps.norm.cdf(-math.sqrt(k / (k - 1)) * sps.t.ppf((1 + level) / 2, k - 1)))


def verdict(est: Estimate, paper_sign: int) -> Verdict:
    """``paper_sign`` +1: the paper claims the statistic > 0; −1: < 0. Supports when the CI lies strictly on the
    paper's side of 0, contradicts when strictly on the other side; otherwise (or no interval) not resolved."""
    if paper_sign not in (1, -1):
        raise ValueError(f"paper_sign must be +1 or -1, not {paper_sign!r}")
    if not est.has_interval:
        return "not resolved"
    if est.lo > 0 or est.hi < 0:
        return "supports the paper" if (est.lo > 0) == (paper_sign > 0) else "contradicts the paper"
    return "not resolved"


def seeds_needed(est: Estimate, n: int) -> int | None:
    """Seeds per cell for the CI half-width to shrink to |estimate| at the observed spread and effect: a rough
    power estimate assuming CI width ∝ 1/√n. ``n`` if the interval already excludes 0; otherwise
    max(n + 1, ⌈n·(half_width/|estimate|)²⌉); None without an interval or with an estimate of 0 or nan."""
    if not est.has_interval or math.isnan(est.estimate) or est.estimate == 0:
        return None
    if est.lo > 0 or est.hi < 0:
        return n
    return max(n + 1, math.ceil(round(n * (est.half_width / abs(est.estimate)) ** 2, 9)))


# ---------------------------------------------------------------- headline statistics: functions of cell means


def std_across(means: Mapping[Any, float], ddof: int = 1) -> float:
    """The std over x of one series' cell means (nan with ddof or fewer finite means)."""
    v = [m for m in means.values() if math.isfinite(m)]
    return float(np.std(v, ddof=ddof)) if len(v) > ddof else nan


def std_difference(cell_means: Mapping[str, Mapping[Any, float]], worse: str, better: str, ddof: int = 1) -> float:
    """``std_across(worse) − std_across(better)`` over the x present in both series."""
    if worse not in cell_means or better not in cell_means:
        return nan
    common = set(cell_means[worse]) & set(cell_means[better])
    return (std_across({x: cell_means[worse][x] for x in common}, ddof)
            - std_across({x: cell_means[better][x] for x in common}, ddof))


def gap_at(cell_means: Mapping[str, Mapping[Any, float]], better: str, base: str, x: Any) -> float:
    """``better[x] − base[x]``; nan when either cell is missing."""
    a, b = cell_means.get(better, {}).get(x), cell_means.get(base, {}).get(x)
    return nan if a is None or b is None else a - b


def gap_at_smallest(cell_means: Mapping[str, Mapping[Any, float]], better: str, base: str) -> float:
    """``better − base`` at the smallest x both series have; nan when they share none."""
    common = sorted(set(cell_means.get(better, {})) & set(cell_means.get(base, {})))
    return gap_at(cell_means, better, base, common[0]) if common else nan


def best_gap(cell_means: Mapping[str, Mapping[Any, float]], better: str, base: str) -> float:
    """The best cell of ``better`` minus the best cell of ``base`` (tuned against tuned, DCL Table 3)."""
    if not cell_means.get(better) or not cell_means.get(base):
        return nan
    return max(cell_means[better].values()) - max(cell_means[base].values())


def gap_slope(cell_means: Mapping[str, Mapping[Any, float]], better: str, base: str, log2_x: bool = True) -> float:
    """Least-squares slope of ``better − base`` against log2(x) (or x), over the x in both series (x > 0 for
    log2); nan with fewer than 2 distinct x."""
    pts = []
    for x in set(cell_means.get(better, {})) & set(cell_means.get(base, {})):
        g = gap_at(cell_means, better, base, x)
        if math.isfinite(g) and (not log2_x or x > 0):
            pts.append((math.log2(x) if log2_x else float(x), g))
    if len({p for p, _ in pts}) < 2:
        return nan
    u, g = np.array(pts).T
    return float(np.sum((u - u.mean()) * (g - g.mean())) / np.sum((u - u.mean()) ** 2))


def best_margin(cell_means: Mapping[str, Mapping[Any, float]], series: str, baseline_x: Any) -> float:
    """``max over x != baseline_x of means[series][x] − means[series][baseline_x]``; nan when missing."""
    means = cell_means.get(series, {})
    others = [m for x, m in means.items() if x != baseline_x]
    return max(others) - means[baseline_x] if others and baseline_x in means else nan


def format_estimate(est: Estimate, digits: int = 1, signed: bool = True) -> str:
    """``+0.6 [-0.9, +2.1]``, or ``+0.6 (n=1, no interval)``; ``nan (n=0, no interval)`` when undefined."""
    spec = f"{'+' if signed else ''}.{digits}f"
    if not est.has_interval:
        return f"{est.estimate:{spec}} (n={est.n}, no interval)"
    return f"{est.estimate:{spec}} [{est.lo:{spec}}, {est.hi:{spec}}]"
