"""dcl_core.study.stats: t-intervals against hand computations, pairing by seed id (never by position), the seed
bootstrap on planted effects and planted nulls, the headline statistics on hand-made means, verdict boundaries,
the power estimate and formatting. Pure and deterministic (fixed rng seeds)."""

import math
import random

import pytest
from scipy import stats as sps

from dcl_core.study.stats import (
    Estimate,
    best_margin,
    bootstrap,
    collect,
    format_estimate,
    gap_at,
    gap_slope,
    paired_difference,
    seeds_needed,
    std_across,
    std_difference,
    t_interval,
    verdict,
)

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


def gap_01(means):
    return gap_at(means, "dcl", "infonce", 0.1)


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
    assert verdict(paired, +1) == "supports the paper"


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


# -------------------------------------------------------------------------------------------------- bootstrap


def test_bootstrap_is_deterministic_in_its_seed():
    data = collect(planted(effect=1.0, noise=1.0), "temperature")
    a, b = bootstrap(data, gap_01, seed=0), bootstrap(data, gap_01, seed=0)
    c = bootstrap(data, gap_01, seed=1)
    assert a == b
    assert (a.lo, a.hi) != (c.lo, c.hi)
    assert a.estimate == c.estimate
    assert abs(a.lo - c.lo) < 0.25 * a.half_width and abs(a.hi - c.hi) < 0.25 * a.half_width


def test_bootstrap_planted_effect_resolves_in_both_directions():
    data = collect(planted(effect=3.0), "temperature")
    e = bootstrap(data, gap_01)
    assert e.estimate == pytest.approx(3.0, abs=0.5)
    assert e.lo <= e.estimate <= e.hi
    assert e.n == 5 and e.std > 0
    assert verdict(e, +1) == "supports the paper"
    assert verdict(e, -1) == "contradicts the paper"
    assert seeds_needed(e, e.n) == 5


def test_bootstrap_planted_null_is_mostly_not_resolved():
    words = []
    for rng_seed in range(10):
        data = collect(planted(effect=0.0, noise=1.0, rng_seed=rng_seed), "temperature")
        e = bootstrap(data, gap_01, draws=1000)
        assert e.lo <= e.estimate <= e.hi
        words.append(verdict(e, +1))
    assert words.count("not resolved") >= 8


def test_bootstrap_planted_std_difference():
    data = collect(planted(effect=0.0, slope=-10.0, noise=0.3), "temperature")  # InfoNCE falls 9 points over τ

    def flatter(m):
        return std_difference(m, worse="infonce", better="dcl")

    e = bootstrap(data, flatter, draws=1000)
    assert e.estimate > 3 and e.lo <= e.estimate <= e.hi
    assert verdict(e, +1) == "supports the paper"
    flat = bootstrap(collect(planted(effect=0.0, noise=0.3), "temperature"), flatter, draws=1000)
    assert verdict(flat, +1) == "not resolved"


def test_bootstrap_one_seed_per_cell_has_no_interval():
    e = bootstrap(collect(planted(effect=3.0, seeds=1), "temperature"), gap_01)
    assert e.n == 1 and not e.has_interval and e.estimate == pytest.approx(3.0, abs=1.5)
    assert verdict(e, +1) == "not resolved" and seeds_needed(e, e.n) is None


def test_bootstrap_no_interval_when_the_cells_the_statistic_uses_have_one_seed():
    rows = [r for r in planted(effect=3.0) if r["temperature"] != 0.1 or r["seed"] == 0]
    e = bootstrap(collect(rows, "temperature"), gap_01)
    assert e.n == 1 and not e.has_interval  # other x have 5 seeds, but the gap at 0.1 rests on one each
    e5 = bootstrap(collect(rows, "temperature"), lambda m: gap_at(m, "dcl", "infonce", 0.5))
    assert e5.n == 5 and e5.has_interval


def test_bootstrap_pairs_series_by_seed():
    data = collect(planted(effect=2.0, noise=0.3, offset=10.0), "temperature")  # seed s adds 10·s to both
    assert t_interval(list(data["infonce"][0.1].values())).std > 10
    e = bootstrap(data, gap_01)
    assert e.half_width < 1 and verdict(e, +1) == "supports the paper"
    # an exact per-seed shift: every draw's gap is exactly that shift
    exact = {"a": {1: {0: 1.0, 1: 50.0, 2: 7.0}}, "b": {1: {0: 3.0, 1: 52.0, 2: 9.0}}}
    e = bootstrap(exact, lambda m: gap_at(m, "b", "a", 1), draws=200)
    assert (e.estimate, e.lo, e.hi, e.n) == pytest.approx((2.0, 2.0, 2.0, 3))


