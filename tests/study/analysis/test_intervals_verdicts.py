"""dcl_core.study.analysis.intervals, .sequential and .verdicts: t-intervals against hand computations, pairing by
seed id (never by position), each seed's own statistic with a t-interval over seeds, the selection-corrected
intervals of best-of statistics, the headline statistics on hand-made means (dcl_core.study.analysis.measures),
verdict boundaries, the group-sequential designs, the power projection and formatting. Pure and deterministic (fixed
rng seeds); their calibration is tests/study/analysis/test_calibration.py."""

import math
import random

import numpy as np
import pytest
from scipy import stats as sps

from dcl_core.study.analysis import answer_output, intervals, sequential, verdicts
from dcl_core.study.analysis.answer import Question
from dcl_core.study.analysis.answer_output import format_estimate
from dcl_core.study.analysis.intervals import (
    Estimate,
    cell_means,
    collect,
    max_min_interval,
    paired_difference,
    per_seed,
    seed_interval,
    t_interval,
)
from dcl_core.study.analysis.measures import (
    GAP_AT,
    STD_DIFFERENCE,
    best_margin,
    gap_at,
    gap_slope,
    std_across,
    std_difference,
)
from dcl_core.study.analysis.sequential import MAX_SEEDS_PROJECTED, seeds_needed
from dcl_core.study.analysis.verdicts import Size, VerdictWord, verdict
from dcl_core.study.analysis.verdicts import size as stats_size

TAUS = (0.1, 0.5, 1.0)


def row(series, x, seed, value, status="ok"):
    return {"series": series, "temperature": x, "seed": seed, "knn_top1": value, "status": status}


def planted(effect, noise=0.3, seeds=5, xs=TAUS, rng_seed=0, slope=0.0, offset=0.0):
    """Rows: InfoNCE = 80 + slope·x + offset·seed + noise; DCL = InfoNCE's level (without slope) + effect + noise."""
    rng = random.Random(rng_seed)
    rows = []
    for s in range(seeds):
        for x in xs:
            rows.append(row("infonce", x, s, 80 + slope * x + offset * s + rng.gauss(0, noise)))
            rows.append(row("dcl", x, s, 80 + effect + offset * s + rng.gauss(0, noise)))
    return rows


GAP_01 = Question("DCL beats InfoNCE at τ 0.1", GAP_AT, "dcl", "infonce", at_x=0.1)
FLATTER = Question("DCL flatter across τ than InfoNCE", STD_DIFFERENCE, "dcl", "infonce")


def gap_01(means):
    return gap_at(means, "dcl", "infonce", 0.1)


def interval(data, q):
    """The seed interval of a question's statistic over the cells it declares it reads."""
    return seed_interval(data, q.function(), q.inputs)


# ------------------------------------------------------------------------------------------------- t-interval


def test_t_interval_matches_hand_computation():
    values = [71.0, 73.0, 72.0, 75.0, 74.0]  # mean 73, s² = 2.5
    e = t_interval(values)
    s = math.sqrt(2.5)
    assert sps.t.ppf(0.975, 4) == pytest.approx(2.7764, abs=1e-4)
    assert (e.estimate, e.n) == (73.0, 5)
    assert e.std == pytest.approx(s)
    assert e.lo == pytest.approx(73 - 2.7764 * s / math.sqrt(5), abs=1e-3)
    assert e.hi == pytest.approx(73 + sps.t.ppf(0.975, 4) * s / math.sqrt(5), rel=1e-12)
    assert e.half_width == pytest.approx(1.9632, abs=1e-3)
    # another level uses its own quantile
    assert t_interval(values, level=0.9).half_width == pytest.approx(sps.t.ppf(0.95, 4) * s / math.sqrt(5))


def test_t_interval_small_n():
    one = t_interval([70.0])
    assert (one.estimate, one.n, one.has_interval) == (70.0, 1, False)
    assert math.isnan(one.lo) and math.isnan(one.hi) and math.isnan(one.std) and math.isnan(one.half_width)
    none = t_interval([])
    assert none.n == 0 and all(math.isnan(v) for v in (none.estimate, none.lo, none.hi, none.std))



def test_identical_values_give_no_interval_and_no_verdict():
    """Seen on a smoke study on two nodes: both seeds' Δstd was +3.54 (kNN over 40 test images moves in steps of
    2.5 %), and the zero-width interval [+3.54, +3.54] printed "supports the paper"."""
    same = t_interval([3.54, 3.54])
    assert (same.estimate, same.n, same.has_interval, same.std) == (3.54, 2, False, 0.0)
    assert verdict(same, +1) is VerdictWord.NOT_RESOLVED and seeds_needed(same, 2) is None
    assert format_estimate(same) == "+3.5 (n=2, no interval)"
    # A best-of statistic with such a contrast has no interval either.
    data = {"dcl": {0.1: {0: 20.0, 1: 22.5}, 0.5: {0: 20.0, 1: 20.0}},
            "infonce": {0.1: {0: 17.5, 1: 20.0}, 0.5: {0: 15.0, 1: 15.0}}}
    best = max_min_interval(data, [[(("dcl", 0.1), ("infonce", 0.1))], [(("dcl", 0.5), ("infonce", 0.5))]])
    assert best.n == 2 and not best.has_interval and verdict(best, +1) is VerdictWord.NOT_RESOLVED


