"""Do the verdicts' intervals mean what they say? Simulated studies with a known truth, run through the code the
studies use (:meth:`.answer.Question.estimate` and :func:`.verdicts.verdict`).

A simulated study has cells (series × x) and seeds. A trial's value is

    truth[series][x] + offset[seed] + noise,   noise ~ N(0, (σ_x · scale_series)²)

``offset`` is shared by every cell of a seed (a seed fixes the images, initial weights and data order of every
loss), σ_x may differ between x (unequal noise between cells) and ``scale_series`` between the two series; a
study may lose one trial (a failed cell of one seed). Under the **null** both series (or every σ of DCLW) share
one curve over x, so the paper's statistic has true value 0 and any "supports"/"contradicts" is a false
resolution. Under a **planted** effect the truth differs by an effect measured in cell-noise SDs (σ = 1).

For each question kind this measures

- the share of null studies resolved (must stay ≤ 5% within binomial noise),
- the share of planted studies resolved in the right direction (power), and
- the coverage of the true value by the 95% interval under the planted truth. The true value of a
  per-seed statistic (e.g. each seed's Δstd) is its expectation for one seed, computed here by Monte Carlo;
  that of a linear or best-of statistic is computed from the truth directly.

``python -m dcl_core.study calibrate`` prints the table the README shows; ``tests/study/analysis/test_calibration.py``
runs the same simulation with fewer studies and asserts the bounds.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from scipy import stats as sps

from dcl_core.study.analysis import intervals, sequential, verdicts
from dcl_core.study.analysis.answer import Question
from dcl_core.study.analysis.measures import BEST_GAP, BEST_MARGIN, GAP_AT, GAP_AT_SMALLEST, GAP_SLOPE, STD_DIFFERENCE
from dcl_core.study.analysis.measures import Kind as StatisticKind
from dcl_core.study.analysis.verdicts import VerdictWord

SEEDS = (2, 3, 5, 8, 20)
EFFECT = 2.5  # planted effect, in cell-noise SDs
LEVEL = 0.95
POWER = 0.8  # the power the fixed and the group-sequential designs are sized for at δ


@dataclass(frozen=True)
class Setting:
    """How a simulated study's trials vary around the truth.

    Attributes:
        name: a short label for tables.
        n_x: number of x values (4-11); x = 2^k for k = 4, 5, … (batch-like, so log2 x is evenly spaced).
        seed_sd: SD of the per-seed offset shared by every cell of a seed.
        noise_ramp: cell-noise SD goes linearly from ``1 − noise_ramp`` to ``1 + noise_ramp`` across x (0: equal).
        series_scale: cell-noise SD factors of (the better series, the base series); (1, 1): equal.
        missing: drop one trial (a random cell of a random seed), as a failed trial does.
    """

    name: str
    n_x: int = 4
    seed_sd: float = 2.0
    noise_ramp: float = 0.0
    series_scale: tuple[float, float] = (1.0, 1.0)
    missing: bool = False

    @property
    def xs(self) -> tuple[int, ...]:
        """The x values of the simulated sweep: 16, 32, 64, ... (``n_x`` of them)."""
        return tuple(2 ** (4 + i) for i in range(self.n_x))

    @property
    def plain(self) -> bool:
        """Equal noise and no missing trial: where "an effect of 2.5 cell-noise SDs" means one thing (power)."""
        return self.noise_ramp == 0 and self.series_scale == (1.0, 1.0) and not self.missing

    def noise(self) -> np.ndarray:
        """Cell-noise SD per x."""
        return np.linspace(1 - self.noise_ramp, 1 + self.noise_ramp, self.n_x)


SETTINGS: tuple[Setting, ...] = (
    Setting("4 x, shared seed offsets"),
    Setting("8 x, shared seed offsets", n_x=8),
    Setting("4 x, unequal noise", noise_ramp=0.6, series_scale=(1.5, 0.75)),
    Setting("6 x, a missing trial", n_x=6, missing=True),
    Setting("11 x, unequal noise, missing trial", n_x=11, noise_ramp=0.5, missing=True),
)


@dataclass(frozen=True)
class Kind:
    """A question kind as the studies ask it, on the simulated grid: the question, and the truth under the null
    and with an effect planted (``{series: array over x}``)."""

    name: str  # the statistic's label (:attr:`.measures.Statistic.label`)
    question: Any  # Setting -> Question
    truth: Any  # (Setting, effect) -> {series: np.ndarray}
    per_seed_truth: bool = False  # true value = E[statistic of one seed] (Monte Carlo), not statistic(truth)
    series_noise: bool = True  # the null survives unequal noise between the two series (a gap; not a std)


def _curve(n_x: int) -> np.ndarray:
    """A shared accuracy curve over x (a bump, as accuracy over τ or batch size), std ≈ 1 cell-noise SD."""
    u = np.linspace(-1, 1, n_x)
    c = 30.0 - 2.0 * u**2 + 0.5 * u
    return c


def _std_truth(s: Setting, effect: float) -> dict[str, np.ndarray]:
    base = _curve(s.n_x)
    z = base - base.mean()
    z = z / z.std(ddof=1)
    # Null: the two series share a curve. Planted: InfoNCE's curve is steeper: its std across x exceeds DCL's by
    # `effect` (in the truth, i.e. with infinitely many seeds).
    return {"dcl": base.mean() + z, "infonce": base.mean() + (1 + effect) * z}


def _gap_smallest_truth(s: Setting, effect: float) -> dict[str, np.ndarray]:
    base = _curve(s.n_x)
    better = base.copy()
    better[0] += effect
    return {"dcl": better, "infonce": base}


def _slope_truth(s: Setting, effect: float) -> dict[str, np.ndarray]:
    # Planted in the paper's direction (sign −1): the gap falls linearly in log2 x by `effect` from the smallest x
    # to the largest.
    base = _curve(s.n_x)
    gap = effect * np.linspace(1, 0, s.n_x)
    return {"dcl": base + gap, "infonce": base}


def _gap_at_truth(s: Setting, effect: float) -> dict[str, np.ndarray]:
    # DCLW-like: one series over σ; the cell at x[1] is `effect` above the baseline (the last x, σ = 1000).
    base = _curve(s.n_x)
    c = np.full(s.n_x, base.mean())
    c[1] += effect
    return {"dclw": c}


def _best_margin_truth(s: Setting, effect: float) -> dict[str, np.ndarray]:
    base = _curve(s.n_x)
    c = np.full(s.n_x, base.mean())
    c[1] += effect  # one σ better than the baseline; under the null every σ equal
    return {"dclw": c}


def _best_gap_truth(s: Setting, effect: float) -> dict[str, np.ndarray]:
    base = _curve(s.n_x)
    return {"dcl": base + effect, "infonce": base}  # tuned DCL's best cell `effect` above tuned InfoNCE's


KINDS: tuple[Kind, ...] = (
    Kind(STD_DIFFERENCE.label, lambda s: Question("flatter", STD_DIFFERENCE, "dcl", "infonce"), _std_truth,
         per_seed_truth=True, series_noise=False),
    Kind(GAP_AT_SMALLEST.label, lambda s: Question("gap", GAP_AT_SMALLEST, "dcl", "infonce"), _gap_smallest_truth),
    Kind(GAP_SLOPE.label, lambda s: Question("slope", GAP_SLOPE, "dcl", "infonce", paper_sign=-1),
         _slope_truth),
    Kind(GAP_AT.label, lambda s: Question("at", GAP_AT, "dclw", "dclw", at_x=s.xs[1], baseline_x=s.xs[-1]),
         _gap_at_truth),
    Kind(BEST_MARGIN.label, lambda s: Question("best σ", BEST_MARGIN, "dclw", baseline_x=s.xs[-1]),
         _best_margin_truth),
    Kind(BEST_GAP.label, lambda s: Question("tuned", BEST_GAP, "dcl", "infonce"), _best_gap_truth),
)


def simulate(kind: Kind, setting: Setting, seeds: int, effect: float, rng: np.random.Generator) -> intervals.Data:
    """One simulated study's data, ``{series: {x: {seed: value}}}``."""
    truth = kind.truth(setting, effect)
    scales = setting.series_scale if kind.series_noise else (1.0, 1.0)
    sd = setting.noise()
    data: intervals.Data = {}
    offsets = rng.normal(0, setting.seed_sd, seeds)
    for i, (series, curve) in enumerate(truth.items()):
        noise = rng.normal(0, 1, (seeds, setting.n_x)) * sd * scales[min(i, 1)]
        values = curve[None, :] + offsets[:, None] + noise
        data[series] = {x: {k: float(values[k, j]) for k in range(seeds)} for j, x in enumerate(setting.xs)}
    if setting.missing:
        series = list(data)[int(rng.integers(len(data)))]
        x = setting.xs[int(rng.integers(setting.n_x))]
        del data[series][x][int(rng.integers(seeds))]
    return data