def test_bootstrap_cell_means_count_repeats_and_skip_missing_seeds():
    data = {"a": {1: {0: 0.0, 1: 10.0, 2: 20.0}}, "b": {1: {0: 0.0}}}
    calls = []

    def stat(m):
        calls.append(m.get("b", {}).get(1))
        return m["a"][1]

    e = bootstrap(data, stat, draws=400)
    seen_b = set(calls[-400:])  # the draws (earlier calls: the point estimate and probes of which cells matter)
    assert seen_b == {0.0, None}  # b lacks seeds 1, 2: its mean is 0 when seed 0 was drawn, else it is absent
    assert e.estimate == 10.0 and 0.0 <= e.lo < 10.0 < e.hi <= 20.0
    # replicate means are k/3 of 10 (repeats counted), so the percentiles are on that grid
    assert {round(e.lo * 3 / 10, 9) % 1, round(e.hi * 3 / 10, 9) % 1} <= {0.0}


def test_bootstrap_discards_nan_draws_and_gives_no_interval_when_most_are_nan():
    data = {"a": {1: {0: 0.0, 1: 10.0, 2: 20.0}}}
    # P(drawn mean == 10) = 7/27 < 1/2: most draws are nan
    exact = bootstrap(data, lambda m: m["a"][1] if abs(m["a"][1] - 10) < 1e-9 else math.nan, draws=500)
    assert exact.estimate == 10.0 and not exact.has_interval
    # P(drawn mean <= 10) = 17/27 > 1/2: an interval from the kept draws only
    low = bootstrap(data, lambda m: m["a"][1] if m["a"][1] <= 10 + 1e-9 else math.nan, draws=500)
    assert low.has_interval and low.hi <= 10 + 1e-9


def test_bootstrap_undefined_statistic():
    e = bootstrap(collect(planted(effect=1.0), "temperature"), lambda m: gap_at(m, "dcl", "missing", 0.1))
    assert math.isnan(e.estimate) and not e.has_interval
    assert math.isnan(bootstrap({}, gap_01).estimate)


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
    (0.1, 2.0, +1, "supports the paper"),
    (1e-12, 2.0, +1, "supports the paper"),
    (0.0, 2.0, +1, "not resolved"),  # touching 0
    (-2.0, 0.0, +1, "not resolved"),
    (-2.0, -1e-12, +1, "contradicts the paper"),
    (-2.0, -0.1, -1, "supports the paper"),
    (0.1, 2.0, -1, "contradicts the paper"),
    (-0.1, 0.1, -1, "not resolved"),
    (math.nan, math.nan, +1, "not resolved"),
])
def test_verdict_boundaries(lo, hi, sign, words):
    est = (lo + hi) / 2 if math.isfinite(lo) else 1.0
    assert verdict(Estimate(est, lo, hi, 3), sign) == words


def test_verdict_rejects_a_bad_sign():
    with pytest.raises(ValueError):
        verdict(Estimate(1.0, 0.5, 1.5, 3), 0)


def test_seeds_needed():
    assert seeds_needed(Estimate(1.0, -1.0, 3.0, 3), 3) == 12  # half-width twice the effect: 3·2²
    assert seeds_needed(Estimate(-1.0, -3.0, 1.0, 3), 3) == 12
    assert seeds_needed(Estimate(1.0, 0.5, 1.5, 3), 3) == 3  # already resolved
    assert seeds_needed(Estimate(1.0, 0.0, 2.0, 3), 3) == 4  # touching 0: at least one more seed
    assert seeds_needed(Estimate(1.0, math.nan, math.nan, 1), 1) is None
    assert seeds_needed(Estimate(0.0, -1.0, 1.0, 3), 3) is None
    assert seeds_needed(Estimate(math.nan, math.nan, math.nan, 0), 0) is None


def test_estimate_properties_and_format():
    e = Estimate(0.6, -0.9, 2.1, 3)
    assert e.has_interval and e.half_width == pytest.approx(1.5)
    assert format_estimate(e) == "+0.6 [-0.9, +2.1]"
    assert format_estimate(e, digits=2, signed=False) == "0.60 [-0.90, 2.10]"
    assert format_estimate(Estimate(0.6, math.nan, math.nan, 1)) == "+0.6 (n=1, no interval)"
    assert not Estimate(0.6, -math.inf, 1.0, 3).has_interval


def test_expanded_tail_widens_few_seed_intervals_and_tends_to_the_plain_percentile():
    from dcl_core.study.stats import expanded_tail

    # Φ(−√(k/(k−1))·t_{0.975,k−1}): with 3 seeds the interval spans the bootstrap extremes, with 5 the 0.1/99.9
    # percentiles (t_{0.975,4} = 2.7764, ×√1.25 = 3.104, Φ(−3.104) = 0.00095), and the usual 2.5% as k grows.
    assert expanded_tail(0.95, 3) < 1e-6
    assert expanded_tail(0.95, 5) == pytest.approx(0.000954, rel=1e-2)
    assert 0.0235 < expanded_tail(0.95, 400) < 0.025
    assert expanded_tail(0.95, 1) == pytest.approx(0.025)