def _float32_percent(correct: int, total: int) -> float:
    """A kNN accuracy as the monitor computed it before it counted in float64: a float32 mean, times 100."""
    return float(np.float32(correct) / np.float32(total)) * 100.0


def test_values_equal_up_to_float32_rounding_give_no_interval():
    """The two-node smoke study's rows (kNN over 40 test images, float32 means): both seeds' Δstd is +3.54 up to
    rounding (3.5355347 and 3.5355369), which printed "supports the paper — Δstd +3.54, 95% CI [+3.54, +3.54]"."""
    counts = {0: {("infonce", 0.1): 12, ("infonce", 0.5): 10, ("dcl", 0.1): 7, ("dcl", 0.5): 7},
              1: {("infonce", 0.1): 12, ("infonce", 0.5): 9, ("dcl", 0.1): 12, ("dcl", 0.5): 13}}
    rows = [row(loss, tau, seed, _float32_percent(k, 40)) for seed, cells in counts.items()
            for (loss, tau), k in cells.items()]
    data = collect(rows, "temperature")
    values = per_seed(data, FLATTER.function(), FLATTER.inputs)
    assert values[0] != values[1] and values[0] == pytest.approx(values[1], abs=1e-5)  # rounding apart
    est = interval(data, FLATTER)
    assert (est.n, est.has_interval) == (2, False) and est.estimate == pytest.approx(5 / math.sqrt(2), abs=1e-5)
    assert verdict(est, +1) is VerdictWord.NOT_RESOLVED
    # Values from the float64 count are the same values exactly, and the smallest real spread is kept.
    assert not t_interval([100 * 12 / 40, 100 * 12 / 40]).has_interval
    assert t_interval([30.0, 30.002]).has_interval  # one image of 50,000 apart


def test_with_a_measurement_in_steps_the_intervals_given_still_cover_95_percent():
    """Simulated studies with a known truth: each seed's value is a normal draw rounded to a 2.5-point grid (kNN on
    40 test images), so seeds often tie. The truth is the mean of the rounded measurement, off the grid. Counting
    a tie's zero-width interval as an interval would cover it almost never (about a third of these studies tie);
    the intervals t_interval gives cover it at least 95% of the time."""
    rng = random.Random(0)
    step, mu, sd, n, studies = 2.5, 20.3, 1.0, 3, 4000
    # E[round(X / step) * step] for X ~ N(mu, sd), summed over the grid points that carry probability.
    grid = [k * step for k in range(int((mu - 10 * sd) / step), int((mu + 10 * sd) / step) + 2)]
    cdf = [sps.norm.cdf((g + step / 2 - mu) / sd) - sps.norm.cdf((g - step / 2 - mu) / sd) for g in grid]
    truth = sum(g * w for g, w in zip(grid, cdf, strict=True))
    assert min(abs(truth - g) for g in grid) > 0.1  # off the grid: a zero-width interval cannot hold it
    ties = given = covered = 0
    for _ in range(studies):
        values = [round(rng.gauss(mu, sd) / step) * step for _ in range(n)]
        est = t_interval(values)
        ties += len(set(values)) == 1
        if est.has_interval:
            given += 1
            covered += est.lo <= truth <= est.hi
        else:
            assert len(set(values)) == 1
    assert ties > 0.2 * studies  # the case exists often enough for this test to fail without the guard
    assert covered / given >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / given)


# ------------------------------------------------------------------------------------------- pairing by seed


def test_paired_difference_pairs_by_seed_id_from_shuffled_rows_with_a_missing_seed():
    rows = [row("dcl", 0.1, 3, 10.0), row("infonce", 0.1, 2, 10.0), row("dcl", 0.1, 1, 12.0),
            row("infonce", 0.1, 1, 10.0), row("dcl", 0.1, 4, 99.0), row("dcl", 0.1, 2, 11.0),
            row("infonce", 0.1, 3, 7.0)]  # dcl has seed 4, infonce does not
    random.Random(1).shuffle(rows)
    data = collect(rows, "temperature")
    e = paired_difference(data["dcl"][0.1], data["infonce"][0.1])
    # seeds 1, 2, 3: differences 2, 1, 3 (by position they would be different numbers)
    assert (e.estimate, e.n, e.std) == (2.0, 3, 1.0)
    assert e.half_width == pytest.approx(sps.t.ppf(0.975, 2) * 1.0 / math.sqrt(3))


