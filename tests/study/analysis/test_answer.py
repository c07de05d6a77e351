"""A study's answer from hand-made rows: cell intervals, paired gaps, verdicts decided by the CI, the regime
line, the paper beside ours, the metrics and tags for the summary run (pure, no Ray)."""

import math
import random
import re
import statistics

import pytest

from dcl_core.study.analysis import sequential
from dcl_core.study.analysis.answer import Question, build_answer, gap_points, regime_line
from dcl_core.study.analysis.answer_output import (
    answer_metrics,
    answer_tags,
    figure_note,
    format_answer,
    verdict_tags,
)
from dcl_core.study.analysis.intervals import collect
from dcl_core.study.analysis.measures import BEST_MARGIN, GAP_AT, GAP_AT_SMALLEST, STD_DIFFERENCE
from dcl_core.study.analysis.paper import paper_claim
from dcl_core.study.analysis.sequential import GroupSequential
from dcl_core.study.analysis.verdicts import VerdictWord

FLATTER = Question("DCL flatter across τ than InfoNCE", STD_DIFFERENCE, "dcl", "infonce", label="Δstd")
GAP = Question("DCL beats InfoNCE at the smallest τ", GAP_AT_SMALLEST, "dcl", "infonce", label="gap")


def rows(effect, noise, seeds=5, taus=(0.1, 0.5, 1.0), rng_seed=0, q=0.9):
    """InfoNCE's accuracy falls with τ (−8 points per unit τ) unless ``effect`` flattens DCL's; ``noise`` per
    trial, plus a per-seed offset shared by both losses (what pairing by seed removes)."""
    rng = random.Random(rng_seed)
    out = []
    for s in range(seeds):
        offset = rng.gauss(0, 3)
        for tau in taus:
            for loss in ("infonce", "dcl"):
                slope = -8.0 * (1 - effect) if loss == "dcl" else -8.0
                acc = 40 + slope * tau + offset + rng.gauss(0, noise)
                out.append({"series": loss, "loss": loss, "temperature": tau, "seed": s, "status": "ok",
                            "knn_top1": acc, "q_mean": q - 0.1 * (tau < 0.2)})
    return out


def test_planted_effect_supports_and_the_verdict_is_printed_last():
    a = build_answer(rows(effect=1.0, noise=0.2), "temperature", "tau", [FLATTER], paper="temperature_sweep")
    (v,) = a.verdicts
    assert v.words is VerdictWord.SUPPORTS and v.estimate.lo > 0
    # like for like: Table 18's std difference over this study's τ (0.1, 0.5, 1.0), its reported +0.46 beside it
    t18 = paper_claim("temperature_sweep").series
    expected = (statistics.stdev(t18["infonce"].values[t] for t in (0.1, 0.5, 1.0))
                - statistics.stdev(t18["dcl"].values[t] for t in (0.1, 0.5, 1.0)))
    assert v.paper_value == pytest.approx(expected)
    text = format_answer(a)
    assert text.splitlines()[-1] == v.line() and "supports the paper" in text.splitlines()[-1]
    assert f"(paper: {expected:+.2f} over tau 0.1, 0.5, 1; it reports +0.46: Table 18's Std column" in v.line()
    assert "Paper: DCL Table 18" in text  # both rows, all 11 τ
    assert "0.07" in text and "NPC regime" in text