def true_value(kind: Kind, setting: Setting, effect: float, draws: int = 20_000) -> float:
    """The statistic's true value: for a per-seed statistic E[statistic of one seed] by Monte Carlo (seeded),
    otherwise the statistic of the truth itself."""
    q = kind.question(setting)
    truth = kind.truth(setting, effect)
    if not kind.per_seed_truth:
        return float(q.function()({s: dict(zip(setting.xs, c.tolist(), strict=True)) for s, c in truth.items()}))
    rng = np.random.default_rng(12345)
    one = replace(setting, missing=False)
    data = simulate(kind, one, draws, effect, rng)
    return float(np.mean(list(intervals.per_seed(data, q.function(), q.inputs).values())))


def true_sd(kind: Kind, setting: Setting, effect: float, draws: int = 20_000) -> float:
    """SD over seeds of one seed's value of a smooth (per-seed) statistic, by Monte Carlo (seeded): what the fixed
    design's power depends on (:func:`fixed_seeds`)."""
    q = kind.question(setting)
    data = simulate(kind, replace(setting, missing=False), draws, effect, np.random.default_rng(54321))
    return float(np.std(list(intervals.per_seed(data, q.function(), q.inputs).values()), ddof=1))


@functools.lru_cache(maxsize=64)  # pure and seeded: the design's table and its tests share one computation
def fixed_seeds(kind: Kind, setting: Setting, effect: float, studies: int = 4000, most: int = 64) -> int | None:
    """Seeds per cell the fixed design (one look at 95%) needs for 80% power at this planted effect. A smooth
    statistic's per-seed values are normal: :func:`.sequential.fixed_design_seeds` at true value / true SD. A best-of
    statistic's Bonferroni bounds have no closed form: the smallest n whose ``studies`` simulated fixed-design
    studies (seeded) support the paper in ≥ 80%, by bisection over [2, ``most``] (power rises with n)."""
    if kind.question(setting).statistic.kind is not StatisticKind.BEST:
        return sequential.fixed_design_seeds(true_value(kind, setting, effect) / true_sd(kind, setting, effect))

    def powered(n: int) -> bool:
        cell = run_block(kind, setting, n, effect, studies, np.random.default_rng(n))
        return cell.right >= POWER * cell.studies

    if not powered(most):
        return None
    lo, hi = 2, most  # powered(hi); find the smallest
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if powered(mid) else (mid + 1, hi)
    return lo