def test_paired_interval_narrower_than_unpaired_with_shared_seed_offsets():
    rng = random.Random(3)
    offsets = {s: rng.gauss(0, 5) for s in range(6)}
    better = {s: 80 + 1 + o + rng.gauss(0, 0.3) for s, o in offsets.items()}
    base = {s: 80 + o + rng.gauss(0, 0.3) for s, o in offsets.items()}
    paired = paired_difference(better, base)
    a, b = t_interval(list(better.values())), t_interval(list(base.values()))
    unpaired_half = sps.t.ppf(0.975, 10) * math.sqrt(a.std**2 / 6 + b.std**2 / 6)
    assert paired.half_width < unpaired_half / 5
    assert verdict(paired, +1) is VerdictWord.SUPPORTS


# ---------------------------------------------------------------------------------------------------- collect


def test_collect_skips_unfinished_and_invalid_rows():
    rows = [row("dcl", 0.1, 0, 70.0), row("dcl", 0.1, 1, 71.0, status="failed"), row("dcl", 0.1, 2, None),
            row("dcl", 0.1, 3, math.nan), row("dcl", 0.1, 4, math.inf), row("dcl", 0.5, None, 72.0),
            row("infonce", 0.5, 0, 60.0), {"series": "dcl", "temperature": 0.1, "seed": 5, "status": "ok"}]
    assert collect(rows, "temperature") == {"dcl": {0.1: {0: 70.0}}, "infonce": {0.5: {0: 60.0}}}
    q = collect([{**row("dcl", 0.1, 0, 70.0), "q_mean": 0.9}], "temperature", value_key="q_mean")
    assert q == {"dcl": {0.1: {0: 0.9}}}


def test_collect_raises_on_duplicate_cell_seed_but_not_on_a_failed_duplicate():
    with pytest.raises(ValueError, match="ambiguous"):
        collect([row("dcl", 0.1, 0, 70.0), row("dcl", 0.1, 0, 71.0)], "temperature")
    ok = collect([row("dcl", 0.1, 0, 70.0), row("dcl", 0.1, 0, 71.0, status="failed")], "temperature")
    assert ok == {"dcl": {0.1: {0: 70.0}}}


# ------------------------------------------------------------------ headline intervals: per seed, best-of


def test_seed_interval_of_a_gap_is_the_paired_t_interval():
    data = collect(planted(effect=3.0, offset=10.0), "temperature")  # seed s adds 10·s to every cell
    e = interval(data, GAP_01)
    paired = paired_difference(data["dcl"][0.1], data["infonce"][0.1])
    assert (e.estimate, e.lo, e.hi, e.n) == pytest.approx((paired.estimate, paired.lo, paired.hi, 5))
    assert e.half_width < 1 and verdict(e, +1) is VerdictWord.SUPPORTS and verdict(e, -1) is VerdictWord.CONTRADICTS
    assert seeds_needed(e, e.n) == 5


def test_per_seed_values_use_only_the_cells_the_statistic_needs_and_the_seeds_they_all_have():
    data = collect(planted(effect=1.0), "temperature")
    del data["infonce"][0.1][4]  # seed 4 lacks a cell the gap at 0.1 uses
    del data["dcl"][1.0][0]  # ... and seed 0 one it does not use
    values = per_seed(data, gap_01, GAP_01.inputs)
    assert sorted(values) == [0, 1, 2, 3]
    assert values[2] == pytest.approx(data["dcl"][0.1][2] - data["infonce"][0.1][2])
    assert GAP_01.inputs(cell_means(data)) == {("infonce", 0.1), ("dcl", 0.1)}


def test_per_seed_std_difference_is_each_seeds_own_std_across_x():
    data = collect(planted(effect=0.0, slope=-10.0, noise=0.3), "temperature")  # InfoNCE falls 9 points over τ

    def flatter(m):
        return std_difference(m, worse="infonce", better="dcl")

    values = per_seed(data, flatter, FLATTER.inputs)
    for seed, v in values.items():
        own = {s: {x: by_x[x][seed] for x in by_x} for s, by_x in data.items()}
        assert v == pytest.approx(flatter(own))
    e = interval(data, FLATTER)
    assert e.estimate > 3 and e.n == 5 and verdict(e, +1) is VerdictWord.SUPPORTS
    flat = interval(collect(planted(effect=0.0, noise=0.3), "temperature"), FLATTER)
    assert verdict(flat, +1) is VerdictWord.NOT_RESOLVED


def test_seed_interval_needs_two_seeds_in_the_cells_it_uses():
    e = interval(collect(planted(effect=3.0, seeds=1), "temperature"), GAP_01)
    assert e.n == 1 and not e.has_interval and e.estimate == pytest.approx(3.0, abs=1.5)
    assert verdict(e, +1) is VerdictWord.NOT_RESOLVED and seeds_needed(e, e.n) is None
    rows = [r for r in planted(effect=3.0) if r["temperature"] != 0.1 or r["seed"] == 0]
    e = interval(collect(rows, "temperature"), GAP_01)
    assert e.n == 1 and not e.has_interval  # other x have 5 seeds, but the gap at 0.1 rests on one each
    e5 = interval(collect(rows, "temperature"), Question("gap at 0.5", GAP_AT, "dcl", "infonce", at_x=0.5))
    assert e5.n == 5 and e5.has_interval


