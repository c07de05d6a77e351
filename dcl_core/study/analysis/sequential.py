"""Sequential designs for seeds added in rounds (``--until-resolved``): where each look's bounds lie so that looking
after every round resolves no more null studies than one look at 95%, and how many seeds a study needs.

- :class:`GroupSequential` (what ``--until-resolved`` runs): 6 looks, a bound on each side of 0 and a futility bound
  on the effect of interest's side, each a Wang-Tsiatis boundary (:class:`SideBoundary`) placed by simulation;
- :class:`Sequential`: Pocock's design, one nominal tail at every look (studies recorded before keep it);
- :func:`group_look`: a question's interval at one look of a group-sequential design;
- :func:`seeds_needed` (the seeds an unresolved interval would need at its observed spread, at most
  :data:`MAX_SEEDS_PROJECTED`) and :func:`fixed_design_seeds` (the seeds one look needs for 80% power).

The intervals themselves are :mod:`.intervals`'; a design only sets the tails they are computed at. Pure and
deterministic: every simulation is seeded. The designs' error rates are checked on simulated studies in
``tests/study/analysis/test_calibration.py``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np

from dcl_core.study.analysis.intervals import Data, Estimate, per_seed_sd, t_quantile

SEQUENTIAL_SIMULATIONS = 200_000  # null studies simulated per design to place its boundary (deterministic)


@dataclass(frozen=True)
class Sequential:
    """A group-sequential design for seeds added in rounds: the verdict is looked at with ``first`` seeds per
    cell, then every ``step`` more, up to ``max_seeds``, and the study stops at the first look that resolves.

    Looking after every round must not resolve more null studies than one look does. Each look here is the
    fixed design's t-interval (or the "best" statistics' bounds) at one constant nominal one-sided tail p*
    (:meth:`tail`; Pocock's boundary on the p-value scale), chosen so that under the null the chance that ANY
    look's t statistic crosses it is the fixed design's tail (0.025 a side). A t statistic over i.i.d. normal
    per-seed values is pivotal (its law does not depend on the mean's scale or the spread), so the sequence of
    t statistics at the looks has one law under every null; p* is its quantile, found by simulating
    :data:`SEQUENTIAL_SIMULATIONS` null studies of this design (seeded: the same p* on every machine, to Monte
    Carlo precision ~2% of p*). Stopping before ``max_seeds`` (a time cap) only removes looks, so the overall
    rate can only fall. Checked on simulated studies with a known truth, through the studies' own code, in
    ``tests/study/analysis/test_calibration.py``."""

    first: int
    max_seeds: int
    step: int = 1

    def __post_init__(self) -> None:
        if not 2 <= self.first <= self.max_seeds or self.step < 1:
            raise ValueError(f"a sequential design needs 2 <= first <= max_seeds and step >= 1, got first "
                             f"{self.first}, max_seeds {self.max_seeds}, step {self.step}")

    @property
    def looks(self) -> tuple[int, ...]:
        """Seeds per cell at each look: first, first + step, …, and max_seeds."""
        return tuple(dict.fromkeys([*range(self.first, self.max_seeds, self.step), self.max_seeds]))

    def tail(self, tail: float) -> float:
        """The nominal one-sided tail each look uses so that the design's overall one-sided tail is ``tail``."""
        return _nominal_tail(self.looks, tail)

    def describe(self) -> str:
        """``looks at 5, 6, …, 45 seeds per cell, each interval at a nominal two-sided 0.62% so that all 41 looks
        together resolve ≤ 5% of null studies`` (what the answer and ``--dry-run`` print of it)."""
        looks = self.looks
        shown = ", ".join(map(str, looks)) if len(looks) <= 5 else f"{looks[0]}, {looks[1]}, …, {looks[-1]}"
        return (f"looks at {shown} seeds per cell, each interval at a nominal two-sided {200 * self.tail(0.025):.2g}% "
                f"so that all {len(looks)} looks together resolve ≤ 5% of null studies")


@functools.lru_cache(maxsize=128)
def _nominal_tail(looks: tuple[int, ...], tail: float) -> float:
    if len(looks) == 1:
        return tail
    from scipy import stats as sps  # ~1 s: a trial worker imports this module (via the spec), never this function

    rng = np.random.default_rng(20261125)
    chunk, smallest = 20_000, []
    for _ in range(SEQUENTIAL_SIMULATIONS // chunk):
        x = rng.standard_normal((chunk, looks[-1]))  # per-seed statistics of null studies, in SD units
        total, squares = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
        p = np.ones(chunk)
        for n in looks:
            mean = total[:, n - 1] / n
            var = np.maximum(squares[:, n - 1] - n * mean**2, 1e-300) / (n - 1)
            p = np.minimum(p, sps.t.sf(mean / np.sqrt(var / n), n - 1))  # one-sided p-value at this look
        smallest.append(p)
    return float(np.quantile(np.concatenate(smallest), tail))


class Boundary(Protocol):
    """What an interval needs of a sequential design at one look: the nominal one-sided tail that stands in for
    the fixed design's ``tail`` (0.025, or a Bonferroni share of it)."""

    def tail(self, tail: float) -> float:
        """The nominal one-sided tail a look uses in place of the fixed design's ``tail``."""
        ...


# The group-sequential design's errors, each over all its looks (fractions of the studies simulated with that truth):
PAPER_SIDE_ERROR = 0.045  # null studies that end "supports the paper" (the interval's bound on the paper's side)
OTHER_SIDE_ERROR = 0.005  # null studies that end "contradicts the paper"; with the above, 5% resolved falsely
FUTILITY_ERROR = 0.05  # studies whose truth is δ that end "rules out the paper's size" (the futility bound)
GROUP_LOOKS = 6  # looks, equally spaced from the first to the last
BOUNDARY_SHAPE = 0.2  # Wang-Tsiatis Δ of every bound: 0.5 is Pocock's (one tail at every look), 0 O'Brien-Fleming's
# Designs recorded before BOUNDARY_SHAPE (their record names no shape): Pocock's boundary, 4% on the paper's side
POCOCK_SHAPE = 0.5
EARLIER_PAPER_SIDE_ERROR = 0.04
RESOLVED_FALSELY = 0.05  # both sides together: as one look at 95%


@functools.lru_cache(maxsize=256)
def _nominal_tails(looks: tuple[int, ...], tail: float, shape: float) -> tuple[float, ...]:
    """Each look's nominal one-sided tail for a one-sided error ``tail`` over all ``looks`` under a Wang-Tsiatis
    boundary of shape Δ: on the normal scale the look at n seeds crosses at c·(n/N)^(Δ−0.5) (N the last look), so
    early looks are stricter than late ones for Δ < 0.5 and all alike for Δ = 0.5 (Pocock's, computed as before:
    :func:`_nominal_tail`). Each look's t statistic is mapped to the normal scale through its own p-value (exact
    for t with n − 1 df), and c is the (1 − tail) quantile of max over looks of z_n / (n/N)^(Δ−0.5) in the same
    seeded simulation of pivotal null studies as :func:`_nominal_tail`."""
    if shape == POCOCK_SHAPE or len(looks) == 1:
        return (_nominal_tail(looks, tail),) * len(looks)
    from scipy import stats as sps  # ~1 s: a trial worker imports this module (via the spec), never this function

    weights = np.array([(n / looks[-1]) ** (shape - 0.5) for n in looks])
    rng = np.random.default_rng(20261125)
    chunk, largest = 20_000, []
    for _ in range(SEQUENTIAL_SIMULATIONS // chunk):
        x = rng.standard_normal((chunk, looks[-1]))  # per-seed statistics of null studies, in SD units
        total, squares = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
        scaled = np.full(chunk, -np.inf)
        for n, w in zip(looks, weights, strict=True):
            mean = total[:, n - 1] / n
            var = np.maximum(squares[:, n - 1] - n * mean**2, 1e-300) / (n - 1)
            z = sps.norm.isf(sps.t.sf(mean / np.sqrt(var / n), n - 1))  # this look's t statistic, normal scale
            scaled = np.maximum(scaled, z / w)
        largest.append(scaled)
    c = float(np.quantile(np.concatenate(largest), 1 - tail))
    return tuple(float(sps.norm.sf(c * w)) for w in weights)


@dataclass(frozen=True)
class SideBoundary:
    """One bound of a :class:`GroupSequential` design at one of its looks (``index``): a Wang-Tsiatis boundary of
    shape ``shape`` (:func:`_nominal_tails`) placed so that over all ``looks`` this side errs in ``error`` of the
    studies at the truth it guards (where the fixed design, one look at 95%, errs in 2.5%). A fixed design's tail
    ``t`` (a Bonferroni share of 0.025 for a "best" statistic) stands for ``t · error / 0.025``, so each share
    scales alike."""

    looks: tuple[int, ...]
    error: float
    shape: float = POCOCK_SHAPE
    index: int = 0

    def tail(self, tail: float) -> float:
        """The nominal one-sided tail this look uses for the fixed design's ``tail``."""
        return _nominal_tails(self.looks, min(0.5, tail * self.error / 0.025), self.shape)[self.index]


@dataclass(frozen=True)
class GroupSequential:
    """A group-sequential design that stops a question once it is settled either way.

    Its looks (``n_looks``, default 6) are equally spaced from ``first`` to ``max_seeds`` seeds per cell, each
    with three bounds:

    - the bound on the paper's side of 0 at ``paper_error`` (:data:`PAPER_SIDE_ERROR`: 4.5% of null studies end
      "supports"),
    - the other bound at the rest of 5% (0.5% end "contradicts"): 5% resolved falsely, as one look at 95%;
    - a futility bound on δ's side at :data:`FUTILITY_ERROR`: of studies whose truth is the effect of interest δ,
      at most 5% end "rules out the paper's size" (the one-sided test of an equivalence test, TOST).

    Each is a Wang-Tsiatis boundary of shape ``shape`` (:data:`BOUNDARY_SHAPE`; :class:`SideBoundary`), placed by
    simulating the design's t statistics (pivotal: the same law under every null, and under "the truth is δ"
    around δ), each side calibrated alone, so the rules are non-binding: a study that runs past a futility stop
    keeps its 5%. Early looks are stricter than late ones, which spends little where a handful of seeds' t
    quantiles are wide; most of the 5% goes to the paper's side, where the claim would be found, and the futility
    bound needs only one side: that is what lets the design stop with fewer seeds than the fixed design, whether
    the truth is 0 or δ (``tests/study/analysis/test_calibration.py`` asserts both, ≤ 0.80×, for every question
    kind, with a version without futility that fails). Designs recorded before this boundary keep theirs
    (``shape`` :data:`POCOCK_SHAPE`, ``paper_error`` :data:`EARLIER_PAPER_SIDE_ERROR`). The error rates hold for
    any last look fixed before the first; the saving is measured at the last look that gives the design 80% power
    at δ (:func:`~dcl_core.study.analysis.calibration.group_row`)."""

    first: int
    max_seeds: int
    n_looks: int = GROUP_LOOKS
    step: int | None = None  # a look every `step` seeds instead (--seeds-per-round), `n_looks` then unused
    shape: float = BOUNDARY_SHAPE
    paper_error: float = PAPER_SIDE_ERROR

    def __post_init__(self) -> None:
        if not 2 <= self.first <= self.max_seeds or self.n_looks < 1 or (self.step is not None and self.step < 1):
            raise ValueError(f"a group-sequential design needs 2 <= first <= max_seeds, looks >= 1 and step >= 1, "
                             f"got first {self.first}, max_seeds {self.max_seeds}, looks {self.n_looks}, step "
                             f"{self.step}")
        if not 0 <= self.shape <= POCOCK_SHAPE or not 0 < self.paper_error < RESOLVED_FALSELY:
            raise ValueError(f"a group-sequential design needs a boundary shape in [0, {POCOCK_SHAPE}] and a paper's "
                             f"side error in (0, {RESOLVED_FALSELY}), got {self.shape} and {self.paper_error}")

    @property
    def looks(self) -> tuple[int, ...]:
        """Seeds per cell at each look: ``n_looks`` equally spaced from ``first`` to ``max_seeds`` (fewer when
        they round to the same seeds), or with ``step``: first, first + step, …, and max_seeds."""
        if self.step is not None:
            return tuple(dict.fromkeys([*range(self.first, self.max_seeds, self.step), self.max_seeds]))
        if self.n_looks == 1 or self.first == self.max_seeds:
            return (self.max_seeds,) if self.n_looks == 1 else (self.first,)
        span = self.max_seeds - self.first
        return tuple(sorted({self.first + math.floor(span * i / (self.n_looks - 1) + 0.5)  # halves up
                             for i in range(self.n_looks)}))

    @property
    def errors(self) -> tuple[float, float, float]:
        """(paper's side, other side, futility): each bound's error over all looks."""
        return self.paper_error, round(RESOLVED_FALSELY - self.paper_error, 12), FUTILITY_ERROR  # 0.01, not 0.0100…02

    def look(self, seeds: int) -> int:
        """The index of the look a study with ``seeds`` seeds per cell is at: the last look at or below it (the
        first below the first look; past the last, the last)."""
        return max([i for i, n in enumerate(self.looks) if n <= seeds], default=0)

    def side(self, error: float, seeds: int | None = None) -> SideBoundary:
        """The boundary of one side at ``error`` over all looks, at the look of ``seeds`` seeds per cell (None:
        the first look)."""
        return SideBoundary(self.looks, error, self.shape, 0 if seeds is None else self.look(seeds))

    def describe(self) -> str:
        """``looks at 3, 5, 7, 8, 10, 12 seeds per cell; each look's bounds at a nominal one-sided 0.055%→3.1%
        (paper's side), … so that …`` (what the answer and ``--dry-run`` print)."""
        looks = self.looks

        def tails(error: float) -> str:
            first, last = (100 * SideBoundary(looks, error, self.shape, i).tail(0.025) for i in (0, len(looks) - 1))
            return f"{first:.2g}%" if math.isclose(first, last) else f"{first:.2g}%→{last:.2g}%"

        paper, other, futility = (tails(e) for e in self.errors)
        rising = "" if self.shape == POCOCK_SHAPE or len(looks) == 1 else (
            f" (rising look by look: a Wang-Tsiatis boundary, Δ {self.shape:g})")
        return (f"looks at {', '.join(map(str, looks))} seeds per cell; each look's bounds at a nominal one-sided "
                f"{paper} (paper's side), {other} (other side) and {futility} (futility, δ's side){rising}, so "
                f"that all {len(looks)} looks together end ≤ {100 * RESOLVED_FALSELY:g}% of null studies resolved "
                f"and ≤ {100 * FUTILITY_ERROR:g}% of studies at δ ruling δ out")


Design = Sequential | GroupSequential  # what --until-resolved records: Pocock's (studies recorded before) or this


def look_seeds(data: Data) -> int:
    """Seeds per cell of the study's look: the most any cell has (a failed trial leaves one cell short)."""
    return max((len(v) for by_x in data.values() for v in by_x.values()), default=0)


def group_look(estimate: Callable[[Boundary], Estimate], design: GroupSequential, paper_sign: int,
               seeds: int) -> Estimate:
    """One look of a :class:`GroupSequential` design, at ``seeds`` seeds per cell: ``estimate(boundary)`` is the
    statistic's interval with the boundary's nominal tails. The look's interval takes its bound on the paper's
    side of 0 from the paper's side's boundary and the other from the other side's, and carries the
    futility-level interval in ``futility``."""
    paper_error, other_error, futility_error = design.errors
    paper = estimate(design.side(paper_error, seeds))
    other = estimate(design.side(other_error, seeds))
    futility = estimate(design.side(futility_error, seeds))
    lo, hi = (paper.lo, other.hi) if paper_sign > 0 else (other.lo, paper.hi)
    return replace(paper, lo=lo, hi=hi, futility=(futility.lo, futility.hi), futility_tail=futility.tail,
                   spread=per_seed_sd(paper))


def fixed_design_seeds(effect_sd: float, power: float = 0.8, level: float = 0.95, most: int = 10_000) -> int | None:
    """Seeds per cell the fixed design (one look, two-sided t at ``level``) needs for ``power`` at a true effect of
    ``effect_sd`` per-seed SDs (noncentral t); None beyond ``most`` or for no effect."""
    from scipy import stats as sps  # ~1 s: never imported by a trial worker

    if not math.isfinite(effect_sd) or effect_sd == 0:
        return None
    e = abs(effect_sd)
    for n in range(2, most + 1):
        crit = t_quantile(1 - (1 - level) / 2, n - 1)
        if float(sps.nct.sf(crit, n - 1, e * math.sqrt(n))) >= power:
            return n
    return None


# The most seeds per cell a projection names: the most `--until-resolved` plans (rounds.MAX_SEEDS_PLANNED). An
# effect that needs more (hundreds or thousands of seeds) is "not resolvable at this spread", not advice to run them.
MAX_SEEDS_PROJECTED = 200


def seeds_needed(est: Estimate, n: int) -> int | None:
    """Seeds per cell at which the interval, at the observed spread, would just exclude 0 for an effect of the
    observed size: the smallest n' > n with q(n')/√n' < |estimate|/(s_d), where the interval's half-width is
    q(n)·s_d/√n and q the t quantile at the interval's tail (Bonferroni's for a "best" statistic) with n' − 1
    degrees of freedom. ``n`` if the interval already excludes 0; None without an interval, with an estimate of 0
    or nan, or beyond :data:`MAX_SEEDS_PROJECTED`. A projection that assumes the effect and spread stay as
    observed, not a promise."""
    if not est.has_interval or math.isnan(est.estimate) or est.estimate == 0:
        return None
    if est.lo > 0 or est.hi < 0:
        return n
    if n < 2:
        return None
    spread = per_seed_sd(est)  # s_d of the statistic
    if spread <= 0:
        return n
    target = abs(est.estimate) / spread
    m = n + 1
    while m <= MAX_SEEDS_PROJECTED:
        if t_quantile(1 - est.tail, m - 1) / math.sqrt(m) < target:
            return m
        m = m + 1 if m < 200 else int(m * 1.05) + 1
    return None
