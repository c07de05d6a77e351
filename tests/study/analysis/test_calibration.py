"""The verdicts' intervals, calibrated by simulating studies with a known truth (study/analysis/calibration.py): under
null studies at most 5% are resolved (within binomial noise) at 2, 3, 5, 8 and 20 seeds, in every setting (shared
seed offsets, unequal noise between cells and between series, a missing trial, 4-11 x values); with an effect
planted, the 95% intervals cover the true value, and the effect is found as often as the t-test's exact power
says. The simulation runs the studies' own code (Question.estimate, verdicts.verdict); seeded, ~40 s."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from dcl_core.study.analysis import intervals, sequential
from dcl_core.study.analysis.calibration import (
    EFFECT,
    GROUP_EFFECTS,
    KINDS,
    SEEDS,
    SETTINGS,
    Setting,
    binomial_upper,
    calibrate,
    exact_power,
    format_group_rows,
    format_report,
    group_row,
    run_sequential,
    simulate,
    true_value,
)

SMOOTH = ("Δstd across x", "gap at smallest x", "gap slope per doubling", "gap at one x vs baseline x")
BEST = ("best margin (max over x)", "best gap (tuned vs tuned)")


# Under pytest-xdist, one worker runs the module fixture report once.
pytestmark = pytest.mark.xdist_group("calibration")


@pytest.fixture(scope="module")
def report():
    return calibrate(studies=200, rng_seed=0)


@pytest.mark.slow  # the calibration: 48,000 simulated studies (module fixture report)
def test_every_kind_and_setting_was_simulated(report):
    assert {k.name for k in KINDS} == set(SMOOTH) | set(BEST) == set(report.null)
    assert {n for by_n in report.null.values() for n in by_n} == set(SEEDS) == {2, 3, 5, 8, 20}
    assert {s.n_x for s in SETTINGS} >= {4, 11} and any(s.missing for s in SETTINGS)
    assert any(s.noise_ramp for s in SETTINGS) and any(s.series_scale != (1.0, 1.0) for s in SETTINGS)
    blocks = [k for k in report.blocks if k[0] == "null"]
    assert len(blocks) == len(KINDS) * len(SETTINGS) * len(SEEDS)
    assert all(c.studies == 200 for c in report.blocks.values())


@pytest.mark.slow  # the calibration: 48,000 simulated studies (module fixture report)
@pytest.mark.parametrize("kind", SMOOTH + BEST)
def test_null_studies_are_resolved_at_most_5_percent_of_the_time(report, kind):
    for n, cell in report.null[kind].items():  # pooled over the settings: 1,000 studies per seed count
        assert binomial_upper(cell.resolved, cell.studies, one_sided=0.001), (kind, n, cell)
    for (what, k, setting, n), cell in report.blocks.items():  # and no setting on its own exceeds it
        if what == "null" and k == kind:
            assert binomial_upper(cell.resolved, cell.studies, one_sided=1e-4), (kind, setting, n, cell)


@pytest.mark.slow  # the calibration: 48,000 simulated studies (module fixture report)
@pytest.mark.parametrize("kind", SMOOTH + BEST)
def test_studies_whose_truth_is_the_effect_of_interest_rule_it_out_at_most_5_percent_of_the_time(report, kind):
    """"Rules out the paper's size" is wrong when the truth is δ: with δ = the planted effect's true value, the
    planted studies say it no more often than 5% (the interval misses the truth on one side: 2.5% expected),
    pooled and in every setting on its own; null studies say it more often with more seeds."""
    for n, cell in report.planted[kind].items():
        assert binomial_upper(cell.ruled_out, cell.studies, one_sided=0.001), (kind, n, cell)
    for (what, k, setting, n), cell in report.blocks.items():
        if what == "planted" and k == kind:
            assert binomial_upper(cell.ruled_out, cell.studies, one_sided=1e-4), (kind, setting, n, cell)
    rates = [cell.ruled_out / cell.studies for _, cell in sorted(report.null[kind].items())]
    assert rates[-1] > rates[0] and rates[-1] > 0.5, (kind, rates)


@pytest.mark.slow  # the calibration: 48,000 simulated studies (module fixture report)
@pytest.mark.parametrize("kind", SMOOTH)
def test_smooth_statistics_are_not_conservative_either(report, kind):
    """A test that never resolves anything is calibrated too: from 3 seeds on, the t-intervals resolve close to
    5% of null studies (not far below), so their power is not thrown away."""
    for n, cell in report.null[kind].items():
        if n >= 3:
            assert cell.resolved / cell.studies > 0.025, (kind, n, cell)


@pytest.mark.slow  # the calibration: 48,000 simulated studies (module fixture report)
@pytest.mark.parametrize("kind", SMOOTH)
def test_planted_effects_are_covered_95_percent(report, kind):
    for n, cell in report.planted[kind].items():
        assert cell.with_interval > 0.95 * cell.studies
        # coverage consistent with >= 95%: not significantly below it
        assert float(sps.binom.cdf(cell.covered, cell.with_interval, 0.95)) > 0.001, (kind, n, cell)


@pytest.mark.slow  # the calibration: 48,000 simulated studies (module fixture report)
@pytest.mark.parametrize("kind", BEST)
def test_best_of_intervals_cover_at_least_95_percent(report, kind):
    """Simultaneous intervals are conservative by construction (every contrast at level 1 − 0.05/m)."""
    for n, cell in report.planted[kind].items():
        assert cell.covered / cell.with_interval >= 0.95, (kind, n, cell)


@pytest.mark.slow  # the calibration: 48,000 simulated studies (module fixture report)
def test_power_of_a_gap_matches_the_exact_t_test_power_and_reaches_80_percent_at_5_seeds(report):
    # A gap of 2.5 cell-noise SDs between two cells with independent noise: per-seed differences have SD √2.
    exact = exact_power(EFFECT / math.sqrt(2), 5)
    assert exact >= 0.80
    for kind in ("gap at smallest x", "gap at one x vs baseline x"):
        cell = report.power[kind][5]
        k, n = cell.right, cell.studies
        assert sps.binomtest(k, n, exact).pvalue > 0.001, (kind, k / n, exact)
        assert cell.resolved == cell.right  # never resolved the wrong way round


@pytest.mark.slow  # the calibration: 48,000 simulated studies (module fixture report)
def test_power_of_the_std_difference_and_of_the_others(report):
    assert report.power["Δstd across x"][5].right / report.power["Δstd across x"][5].studies >= 0.80
    # A slope whose gap falls by 2.5 SDs across the whole grid is a smaller effect per doubling; best-of
    # statistics pay for their simultaneous intervals. Each still finds a planted effect far more often than a
    # null one (5%), and more often with more seeds.
    for kind in ("gap slope per doubling", *BEST):
        by_n = report.power[kind]
        rates = [by_n[n].right / by_n[n].studies for n in sorted(by_n)]
        assert rates == sorted(rates) and rates[-1] > 0.5, (kind, rates)


def test_the_true_value_of_a_per_seed_std_difference_is_zero_under_the_null_and_below_the_planted_truth():
    kind = next(k for k in KINDS if k.name == "Δstd across x")
    setting = SETTINGS[0]
    assert abs(true_value(kind, setting, 0.0)) < 0.01
    # noise spreads one run's values across x for both losses alike, so the expected difference of one run's
    # stds is positive but below the 2.5 planted in the curves themselves
    assert 1.0 < true_value(kind, setting, EFFECT) < EFFECT


def test_per_cell_t_intervals_cover_the_cell_mean_95_percent():
    """The per-cell intervals (mean over seeds, seed offsets included) and the paired gaps are t-intervals; their
    coverage under the model with seed offsets and noise."""
    rng = np.random.default_rng(1)
    for seeds in (2, 3, 5, 8, 20):
        covered = total = 0
        for _ in range(2000):
            values = 30.0 + rng.normal(0, 2.0, seeds) + rng.normal(0, 1.0, seeds)
            e = intervals.t_interval(values.tolist())
            total += 1
            covered += e.lo <= 30.0 <= e.hi
        assert sps.binomtest(covered, total, 0.95).pvalue > 0.001, (seeds, covered / total)


def test_simulated_data_has_the_setting_shape():
    rng = np.random.default_rng(0)
    kind = KINDS[1]
    missing = next(s for s in SETTINGS if s.missing)
    data = simulate(kind, missing, 5, 0.0, rng)
    assert set(data) == {"dcl", "infonce"} and all(len(by_x) == missing.n_x for by_x in data.values())
    assert sum(len(v) for by_x in data.values() for v in by_x.values()) == 2 * missing.n_x * 5 - 1


@pytest.mark.slow  # the calibration: 48,000 simulated studies (module fixture report)
def test_format_report_lists_every_kind(report):
    text = format_report(report)
    assert all(kind in text for kind in SMOOTH + BEST)
    assert "null, 2 seeds" in text and "found at 2.5 SD, 5 seeds" in text
    assert "null rules out δ, 5 seeds" in text and "planted rules out δ (wrong)" in text


# ------------------------------------------------------------------------------------ sequential (--until-resolved)
SEQUENTIAL = sequential.Sequential(first=3, max_seeds=18)  # a look after every seed, 3 to 18 seeds per cell


@pytest.mark.slow  # a sequential simulation of 300-400 studies
@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_a_sequential_study_resolves_a_null_at_most_5_percent_of_the_time_over_all_its_looks(kind):
    """16 looks at the data (3, 4, …, 18 seeds), stopping at the first that resolves: over all of them a null
    study is resolved no more often than one look at the fixed design's 5%, in the plain and the hardest setting."""
    rng = np.random.default_rng(7)
    for setting in (SETTINGS[0], SETTINGS[-1]):
        cell = run_sequential(kind, setting, SEQUENTIAL, 0.0, 300, rng)
        assert binomial_upper(cell.resolved, cell.studies), (setting.name, cell.resolved, cell.studies)