def test_seed_interval_of_an_undefined_statistic():
    e = interval(collect(planted(effect=1.0), "temperature"), Question("?", GAP_AT, "dcl", "missing", at_x=0.1))
    assert math.isnan(e.estimate) and not e.has_interval
    assert math.isnan(interval({}, GAP_01).estimate)


def test_max_min_interval_corrects_each_side_for_the_events_it_can_fail_by():
    data = {"d": {1: {0: 10.0, 1: 12.0, 2: 11.0}, 2: {0: 14.0, 1: 15.0, 2: 17.0}},
            "b": {1: {0: 9.0, 1: 10.0, 2: 11.0}}}

    def bounds(better, base, tail_lo, tail_hi):
        d = paired_difference(better, base)
        se = d.std / math.sqrt(d.n)
        return d.estimate - sps.t.ppf(1 - tail_lo, d.n - 1) * se, d.estimate + sps.t.ppf(1 - tail_hi, d.n - 1) * se

    # best of d's two cells against b's one: 2 groups of 1 contrast; lower bounds at α/(2·2), upper at α/2
    e = max_min_interval(data, [[(("d", 1), ("b", 1))], [(("d", 2), ("b", 1))]])
    lo1, hi1 = bounds(data["d"][1], data["b"][1], 0.0125, 0.025)
    lo2, hi2 = bounds(data["d"][2], data["b"][1], 0.0125, 0.025)
    assert e.estimate == pytest.approx(16 / 3) and e.n == 3  # d(2) − b(1): 5, 5, 6
    assert (e.lo, e.hi) == pytest.approx((max(lo1, lo2), max(hi1, hi2)))
    assert e.tail == pytest.approx(0.0125)
    # tuned vs tuned, 2 × 2: max_a min_b; 2 groups (α/4 below) of 2 contrasts (α/4 above), not α/8 on both
    two_base = {**data, "b": {1: data["b"][1], 2: {0: 13.0, 1: 14.0, 2: 15.0}}}
    groups = [[(("d", a), ("b", b)) for b in (1, 2)] for a in (1, 2)]
    e = max_min_interval(two_base, groups)
    assert e.estimate == pytest.approx(46 / 3 - 14) and e.tail == pytest.approx(0.0125)  # best d − best b
    los = {(a, b): bounds(two_base["d"][a], two_base["b"][b], 0.0125, 0.0125) for a in (1, 2) for b in (1, 2)}
    assert e.lo == pytest.approx(max(min(los[(a, 1)][0], los[(a, 2)][0]) for a in (1, 2)))
    assert e.hi == pytest.approx(max(min(los[(a, 1)][1], los[(a, 2)][1]) for a in (1, 2)))


def test_max_min_interval_without_an_interval_or_a_cell():
    data = {"d": {1: {0: 1.0}, 2: {0: 2.0}}}
    e = max_min_interval(data, [[(("d", 1), ("d", 2))]])
    assert e.estimate == -1.0 and not e.has_interval and e.n == 1
    assert math.isnan(max_min_interval(data, [[(("d", 1), ("x", 2))]]).estimate)
    assert math.isnan(max_min_interval(data, []).estimate)


# ----------------------------------------------------------------------------------------- headline statistics


def test_gap_slope_known_slopes():
    xs = (1, 2, 4, 8, 16)
    means = {"dcl": {x: 75 + 5 - math.log2(x) for x in xs}, "infonce": {x: 75.0 for x in xs}}
    assert gap_slope(means, "dcl", "infonce") == pytest.approx(-1.0)
    lin = {"dcl": {x: 2.0 * x for x in xs}, "infonce": {x: 0.0 for x in (*xs, 32)}}
    assert gap_slope(lin, "dcl", "infonce", log2_x=False) == pytest.approx(2.0)
    assert math.isnan(gap_slope({"dcl": {1: 1.0}, "infonce": {1: 0.0, 2: 0.0}}, "dcl", "infonce"))
    assert math.isnan(gap_slope(means, "dcl", "missing"))


def test_best_margin_and_gap_at():
    means = {"dclw": {1: 70.0, 2: 75.0, 4: 72.0}, "dcl": {1: 71.0}}
    assert best_margin(means, "dclw", 1) == 5.0
    assert best_margin(means, "dclw", 2) == -3.0
    assert math.isnan(best_margin(means, "dclw", 8)) and math.isnan(best_margin(means, "dcl", 1))
    assert gap_at(means, "dcl", "dclw", 1) == 1.0 and math.isnan(gap_at(means, "dcl", "dclw", 2))