def test_a_null_that_excludes_the_papers_size_rules_it_out_and_a_given_effect_of_interest_replaces_it():
    """No effect, little noise: Δstd's interval contains 0 and lies below Table 18's like-for-like value, so the
    data rule out an effect as large as the paper's; the verdict says so, logs it and its δ, and counts as settled
    (--until-resolved stops on it). A δ given inside the interval (--effect-of-interest) leaves it unresolved."""
    a = build_answer(rows(effect=0.0, noise=0.3), "temperature", "tau", [FLATTER], paper="temperature_sweep")
    (v,) = a.verdicts
    assert v.estimate.lo < 0 < v.estimate.hi < v.paper_value and v.delta == v.paper_value
    assert v.words is VerdictWord.RULES_OUT and a.resolved and v.power_line() is None
    assert v.line().startswith(f"DCL flatter across τ than InfoNCE: rules out the paper's size — no effect as large "
                               f"as the paper's {v.paper_value:+.2f} at this scale: Δstd ")
    metrics, tags = answer_metrics(a), answer_tags(a)
    assert metrics["verdict/std_difference_0/rules_out"] == 1.0 and metrics["verdict/std_difference_0/supports"] == 0
    assert metrics["verdict/std_difference_0/effect_of_interest"] == pytest.approx(v.paper_value)
    assert metrics["verdict/std_difference_0/effect_spread"] == pytest.approx(v.spread) and v.spread > 0
    assert tags["verdict_0"] == "rules out the paper's size"

    inside = Question(**{**FLATTER.__dict__, "effect_of_interest": v.estimate.hi / 2})
    (w,) = build_answer(rows(effect=0.0, noise=0.3), "temperature", "tau", [inside], paper="temperature_sweep").verdicts
    assert w.words is VerdictWord.NOT_RESOLVED and w.delta == pytest.approx(v.estimate.hi / 2)
    assert "(--effect-of-interest)" in w.line() and w.paper_value == v.paper_value  # the paper's still printed
    assert w.spread == 0 and "verdict/std_difference_0/effect_spread" not in answer_metrics(  # a given δ is exact
        build_answer(rows(effect=0.0, noise=0.3), "temperature", "tau", [inside], paper="temperature_sweep"))


def test_the_figure_states_the_verdict_s_numbers_as_its_line_rounds_them():
    """The study's figure said "Δstd -0.0" where the console's verdict line said -0.05: one rounding everywhere."""
    a = build_answer(rows(effect=0.0, noise=0.3), "temperature", "tau", [FLATTER], paper="temperature_sweep")
    (v,) = a.verdicts
    numbers = re.search(r"Δstd ([-+]\d\.\d\d), 95% CI \[([-+]\d\.\d\d), ([-+]\d\.\d\d)\]", v.line())
    assert numbers is not None, v.line()
    assert figure_note(v) == (f"DCL flatter across τ than InfoNCE: Δstd {numbers[1]}, 95% CI [{numbers[2]}, "
                              f"{numbers[3]}], rules out the paper's size")


def test_a_group_sequential_look_rules_out_by_its_futility_bound_and_says_which_bound():
    """Under --until-resolved's group-sequential design a look's interval is wider than one fixed look's, and δ
    is ruled out by its futility bound: a δ between that bound and the look's upper bound is ruled out, the line
    names the bound, the summary run logs it. Without the design the same δ is judged by the 95% interval."""
    data = rows(effect=0.0, noise=0.3)
    one = build_answer(data, "temperature", "tau", [FLATTER], paper="temperature_sweep").verdicts[0]
    design = GroupSequential(3, 12)
    look = FLATTER.estimate(collect(data, "temperature"), design)
    assert look.futility is not None and look.lo < one.estimate.lo and one.estimate.hi < look.hi
    delta = (look.futility[1] + look.hi) / 2  # beyond the futility bound, inside the look's own interval
    given = Question(**{**FLATTER.__dict__, "effect_of_interest": delta})
    a = build_answer(data, "temperature", "tau", [given], paper="temperature_sweep", design=design)
    (v,) = a.verdicts
    assert v.words is VerdictWord.RULES_OUT and v.estimate.hi > delta
    level = f"{100 - 100 * look.futility_tail:.1f}"
    deciding = (f"the design's futility bound Δstd < {look.futility[1]:+.2f} (one-sided {level}% at this look) "
                f"excludes {delta:+.2f}")
    # the 95% interval holds δ, so the line, the figure and MLflow name the bound that decided, with its level
    assert f"95% CI [{v.estimate.lo:+.2f}, {v.estimate.hi:+.2f}]; {deciding} (paper: " in v.line()
    assert figure_note(v).endswith(f"; {deciding}, rules out the paper's size")
    # the paper's own δ (Table 18's +1.38, ±0.12 from its rounding): the bound must clear the range's nearer end
    quiet = rows(effect=0.0, noise=0.05)
    (p,) = build_answer(quiet, "temperature", "tau", [FLATTER], paper="temperature_sweep", design=design).verdicts
    assert p.words is VerdictWord.RULES_OUT and p.estimate.futility[1] < p.delta - p.spread
    assert p.deciding_bound().endswith(f"excludes {p.delta:+.2f} and every value its table's rounding allows "
                                       f"(from {p.delta - p.spread:+.2f})")
    assert verdict_tags(a.verdicts)["verdict_0_line"] == v.line()
    assert 0 < look.futility_tail < sequential.FUTILITY_ERROR
    assert answer_metrics(a)["verdict/std_difference_0/futility_hi"] == pytest.approx(look.futility[1])
    assert "against the effect of interest by the design's futility bound" in format_answer(a)
    (w,) = build_answer(data, "temperature", "tau", [given], paper="temperature_sweep").verdicts
    assert (w.words is VerdictWord.RULES_OUT) == (w.estimate.hi < delta) and "futility" not in w.line()