NEAR = 1.0  # a planted effect of 1 cell-noise SD: small for 3-10 seeds, so studies often end near a boundary


@pytest.mark.slow  # a sequential simulation of 1,000 studies per smooth kind, 200 per best-of kind, and 2 x 200
@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_a_sequential_study_that_stops_once_settled_rules_out_a_true_effect_at_most_5_percent_of_the_time(kind):
    """--until-resolved stops a question once it is settled either way, "rules out the paper's size" included.
    With δ the planted effect's true value, studies whose truth is δ end ruling it out in at most 5% (the design's
    two-sided boundary, applied around δ, allows 2.5%); null studies, which now stop once they rule a large δ
    out, use fewer seeds than when only excluding 0 could stop them, and still resolve at most 5%."""
    design = sequential.Sequential(first=3, max_seeds=10)
    setting = SETTINGS[3]  # 6 x, a missing trial
    delta = true_value(kind, setting, NEAR)
    at_delta = run_sequential(kind, setting, design, NEAR, 1000 if kind.name in SMOOTH else 200,
                              np.random.default_rng(12), delta=delta)
    assert binomial_upper(at_delta.ruled_out, at_delta.studies), at_delta
    large = true_value(kind, setting, EFFECT)
    null = run_sequential(kind, setting, design, 0.0, 200, np.random.default_rng(13), delta=large)
    assert binomial_upper(null.resolved, null.studies), null
    without = run_sequential(kind, setting, design, 0.0, 200, np.random.default_rng(13))
    assert null.mean_seeds < without.mean_seeds and null.ruled_out > null.studies / 2, (null, without)