def test_std_difference_over_common_x_with_ddof():
    means = {"infonce": {1: 0.0, 2: 2.0, 3: 100.0}, "dcl": {1: 1.0, 2: 1.0}}
    assert std_difference(means, "infonce", "dcl") == pytest.approx(math.sqrt(2))  # x = 3 is not in both
    assert std_difference(means, "infonce", "dcl", ddof=0) == pytest.approx(1.0)
    assert std_across({1: 0.0, 2: 2.0, 3: 4.0}) == pytest.approx(2.0)
    assert math.isnan(std_across({1: 3.0})) and math.isnan(std_difference(means, "infonce", "missing"))


# -------------------------------------------------------------------------------------- verdict, power, format


@pytest.mark.parametrize(("lo", "hi", "sign", "words"), [
    (0.1, 2.0, +1, VerdictWord.SUPPORTS),
    (1e-12, 2.0, +1, VerdictWord.SUPPORTS),
    (0.0, 2.0, +1, VerdictWord.NOT_RESOLVED),  # touching 0
    (-2.0, 0.0, +1, VerdictWord.NOT_RESOLVED),
    (-2.0, -1e-12, +1, VerdictWord.CONTRADICTS),
    (-2.0, -0.1, -1, VerdictWord.SUPPORTS),
    (0.1, 2.0, -1, VerdictWord.CONTRADICTS),
    (-0.1, 0.1, -1, VerdictWord.NOT_RESOLVED),
    (math.nan, math.nan, +1, VerdictWord.NOT_RESOLVED),
])
def test_verdict_boundaries(lo, hi, sign, words):
    est = (lo + hi) / 2 if math.isfinite(lo) else 1.0
    assert verdict(Estimate(est, lo, hi, 3), sign) == words


# δ, the effect of interest: the paper's +1.38 (temperature study) or −3 for a claim of a negative statistic
@pytest.mark.parametrize(("lo", "hi", "sign", "delta", "words", "size"), [
    (-0.45, 0.87, +1, 1.38, VerdictWord.RULES_OUT, None),  # contains 0, excludes δ: no effect as large
    (-0.45, 1.38, +1, 1.38, VerdictWord.NOT_RESOLVED, None),  # touching δ
    (-0.45, 1.50, +1, 1.38, VerdictWord.NOT_RESOLVED, None),  # contains both
    (-0.45, 0.87, +1, None, VerdictWord.NOT_RESOLVED, None),  # no δ: as without one
    (-0.45, 0.87, +1, math.nan, VerdictWord.NOT_RESOLVED, None),
    (0.20, 0.87, +1, 1.38, VerdictWord.SUPPORTS, Size.SMALLER),  # an effect, smaller than the paper's
    (0.20, 1.50, +1, 1.38, VerdictWord.SUPPORTS, None),  # an effect, as large as the paper's for all we know
    (1.50, 2.50, +1, 1.38, VerdictWord.SUPPORTS, Size.LARGER),
    (-2.0, -0.1, +1, 1.38, VerdictWord.CONTRADICTS, None),  # the other side: contradicts, δ aside
    (-2.0, 1.0, -1, -3.0, VerdictWord.RULES_OUT, None),  # a negative claim: δ = −3 lies below the interval
    (-2.5, -0.5, -1, -3.0, VerdictWord.SUPPORTS, Size.SMALLER),
    (-4.5, -3.5, -1, -3.0, VerdictWord.SUPPORTS, Size.LARGER),
    (0.2, 0.8, +1, -1.0, VerdictWord.SUPPORTS, None),  # δ on the other side of 0 than the claim: no size
    (math.nan, math.nan, +1, 1.38, VerdictWord.NOT_RESOLVED, None),
])
def test_verdict_against_the_effect_of_interest(lo, hi, sign, delta, words, size):
    est = Estimate((lo + hi) / 2 if math.isfinite(lo) else 1.0, lo, hi, 3)
    assert verdict(est, sign, delta) == words
    assert stats_size(est, sign, delta) == size