@dataclass
class Cell:
    """Results of one (kind, setting, seeds, effect) block of simulated studies."""

    studies: int = 0
    resolved: int = 0  # supports or contradicts
    right: int = 0  # resolved in the planted effect's direction
    ruled_out: int = 0  # "rules out the paper's size" with δ = the planted effect's true value
    covered: int = 0  # the interval covers the true value
    with_interval: int = 0


def run_block(kind: Kind, setting: Setting, seeds: int, effect: float, studies: int, rng: np.random.Generator,
              truth: float | None = None, delta: float | None = None) -> Cell:
    """``studies`` simulated studies through ``Question.estimate`` and ``verdicts.verdict``, the verdict weighed
    against the effect of interest ``delta`` (None: none)."""
    q = kind.question(setting)
    out = Cell()
    for _ in range(studies):
        est = q.estimate(simulate(kind, setting, seeds, effect, rng))
        words = verdicts.verdict(est, q.paper_sign, delta)
        out.studies += 1
        out.ruled_out += words is VerdictWord.RULES_OUT
        if words in (VerdictWord.SUPPORTS, VerdictWord.CONTRADICTS):
            out.resolved += 1
            out.right += words is VerdictWord.SUPPORTS
        if est.has_interval:
            out.with_interval += 1
            if truth is not None and est.lo <= truth <= est.hi:
                out.covered += 1
    return out