def test_in_simulated_looks_every_verdict_prints_a_bound_that_agrees_with_it():
    """Simulated group-sequential looks (3 of 12 seeds per cell, truth: no effect, δ given near the looks' upper
    bounds): a 'rules out' whose 95% interval still holds δ (most of them) prints the futility bound that decided
    it, on the near side of δ; a verdict decided by its 95% interval prints no other bound."""
    design, printed, plain = GroupSequential(3, 12), 0, 0
    bound = re.compile(r"the design's futility bound Δstd < ([-+]\d+\.\d\d) \(one-sided \d+\.\d+% at this look\)")
    for seed in range(40):
        data = rows(effect=0.0, noise=0.3, seeds=3, rng_seed=seed)
        given = Question(**{**FLATTER.__dict__, "effect_of_interest": 1.0})
        (v,) = build_answer(data, "temperature", "tau", [given], paper="temperature_sweep", design=design).verdicts
        found = bound.search(v.line())
        if v.words is VerdictWord.RULES_OUT:
            assert found is not None and float(found[1]) < 1.0 and found[0] in figure_note(v), v.line()
            printed += v.estimate.hi >= 1.0
        else:
            assert found is None and "futility bound" not in figure_note(v), v.line()
            plain += 1
    assert printed >= 5 and plain >= 1  # both kinds occurred: the property was exercised


def test_a_paper_value_over_the_papers_own_x_is_no_effect_of_interest():
    """Where the grids share no x the paper's value is over its own x (said so in the line): not like for like,
    so it is no δ, and the same null rows that rule out Table 18's value over shared τ stay unresolved."""
    null = rows(effect=0.0, noise=0.3, taus=(0.15, 0.25, 0.35))
    (v,) = build_answer(null, "temperature", "tau", [FLATTER], paper="temperature_sweep").verdicts
    assert "over its own tau" in v.line() and v.paper_value is not None and not v.paper.like_for_like
    assert v.delta is None and v.words is VerdictWord.NOT_RESOLVED and v.estimate.hi < v.paper_value


def test_a_supporting_interval_says_whether_the_effect_is_smaller_or_larger_than_the_papers():
    small = build_answer(rows(effect=0.1, noise=0.05), "temperature", "tau", [FLATTER], paper="temperature_sweep")
    (v,) = small.verdicts
    assert 0 < v.estimate.lo < v.estimate.hi < v.paper_value
    assert v.words is VerdictWord.SUPPORTS and v.line().startswith(
        "DCL flatter across τ than InfoNCE: supports the paper, smaller than the paper's — Δstd")
    assert answer_tags(small)["verdict_0_size"] == "smaller than the paper's"
    large = build_answer(rows(effect=1.0, noise=0.2), "temperature", "tau", [FLATTER], paper="temperature_sweep")
    (w,) = large.verdicts
    assert w.estimate.lo > w.paper_value and "supports the paper, larger than the paper's" in w.line()
    given = Question(**{**FLATTER.__dict__, "effect_of_interest": w.estimate.hi + 1})
    (g,) = build_answer(rows(effect=1.0, noise=0.2), "temperature", "tau", [given], paper="temperature_sweep").verdicts
    assert ": supports the paper, smaller than the effect of interest — " in g.line()


