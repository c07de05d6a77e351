"""Confidence intervals over a study's seeds, each an :class:`Estimate`: t-intervals, differences paired by seed id,
each seed's own statistic with a t-interval over seeds, and the selection-corrected interval of a "best" statistic.

Two kinds of question statistic (:mod:`.measures`), two intervals, both calibrated by simulating studies with a
known truth (``tests/study/analysis/test_calibration.py``, :mod:`dcl_core.study.analysis.calibration`):

- smooth ones (a std difference across x, a gap at one x, a slope): computed on each seed's own cells, then a
  t-interval over seeds (:func:`seed_interval`);
- "best" ones (the best σ against DCL, tuned against tuned): a max/min of paired contrasts with t bounds
  corrected for the selection (:func:`max_min_interval`).

A sequential design's look gives these intervals its own tails (:mod:`.sequential`); what an interval says of the
paper's claim is :mod:`.verdicts`'. Data is ``{series: {x: {seed: value}}}`` (:func:`collect`). Everything here is
pure (numpy and scipy only) and deterministic.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import numpy as np

from dcl_core.study.analysis.columns import KNN_TOP1, SEED, SERIES, STATUS, Status

log = logging.getLogger(__name__)

Data = dict[str, dict[Any, dict[int, float]]]  # {series: {x: {seed: value}}}
Means = dict[str, dict[Any, float]]  # {series: {x: mean over seeds}}
Cell = tuple[str, Any]  # (series, x)
nan = math.nan
# Values closer than this (relative to max(100, |value|): 1e-4 on a percentage scale) are one value. A metric
# computed in float32 carries ~1e-7 relative rounding per value, a statistic of several such values a few times
# that: two seeds' Δstd from identical kNN counts came out 3.5355347 and 3.5355369, and their "interval" was
# [+3.54, +3.54]. No seed-to-seed spread of a real measurement is that small: a kNN accuracy moves in steps of
# 100/n_test ≥ 0.002 points (50,000 test images).
SAME_VALUE_RTOL = 1e-6


@dataclass(frozen=True)
class Estimate:
    """A point estimate, its 95% CI (``nan`` bounds when there is none) and the observations behind it."""

    estimate: float
    lo: float
    hi: float
    n: int
    std: float = nan
    tail: float = 0.025  # each side's tail probability of the interval (Bonferroni's when simultaneous)
    # A group-sequential look (:class:`.sequential.GroupSequential`): the interval at the design's futility level,
    # whose bound on δ's side rules δ out; None: the interval's own bounds do.
    futility: tuple[float, float] | None = None
    futility_tail: float = nan  # that interval's nominal one-sided tail at this look (its bound's level: 1 − it)
    # The statistic's per-seed SD where the bounds are not symmetric about the estimate (a group-sequential look);
    # nan: read from the half-width (:func:`per_seed_sd`).
    spread: float = nan

    @property
    def has_interval(self) -> bool:
        """Whether both bounds of the confidence interval are finite."""
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    @property
    def half_width(self) -> float:
        """Half the confidence interval's width, nan when there is no interval."""
        return (self.hi - self.lo) / 2 if self.has_interval else nan