@dataclass
class SequentialCell:
    """Results of simulated studies run through a sequential design (:class:`~.sequential.Sequential`)."""

    studies: int = 0
    resolved: int = 0  # supports or contradicts, at some look
    right: int = 0  # resolved in the planted effect's direction
    ruled_out: int = 0  # ended with "rules out the paper's size"
    seeds: int = 0  # seeds per cell spent, summed over studies (a study stops at its first settling look)

    @property
    def mean_seeds(self) -> float:
        """Seeds per cell the simulated studies used, on average (nan when none ran)."""
        return self.seeds / self.studies if self.studies else float("nan")


def run_sequential(kind: Kind, setting: Setting, design: sequential.Design, effect: float, studies: int,
                   rng: np.random.Generator, delta: float | None = None) -> SequentialCell:
    """``studies`` simulated studies, each looked at with ``design.looks`` seeds per cell (the first seeds of one
    simulated study of ``design.max_seeds``) through ``Question.estimate(data, design)`` and ``verdicts.verdict``
    against the effect of interest ``delta``, stopping at the first look that settles the question either way
    (any verdict but "not resolved"), as ``--until-resolved`` does."""
    q = kind.question(setting)
    out = SequentialCell()
    for _ in range(studies):
        data = simulate(kind, setting, design.max_seeds, effect, rng)
        words, used = VerdictWord.NOT_RESOLVED, design.max_seeds
        for n in design.looks:
            seen = {s: {x: {k: v for k, v in cell.items() if k < n} for x, cell in by_x.items()}
                    for s, by_x in data.items()}
            words = verdicts.verdict(q.estimate(seen, design), q.paper_sign, delta)
            if words.settled:
                used = n
                break
        out.studies += 1
        out.seeds += used
        out.ruled_out += words is VerdictWord.RULES_OUT
        if words in (VerdictWord.SUPPORTS, VerdictWord.CONTRADICTS):
            out.resolved += 1
            out.right += words is VerdictWord.SUPPORTS
    return out


# Planted effects (cell-noise SDs) at which the fixed design needs 12-16 seeds per cell for 80% power (plain
# setting), per kind: where the group-sequential design's saving is measured.
GROUP_EFFECTS = {STD_DIFFERENCE.label: 0.7, GAP_AT_SMALLEST.label: 1.26, GAP_SLOPE.label: 1.5, GAP_AT.label: 1.26,
                 BEST_MARGIN.label: 1.5, BEST_GAP.label: 1.5}


MOST_OVER_FIXED = 1.3  # the most seeds per cell a group-sequential design may plan, over the fixed design's


@dataclass(frozen=True)
class GroupRow:
    """The group-sequential design on one kind against the fixed design with 80% power at δ: simulated studies at
    truth 0 and at truth δ (δ = the planted effect's true value), the design's last look the fewest seeds per cell
    that give it 80% power at δ (:func:`planned_last_look`)."""

    kind: str
    fixed: int  # the fixed design's seeds per cell for 80% power at δ
    design: sequential.GroupSequential
    null: SequentialCell
    at_delta: SequentialCell


