"""dcl_core.study.analysis.measures: the registry of question statistics (one object per name, unknown names
refused) and, for every registered statistic, that the cells it declares it reads are exactly the cells whose
removal or change changes its value (what stats.used_cells used to find by nudging each mean)."""

import dataclasses
import math
import random

import pytest

from dcl_core.study.analysis.answer import Question
from dcl_core.study.analysis.measures import (
    BEST_GAP,
    BEST_MARGIN,
    GAP_AT,
    GAP_AT_SMALLEST,
    GAP_SLOPE,
    STATISTICS,
    STD_DIFFERENCE,
    Best,
    Kind,
    Smooth,
    of_kind,
    statistic,
)

NAMES = ("std_difference", "gap_at", "gap_at_smallest", "gap_slope", "best_margin", "best_gap")


def test_every_name_maps_to_one_object_and_an_unknown_name_is_refused():
    assert tuple(STATISTICS) == NAMES  # the strings records, MLflow metrics and re-analysis know
    assert all(statistic(name) is s and s.name == name == str(s) for name, s in STATISTICS.items())
    assert len({id(s) for s in STATISTICS.values()}) == len(NAMES)
    assert statistic(GAP_SLOPE) is GAP_SLOPE
    assert Question("gap", "gap_at_smallest", "dcl", "infonce").statistic is GAP_AT_SMALLEST
    assert Question("gap", GAP_AT_SMALLEST, "dcl", "infonce") == Question("gap", "gap_at_smallest", "dcl", "infonce")
    with pytest.raises(ValueError, match="unknown statistic 'gap_at_largest'"):
        statistic("gap_at_largest")
    with pytest.raises(ValueError, match="unknown statistic"):
        Question("gap", "gap_at_largest", "dcl", "infonce")


def test_kinds():
    assert [s.name for s in of_kind(Kind.SMOOTH)] == ["std_difference", "gap_at", "gap_at_smallest", "gap_slope"]
    assert [s.name for s in of_kind(Kind.BEST)] == ["best_margin", "best_gap"]
    assert all(isinstance(s, Smooth) for s in of_kind(Kind.SMOOTH))
    assert all(isinstance(s, Best) for s in of_kind(Kind.BEST))


# Questions over generic means (irregular x, no ties, cells missing in one series or the other), at least one per
# registered statistic, with and without a claimed range.
CASES = (
    Question("flatter", STD_DIFFERENCE, "dcl", "infonce"),
    Question("flatter, τ ≥ 0.2", STD_DIFFERENCE, "dcl", "infonce", x_min=0.2),
    Question("at", GAP_AT, "dcl", "infonce", at_x=0.3),
    Question("at vs baseline", GAP_AT, "dclw", "dclw", at_x=0.13, baseline_x=1.7),
    Question("at vs other series", GAP_AT, "dcl", "infonce", at_x=0.3, baseline_x=1.7),
    Question("smallest", GAP_AT_SMALLEST, "dcl", "infonce"),
    Question("smallest, τ ≥ 0.2", GAP_AT_SMALLEST, "dcl", "infonce", x_min=0.2),
    Question("slope", GAP_SLOPE, "dcl", "infonce", paper_sign=-1),
    Question("slope, τ ≥ 0.2", GAP_SLOPE, "dcl", "infonce", x_min=0.2),
    Question("best σ", BEST_MARGIN, "dclw", baseline_x=1.7),
    Question("best σ, σ ≥ 0.2", BEST_MARGIN, "dclw", baseline_x=1.7, x_min=0.2),
    Question("tuned", BEST_GAP, "dcl", "infonce"),
    Question("tuned, τ ≥ 0.2", BEST_GAP, "dcl", "infonce", x_min=0.2),
)


def generic_means(rng_seed: int = 0) -> dict[str, dict[float, float]]:
    """Means with no coincidences: DCL lacks τ 0.55, InfoNCE has τ 0.07 DCL lacks, plus series no question of
    the pair reads."""
    rng = random.Random(rng_seed)
    xs = (0.07, 0.13, 0.3, 0.55, 1.0, 1.7)

    def curve(skip=()):
        return {x: 70 + 10 * rng.random() for x in xs if x not in skip}

    return {"dcl": curve(skip=(0.07, 0.55)), "infonce": curve(), "dclw": curve(), "other": curve()}


def _differs(a: float, b: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) != math.isnan(b)
    return abs(a - b) > 1e-9


def changing_cells(q: Question, means) -> set:
    """The cells whose removal, ±1 change or raise by 100 (enough to become any series' best) changes the
    statistic."""
    f = q.function()
    point = f(means)
    out = set()
    for s, by_x in means.items():
        for x in by_x:
            variants = [{**means, s: {y: m for y, m in by_x.items() if y != x}}]
            variants += [{**means, s: {**by_x, x: by_x[x] + d}} for d in (1.0, -1.0, 100.0)]
            if any(_differs(f(v), point) for v in variants):
                out.add((s, x))
    return out


def test_the_cases_cover_every_registered_statistic():
    assert {q.statistic.name for q in CASES} == set(STATISTICS)


@pytest.mark.parametrize("q", CASES, ids=lambda q: q.claim)
@pytest.mark.parametrize("rng_seed", range(3))
def test_declared_inputs_are_the_cells_that_change_the_statistic(q, rng_seed):
    means = generic_means(rng_seed)
    assert math.isfinite(q.function()(means))
    declared = q.inputs(means)
    assert declared == changing_cells(q, means)
    assert declared and all(q.in_range(x) for _, x in declared)