def test_planted_null_is_not_resolved_with_a_power_estimate():
    a = build_answer(rows(effect=0.0, noise=2.0), "temperature", "tau", [GAP])
    (v,) = a.verdicts
    assert v.words is VerdictWord.NOT_RESOLVED and v.estimate.lo < 0 < v.estimate.hi
    assert v.seeds_needed is not None and v.seeds_needed > 5
    assert v.power_line() == (f"  gap: ≈{v.seeds_needed} seeds per cell would resolve an effect of this size at "
                              "this spread (now 5; a projection, not a promise)")
    assert v.power_line() in format_answer(a)


def test_a_projection_past_the_cap_reads_as_not_resolvable():
    """Past MAX_SEEDS_PROJECTED seeds the power line names no number: it is no advice to run 40,000 seeds."""
    from dcl_core.study.analysis.answer import Verdict
    from dcl_core.study.analysis.intervals import Estimate

    tiny = Estimate(0.01, -1.0, 1.02, 5)
    line = Verdict(GAP, tiny, VerdictWord.NOT_RESOLVED, None, None).power_line()
    assert line == "  gap: not resolvable at this spread within 200 seeds per cell (the effect is small for its " \
                   "seed-to-seed spread)"


def test_one_seed_per_cell_has_no_interval_and_says_so():
    a = build_answer(rows(effect=1.0, noise=0.2, seeds=1), "temperature", "tau", [FLATTER])
    (v,) = a.verdicts
    assert v.words is VerdictWord.NOT_RESOLVED and "no interval" in v.line()
    assert all(not e.has_interval for by_x in a.cells.values() for e in by_x.values())


def test_paired_gaps_use_common_seeds_and_cells_have_t_intervals():
    data = rows(effect=1.0, noise=0.2)
    data = [r for r in data if not (r["series"] == "dcl" and r["seed"] == 4)]  # DCL's seed 4 failed
    a = build_answer(data, "temperature", "tau", [])
    gap = a.pairs["dcl − infonce"][1.0]
    assert gap.n == 4
    by = {(r["series"], r["seed"]): r["knn_top1"] for r in data if r["temperature"] == 1.0}
    assert gap.estimate == pytest.approx(sum(by[("dcl", s)] - by[("infonce", s)] for s in range(4)) / 4)
    assert a.cells["infonce"][1.0].n == 5 and a.cells["dcl"][1.0].n == 4
    # the per-seed offset (std 3) is shared: the paired interval is far narrower than the cells' own
    assert gap.half_width < a.cells["dcl"][1.0].half_width / 3


def test_regime_line_names_the_range_and_the_cells_in_the_regime():
    line = regime_line({"infonce": {0.1: 0.55, 0.5: 0.97}}, ["infonce"])
    assert "0.55–0.97" in line and "3–45% weaker" in line and "1 of 2 cells reach q_B ≤ 0.6" in line
    assert "no q_B measured" in regime_line({}, [])


def test_metrics_and_tags_for_the_summary_run():
    a = build_answer(rows(effect=1.0, noise=0.2), "temperature", "tau", [FLATTER], paper="temperature_sweep")
    m = answer_metrics(a)
    assert m["verdict/std_difference_0/supports"] == 1.0 and m["verdict/std_difference_0/ci_lo"] > 0
    assert "cell/dcl/0.1/ci_lo" in m and "paired_gap/dcl-infonce/0.1/mean" in m and "cell/infonce/0.1/q_b" in m
    assert all(math.isfinite(v) for v in m.values())
    tags = answer_tags(a)
    assert type(tags["verdict_0"]) is str  # a plain string for MLflow, not the enum
    assert tags["verdict_0"] == "supports the paper" and tags["verdict_0_line"].startswith(FLATTER.claim)


def test_gap_points_pair_dcl_and_infonce_cells_across_studies():
    pts = gap_points({"a": rows(effect=1.0, noise=0.2), "b": rows(effect=0.0, noise=0.2, taus=(0.5,))})
    assert len(pts) == 4 and {p["label"] for p in pts} == {"a", "b"}
    p = next(p for p in pts if p["label"] == "a" and p["one_minus_q"] == pytest.approx(0.2))  # τ = 0.1 cell
    assert p["n"] == 5 and p["lo"] <= p["gap"] <= p["hi"]


def test_a_study_whose_every_trial_failed_still_has_an_answer():
    failed = [{**r, "status": "error", "knn_top1": None} for r in rows(effect=0.0, noise=1.0)]
    a = build_answer(failed, "temperature", "tau", [FLATTER], paper="temperature_sweep")
    text = format_answer(a)
    assert "no finished trial" in text and "not measurable" in text.splitlines()[-1]