@functools.lru_cache(maxsize=64)  # pure and seeded, as fixed_seeds
def planned_last_look(kind: Kind, setting: Setting, effect: float, first: int, fixed: int, studies: int = 1000,
                      ) -> int:
    """The fewest seeds per cell of a last look at which the group-sequential design (first look ``first``, the
    default looks between) finds the planted effect (ends "supports the paper") in ≥ 80% of ``studies`` simulated
    studies at δ (seeded apart from :func:`group_row`'s): how a group-sequential design is sized (its last look
    over the fixed design's seeds is its inflation factor). Searched one seed at a time from ``fixed`` (power rises
    with the last look), within [``first``, 1.3 × ``fixed``]; the most when even that falls short."""
    delta = true_value(kind, setting, effect)

    def powered(last: int) -> bool:
        design = sequential.GroupSequential(first, last)
        cell = run_sequential(kind, setting, design, effect, studies, np.random.default_rng(3), delta=delta)
        return cell.right >= POWER * cell.studies

    most = max(first, math.floor(MOST_OVER_FIXED * fixed))
    last = min(max(first, fixed), most)
    if powered(last):
        while last > first and powered(last - 1):
            last -= 1
        return last
    while last < most:
        last += 1
        if powered(last):
            break
    return last


def group_row(kind: Kind, studies: int, setting: Setting = SETTINGS[0], futility: bool = True,
              first: int = 3) -> GroupRow:
    """:class:`GroupRow` of ``kind`` (a kind of :data:`GROUP_EFFECTS`), ``studies`` per truth (seeded);
    ``futility=False`` runs the null studies without δ, so only excluding 0 can stop them."""
    effect = GROUP_EFFECTS[kind.name]
    fixed = fixed_seeds(kind, setting, effect)
    if fixed is None:
        raise ValueError(f"{kind.name}: no fixed design reaches 80% power at {effect} SD")
    design = sequential.GroupSequential(first, planned_last_look(kind, setting, effect, first, fixed))
    delta = true_value(kind, setting, effect)
    null = run_sequential(kind, setting, design, 0.0, studies, np.random.default_rng(1),
                          delta=delta if futility else None)
    at_delta = run_sequential(kind, setting, design, effect, studies, np.random.default_rng(2), delta=delta)
    return GroupRow(kind.name, fixed, design, null, at_delta)


def format_group_rows(rows: Sequence[GroupRow]) -> str:
    """The group-sequential design's table: its looks, its last look and mean seeds per cell at truth 0 and δ over
    the fixed design's, power, and the two error rates."""
    lines = ["| statistic | fixed design | looks | last look | mean seeds, truth 0 | mean seeds, truth δ | "
             "found at δ | null resolved | δ ruled out at δ |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r.kind} | {r.fixed} | {', '.join(map(str, r.design.looks))} | "
                     f"{r.design.max_seeds / r.fixed:.2f}× | "
                     f"{r.null.mean_seeds / r.fixed:.2f}× | {r.at_delta.mean_seeds / r.fixed:.2f}× | "
                     f"{100 * r.at_delta.right / r.at_delta.studies:.1f}% | "
                     f"{100 * r.null.resolved / r.null.studies:.1f}% | "
                     f"{100 * r.at_delta.ruled_out / r.at_delta.studies:.1f}% |")
    return "\n".join(lines)


@dataclass
class Report:
    """Pooled over the settings: ``null[kind][seeds]`` (null studies: false resolutions, coverage of 0),
    ``planted[kind][seeds]`` (coverage of the planted truth, every setting) and ``power[kind][seeds]`` (found,
    in the :attr:`Setting.plain` settings); every block by itself in
    ``blocks[(null|planted, kind, setting, seeds)]``."""

    studies_per_block: int
    null: dict[str, dict[int, Cell]] = field(default_factory=dict)
    planted: dict[str, dict[int, Cell]] = field(default_factory=dict)
    power: dict[str, dict[int, Cell]] = field(default_factory=dict)
    blocks: dict[tuple[str, str, str, int], Cell] = field(default_factory=dict)