# δ known only to within ±spread (a paper's value from its rounded table): the words need the interval beyond every
# value in [δ − spread, δ + spread]; with spread 0 the same intervals give the words of the exact δ beside them
@pytest.mark.parametrize(("lo", "hi", "sign", "delta", "spread", "words", "size", "exact"), [
    # the MI toy: EqCo Table 5's slope +0.67, ±0.08 from its one-decimal cells; the toy's interval lies just below
    (0.666, 0.669, +1, 0.67, 0.08, VerdictWord.SUPPORTS, None, (VerdictWord.SUPPORTS, Size.SMALLER)),
    (0.30, 0.58, +1, 0.67, 0.08, VerdictWord.SUPPORTS, Size.SMALLER, (VerdictWord.SUPPORTS, Size.SMALLER)),
    (0.70, 0.74, +1, 0.67, 0.08, VerdictWord.SUPPORTS, None, (VerdictWord.SUPPORTS, Size.LARGER)),
    (0.76, 0.90, +1, 0.67, 0.08, VerdictWord.SUPPORTS, Size.LARGER, (VerdictWord.SUPPORTS, Size.LARGER)),
    # Table 18's Δstd +1.38, ±0.115 over four τ
    (-0.45, 0.87, +1, 1.38, 0.115, VerdictWord.RULES_OUT, None, (VerdictWord.RULES_OUT, None)),
    (-0.45, 1.30, +1, 1.38, 0.115, VerdictWord.NOT_RESOLVED, None, (VerdictWord.RULES_OUT, None)),
    # a negative δ: its nearest value to 0 is δ + spread
    (-2.0, 1.0, -1, -3.0, 0.5, VerdictWord.RULES_OUT, None, (VerdictWord.RULES_OUT, None)),
    (-2.6, 1.0, -1, -3.0, 0.5, VerdictWord.NOT_RESOLVED, None, (VerdictWord.RULES_OUT, None)),
    (-2.4, -0.5, -1, -3.0, 0.5, VerdictWord.SUPPORTS, Size.SMALLER, (VerdictWord.SUPPORTS, Size.SMALLER)),
    (-2.6, -0.5, -1, -3.0, 0.5, VerdictWord.SUPPORTS, None, (VerdictWord.SUPPORTS, Size.SMALLER)),
    # a table that allows an effect of 0: no size is ruled out, nothing is smaller than it
    (-0.10, 0.05, +1, 0.10, 0.20, VerdictWord.NOT_RESOLVED, None, (VerdictWord.RULES_OUT, None)),
    (0.01, 0.02, +1, 0.10, 0.20, VerdictWord.SUPPORTS, None, (VerdictWord.SUPPORTS, Size.SMALLER)),
])
def test_verdict_against_a_paper_value_known_to_within_its_rounding(lo, hi, sign, delta, spread, words, size, exact):
    est = Estimate((lo + hi) / 2, lo, hi, 3)
    assert (verdict(est, sign, delta, spread), stats_size(est, sign, delta, spread)) == (words, size)
    assert (verdict(est, sign, delta), stats_size(est, sign, delta)) == exact


def test_a_futility_bound_rules_out_only_beyond_every_value_the_table_allows():
    est = Estimate(0.3, -0.5, 1.6, 12, futility=(-0.2, 1.2))
    assert verdict(est, +1, 1.38) is VerdictWord.RULES_OUT
    assert verdict(est, +1, 1.38, 0.115) is VerdictWord.RULES_OUT  # 1.2 < 1.265
    assert verdict(est, +1, 1.30, 0.115) is VerdictWord.NOT_RESOLVED  # 1.2 > 1.185


def test_a_paper_value_known_to_within_its_rounding_is_said_no_smaller_unless_every_value_is_excluded():
    """Simulated studies whose truth is a value the paper's rounded table allows, at the range's ends (the
    hardest): a narrow interval (20 seeds, noise 0.02) says "smaller than the paper's" at the nearer end, or "larger"
    at the farther, at most 2.5% of the time (+ Monte Carlo error), and a wide one (noise 0.45, δ 0.3 ± 0.1)
    "rules out the paper's size" at most 2.5%; weighed against the exact δ the narrow ones would say so almost
    always, the wide ones several times too often. And the words still find a truth beyond the range: at
    δ − 3·spread they say "smaller" nearly always."""
    studies = 400
    rng = np.random.default_rng(5)
    q = Question("MI toy slope", GAP_AT, "better", "base", at_x=1)
    allowed = 0.025 + 3 * math.sqrt(0.025 * 0.975 / studies)

    def rates(truth, noise, delta, spread, words):
        said = exact = 0
        for _ in range(studies):
            data = {"better": {1: dict(enumerate(rng.normal(truth, noise, 20)))},
                    "base": {1: dict.fromkeys(range(20), 0.0)}}
            est = q.estimate(data)
            said += words in {verdict(est, 1, delta, spread), stats_size(est, 1, delta, spread)}
            exact += words in {verdict(est, 1, delta), stats_size(est, 1, delta)}
        return said / studies, exact / studies

    smaller, exact_smaller = rates(0.67 - 0.08, 0.02, 0.67, 0.08, Size.SMALLER)
    assert smaller <= allowed and exact_smaller > 0.95
    larger, exact_larger = rates(0.67 + 0.08, 0.02, 0.67, 0.08, Size.LARGER)
    assert larger <= allowed and exact_larger > 0.95
    ruled_out, exact_ruled_out = rates(0.3 - 0.1, 0.45, 0.3, 0.1, VerdictWord.RULES_OUT)
    assert ruled_out <= allowed and exact_ruled_out > 0.06
    inside, exact_inside = rates(0.67 - 0.04, 0.02, 0.67, 0.08, Size.SMALLER)
    assert inside == 0 and exact_inside > 0.95
    assert rates(0.67 - 3 * 0.08, 0.02, 0.67, 0.08, Size.SMALLER)[0] > 0.95


