"""The papers' numbers (study/analysis/paper.py): internally consistent, immutable, the headlines derived from them,
and each verdict's paper value computed like for like: the question's own statistic over the x both grids share."""

import dataclasses
import math
import statistics
from pathlib import Path

import pytest

from dcl_core.study.analysis import paper as P
from dcl_core.study.analysis.answer import Question
from dcl_core.study.analysis.measures import BEST_GAP, BEST_MARGIN, GAP_AT, GAP_AT_SMALLEST, GAP_SLOPE, STD_DIFFERENCE
from dcl_core.study.analysis.paper import (
    PAPER,
    TABLE18_REPORTED_STD,
    TABLE18_STD_DDOF,
    TABLE18_STD_TAUS,
    TABLE18_TAUS,
    PaperClaim,
    PaperSeries,
    gap_slope,
    paper_claim,
    std_across,
)

# every study of a paper (studies/sweep.py, the generic sweep, asks the user's claim: no paper behind it)
STUDIES = {p.stem for p in (Path(__file__).resolve().parents[3] / "studies").glob("*.py")} - {"sweep"}


def _std(values, ddof):
    return statistics.stdev(values) if ddof == 1 else statistics.pstdev(values)


def test_every_claim_belongs_to_a_study_script_and_every_script_has_one():
    assert set(PAPER) == STUDIES and len(STUDIES) == 9
    assert paper_claim("no_such_study") is None
    for name in PAPER:
        assert paper_claim(name) is PAPER[name]


def test_every_series_cites_its_table_and_is_immutable():
    for study, claim in PAPER.items():
        assert isinstance(claim, PaperClaim) and claim.source and claim.headline_source, study
        for name, s in claim.series.items():
            assert isinstance(s, PaperSeries) and s.source and s.metric and s.values, (study, name)
            assert ("Table" in s.source or "text" in s.source), (study, name)
            with pytest.raises(TypeError):
                s.values[0] = 1.0  # type: ignore[index]
            with pytest.raises(dataclasses.FrozenInstanceError):
                s.values = {}  # type: ignore[misc]
            assert list(s.values) == sorted(s.values)
        with pytest.raises(TypeError):
            claim.series["x"] = claim.series  # type: ignore[index]
        with pytest.raises(dataclasses.FrozenInstanceError):
            claim.headline = 0.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        PAPER["x"] = PAPER["few_epochs"]  # type: ignore[index]


def test_series_accept_pairs_or_a_mapping_and_do_not_alias_the_input():
    src = {2: 1.0, 1: 3.0}
    a, b = PaperSeries("s", "m", src), PaperSeries("s", "m", ((1, 3.0), (2, 1.0)))
    src[3] = 9.0
    assert dict(a.values) == dict(b.values) == {1: 3.0, 2: 1.0}