@pytest.mark.slow  # a sequential simulation of 1,000 studies
def test_ruling_out_at_the_fixed_level_after_every_seed_would_not_be_calibrated():
    """The test above can fail: the fixed 95% interval looked at after every seed rules out a true δ in more than
    5% of the studies (the same simulation with the one-look level at every look)."""
    class EveryLookAtTheFixedLevel(sequential.Sequential):
        def tail(self, tail: float) -> float:
            return tail

    kind, setting = KINDS[1], SETTINGS[3]
    cell = run_sequential(kind, setting, EveryLookAtTheFixedLevel(3, 10), NEAR, 1000, np.random.default_rng(12),
                          delta=true_value(kind, setting, NEAR))
    assert not binomial_upper(cell.ruled_out, cell.studies), cell


@pytest.mark.slow  # a sequential simulation of 300-400 studies
def test_looking_after_every_seed_at_the_fixed_level_would_not_be_calibrated():
    """The reason for the design: the fixed 95% interval looked at after every seed resolves a null study far
    more often than 5% (the same simulation with p* = 0.025 at every look)."""
    class EveryLookAtTheFixedLevel(sequential.Sequential):
        def tail(self, tail: float) -> float:
            return tail

    naive = EveryLookAtTheFixedLevel(first=3, max_seeds=18)
    cell = run_sequential(KINDS[1], SETTINGS[0], naive, 0.0, 300, np.random.default_rng(8))
    assert cell.resolved / cell.studies > 0.10