def _eqco_rows(seeds=4):
    """SimCLR/EqCo cells at K = 4, 16, 63: α = 256 loses 3 points at K = 4 only (a planted small-K cost)."""
    rng = random.Random(2)
    out = []
    for s in range(seeds):
        offset = rng.gauss(0, 2)
        for k in (4, 16, 63):
            for series in ("simclr+eqco(α=256)", "simclr+eqco(α=K)"):
                cost = -3.0 if (k == 4 and "256" in series) else 0.0
                out.append({"series": series, "num_negatives": k, "seed": s, "status": "ok", "q_mean": 0.9,
                            "knn_top1": 30 + offset + cost + rng.gauss(0, 0.2)})
    return out


def test_a_claimed_range_leaves_cells_below_it_out_of_the_verdict_and_labels_them():
    inside = Question("EqCo beats α = K at the smallest K (SimCLR)", GAP_AT_SMALLEST, "simclr+eqco(α=256)",
                      "simclr+eqco(α=K)", label="gap at smallest K", x_min=16, range_note="K ≥ 16, EqCo Sec. 1")
    everywhere = Question("EqCo beats α = K at the smallest K (SimCLR)", GAP_AT_SMALLEST, "simclr+eqco(α=256)",
                          "simclr+eqco(α=K)", label="gap at smallest K")
    pairs = (("simclr+eqco(α=256)", "simclr+eqco(α=K)"),)
    a = build_answer(_eqco_rows(), "num_negatives", "K", [inside, everywhere], pairs=pairs,
                     paper="eqco_negatives_sweep")
    within, outside = a.verdicts
    assert within.words is VerdictWord.NOT_RESOLVED and abs(within.estimate.estimate) < 1  # the gap at K = 16
    assert outside.words is VerdictWord.CONTRADICTS and outside.estimate.estimate == pytest.approx(-3.0, abs=0.5)
    assert within.line().startswith("EqCo beats α = K at the smallest K (SimCLR) [K ≥ 16, EqCo Sec. 1]: ")
    assert within.line().endswith("(paper: no number in the paper)")
    text = format_answer(a)
    assert ("K=4: outside the paper's claimed range for simclr+eqco(α=256) vs simclr+eqco(α=K) (K ≥ 16, "
            "EqCo Sec. 1); shown, not counted in its verdict") in text
    assert "K=16: outside" not in text


def test_best_of_questions_use_the_selection_corrected_interval():
    """DCLW's best σ against σ = 1000 and tuned-vs-tuned: wider than the paired interval of the cell that came out
    best, since that cell was picked after seeing the data."""
    rng = random.Random(4)
    data = []
    for s in range(6):
        offset = rng.gauss(0, 2)
        for sigma in (0.1, 0.5, 1.0, 1000.0):
            data.append({"series": "dclw", "sigma": sigma, "seed": s, "status": "ok", "q_mean": 0.9,
                         "knn_top1": 30 + offset + (2.0 if sigma == 0.5 else 0.0) + rng.gauss(0, 0.5)})
    at = Question("DCLW (σ = 0.5) beats DCL", GAP_AT, "dclw", "dclw", at_x=0.5, baseline_x=1000.0)
    best = Question("DCLW (best σ) beats DCL", BEST_MARGIN, "dclw", baseline_x=1000.0, paper_key="best")
    a = build_answer(data, "sigma", "sigma", [at, best], pairs=(("dclw", "dclw", 1000.0),),
                     paper="dclw_sigma_sweep")
    v_at, v_best = a.verdicts
    paired = a.pairs["dclw − dclw@1000"][0.5]
    assert (v_at.estimate.lo, v_at.estimate.hi) == pytest.approx((paired.lo, paired.hi))
    assert v_best.estimate.estimate == pytest.approx(paired.estimate)  # σ = 0.5 is the best cell
    assert v_best.estimate.lo < paired.lo  # corrected for picking the best of three σ
    assert v_at.words == v_best.words is VerdictWord.SUPPORTS
    assert "(paper: +0.60 over sigma 0.5, 1000; it has no sigma 0.1, 1)" in v_at.line()