def test_verdict_rejects_a_bad_sign():
    with pytest.raises(ValueError):
        verdict(Estimate(1.0, 0.5, 1.5, 3), 0)


def test_seeds_needed_follows_the_t_quantile():
    # 3 seeds, s_d = 1: half-width t_{.975,2}/√3 = 2.48; an effect of 1 needs t_{.975,n−1}/√n < 1, i.e. n = 7
    h = sps.t.ppf(0.975, 2) / math.sqrt(3)
    assert seeds_needed(Estimate(1.0, 1.0 - h, 1.0 + h, 3), 3) == 7
    assert sps.t.ppf(0.975, 5) / math.sqrt(6) > 1 > sps.t.ppf(0.975, 6) / math.sqrt(7)
    assert seeds_needed(Estimate(-1.0, -1.0 - h, -1.0 + h, 3), 3) == 7
    assert seeds_needed(Estimate(1.0, 0.5, 1.5, 3), 3) == 3  # already resolved
    # a Bonferroni interval (tail 0.025/4) needs more seeds for the same spread
    hb = sps.t.ppf(1 - 0.025 / 4, 2) / math.sqrt(3)
    assert seeds_needed(Estimate(1.0, 1.0 - hb, 1.0 + hb, 3, tail=0.025 / 4), 3) > 7
    assert seeds_needed(Estimate(1e-6, -1.0, 1.0, 3), 3) is None  # beyond any sensible number of seeds
    assert seeds_needed(Estimate(1.0, math.nan, math.nan, 1), 1) is None
    assert seeds_needed(Estimate(0.0, -1.0, 1.0, 3), 3) is None
    assert seeds_needed(Estimate(math.nan, math.nan, math.nan, 0), 0) is None


def test_seeds_needed_names_no_number_past_what_until_resolved_can_run():
    """A projection past MAX_SEEDS_PROJECTED (200, the most --until-resolved plans) is no advice: None, which the
    power line prints as "not resolvable at this spread" (it once printed "≈40,143 seeds per cell")."""
    h = sps.t.ppf(0.975, 2) / math.sqrt(3)  # 3 seeds, s_d = 1
    near = seeds_needed(Estimate(0.2, 0.2 - h, 0.2 + h, 3), 3)  # (1.97 / 0.2)² ≈ 99 seeds
    assert near is not None and 90 < near < MAX_SEEDS_PROJECTED == 200
    assert seeds_needed(Estimate(0.1, 0.1 - h, 0.1 + h, 3), 3) is None  # ≈ 390 seeds


def test_estimate_properties_and_format():
    e = Estimate(0.6, -0.9, 2.1, 3)
    assert e.has_interval and e.half_width == pytest.approx(1.5)
    assert format_estimate(e) == "+0.6 [-0.9, +2.1]"
    assert format_estimate(e, digits=2, signed=False) == "0.60 [-0.90, 2.10]"
    assert format_estimate(Estimate(0.6, math.nan, math.nan, 1)) == "+0.6 (n=1, no interval)"
    assert not Estimate(0.6, -math.inf, 1.0, 3).has_interval


def test_verdict_words_are_the_printed_strings():
    """The enum's values are exactly the words table.txt prints and the summary run's tags hold."""
    assert [str(w) for w in VerdictWord] == ["supports the paper", "contradicts the paper",
                                             "rules out the paper's size", "not resolved"]
    assert [str(s) for s in Size] == ["smaller than the paper's", "larger than the paper's"]
    assert [w.settled for w in VerdictWord] == [True, True, True, False]
    assert f"{VerdictWord.NOT_RESOLVED}" == "not resolved" and VerdictWord("supports the paper") is VerdictWord.SUPPORTS


# ------------------------------------------------------------------------------ the group-sequential design's parts
def test_a_group_sequential_design_has_equally_spaced_looks_and_three_bounds_of_rising_tail():
    design = sequential.GroupSequential(3, 19)
    assert design.looks == (3, 6, 9, 13, 16, 19)
    assert sequential.GroupSequential(5, 5).looks == (5,) and sequential.GroupSequential(5, 7).looks == (5, 6, 7)
    for seeds in design.looks:
        other, paper, futility = (design.side(e, seeds).tail(0.025) for e in (
            sequential.OTHER_SIDE_ERROR, sequential.PAPER_SIDE_ERROR, sequential.FUTILITY_ERROR))
        assert other < paper < futility < sequential.FUTILITY_ERROR  # each stricter than one look at its error
    # between looks, a study is at the last look it reached
    assert [design.look(n) for n in (2, 3, 5, 6, 18, 19, 30)] == [0, 0, 0, 1, 4, 5, 5]
    assert (sequential.GroupSequential(5, 5).side(sequential.PAPER_SIDE_ERROR).tail(0.025)
            == pytest.approx(sequential.PAPER_SIDE_ERROR))
    with pytest.raises(ValueError):
        sequential.GroupSequential(1, 5)


