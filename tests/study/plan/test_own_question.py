"""A question of one's own (``--compare``, ``--statistic``, ``--at``, ``--claim``) put to a study, and the generic
sweep (``studies/sweep.py``): the question each builds, one-line refusals before anything runs, and the verdict's
words for a claim with no paper behind it (pure: no Ray)."""

import importlib.util
import random
from pathlib import Path

import pytest

from dcl_core.config import ConfigError
from dcl_core.study.analysis.answer import Question, build_answer
from dcl_core.study.analysis.answer_output import answer_tags, figure_note, format_answer
from dcl_core.study.analysis.columns import SWEPT, x_column
from dcl_core.study.cli.options import args_of, build_parser
from dcl_core.study.cli.script import Script
from dcl_core.study.plan.questions import claim_text, series_names

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "docs" / "examples" / "my_losses.py"


def load(name):
    spec = importlib.util.spec_from_file_location(f"own_question_{name}", REPO / "studies" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def built(name, *argv, extra=()):
    """The validated spec a study's command line builds (Script.build: the path every study and `answer` take)."""
    module = load(name)
    args = args_of(build_parser("", name, tuple(module.PRESETS), extra).parse_args(list(argv)))
    return Script("", name, module.build_spec, tuple(module.PRESETS), extra=extra).build(args)


def test_compare_asks_the_studys_statistics_of_another_pair_as_your_claim():
    mine = f"{EXAMPLE}:PositiveWeighted"
    spec = built("batch_size_sweep", "--smoke", "--losses", f"{mine},dcl,infonce", "--compare", f"{mine},dcl")
    assert [q.statistic.name for q in spec.questions] == ["gap_at_smallest", "gap_slope"]  # the study's own two
    assert all(q.own and (q.better, q.base) == ("PositiveWeighted", "dcl") for q in spec.questions)
    assert spec.questions[0].claim == "PositiveWeighted beats dcl at the smallest batch"
    # the paper's claim was that DCL's gain shrinks: the retargeted slope keeps that sign and says so
    assert spec.questions[1].paper_sign == -1 and "shrinks" in spec.questions[1].claim
    assert spec.pairs == (("PositiveWeighted", "dcl"),)
    untouched = built("batch_size_sweep", "--smoke")
    assert not any(q.own for q in untouched.questions) and untouched.pairs is None


def test_statistic_at_and_claim_replace_the_question():
    spec = built("temperature_sweep", "--smoke", "--statistic", "gap_at", "--at", "0.5", "--claim", "DCL wins at 0.5")
    (q,) = spec.questions
    assert (q.statistic.name, q.at_x, q.claim, q.better, q.base, q.own) == (
        "gap_at", 0.5, "DCL wins at 0.5", "dcl", "infonce", True)
    (d,) = built("temperature_sweep", "--smoke", "--statistic", "std_difference", "--compare", "infonce,dcl",
                 "--effect-of-interest", "std_difference=2").questions
    assert d.claim == "infonce flatter across tau than dcl" and d.effect_of_interest == 2.0


@pytest.mark.parametrize(("argv", "message"), [
    (("--compare", "infonce,nope"), "'nope' is not a series of this study (its series: infonce, dcl"),
    (("--compare", "dcl,dcl"), "dcl against itself asks nothing"),
    (("--compare", "dcl"), "--compare takes two series, BETTER,BASE"),
    (("--statistic", "gap_at"), "--statistic gap_at needs --at, the tau to compare at (one of 0.1, 0.5)"),
    (("--statistic", "gap_at", "--at", "0.3"), "--at '0.3' is not a tau this study runs (it runs 0.1, 0.5)"),
    (("--at", "0.5"), "--at is the x of --statistic gap_at"),
    (("--claim", "a\x1b[2Jb"), "--claim must be one line"),
    (("--statistic", "gap_slope", "--effect-of-interest", "std_difference=1"), "is not a question of study"),
])
def test_a_question_the_study_cannot_answer_is_refused_in_one_line(argv, message):
    with pytest.raises(ConfigError, match=None) as info:
        built("temperature_sweep", "--smoke", *argv)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_claim_for_a_study_of_several_questions_needs_one_statistic():
    with pytest.raises(ConfigError, match="--claim states one claim and study batch_size_sweep asks 2 questions"):
        built("batch_size_sweep", "--smoke", "--claim", "mine is better")


def _rows(effect, seeds=12, xs=(16, 32, 64), noise=1.0, rng_seed=0):
    """Series ``mine`` ``effect`` points above ``dcl`` at every x, a per-seed offset both share."""
    rng = random.Random(rng_seed)
    out = []
    for s in range(seeds):
        offset = rng.gauss(0, 3)
        for x in xs:
            for name, shift in (("mine", effect), ("dcl", 0.0)):
                out.append({"series": name, "loss": name, "swept": float(x), "seed": s, "status": "ok",
                            "knn_top1": 50 + shift + offset + rng.gauss(0, noise), "q_mean": 0.9})
    return out


OWN = Question("mine beats dcl at the smallest value", "gap_at_smallest", "mine", "dcl", own=True)


@pytest.mark.parametrize(("effect", "delta", "said"), [
    (5.0, None, "supports the claim"),
    (-5.0, None, "contradicts the claim"),
    (0.0, 4.0, "rules out an effect of +4.00"),
    (0.0, None, "not resolved"),  # no δ given: nothing to rule out, and no paper to take one from
])
def test_a_claim_of_your_own_is_judged_in_its_own_words(effect, delta, said):
    q = Question(OWN.claim, OWN.statistic, "mine", "dcl", own=True, effect_of_interest=delta)
    answer = build_answer(_rows(effect), "swept", "value", [q])
    (v,) = answer.verdicts
    assert v.said == said and v.paper_value is None
    assert v.line().startswith(f"mine beats dcl at the smallest value: {said}")
    assert "(your claim, not the paper's" in v.line() and "paper:" not in v.line()
    assert figure_note(v).endswith(said)
    tags = answer_tags(answer)
    assert tags["verdict_0"] == said and tags["verdict"] == said
    last = format_answer(answer).split("\n")[-1]
    assert not any(w in last for w in ("supports the paper", "contradicts the paper", "the paper's size", "paper:"))


def test_the_papers_questions_keep_the_papers_words():
    q = Question("DCL beats InfoNCE at the smallest batch", "gap_at_smallest", "mine", "dcl")
    (v,) = build_answer(_rows(5.0), "swept", "value", [q]).verdicts
    assert v.said == "supports the paper" and "(paper: no number in the paper)" in v.line()


def test_claim_text_reads_right_for_each_statistic():
    assert claim_text("std_difference", "A", "B", "tau") == "A flatter across tau than B"
    assert claim_text("gap_at", "A", "B", "batch", 32) == "A beats B at batch 32"
    assert claim_text("gap_at_smallest", "A", "B", "batch", sign=-1) == "A trails B at the smallest batch"
    assert claim_text("gap_slope", "A", "B", "batch") == "A's gain over B grows as batch grows"
    assert claim_text("best_gap", "A", "B", "lr") == "tuned A beats tuned B"


# ---------------------------------------------------------------- the generic sweep (studies/sweep.py)

SWEEP = ("key", "values")


def test_the_sweep_runs_losses_by_values_by_seeds_and_asks_tuned_against_tuned():
    mine = f"{EXAMPLE}:PositiveWeighted"
    spec = built("sweep", "--smoke", "--key", "optim.weight_decay", "--values", "1e-3,0,1e-3", "--losses",
                 f"{mine},dcl", "--seeds", "2", extra=SWEEP)
    (grid,) = spec.grids
    assert grid["optim.weight_decay"].values == (0.0, 0.001) and grid["seed"].values == (0, 1)
    assert series_names(spec) == ["PositiveWeighted", "dcl"]
    (q,) = spec.questions
    assert (q.statistic.name, q.better, q.base, q.own) == ("best_gap", "PositiveWeighted", "dcl", True)
    assert x_column(spec.x_key) == SWEPT  # no results column shows weight decay: the sweep's own column does
    assert x_column("optim.batch_size") == "batch_size"  # a key a column shows keeps it
    (g,) = built("sweep", "--smoke", "--key", "optim.batch_size", "--values", "16,64", "--statistic", "gap_at",
                 "--at", "64", extra=SWEEP).questions
    assert g.at_x == 64 and g.claim == "dcl beats infonce at batch_size 64"


@pytest.mark.parametrize(("argv", "message"), [
    ((), "the sweep needs --key"),
    (("--key", "nope", "--values", "1,2"), "--key/--values: unknown config key 'nope'"),
    (("--key", "model.arch", "--values", "resnet18,resnet50"), "is not a number"),
    (("--key", "loss.temperature", "--values", "0.1,0.1"), "give 2 to 64 different values"),
    (("--key", "loss.temperature", "--values", "0.1,-1"), "--key/--values: loss.temperature"),
    (("--key", "loss.name", "--values", "dcl,infonce"), "sweep it with --losses"),
    (("--key", "optim.batch_size", "--values", "16,32", "--search", "optuna"), "drop --search optuna"),
])
def test_a_sweep_that_cannot_run_is_refused_in_one_line(argv, message):
    with pytest.raises(ConfigError) as info:
        built("sweep", "--smoke", *argv, extra=SWEEP)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_only_the_sweep_takes_key_and_values():
    with pytest.raises(SystemExit):
        build_parser("", "temperature_sweep").parse_args(["--key", "optim.epochs"])
    assert build_parser("", "sweep", extra=SWEEP).parse_args(["--key", "optim.epochs"]).key == "optim.epochs"


@pytest.mark.parametrize(("delta", "header"), [
    (None, "which a claim of your own has only if --effect-of-interest gives one"),
    (4.0, "the one --effect-of-interest gives"),
])
def test_the_verdict_header_says_where_the_effect_of_interest_came_from(delta, header):
    """A claim of your own without --effect-of-interest has none: the header must not say one was given."""
    q = Question(OWN.claim, OWN.statistic, "mine", "dcl", own=True, effect_of_interest=delta)
    text = " ".join(format_answer(build_answer(_rows(0.0), "swept", "value", [q])).split())
    assert header in text
    assert ("the one --effect-of-interest gives" in text) == (delta is not None)