def test_the_property_catches_a_wrongly_declared_input():
    """Declaring the largest common x instead of the smallest, or forgetting the base series, is caught."""
    means = generic_means()
    largest = dataclasses.replace(GAP_AT_SMALLEST, reads=lambda q, m: {
        (s, max(set(m[q.better]) & set(m[q.base]))) for s in (q.better, q.base)})
    one_side = dataclasses.replace(GAP_SLOPE, reads=lambda q, m: {(q.better, x) for x in m[q.better]})
    for wrong in (largest, one_side):
        q = Question("wrong", wrong, "dcl", "infonce")
        assert q.inputs(means) != changing_cells(q, means)


def test_a_seed_missing_a_declared_input_is_left_out():
    """per_seed keeps the seeds that have every declared input, and only those (a cell outside them may lack a
    seed)."""
    from dcl_core.study.analysis.intervals import per_seed

    q = Question("smallest", GAP_AT_SMALLEST, "dcl", "infonce")
    data = {s: {x: {seed: m + seed for seed in range(4)} for x, m in by_x.items()}
            for s, by_x in generic_means().items()}
    del data["infonce"][0.13][1]  # the smallest x both have: seed 1 lacks an input
    del data["infonce"][1.7][2]  # not an input: seed 2 stays
    assert sorted(per_seed(data, q.function(), q.inputs)) == [0, 2, 3]


def _moves(q: Question, means, h: float) -> list[float]:
    """How far the statistic moves at every corner of the box ±h around the cells it reads, and at random points
    inside it: what a table rounded to ±h a cell leaves open."""
    f, point = q.function(), q.function()(means)
    cells = sorted(q.inputs(means), key=repr)
    rng = random.Random(0)
    shifts = [[h * (1 if bits >> i & 1 else -1) for i in range(len(cells))] for bits in range(2 ** len(cells))]
    shifts += [[rng.uniform(-h, h) for _ in cells] for _ in range(200)]
    out = []
    for shift in shifts:
        moved = {s: dict(by_x) for s, by_x in means.items()}
        for (s, x), d in zip(cells, shift, strict=True):
            moved[s][x] += d
        out.append(abs(f(moved) - point))
    return out


@pytest.mark.parametrize("q", CASES, ids=lambda q: q.claim)
@pytest.mark.parametrize("rng_seed", range(3))
def test_the_lipschitz_constant_bounds_what_rounding_the_cells_can_do_and_is_reached(q, rng_seed):
    """|f(m + e) − f(m)| ≤ L·h for every change of at most h a cell; the linear and best-of statistics reach it at
    a corner, Δstd (a difference of two stds, each moving by at most the std of the change) comes within a
    factor 2 of it."""
    means, h = generic_means(rng_seed), 0.05
    bound = q.statistic.lipschitz(q, q._restrict(means)) * h
    moves = _moves(q, means, h)
    assert max(moves) <= bound + 1e-9
    reached = 0.5 if q.statistic is STD_DIFFERENCE else 1.0 - 1e-9
    assert max(moves) >= reached * bound


def test_the_lipschitz_constants_by_hand():
    """Plain transcriptions: a gap reads two cells (2); a slope over log2 x = 0, 1, 2 has weights −1/2, 0, +1/2 in
    each series (2 · 1 = 2); over 4 evenly spaced x, weights ∓0.3, ∓0.1 (2 · 0.8 = 1.6); Δstd over 4 x:
    2·sqrt(4/3), over 3 x: 2·sqrt((3 − 1/3)/2), each series' term over its own finite means; a best-of: 2."""
    means = {"dcl": {32: 1.0, 64: 2.0, 128: 4.0, 256: 3.0}, "infonce": {32: 0.5, 64: 1.0, 128: 2.5, 256: 2.0}}
    three = {s: {x: v for x, v in by_x.items() if x < 256} for s, by_x in means.items()}
    slope, flat = Question("s", GAP_SLOPE, "dcl", "infonce"), Question("f", STD_DIFFERENCE, "dcl", "infonce")
    assert GAP_SLOPE.lipschitz(slope, three) == pytest.approx(2.0)
    assert GAP_SLOPE.lipschitz(slope, means) == pytest.approx(1.6)
    assert STD_DIFFERENCE.lipschitz(flat, means) == pytest.approx(2 * math.sqrt(4 / 3))
    assert STD_DIFFERENCE.lipschitz(flat, three) == pytest.approx(2 * math.sqrt((3 - 1 / 3) / 2))
    assert GAP_AT_SMALLEST.lipschitz(slope, means) == GAP_AT.lipschitz(Question("a", GAP_AT, "dcl", "infonce",
                                                                                 at_x=64), means) == 2.0
    assert BEST_GAP.lipschitz(slope, means) == BEST_MARGIN.lipschitz(Question("m", BEST_MARGIN, "dcl",
                                                                             baseline_x=32), means) == 2.0
    gapped = {"dcl": {**means["dcl"], 256: math.nan}, "infonce": means["infonce"]}  # std_across drops a NaN mean
    assert STD_DIFFERENCE.lipschitz(flat, gapped) == pytest.approx(math.sqrt((3 - 1 / 3) / 2) + math.sqrt(4 / 3))
    one = {s: {32: v[32]} for s, v in means.items()}
    assert math.isnan(GAP_SLOPE.lipschitz(slope, one)) and math.isnan(STD_DIFFERENCE.lipschitz(flat, one))


def test_the_lipschitz_property_catches_a_bound_too_small():
    """A slope's bound without its factor 2 (one series' weights only) is caught."""
    half = dataclasses.replace(GAP_SLOPE, lipschitz_of=lambda q, m: GAP_SLOPE.lipschitz(q, m) / 2)
    q = Question("wrong", half, "dcl", "infonce")
    means, h = generic_means(), 0.05
    assert max(_moves(q, means, h)) > half.lipschitz(q, q._restrict(means)) * h
