"""``--until-resolved`` without Ray: the round options' one-line errors, the design's planning and recording, and
the loop's stopping rules (resolved, the last look, the time cap) on outcomes given to it. The rounds through real
Ray, Tune and MLflow: tests/study/cli/test_studies_e2e.py."""

import pytest

from dcl_core.config import ConfigError, preset
from dcl_core.study.analysis import sequential
from dcl_core.study.analysis.sequential import GROUP_LOOKS, GroupSequential, Sequential
from dcl_core.study.cli.options import build_parser, request_of
from dcl_core.study.execution import rounds
from dcl_core.study.execution.results import StudyOutcome
from dcl_core.study.plan import design as designs
from dcl_core.study.plan.spec import StudySpec
from search_spaces import Grid


def request(*argv):
    return request_of(build_parser("doc", "temperature_sweep").parse_args(list(argv)))


@pytest.mark.parametrize(("argv", "needle"), [
    (["--max-seeds", "9"], "--max-seeds caps --until-resolved"),
    (["--max-minutes", "9"], "--max-minutes caps --until-resolved"),
    (["--until-resolved"], "needs a cap"),
    (["--until-resolved", "--max-minutes", "0"], "--max-minutes must be in"),
    (["--until-resolved", "--max-minutes", "nan"], "--max-minutes must be in"),
    (["--until-resolved", "--max-seeds", "9", "--seeds-per-round", "0"], "--seeds-per-round must be >= 1"),
    (["--until-resolved", "--max-seeds", "9", "--search", "optuna"], "an Optuna search has no seed grid"),
    (["--until-resolved", "--max-seeds", "9", "--reanalyze"], "--reanalyze trains nothing"),
])
def test_round_options_are_checked_in_one_line(argv, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        request(*argv).check()


def spec_with(seeds):
    """A grid study of ``seeds`` seeds per cell (what plan() reads of it: its seed grid)."""
    grid = {"loss.name": Grid(("dcl",)), "seed": Grid(tuple(range(seeds)))}
    return StudySpec(name="s", base=preset("smoke"), grid=grid, x_key="loss.temperature", x_label="tau")


def test_a_design_is_planned_from_the_caps_and_a_recorded_one_is_kept():
    def plan(r, seeds=5, per_seed=None, design=None):
        a = r.args
        return designs.plan(spec_with(seeds), design, a.max_seeds, a.max_minutes, a.seeds_per_round, lambda: per_seed)

    assert plan(request("--until-resolved", "--max-seeds", "12")) == GroupSequential(5, 12)
    assert plan(request("--until-resolved", "--max-seeds", "12")).looks == (5, 6, 8, 9, 11, 12)
    assert plan(request("--until-resolved", "--max-seeds", "12", "--seeds-per-round", "3")) == GroupSequential(
        5, 12, step=3)
    # --max-minutes alone: as many seeds as the estimate fits, less each round's overhead
    per = 60.0
    overhead = designs.ROUND_OVERHEAD_S * (GROUP_LOOKS - 1)
    assert plan(request("--until-resolved", "--max-minutes", "30"), per_seed=per) == GroupSequential(
        5, (30 * 60 - int(overhead)) // 60)
    assert plan(request("--until-resolved", "--max-minutes", "1"), per_seed=per) == GroupSequential(5, 5)
    with_rounds = request("--until-resolved", "--max-minutes", "30", "--seeds-per-round", "1")
    assert plan(with_rounds, per_seed=per - designs.ROUND_OVERHEAD_S) == GroupSequential(5, 30, step=1)
    with pytest.raises(ConfigError, match="one trial does not fit"):
        plan(request("--until-resolved", "--max-minutes", "30"))
    with pytest.raises(ConfigError, match="below the first look"):
        plan(request("--until-resolved", "--max-seeds", "4"))
    with pytest.raises(ConfigError, match="--seeds 2 or more"):
        plan(request("--until-resolved", "--max-seeds", "4"), seeds=1)
    recorded = {"first": 3, "max_seeds": 20, "step": 2}
    resumed = request("--until-resolved", "--max-minutes", "5")
    assert plan(resumed, seeds=7, design=recorded) == Sequential(3, 20, 2)  # the recorded design, whatever the cap
    with pytest.raises(ConfigError, match="--max-seeds 25 is refused"):
        plan(request("--until-resolved", "--max-seeds", "25"), seeds=7, design=recorded)


def test_the_recorded_design_round_trips_and_bounds_later_seeds():
    d = Sequential(3, 20, 2)  # a study recorded before the group-sequential design keeps its own
    assert designs.from_record(designs.to_record(d)) == d and designs.from_record(None) is None
    for g in (GroupSequential(3, 20), GroupSequential(3, 20, step=2), GroupSequential(3, 20, 4)):
        assert designs.from_record(designs.to_record(g)) == g
    assert designs.from_record({"first": 3, "max_seeds": 20, "step": 2}) == Sequential(3, 20, 2)
    # recorded before the Wang-Tsiatis boundary: Pocock's, 4% on the paper's side, as it ran
    earlier = designs.from_record({"first": 5, "max_seeds": 15, "looks": 5, "step": None})
    assert earlier == GroupSequential(5, 15, 5, shape=sequential.POCOCK_SHAPE,
                                      paper_error=sequential.EARLIER_PAPER_SIDE_ERROR)
    assert earlier.looks == (5, 8, 10, 13, 15) and earlier.errors == (0.04, 0.01, 0.05)  # exactly: the tails it ran
    assert designs.to_record(GroupSequential(3, 20))["shape"] == sequential.BOUNDARY_SHAPE
    # what the earlier code printed for the temperature study recorded under it (docs/results.md), to the character
    assert earlier.describe() == (
        "looks at 5, 8, 10, 13, 15 seeds per cell; each look's bounds at a nominal one-sided 1.4% (paper's side), "
        "0.29% (other side) and 1.8% (futility, δ's side), so that all 5 looks together end ≤ 5% of null studies "
        "resolved and ≤ 5% of studies at δ ruling δ out")
    for damaged in ({"first": 3}, {"first": 9, "max_seeds": 4, "step": 1}, "3-20", {"first": 3, "x": 1},
                    {"first": 3, "max_seeds": 20, "looks": 0}, {"first": 3, "max_seeds": 20, "looks": True},
                    {"first": 3, "max_seeds": 20, "looks": 10**6}, {"max_seeds": 20, "looks": 5},
                    {"first": 3, "max_seeds": 20, "looks": 5, "shape": 0.9},
                    {"first": 3, "max_seeds": 20, "looks": 5, "shape": "pocock"},
                    {"first": 3, "max_seeds": 20, "looks": 5, "paper_side": float("nan")},
                    {"first": 3, "max_seeds": 20, "looks": 5, "paper_side": 0.2}):
        with pytest.raises(ConfigError, match=r"recorded sequential design .* is damaged"):
            designs.from_record(damaged)
    designs.check_within(d, 20)
    designs.check_within(None, 500)
    with pytest.raises(ConfigError, match="void its 5% guarantee"):
        designs.check_within(d, 21)


def outcome(resolved: bool, n: int) -> StudyOutcome:
    return StudyOutcome([], "", {}, verdicts=[f"verdict at {n}"], resolved=resolved,
                        power=[] if resolved else [f"≈{n + 9} seeds"])


def loop(first_resolved_at=None, design=None, first_seconds=1.0, max_minutes=None, per_seed=0.0):
    """The loop on given outcomes and a clock that a round of k seeds advances by k * per_seed seconds."""
    design = design or Sequential(3, 6)
    ran, said, now = [], [], [first_seconds]

    def next_round(n):
        now[0] += (n - (ran[-1] if ran else 3)) * per_seed
        ran.append(n)
        return outcome(first_resolved_at is not None and n >= first_resolved_at, n)

    _, why = rounds.until_resolved(outcome(first_resolved_at == 3, 3), design, 3, first_seconds, max_minutes,
                                   next_round, said.append, clock=lambda: now[0])
    return ran, said, why


def test_the_loop_stops_at_the_first_resolved_look():
    ran, said, why = loop(first_resolved_at=5)
    assert ran == [4, 5] and why.startswith("stopped: every question settled at 5 seeds per cell (look 3)")
    assert [line for line in said if line.startswith("look")] == [
        f"look {i} of 4: {n} seeds per cell, 0.0 min spent" for i, n in ((1, 3), (2, 4), (3, 5))]
    assert "  verdict at 4" in said and "  ≈13 seeds" in said
    assert loop(first_resolved_at=3)[0] == []  # resolved at the first look: no round


def test_the_loop_stops_at_the_last_look_and_rounds_never_pass_it():
    ran, _, why = loop(design=Sequential(3, 8, step=2))
    assert ran == [5, 7, 8] and why.startswith("stopped: not resolved at the last look (8 seeds per cell")
    ran, said, why = loop(design=GroupSequential(3, 13))  # rounds go from look to look: 3, 5, 7, 9, 11, 13
    assert ran == [5, 7, 9, 11, 13] and why.startswith("stopped: not resolved at the last look (13 seeds per cell")
    assert "look 2 of 6: 5 seeds per cell, 0.0 min spent" in said


def test_the_time_cap_starts_no_round_that_would_end_after_it():
    # the first round's 3 seeds took 60 s: a round of one seed takes ~20 s at that pace
    ran, _, why = loop(first_seconds=60.0, max_minutes=1.2, per_seed=20.0)  # 60 spent + 20 > 72 s
    assert ran == [] and "would end after --max-minutes 1.2 (1.0 min spent)" in why
    ran, said, why = loop(first_seconds=60.0, max_minutes=1.4, per_seed=20.0)  # 80 s fits in 84, 100 does not
    assert ran == [4] and "look 2 of 4: 4 seeds per cell, 1.3 min of 1.4 spent" in said



def test_the_resume_line_of_an_interrupted_round_continues_with_the_seeds_the_rounds_added(tmp_path, capsys):
    """Ctrl-C in a round prints the original command with --resume, and so its first --seeds; the record holds
    the seeds the rounds have since added (3 here), which the resume continues with under the recorded design,
    instead of refusing --seeds 2 as dropping one (found by interrupting a real --until-resolved run)."""
    import importlib.util
    import json
    from pathlib import Path

    from dcl_core.study.cli.script import main
    from dcl_core.study.plan.storage import OPTIONS_FILE, summary_dir

    out = tmp_path / "out"
    record = summary_dir(out, "temperature_sweep") / OPTIONS_FILE
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"spec": {"base": {}}, "seed_rounds": [[0, 1], [2]], "command": {
        "script": "temperature_sweep", "seeds": 3, "design": {"first": 2, "max_seeds": 4, "step": 1}}}))
    path = Path(__file__).resolve().parents[3] / "studies" / "temperature_sweep.py"
    spec = importlib.util.spec_from_file_location("study_temperature_sweep", path)
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    code = main(study.__doc__, "temperature_sweep", study.build_spec, argv=[
        "--smoke", "--seeds", "2", "--until-resolved", "--max-seeds", "4", "--output-dir", str(out), "--resume",
        "--dry-run"])
    stdout = capsys.readouterr().out
    assert code == 0 and "looks at 2, 3, 4 seeds per cell" in stdout
    assert stdout.count("seeds 0-2:") == 4  # every cell at the 3 seeds it has, not the first --seeds 2