def _finite(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def collect(rows: Sequence[Mapping[str, Any]], x_key: str, series_key: str = SERIES,
            value_key: str = KNN_TOP1) -> Data:
    """``{series: {x: {seed: value}}}`` from the rows with ``status == Status.OK`` and a finite ``value_key`` (rows
    without a seed are skipped: they cannot be paired). A second row for one (series, x, seed) raises ValueError:
    a pairing by seed would be ambiguous."""
    data: Data = {}
    no_seed = 0
    for r in rows:
        value = _finite(r.get(value_key))
        if r.get(STATUS) != Status.OK or value is None:
            continue
        if r.get(SEED) is None:
            no_seed += 1
            continue
        series: str = r[series_key]  # an OK row always has its series
        cell = data.setdefault(series, {}).setdefault(r.get(x_key), {})
        if r[SEED] in cell:
            raise ValueError(f"two rows for {series_key}={r.get(series_key)!r}, {x_key}={r.get(x_key)!r}, "
                             f"seed={r[SEED]!r}: pairing by seed would be ambiguous")
        cell[r[SEED]] = value
    if no_seed:
        log.warning("skipped %d finished row(s) without a seed (%s)", no_seed, value_key)
    return data


@functools.lru_cache(maxsize=4096)
def t_quantile(q: float, df: int) -> float:
    """Student's t ``q``-quantile with ``df`` degrees of freedom (scipy's, cached: the calibration simulations ask
    for the same few hundred thousands of times)."""
    from scipy import stats as sps  # ~1 s: a trial worker imports this module (via the spec), never this function

    return float(sps.t.ppf(q, df))


def t_interval(values: Sequence[float], level: float = 0.95) -> Estimate:
    """Mean and its t-distribution CI over the finite ``values``: mean ± t_{(1+level)/2, n−1}·s/√n, s with ddof=1.
    n = 1: no interval; n = 0: everything nan. Identical values (equal up to rounding, :data:`SAME_VALUE_RTOL`)
    give no interval either: a measurement that moves in steps (a kNN accuracy over a few test images moves by
    100/n_test %) can repeat exactly, and a zero-width interval would claim a certainty the seeds do not give (it
    misses the mean whenever the mean is not on the step grid;
    ``tests/study/analysis/test_intervals_verdicts.py`` simulates it)."""
    v = np.array([x for x in values if _finite(x) is not None], dtype=float)
    n = int(v.size)
    if n == 0:
        return Estimate(nan, nan, nan, 0)
    # numpy's mean, ptp and std(ddof=1), step by step: the same operations in the same order, so the same bits,
    # without their wrappers' overhead (the calibration computes a million of these)
    mean = float(np.add.reduce(v) / n)
    if n == 1:
        return Estimate(mean, nan, nan, 1, tail=(1 - level) / 2)
    top, bottom = float(v.max()), float(v.min())
    if top - bottom <= SAME_VALUE_RTOL * max(100.0, top, -bottom):
        return Estimate(mean, nan, nan, n, 0.0, tail=(1 - level) / 2)
    deviations = v - mean
    s = math.sqrt(float(np.add.reduce(deviations * deviations)) / (n - 1))
    h = t_quantile((1 + level) / 2, n - 1) * s / math.sqrt(n)
    return Estimate(mean, mean - h, mean + h, n, s, tail=(1 - level) / 2)


def paired_difference(better: Mapping[int, float], base: Mapping[int, float], level: float = 0.95) -> Estimate:
    """``better − base`` paired by seed id over the seeds present in both (never by position): t-interval of the
    per-seed differences."""
    common = sorted(set(better) & set(base))
    return t_interval([better[s] - base[s] for s in common], level)


def cell_means(data: Data) -> Means:
    """``{series: {x: mean over its seeds}}`` of the cells that have at least one value."""
    means = {s: {x: float(np.mean(list(v.values()))) for x, v in by_x.items() if v} for s, by_x in data.items()}
    return {s: by_x for s, by_x in means.items() if by_x}


def per_seed(data: Data, statistic: Callable[[Means], float], inputs: Callable[[Means], Iterable[Cell]]
             ) -> dict[int, float]:
    """The statistic computed on each seed's own cells: ``{seed: statistic({series: {x: that seed's value}})}``
    over the seeds present in every cell the statistic uses (``inputs`` of the cell means: the cells it reads,
    :meth:`.measures.Statistic.inputs`), each seed's cells restricted to those, so every seed's value is the
    same function of the same cells."""
    means = cell_means(data)
    if not means or math.isnan(float(statistic(means))):
        return {}
    declared = set(inputs(means))
    used = [(s, x) for s, by_x in means.items() for x in by_x if (s, x) in declared]
    if not used:
        return {}
    seeds = set.intersection(*(set(data[s][x]) for s, x in used))
    out = {}
    for seed in sorted(seeds):
        own: Means = {}
        for s, x in used:
            own.setdefault(s, {})[x] = data[s][x][seed]
        out[seed] = float(statistic(own))
    return {k: v for k, v in out.items() if math.isfinite(v)}


def seed_interval(data: Data, statistic: Callable[[Means], float], inputs: Callable[[Means], Iterable[Cell]],
                  level: float = 0.95) -> Estimate:
    """The statistic's mean over seeds with a t-interval over seeds (:func:`per_seed`, then :func:`t_interval`).

    A seed is the study's replication unit: it fixes the images, the initial weights, the data order and the views
    of every cell (``tests/training/test_trainer.py`` checks it), so each seed's statistic (its Δstd across τ, its
    gap, its slope) is one independent draw, and a seed's offset shared by all its cells cancels inside it. For a
    statistic linear in the cells (a gap, a slope) the estimate equals the statistic of the cell means over the
    same seeds and this is the paired t-interval; for a nonlinear one (a std across x) the estimand is the
    expected statistic of one run per cell, which is how a paper computes it from its single runs. Seeds missing a
    cell the statistic uses are left out (n counts the rest); fewer than 2 seeds: no interval. Its coverage is
    checked by simulation (``tests/study/analysis/test_calibration.py``)."""
    values = per_seed(data, statistic, inputs)
    if not values:
        means = cell_means(data)
        point = float(statistic(means)) if means else nan
        return Estimate(point, nan, nan, 0)
    return t_interval(list(values.values()), level)


def max_min_interval(data: Data, groups: Sequence[Sequence[tuple[Cell, Cell]]], level: float = 0.95,
                     adjust: Callable[[float], float] | None = None) -> Estimate:
    """θ = max over groups of (min over the group's contrasts of E[a − b]), with an interval valid for any truth.

    A "best" statistic has this form: the best σ's margin over σ = 1000 is max_σ (μ_σ − μ_1000) (one contrast a
    group), tuned-vs-tuned is max_a μ_a − max_b ν_b = max_a min_b (μ_a − ν_b). Each contrast ``(a, b)`` (cells
    ``(series, x)``) gets paired t bounds over the seeds both cells have; the interval is
    [max_g min_c lo_c, max_g min_c hi_c], monotone in every contrast. Its error on each side is a union over few
    events, whatever cell the data make look best:

    - L > θ needs, in some group g, lo_c > E[c] at that group's true minimising contrast c (one fixed contrast
      per group): each lower bound is one-sided at α/(2·G), G = the number of groups;
    - U < θ needs, in the true best group g*, hi_c < E[c] for some c of g*: each upper bound is one-sided at
      α/(2·S), S = the size of the largest group.

    So P(θ outside) ≤ α (Bonferroni over G events below and S above, not over all G·S contrasts). The estimate is
    max_g min_c of the contrasts' mean differences. No interval when a contrast has fewer than 2 common seeds or
    identical differences on all of them (:func:`t_interval`); nan when a cell is missing. ``tail`` is the
    smaller of the two one-sided tails (for :func:`.sequential.seeds_needed`). ``adjust`` maps each one-sided tail
    to the one a look of a sequential design uses (:meth:`.sequential.Sequential.tail`)."""
    groups = [list(g) for g in groups if g]
    contrasts = list(dict.fromkeys(c for g in groups for c in g))
    if not contrasts:
        return Estimate(nan, nan, nan, 0)
    tail_lo = (1 - level) / (2 * len(groups))
    tail_hi = (1 - level) / (2 * max(len(g) for g in groups))
    if adjust is not None:  # a look of a sequential design: each bound's tail as that design spends it
        tail_lo, tail_hi = adjust(tail_lo), adjust(tail_hi)
    lo: dict[tuple[Cell, Cell], float] = {}
    hi: dict[tuple[Cell, Cell], float] = {}
    mean: dict[tuple[Cell, Cell], float] = {}
    n = math.inf
    for c in contrasts:
        (sa, xa), (sb, xb) = c
        a, b = data.get(sa, {}).get(xa), data.get(sb, {}).get(xb)
        if not a or not b:
            return Estimate(nan, nan, nan, 0)
        d = paired_difference(a, b)
        mean[c], n = d.estimate, min(n, d.n)
        if d.has_interval:  # 2 or more common seeds whose differences are not all equal
            se = d.std / math.sqrt(d.n)
            lo[c] = d.estimate - t_quantile(1 - tail_lo, d.n - 1) * se
            hi[c] = d.estimate + t_quantile(1 - tail_hi, d.n - 1) * se
    point = max(min(mean[c] for c in g) for g in groups)
    tail = min(tail_lo, tail_hi)
    if n < 2 or len(lo) < len(contrasts):  # a contrast without an interval leaves the statistic without one
        return Estimate(point, nan, nan, int(n), tail=tail)
    return Estimate(point, max(min(lo[c] for c in g) for g in groups), max(min(hi[c] for c in g) for g in groups),
                    int(n), tail=tail)


def per_seed_sd(est: Estimate) -> float:
    """The statistic's per-seed SD behind ``est``'s interval (its ``spread``, else half-width·√n over its t
    quantile); nan without one."""
    if math.isfinite(est.spread):
        return est.spread
    if not est.has_interval or est.n < 2:
        return nan
    return est.half_width * math.sqrt(est.n) / t_quantile(1 - est.tail, est.n - 1)


def format_number(value: float, digits: int = 1, signed: bool = False) -> str:
    """``value`` with ``digits`` decimals, a half rounded away from zero, after dropping float noise (12
    significant digits): one mean computed two ways (34.25 and 34.250000000000007) prints the same, 34.3, where
    Python's format rounds the first to even (34.2) and the second up. ``signed``: ``+`` before a positive value."""
    if not math.isfinite(value):
        return f"{value:{'+' if signed else ''}.{digits}f}"
    text = f"{Decimal(f'{value:.12g}').quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP):f}"
    return f"+{text}" if signed and not text.startswith("-") else text