@pytest.mark.slow  # a sequential simulation of 300-400 studies
def test_a_sequential_study_needs_fewer_seeds_than_the_fixed_design_with_80_percent_power():
    """A gap planted so that the fixed design needs 12 seeds per cell for 80% power (the exact t-test power: a
    seed's gap has SD √2 cell-noise SDs): looking after every seed from 3 up to 18, the sequential design finds it
    at least as often, with fewer seeds per cell on average."""
    effect = 1.26  # cell-noise SDs
    n80 = next(n for n in range(2, 100) if exact_power(effect / math.sqrt(2), n) >= 0.8)
    assert n80 == 12
    cell = run_sequential(KINDS[1], SETTINGS[0], SEQUENTIAL, effect, 400, np.random.default_rng(9))
    assert cell.right / cell.studies >= 0.8
    assert cell.mean_seeds < n80, cell.mean_seeds


def test_the_sequential_boundary_is_stricter_than_one_look_and_the_same_everywhere():
    design = sequential.Sequential(first=3, max_seeds=18)
    assert design.looks == tuple(range(3, 19))
    assert 0.001 < design.tail(0.025) < 0.025 / 4  # stricter than one look, far looser than Bonferroni's 0.025/16
    assert sequential.Sequential(first=5, max_seeds=5).tail(0.025) == 0.025  # one look is the fixed design
    with pytest.raises(ValueError):
        sequential.Sequential(first=1, max_seeds=5)


@pytest.mark.slow  # a sequential simulation of 300-400 studies
@pytest.mark.parametrize("setting", [Setting("3 x, shared seed offsets", n_x=3),
                                     Setting("3 x, unequal noise, missing trial", n_x=3, noise_ramp=0.5,
                                             series_scale=(1.5, 0.75), missing=True)], ids=lambda s: s.name)
def test_tuned_against_tuned_over_three_learning_rates_is_calibrated(setting):
    """studies/lr_in_regime.py compares each loss at the best of 3 base lrs: that maximum's bounds resolve at most
    5% of null studies at the seeds its presets run (2, 5) and over the looks of --until-resolved (5 to 20 seeds),
    and cover a planted effect at least 95% of the time."""
    kind = next(k for k in KINDS if k.name == "best gap (tuned vs tuned)")
    rep = calibrate(studies=400, seeds=(2, 5), settings=(setting,), kinds=(kind,), power_seeds=(5,), rng_seed=4)
    for n, cell in rep.null[kind.name].items():
        assert binomial_upper(cell.resolved, cell.studies), (n, cell)
    planted = rep.planted[kind.name][5]
    assert planted.covered / planted.with_interval >= 0.95, planted
    cell = run_sequential(kind, setting, sequential.Sequential(5, 20), 0.0, 300, np.random.default_rng(11))
    assert binomial_upper(cell.resolved, cell.studies), cell


# ---------------------------------------------------------- the group-sequential design (settles either way, early)
GROUP_STUDIES = 1000  # simulated studies per truth and kind: the mean-seeds ratio to ±0.01 (one SE)


def _binomial_at_least(k: int, n: int, p: float, one_sided: float = 0.001) -> bool:
    """True when k successes in n are consistent with a rate ≥ p (one-sided binomial test)."""
    return float(sps.binom.cdf(k, n, p)) > one_sided


