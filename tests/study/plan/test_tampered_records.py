"""A tampered study record gives one line naming the file and the field, never a silently different answer (issue 46,
item 8). In a finished ``--seeds 2 --until-resolved --max-seeds 4`` smoke study, ``command.design.first`` 2 -> 4
flipped the verdict from "not resolved" to "rules out the paper's size", and ``max_seeds`` 200 printed "no interval
(its 4 seeds gave identical values)", which was false; the MI toy's ``mi_estimate`` inf or NaN read "not
measurable" and 1e308 printed a slope of 300 digits.

The temperature study below is that smoke study's record and results as it wrote them (its 16 trials' kNN values;
design, seed rounds and seeds from its ``study_options.json``); the MI toy's table is the smoke toy's own runs
(``_run_one``, without Ray). The real ``python -m dcl_core.study answer`` entry point, in-process, real MLflow."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mlflow.tracking import MlflowClient

from dcl_core.config import ConfigError, preset
from dcl_core.study.analysis.answer import Question, build_answer
from dcl_core.study.analysis.measures import STD_DIFFERENCE
from dcl_core.study.analysis.sequential import GroupSequential
from dcl_core.study.analysis.tables import read_table
from dcl_core.study.cli.answer_command import answer_main as answer
from dcl_core.study.plan import design as rounds
from dcl_core.study.plan import signing
from dcl_core.study.plan.record import write_record
from dcl_core.study.plan.spec import StudySpec
from dcl_core.study.plan.storage import default_tracking_uri, summary_dir
from dcl_core.study.plan.writers import write_rows, write_table
from search_spaces import Grid

STUDY = "temperature_sweep"
# kNN top-1 of the real smoke study's trials: (loss, τ) -> seeds 0-3 (run with --seeds 2 --until-resolved
# --max-seeds 4: looks at 2, 3 and 4 seeds per cell, not resolved at the last)
KNN = {("dcl", 0.1): (10.0, 17.5, 12.5, 17.5), ("dcl", 0.5): (12.5, 10.0, 17.5, 25.0),
       ("infonce", 0.1): (7.5, 10.0, 12.5, 20.0), ("infonce", 0.5): (7.5, 10.0, 15.0, 27.5)}
DESIGN = {"first": 2, "max_seeds": 4, "looks": 6, "step": None, "shape": 0.2, "paper_side": 0.045}
SEED_ROUNDS = [[0, 1], [2], [3]]


def _study(root: Path) -> Path:
    """The smoke study's summary folder as it recorded it."""
    out = root / "out"
    d = out / "summary" / STUDY
    rows = [{"trial_id": f"a75a2_{i:05d}", "status": "ok", "series": loss, "loss": loss, "temperature": tau,
             "seed": seed, "knn_top1": knn}
            for i, ((loss, tau), values) in enumerate(KNN.items()) for seed, knn in enumerate(values)]
    write_table(rows, d)
    command = {"script": STUDY, "preset": "smoke", "search": "grid", "num_samples": None, "asha": False,
               "losses": None, "seeds": 4, "data_root": None, "set": [], "name": STUDY, "design": DESIGN,
               "effect_of_interest": []}
    options = {"output_dir": str(out.resolve()), "tracking_uri": default_tracking_uri(out), "command": command,
               "seed_rounds": SEED_ROUNDS}
    (d / "study_options.json").write_text(json.dumps(options, indent=1))
    return out


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own cache folder, where the signing key lives (never the user's)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


def _signed(out: Path) -> Path:
    """The study's record as a study writes it: signed with this user's key (study/plan/record.py)."""
    path = out / "summary" / STUDY / "study_options.json"
    write_record(path, json.loads(path.read_text()))
    return path


def _tamper(out: Path, **design: object) -> Path:
    path = out / "summary" / STUDY / "study_options.json"
    options = json.loads(path.read_text())
    options["command"]["design"].update(design)
    path.write_text(json.dumps(options, indent=1))
    return path


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert answer(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    return line


@pytest.mark.slow  # a sequential design planned by simulation: ~5 s
def test_the_untampered_study_is_not_resolved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _study(tmp_path)
    assert answer([str(out), "-q"]) == 0, capsys.readouterr().err
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("DCL flatter across τ than InfoNCE: not resolved — Δstd -2.21, 95% CI [-5.59, +5.30]")


@pytest.mark.parametrize(("design", "off"), [({"first": 4}, "2 seeds per cell is not a look"),
                                             ({"max_seeds": 200}, "3 seeds per cell is not a look"),
                                             ({"first": 3}, "2 seeds per cell is not a look"),
                                             ({"max_seeds": 3, "first": 2}, "4 seeds per cell is not a look")])
def test_a_design_its_rounds_did_not_run_under_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                          design: dict, off: str) -> None:
    """Before: first 4 answered "rules out the paper's size" (one look at 4 seeds: the fixed design's bounds),
    max_seeds 200 "no interval (its 4 seeds gave identical values)" (the first of 6 looks up to 200 seeds)."""
    out = _study(tmp_path)
    path = _tamper(out, **design)
    line = _one_line(capsys, [str(out), "-q"])
    assert line.startswith(f"error: {path}'s command.design (looks at ") and off in line, line
    assert "seed_rounds: 2, 3, 4 seeds per cell" in line


def test_a_design_without_its_seed_rounds_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = _study(tmp_path)
    path = out / "summary" / STUDY / "study_options.json"
    options = json.loads(path.read_text())
    del options["seed_rounds"]
    path.write_text(json.dumps(options))
    assert "records a sequential design (looks at 2, 3, 4 seeds per cell) but not the seed rounds it ran" in \
        _one_line(capsys, [str(out), "-q"])


def _resume_dry_run(out: Path) -> int:
    """``studies/temperature_sweep.py --smoke --seeds 2 --until-resolved --max-seeds 4 --resume --dry-run`` on
    ``out``, in this process: the exit code."""
    import importlib.util

    from dcl_core.study.cli.script import main

    path = Path(__file__).resolve().parents[3] / "studies" / "temperature_sweep.py"
    spec = importlib.util.spec_from_file_location("study_temperature_sweep", path)
    assert spec is not None and spec.loader is not None
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    return main(study.__doc__, STUDY, study.build_spec, argv=[
        "--smoke", "--seeds", "2", "--until-resolved", "--max-seeds", "4", "--output-dir", str(out), "--resume",
        "--dry-run"])


def test_resume_refuses_the_tampered_design_before_anything_runs(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = _study(tmp_path)
    _tamper(out, first=4)
    code = _resume_dry_run(out)
    err = capsys.readouterr().err
    assert code == 2 and "is not the design its seed rounds ran under" in err and "Traceback" not in err


# Issue 61, item 9: edits that keep the record consistent passed every check above and changed the answer (first
# 2 -> 3 with the rounds merged to match; a design.shape within [0, 0.5]); a record the study signed is now read
# only as it was signed.
CONSISTENT_EDITS = {
    "first look and rounds": lambda o: (o["command"]["design"].update(first=3), o.update(seed_rounds=[[0, 1, 2], [3]])),
    "boundary shape": lambda o: o["command"]["design"].update(shape=0.5),
    "signature removed": lambda o: (o.pop("signature"), o["command"]["design"].update(first=3),
                                    o.update(seed_rounds=[[0, 1, 2], [3]])),
    "signature of the edit with another key": lambda o: o.update(signing.signed_json(
        {**o, "seed_rounds": [[0, 1, 2], [3]], "command": {**o["command"], "design": {**DESIGN, "first": 3}}},
        "study record temperature_sweep")),
}


@pytest.mark.parametrize("edit", list(CONSISTENT_EDITS))
def test_a_consistently_edited_record_the_study_signed_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   edit: str) -> None:
    """Before: answered exit 0 with intervals the study's looks never spent (first 3: 95% CI [-5.36, +5.03] for
    [-5.59, +5.30]; shape 0.5: [-6.14, +7.08])."""
    out = _study(tmp_path)
    path = _signed(out)
    assert answer([str(out), "-q"]) == 0, capsys.readouterr().err  # as the study signed it: answered
    capsys.readouterr()
    options = json.loads(path.read_text())
    if edit == "signature of the edit with another key":
        signing.key_path().rename(signing.key_path().with_name("mine"))  # the edit is signed with a key of its own
        CONSISTENT_EDITS[edit](options)
        signing.key_path().unlink()
        signing.key_path().with_name("mine").rename(signing.key_path())
    else:
        CONSISTENT_EDITS[edit](options)
    path.write_text(json.dumps(options, indent=1))
    line = _one_line(capsys, [str(out), "-q"])
    assert line.startswith(f"error: {STUDY}: {path} was changed since the study wrote it"), line
    assert "put back the file the study wrote" in line


def test_a_resume_refuses_a_changed_record_before_anything_runs(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = _study(tmp_path)
    path = _signed(out)
    options = json.loads(path.read_text())
    CONSISTENT_EDITS["boundary shape"](options)
    path.write_text(json.dumps(options, indent=1))
    code = _resume_dry_run(out)
    err = capsys.readouterr().err
    assert code == 2 and f"error: {path} was changed since the study wrote it" in err and "Traceback" not in err


@pytest.mark.slow  # a sequential design planned by simulation: ~5 s
@pytest.mark.parametrize("why", ["from before records were signed", "no private key"])
def test_a_record_no_key_of_this_user_signed_is_read_as_before(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                why: str) -> None:
    """A record from before signing existed, from another user or machine, or read where no key can be kept: read
    as before, every value checked (the tests above), and answered."""
    out = _study(tmp_path)  # written by hand, unsigned
    if why == "no private key":
        signing.key(create=True)
        signing.key_path().chmod(0o644)  # others may read it: not a key
    assert answer([str(out), "-q"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("DCL flatter across τ than InfoNCE: not resolved — Δstd -2.21, 95% CI [-5.59, +5.30]")


# ----------------------------------------------------------------------- the summary run, found by its record

def _summary_and_trial(out: Path) -> tuple[MlflowClient, str, str]:
    """The study answered once (its summary run, recorded), then a trial's run as a study's tracker makes one."""
    from dcl_core.study.tracking import StudyTracker

    uri = default_tracking_uri(out)
    tracker = StudyTracker(uri, STUDY, artifact_root=out / "mlartifacts", journal_dir=summary_dir(out, STUDY)).open()
    trial = tracker.trial_run("a75a2_00000", "dcl_t0.1_a75a2_00000", {}, {"loss.name": "dcl"})
    tracker.end_run(trial)
    assert tracker.parent_run_id is not None
    return MlflowClient(uri), tracker.parent_run_id, trial


def test_the_summary_run_is_found_by_the_record_the_study_signed_not_by_its_tag(tmp_path: Path) -> None:
    from dcl_core.study.tracking import StudyTracker, summary_run

    out = tmp_path / "out"
    folder = summary_dir(out, STUDY)
    uri = default_tracking_uri(out)
    first = StudyTracker(uri, STUDY, artifact_root=out / "mlartifacts", journal_dir=folder).open()
    trial = first.trial_run("t1", "trial", {}, {"a": "1"})
    with sqlite3.connect(out / "mlflow.db") as db:  # the trial's run tagged as the summary run
        db.execute("insert into tags(key,value,run_uuid) values('dcl.summary','true',?)", (trial,))
    again = StudyTracker(uri, STUDY, artifact_root=out / "mlartifacts", journal_dir=folder).open()
    assert again.parent_run_id == first.parent_run_id != trial
    assert summary_run.recorded(folder) == [first.parent_run_id]
    # A record naming another run as it was not signed, or another study's record, is not followed.
    record = folder / summary_run.RECORD
    data = json.loads(record.read_text())
    record.write_text(json.dumps({**data, "runs": [trial]}))
    assert summary_run.recorded(folder) == []
    summary_run.record(summary_dir(out, "other"), trial)
    record.write_text((summary_dir(out, "other") / summary_run.RECORD).read_text())
    assert summary_run.recorded(folder) == []


@pytest.mark.slow  # two answers of a sequential design planned by simulation: ~10 s
@pytest.mark.parametrize("forgery", ["tag in the store", "record names the trial", "record removed"])
def test_a_forged_summary_tag_or_record_never_puts_the_answer_on_a_trial(tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture[str],
                                                                        forgery: str) -> None:
    """Issue 61, item 4: ``insert into tags(key,value,run_uuid) values('dcl.summary','true','<trial>')`` had the
    next ``answer`` write the verdict, the description and every summary metric onto that trial."""
    out = _study(tmp_path)
    _signed(out)
    assert answer([str(out), "-q"]) == 0, capsys.readouterr().err
    client, summary, trial = _summary_and_trial(out)
    record = summary_dir(out, STUDY) / "summary_run.json"
    if forgery == "tag in the store":
        with sqlite3.connect(out / "mlflow.db") as db:
            db.execute("insert into tags(key,value,run_uuid) values('dcl.summary','true',?)", (trial,))
    elif forgery == "record names the trial":
        data = json.loads(record.read_text())
        data["runs"] = [trial]
        record.write_text(json.dumps(data))
    else:
        record.unlink()
    assert answer([str(out), "-q"]) == 0, capsys.readouterr().err
    tags, metrics = client.get_run(trial).data.tags, client.get_run(trial).data.metrics
    assert "mlflow.note.content" not in tags and not metrics, (tags, metrics)
    answered = client.get_run(summary) if forgery == "tag in the store" else None
    if answered is None:  # a record not followed: the answer is on a new summary run, recorded
        (new,) = json.loads(record.read_text())["runs"][-1:]
        assert new not in (summary, trial)
        answered = client.get_run(new)
    assert answered.data.tags["mlflow.note.content"].startswith("Verdict: not resolved")


@pytest.mark.slow  # two answers of a sequential design planned by simulation: ~10 s
def test_a_forged_figure_tag_never_deletes_a_trial_s_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The answer replaces the study's figure run (tag ``dcl.figure``): the same tag written onto a trial's run in
    the store must not have the next ``answer`` delete that trial's run."""
    out = _study(tmp_path)
    _signed(out)
    assert answer([str(out), "-q"]) == 0, capsys.readouterr().err
    client, _, trial = _summary_and_trial(out)
    with sqlite3.connect(out / "mlflow.db") as db:
        db.execute("insert into tags(key,value,run_uuid) values('dcl.figure','true',?)", (trial,))
    assert answer([str(out), "-q"]) == 0, capsys.readouterr().err
    assert client.get_run(trial).info.lifecycle_stage == "active"


@pytest.mark.slow  # a sequential design planned by simulation: ~5 s
def test_a_look_too_strict_for_a_finite_interval_does_not_claim_identical_values() -> None:
    """A design's first look at a few seeds with its last far away needs a t quantile beyond float precision (the
    max_seeds 200 tampering, or a real --max-seeds 200 study at its first look): said as such."""
    rows = [{"series": loss, "loss": loss, "temperature": tau, "seed": s, "status": "ok", "knn_top1": v}
            for (loss, tau), values in KNN.items() for s, v in enumerate(values)]
    question = Question("DCL flatter across τ than InfoNCE", STD_DIFFERENCE, "dcl", "infonce", label="Δstd")
    (v,) = build_answer(rows, "temperature", "tau", [question], design=GroupSequential(2, 200)).verdicts
    assert "identical values" not in v.line() and "identical values" not in (v.power_line() or "")
    assert "no finite interval at this look" in v.line()
    assert "too strict for a finite interval" in (v.power_line() or "")


def _spec(seeds: int) -> StudySpec:
    return StudySpec(name="s", base=preset("smoke"), grid={"loss.name": Grid(("dcl",)), "seed": Grid(tuple(range(
        seeds)))}, x_key="loss.temperature", x_label="tau")


def test_the_study_itself_never_writes_such_a_record() -> None:
    """Every round ends at a look: a plain --resume --seeds N lands on one, and a design begins at the study's first
    look (a study that already looked without one cannot start one later)."""
    design = GroupSequential(2, 10)
    assert design.looks == (2, 4, 5, 7, 8, 10)
    rounds.check_within(design, 4)
    with pytest.raises(ConfigError, match=r"looks at 2, 4, 5, 7, 8, 10 seeds per cell; --seeds 3 would look between"):
        rounds.check_within(design, 3)
    assert rounds.plan(_spec(2), None, 10, None, None, lambda: None, looks_ran=[2]) == design
    with pytest.raises(ConfigError, match="already looked at 2 seeds per cell without one"):
        rounds.plan(_spec(3), None, 10, None, None, lambda: None, looks_ran=[2, 3])


# ------------------------------------------------------------------------------------------------- the MI toy

TOY = "eqco_mi_toy"


@pytest.fixture(scope="module")
def toy_rows() -> list[dict]:
    """The smoke toy's 12 runs, as the study runs each (without Ray) and stores them."""
    from dcl_core.study.execution.mi_toy_runs import _run_one, toy_configs

    rows = [_run_one(c) for c in toy_configs((2.0, 6.0), (64, 128), steps=60, repeats=10, seeds=2, alpha=512.0)]
    for r in rows:
        r.pop("bounds")
    return sorted(rows, key=lambda r: (r["true_mi"], r["seed"], r["k"], r["method"]))


def _toy(root: Path, rows: list[dict]) -> Path:
    out = root / "out"
    write_rows(rows, out / "summary" / TOY, "mi_toy")
    return out


@pytest.mark.slow  # the MI toy's answer: ~6 s
def test_the_toy_s_own_table_is_answered(tmp_path: Path, toy_rows: list[dict],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    out = _toy(tmp_path, toy_rows)
    assert answer([str(out)]) == 0, capsys.readouterr().err
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("InfoNCE's MI bound grows with K, EqCo's does not (true MI 6): ")
    assert "not measurable" not in last


@pytest.mark.parametrize(("field", "value", "why"), [
    ("mi_estimate", math.inf, "must be a finite number of nats in [-1000, 1000]"),
    ("mi_estimate", math.nan, "must be a finite number of nats in [-1000, 1000]"),
    ("mi_estimate", 1e308, "must be a finite number of nats in [-1000, 1000]"),
    ("mi_estimate", None, "must be a finite number of nats in [-1000, 1000]"),
    ("true_mi", -2.0, "must be a number of nats in (0, 1000]"),
    ("method", "nce", "must be one of infonce, eqco"),
    ("seed", -1, "must be a whole number >= 0"),
])
def test_a_tampered_toy_value_is_refused_naming_the_file_and_field(tmp_path: Path, toy_rows: list[dict],
                                                                   capsys: pytest.CaptureFixture[str], field: str,
                                                                   value: object, why: str) -> None:
    out = _toy(tmp_path, toy_rows)
    path = out / "summary" / TOY / "mi_toy.parquet"
    rows = read_table(path)
    last = len(rows) - 1  # the largest true MI's: the verdict's
    rows[last][field] = value
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(path)), path)
    line = _one_line(capsys, [str(out)])
    assert f"{path}, row {last}: {field} {why}" in line, line
    assert len(line) < 300