def test_table18_has_all_eleven_taus_for_both_rows():
    claim = PAPER["temperature_sweep"]
    assert set(claim.series) == {"infonce", "dcl"}
    assert TABLE18_TAUS == (0.07, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    for s in claim.series.values():
        assert tuple(s.values) == TABLE18_TAUS


def test_table18_reported_std_is_a_sample_std_over_tau_0_1_to_1_0():
    """Both reported Std values reproduce with ddof = 1 over τ = 0.1..1.0 (to 0.01); ddof = 0 does not."""
    assert TABLE18_STD_DDOF == 1
    assert TABLE18_TAUS[1:] == TABLE18_STD_TAUS
    for name, s in PAPER["temperature_sweep"].series.items():
        values = [s.values[t] for t in TABLE18_STD_TAUS]
        assert _std(values, TABLE18_STD_DDOF) == pytest.approx(TABLE18_REPORTED_STD[name], abs=0.01), name
        assert std_across(s, TABLE18_STD_DDOF, TABLE18_STD_TAUS) == pytest.approx(_std(values, 1))
    dcl = [PAPER["temperature_sweep"].series["dcl"].values[t] for t in TABLE18_STD_TAUS]
    assert abs(_std(dcl, 0) - TABLE18_REPORTED_STD["dcl"]) > 0.04  # the population std does not reproduce it


def test_table18_std_over_all_eleven_taus_reproduces_dcl_but_not_simclr():
    """The documented inconsistency: over all 11 τ the DCL row still gives 0.98 (ddof 1), SimCLR gives 1.87."""
    series = PAPER["temperature_sweep"].series
    all_dcl = list(series["dcl"].values.values())
    all_nce = list(series["infonce"].values.values())
    assert _std(all_dcl, 1) == pytest.approx(0.98, abs=0.01)
    assert _std(all_dcl, 0) == pytest.approx(0.94, abs=0.01)
    for ddof in (0, 1):
        assert abs(_std(all_nce, ddof) - TABLE18_REPORTED_STD["infonce"]) > 0.3
    flatter = Question("DCL flatter", STD_DIFFERENCE, "dcl", "infonce")
    value = flatter.paper(PAPER["temperature_sweep"], TABLE18_TAUS, "tau")
    assert value.value == pytest.approx(_std(all_nce, 1) - _std(all_dcl, 1))


def test_temperature_headlines():
    claim = PAPER["temperature_sweep"]
    assert claim.headline == pytest.approx(1.44 - 0.98)
    assert claim.headline == pytest.approx(TABLE18_REPORTED_STD["infonce"] - TABLE18_REPORTED_STD["dcl"])
    s = claim.series
    tuned = Question("tuned", BEST_GAP, "dcl", "infonce", paper_key="best_gap").paper(claim, [0.123], "tau")
    assert tuned.value == pytest.approx(max(s["dcl"].values.values()) - max(s["infonce"].values.values()))
    assert "over its own tau" in tuned.text and "none shared" in tuned.text and "reports" not in tuned.text


def test_temperature_paper_value_is_table18s_statistic_over_the_studys_own_taus():
    """Over the CPU grid (0.07/0.2/0.5/1.0) Table 18's rows give SimCLR 2.89 vs DCL 1.51: +1.38, not the reported
    +0.46 (over τ 0.1-1.0), which is printed beside it."""
    claim = PAPER["temperature_sweep"]
    ours = (0.07, 0.2, 0.5, 1.0)
    s = claim.series
    nce = _std([s["infonce"].values[t] for t in ours], 1)
    dcl = _std([s["dcl"].values[t] for t in ours], 1)
    assert (round(nce, 2), round(dcl, 2)) == (2.89, 1.51)
    v = Question("DCL flatter", STD_DIFFERENCE, "dcl", "infonce").paper(claim, ours, "tau")
    assert v.value == pytest.approx(nce - dcl) and round(v.value, 2) == 1.38
    assert v.text.startswith("+1.38 over tau 0.07, 0.2, 0.5, 1") and "reports +0.46" in v.text
    # a grid beyond the paper's τ: the value over the shared τ, and the others named
    v = Question("DCL flatter", STD_DIFFERENCE, "dcl", "infonce").paper(claim, (0.05, 0.1, 0.5, 1.0), "tau")
    assert "over tau 0.1, 0.5, 1; it has no tau 0.05" in v.text


def _gap_at_smallest(claim, better, base):
    b, a = claim.series[better].values, claim.series[base].values
    x = min(set(b) & set(a))
    return b[x] - a[x]


@pytest.mark.parametrize(("study", "better", "base", "expected"), [
    ("batch_size_sweep", "dcl", "infonce", 4.8),  # Sec. 4.2: "outperforms its baseline by 4.8%" (CIFAR-10 kNN)
    ("queue_size_sweep", "dcl", "infonce", 2.5),
    ("few_epochs", "dcl", "infonce", 7.1),  # Sec. 4.3: 64.6% vs 57.5%
])
def test_gap_at_smallest_headlines(study, better, base, expected):
    claim = PAPER[study]
    assert claim.headline == pytest.approx(_gap_at_smallest(claim, better, base))
    assert claim.headline == pytest.approx(expected)


def test_batch_size_paper_values_over_the_shared_batches():
    claim = PAPER["batch_size_sweep"]
    assert tuple(claim.series["dcl"].values) == (32, 64, 128, 256, 512)
    smallest = Question("gap", GAP_AT_SMALLEST, "dcl", "infonce")
    cpu = smallest.paper(claim, (32, 64, 128, 256), "batch")
    assert cpu.value == pytest.approx(claim.headline) and cpu.text == "+4.80 over batch 32, 64, 128, 256"
    long = smallest.paper(claim, (16, 32, 64, 128), "batch")  # cpu_long: batch 16 is below Table 1's grid
    assert long.value == pytest.approx(4.8) and long.text == "+4.80 over batch 32, 64, 128; it has no batch 16"
    slope = Question("slope", GAP_SLOPE, "dcl", "infonce", paper_sign=-1, paper_key="slope")
    b, a = claim.series["dcl"].values, claim.series["infonce"].values
    xs = [math.log2(x) for x in b]
    ys = [b[x] - a[x] for x in b]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    expected = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    assert slope.paper(claim, tuple(b), "batch").value == pytest.approx(expected) == pytest.approx(-0.64, abs=0.005)
    # over the cpu_long grid's shared batches (32-128): gaps 4.8, 4.0, 3.3
    assert slope.paper(claim, (16, 32, 64, 128), "batch").value == pytest.approx(-0.75)


def test_dclw_tau_lr_and_eqco_headlines():
    dclw = PAPER["dclw_sigma_sweep"]
    v = dclw.series["dclw"].values
    assert set(v) == {0.5, 1000.0}
    assert dclw.headline == pytest.approx(v[0.5] - v[1000.0]) and dclw.headline == pytest.approx(0.6)
    tau = PAPER["tau_lr_search"]
    assert tau.headline == pytest.approx(max(tau.series["dcl"].values.values())
                                         - max(tau.series["infonce"].values.values()))
    assert tau.headline == pytest.approx(6.0)  # Table 9: "67.8 (+6.0)"
    assert PAPER["eqco_negatives_sweep"].headline is None
    assert PAPER["eqco_mi_toy"].headline is None
    tuned = Question("tuned", BEST_GAP, "dcl", "infonce").paper(tau, [0.13, 0.31], "tau")
    assert tuned.value == pytest.approx(6.0)
    assert "tuned DCL (Table 3) against untuned SimCLR (Table 2" in tuned.text
    eqco = Question("EqCo", GAP_AT_SMALLEST, "simclr+eqco(α=256)", "simclr+eqco(α=K)", x_min=16)
    assert eqco.paper(PAPER["eqco_negatives_sweep"], (4, 16, 63), "K").text == "no number in the paper"
    sigma = Question("σ 0.5", GAP_AT, "dclw", "dclw", at_x=0.5, baseline_x=1000.0)
    v = sigma.paper(dclw, (0.1, 0.25, 0.5, 1.0, 1000.0), "sigma")
    assert v.value == pytest.approx(0.6) and v.text == "+0.60 over sigma 0.5, 1000; it has no sigma 0.1, 0.25, 1"
    best = Question("best σ", BEST_MARGIN, "dclw", baseline_x=1000.0, paper_key="best")
    assert best.paper(dclw, (0.1, 0.25, 0.5, 1.0, 1000.0), "sigma").value == pytest.approx(0.6)
    few = Question("gap", GAP_AT_SMALLEST, "dcl", "infonce").paper(PAPER["few_epochs"], (2, 4, 8), "epochs")
    assert few.value == pytest.approx(7.1) and few.text == "+7.10 over its own epochs 100, 200, none shared with ours"


def test_few_epochs_and_eqco_series_names():
    assert set(PAPER["few_epochs"].series) == {"infonce", "dcl", "moco+infonce", "moco+dcl"}
    assert set(PAPER["eqco_negatives_sweep"].series) <= {
        "simclr+eqco(α=K)", "simclr+eqco(α=256)", "simo+eqco(α=K)", "simo+eqco(α=256)"}


def test_gap_slope_on_hand_made_numbers():
    base = {8: 50.0, 16: 50.0, 32: 50.0, 64: 50.0}
    better = {8: 56.0, 16: 54.5, 32: 53.0, 64: 51.5}  # the gap shrinks by 1.5 per doubling
    assert gap_slope(better, base) == pytest.approx(-1.5)
    assert gap_slope(PaperSeries("s", "m", better), PaperSeries("s", "m", base)) == pytest.approx(-1.5)
    assert gap_slope({8: 1.0, 16: 2.0, 99: 7.0}, {8: 0.0, 16: 0.0}) == pytest.approx(1.0)  # common x only
    assert math.isnan(gap_slope({8: 1.0}, {8: 0.0}))


def test_the_mi_toy_reads_table5_and_the_claim_matches_it():
    from dcl_core.study.analysis import mi_toy_answer

    assert mi_toy_answer.PAPER_TABLE5 is P.PAPER_TABLE5
    assert mi_toy_answer.PAPER_KS is P.PAPER_KS == (64, 128, 256, 512)
    assert P.PAPER_TABLE5["infonce"][10] == (4.1, 4.7, 5.4, 6.0)
    assert P.PAPER_TABLE5["eqco"][4] == (3.8, 3.7, 3.6, 3.6)
    series = PAPER["eqco_mi_toy"].series
    assert len(series) == 10
    for method, by_mi in P.PAPER_TABLE5.items():
        for mi, row in by_mi.items():
            assert tuple(series[f"{method}/MI={mi}"].values.items()) == tuple(zip(P.PAPER_KS, row, strict=True))


def _toy_rows(slope: float, noise: float = 0.0005, seeds: int = 3) -> list[dict]:
    """MI toy rows at true MI 10: I_NCE grows by ``slope`` nats per doubling of K from 4.1, I_EqCo stays at 6.0."""
    import random

    rng = random.Random(1)
    return [{"true_mi": 10.0, "k": k, "seed": s, "method": m,
             "mi_estimate": (4.1 + slope * math.log2(k / 64) if m == "infonce" else 6.0) + rng.gauss(0, noise)}
            for s in range(seeds) for k in P.PAPER_KS for m in ("infonce", "eqco")]


def test_a_paper_value_carries_the_rounding_of_its_table():
    """Each cell printed to one decimal lies within ±0.05 of the paper's number: Table 18's Δstd over 4 τ is open
    by 2·0.05·sqrt(4/3), Table 1's gap by 2·0.05, Table 5's slope over K 64-512 by 2·0.05·(Σ|w| = 0.8) = 0.08."""
    assert PAPER["temperature_sweep"].rounding == 0.05
    flat = Question("f", STD_DIFFERENCE, "dcl", "infonce").paper(PAPER["temperature_sweep"], [0.07, 0.2, 0.5, 1.0],
                                                                 "tau")
    assert flat.spread == pytest.approx(0.1 * math.sqrt(4 / 3))
    gap = Question("g", GAP_AT_SMALLEST, "dcl", "infonce").paper(PAPER["batch_size_sweep"], [32, 64], "batch")
    assert (gap.value, gap.spread) == (pytest.approx(4.8), pytest.approx(0.1))
    toy = Question("s", GAP_SLOPE, "infonce/MI=10", "eqco/MI=10").paper(PAPER["eqco_mi_toy"], P.PAPER_KS, "K")
    assert (toy.value, toy.spread) == (pytest.approx(0.67), pytest.approx(0.08))


def test_the_mi_toy_within_its_table_s_rounding_is_not_called_smaller_and_its_line_says_why():
    """The toy's slope, +0.667 nats per doubling with three critics agreeing to 0.003, lies just below Table 5's
    +0.67: a slope the table's one-decimal cells allow anywhere in [+0.59, +0.75]. "Smaller than the paper's"
    would be a claim about the rounding: the verdict supports the paper and names the range; a slope of +0.40 is
    smaller than any the table allows, and says so without the range."""
    from dcl_core.study.analysis.mi_toy_answer import toy_verdict
    from dcl_core.study.analysis.verdicts import Size, VerdictWord

    close = toy_verdict(_toy_rows(0.667))
    assert close.estimate.hi < close.paper_value and close.spread == pytest.approx(0.08)
    assert (close.words, close.size, close.rounding_decided) == (VerdictWord.SUPPORTS, None, True)
    assert ": supports the paper — slope" in close.line()
    assert close.line().endswith("(paper: +0.67 over K 64, 128, 256, 512; its table's rounding allows +0.59 to "
                                 "+0.75)")
    far = toy_verdict(_toy_rows(0.40))
    assert (far.words, far.size, far.rounding_decided) == (VerdictWord.SUPPORTS, Size.SMALLER, False)
    assert ": supports the paper, smaller than the paper's — slope" in far.line()
    assert "rounding" not in far.line()