def calibrate(studies: int = 200, seeds: Sequence[int] = SEEDS, settings: Sequence[Setting] = SETTINGS,
              kinds: Sequence[Kind] = KINDS, effect: float = EFFECT, power_seeds: Sequence[int] = (3, 5, 8),
              rng_seed: int = 0) -> Report:
    """Every kind × setting × seed count, under the null and (at ``power_seeds``) with ``effect`` planted; the
    effect of interest δ is the planted effect's true value (so a null study that rules it out is right, a
    planted one wrong)."""
    rng = np.random.default_rng(rng_seed)
    report = Report(studies)
    for kind in kinds:
        for setting in settings:
            planted = true_value(kind, setting, effect)
            for n in seeds:
                block = run_block(kind, setting, n, 0.0, studies, rng, truth=0.0, delta=planted)
                report.blocks[("null", kind.name, setting.name, n)] = block
                _add(report.null.setdefault(kind.name, {}).setdefault(n, Cell()), block)
                if n in power_seeds:
                    block = run_block(kind, setting, n, effect, studies, rng, truth=planted, delta=planted)
                    report.blocks[("planted", kind.name, setting.name, n)] = block
                    _add(report.planted.setdefault(kind.name, {}).setdefault(n, Cell()), block)
                    if setting.plain:
                        _add(report.power.setdefault(kind.name, {}).setdefault(n, Cell()), block)
    return report


def _add(total: Cell, block: Cell) -> None:
    for f in ("studies", "resolved", "right", "ruled_out", "covered", "with_interval"):
        setattr(total, f, getattr(total, f) + getattr(block, f))


def exact_power(effect_sd: float, seeds: int, level: float = LEVEL) -> float:
    """Power of the two-sided t-test over ``seeds`` per-seed differences whose mean is ``effect_sd`` of their SD:
    P(|T| > t_crit) for a noncentral t with noncentrality effect_sd·√seeds, counting the right side only."""
    crit = float(sps.t.ppf(1 - (1 - level) / 2, seeds - 1))
    return float(sps.nct.sf(crit, seeds - 1, effect_sd * seeds**0.5))


def binomial_upper(k: int, n: int, p: float = 1 - LEVEL, one_sided: float = 0.001) -> bool:
    """True when k successes in n are consistent with a rate ≤ p (one-sided binomial test at ``one_sided``)."""
    return n == 0 or float(sps.binom.sf(k - 1, n, p)) > one_sided


def format_report(report: Report) -> str:
    """The calibration table: per kind, the null resolution rate at each seed count; with the effect planted,
    the rate it is found and the interval's coverage of the true value; and with δ = that true value, how often
    a null study rules δ out (right) and a planted one does (wrong, every setting pooled)."""
    seeds = sorted({n for by_n in report.null.values() for n in by_n})
    power_seeds = sorted({n for by_n in report.power.values() for n in by_n})
    head = ("| statistic | " + " | ".join(f"null, {n} seeds" for n in seeds) + " | "
            + " | ".join(f"found at {EFFECT:g} SD, {n} seeds" for n in power_seeds)
            + " | coverage, planted | "
            + " | ".join(f"null rules out δ, {n} seeds" for n in power_seeds)
            + " | planted rules out δ (wrong) |")
    lines = [head, "|" + "---|" * (3 + len(seeds) + 2 * len(power_seeds))]
    for kind, by_n in report.null.items():
        cells = [f"{100 * c.resolved / c.studies:.1f}%" for _, c in sorted(by_n.items())]
        power = report.power.get(kind, {})
        found = [f"{100 * power[n].right / power[n].studies:.0f}%" if n in power else "-" for n in power_seeds]
        planted = report.planted.get(kind, {}).values()
        cov_n = sum(c.with_interval for c in planted)
        cov = f"{100 * sum(c.covered for c in planted) / cov_n:.1f}%" if cov_n else "-"
        ruled = [f"{100 * by_n[n].ruled_out / by_n[n].studies:.0f}%" if n in by_n else "-" for n in power_seeds]
        studies = sum(c.studies for c in planted)
        wrong = f"{100 * sum(c.ruled_out for c in planted) / studies:.1f}%" if studies else "-"
        lines.append(f"| {kind} | " + " | ".join(cells) + " | " + " | ".join(found) + f" | {cov} | "
                     + " | ".join(ruled) + f" | {wrong} |")
    return "\n".join(lines)