@pytest.mark.slow  # 2 x 1,000 sequential studies per kind and ~4 x 1,000 to plan the last look: 5-40 s each
@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_the_group_sequential_design_settles_with_fewer_seeds_than_the_fixed_design(kind):
    """--until-resolved's design against the fixed design with 80% power at δ (δ = the planted effect's true
    value), its last look the fewest seeds that give it 80% power at δ, 1,000 simulated studies at truth 0 and at
    truth δ (``python -m dcl_core.study calibrate --design``): ≤ 5% of null studies end supporting or
    contradicting the paper, ≤ 5% of studies at δ end ruling δ out, ≥ 80% of them find it (each a binomial test
    at 0.001), the mean seeds per cell at either truth ≤ 0.80 of the fixed design's, the most ≤ 1.3 of it; for
    every question kind, the best-of ones included."""
    row = group_row(kind, GROUP_STUDIES)
    assert 12 <= row.fixed <= 16 and row.design.max_seeds <= 1.3 * row.fixed
    null, at_delta = row.null, row.at_delta
    assert binomial_upper(null.resolved, null.studies), null
    assert binomial_upper(at_delta.ruled_out, at_delta.studies), at_delta
    assert _binomial_at_least(at_delta.right, at_delta.studies, 0.8), at_delta
    assert null.mean_seeds <= 0.80 * row.fixed, (null.mean_seeds, row.fixed)
    assert at_delta.mean_seeds <= 0.80 * row.fixed, (at_delta.mean_seeds, row.fixed)
    assert f"| {kind.name} | {row.fixed} |" in format_group_rows([row])


@pytest.mark.slow  # 300 sequential studies
def test_without_its_futility_bound_the_design_would_not_save_seeds_at_the_null():
    """The test above can fail: the same design stopping only when its interval excludes 0 (no δ to rule out)
    runs null studies to about its last look, more than the fixed design's seeds."""
    kind = next(k for k in KINDS if k.name == "gap at smallest x")
    row = group_row(kind, 300, futility=False)
    assert row.null.mean_seeds > 0.80 * row.fixed, (row.null.mean_seeds, row.fixed)


@pytest.mark.slow  # 2 x 200 sequential studies per kind and setting: 2-10 s each
@pytest.mark.parametrize("kind", KINDS, ids=[k.name for k in KINDS])
def test_the_group_sequential_design_keeps_its_error_rates_in_the_hard_settings(kind):
    """Unequal noise, a missing trial, 11 x, "best" statistics: null studies resolved and studies at δ ruling δ
    out stay ≤ 5% (the design's three bounds scale each Bonferroni share of a best-of statistic alike)."""
    design = sequential.GroupSequential(3, 12)
    # a best-of statistic over 11 x takes ~40 s: unequal noise and a missing trial in its 4-6 x settings instead
    for setting in (SETTINGS[3], SETTINGS[-1] if kind.name in SMOOTH else SETTINGS[2]):
        at_delta = run_sequential(kind, setting, design, NEAR, 200, np.random.default_rng(12),
                                  delta=true_value(kind, setting, NEAR))
        assert binomial_upper(at_delta.ruled_out, at_delta.studies), (setting.name, at_delta)
        null = run_sequential(kind, setting, design, 0.0, 200, np.random.default_rng(13),
                              delta=true_value(kind, setting, EFFECT))
        assert binomial_upper(null.resolved, null.studies), (setting.name, null)


@pytest.mark.slow  # the fixed designs' Monte Carlo (true values and spreads): ~12 s
def test_the_calibrate_command_prints_the_designs_table(capsys):
    """``python -m dcl_core.study calibrate --design``: the table docs/statistics.md shows (here with 20 studies)."""
    from dcl_core.study.cli.calibrate_command import calibrate_main

    assert calibrate_main(["--design", "--studies", "20"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("20 simulated studies per truth and kind")
    assert all(f"| {kind} | " in out for kind in GROUP_EFFECTS) and "| mean seeds, truth 0 |" in out