def test_a_wang_tsiatis_boundary_rises_look_by_look_and_errs_as_often_as_it_is_set_to():
    """Each look's nominal tail lies on c·(n/N)^(Δ−0.5) on the normal scale (rising from look to look for
    Δ < 0.5), and over all looks a null study's t statistics cross it in ``error`` of studies: checked on
    200,000 null studies simulated apart from the ones that placed it (Monte Carlo SE ~0.05%)."""
    from scipy import stats as sps

    design = sequential.GroupSequential(3, 15)
    looks = design.looks
    tails = [design.side(sequential.PAPER_SIDE_ERROR, n).tail(0.025) for n in looks]
    assert tails == sorted(tails) and tails[0] < tails[-1] / 10
    scaled = [sps.norm.isf(t) * (n / looks[-1]) ** (0.5 - sequential.BOUNDARY_SHAPE)
              for t, n in zip(tails, looks, strict=True)]
    assert max(scaled) - min(scaled) < 1e-9
    rng = np.random.default_rng(99)
    x = rng.standard_normal((200_000, looks[-1]))
    crossed = np.zeros(len(x), bool)
    for n, t in zip(looks, tails, strict=True):
        mean, sd = x[:, :n].mean(axis=1), x[:, :n].std(axis=1, ddof=1)
        crossed |= sps.t.sf(mean / (sd / math.sqrt(n)), n - 1) < t
    assert crossed.mean() == pytest.approx(sequential.PAPER_SIDE_ERROR, abs=0.0015)
    # Pocock's shape, which designs recorded before keep, is one tail at every look, the earlier computation's
    pocock = sequential.GroupSequential(3, 15, shape=sequential.POCOCK_SHAPE,
                                        paper_error=sequential.EARLIER_PAPER_SIDE_ERROR)
    assert {pocock.side(0.04, n).tail(0.025) for n in looks} == {sequential._nominal_tail(looks, 0.04)}


def test_a_group_look_takes_each_bound_from_its_side_and_rules_out_by_its_futility_bound():
    """A look's interval: the paper's side from the paper's boundary, the other from the other side's; its
    futility interval (narrower) rules δ out even where the look's own upper bound does not."""
    rng = np.random.default_rng(3)
    values = list(rng.normal(0.2, 1.0, 12))
    design = sequential.GroupSequential(3, 12)

    def estimate(boundary):
        return intervals.t_interval(values, 1 - 2 * boundary.tail(0.025))

    up = sequential.group_look(estimate, design, paper_sign=1, seeds=12)
    down = sequential.group_look(estimate, design, paper_sign=-1, seeds=12)
    paper = estimate(design.side(sequential.PAPER_SIDE_ERROR, 12))
    other = estimate(design.side(sequential.OTHER_SIDE_ERROR, 12))
    assert (up.lo, up.hi) == (paper.lo, other.hi) and (down.lo, down.hi) == (other.lo, paper.hi)
    flo, fhi = up.futility
    assert up.lo < flo < fhi < up.hi
    # the power line's projection reads the seeds' spread, not the half-width of two sides at two levels
    assert intervals.per_seed_sd(up) == pytest.approx(float(np.std(values, ddof=1)))
    delta = (fhi + up.hi) / 2  # beyond the futility bound, inside the look's interval
    assert verdicts.verdict(up, 1, delta) is verdicts.VerdictWord.RULES_OUT
    assert (verdicts.verdict(intervals.Estimate(up.estimate, up.lo, up.hi, up.n), 1, delta)
            is verdicts.VerdictWord.NOT_RESOLVED)
    below = (down.lo + down.futility[0]) / 2  # a paper claiming a negative effect: δ's side is below
    assert down.lo < 0 < down.hi and verdicts.verdict(down, -1, below) is verdicts.VerdictWord.RULES_OUT


def test_the_fixed_designs_seeds_for_80_percent_power():
    assert sequential.fixed_design_seeds(1.26 / math.sqrt(2)) == 12  # the gap of 1.26 cell SDs (test_calibration)
    assert sequential.fixed_design_seeds(-1.26 / math.sqrt(2)) == 12 and sequential.fixed_design_seeds(0.0) is None


def test_a_number_prints_the_same_however_its_float_was_computed():
    """A half rounds away from zero after float noise is dropped: one mean computed two ways (a table's fmean and
    an answer's numpy mean) prints one way, where Python's format gives 34.2 for 34.25 and 34.3 for 34.25000...07."""
    from dcl_core.study.analysis.intervals import format_number

    assert [format_number(v) for v in (34.25, 34.250000000000007, 34.249999999999993)] == ["34.3"] * 3
    assert format_number(-0.05) == "-0.1" and format_number(0.04, signed=True) == "+0.0"
    assert format_number(2.0, 2, signed=True) == "+2.00" and format_number(float("nan")) == "nan"
    assert answer_output.format_estimate(intervals.Estimate(34.25, 32.35, 36.15, 2)) == "+34.3 [+32.4, +36.2]"
