"""The MLflow journal on its own (dcl_core/study/tracking/journal.py): appends and reads in order, a line cut short
by a crash, writers in several processes at once, a rewrite after a replay, the kept copies of temporary files;
and, with a real SQLite MLflow store, that replaying the same journal twice (a crash between the replay and the
rewrite) creates no run twice."""

import json
import logging
import multiprocessing
from pathlib import Path

import journal_writers
from mlflow.tracking import MlflowClient

from dcl_core.study.tracking import JOURNAL_FILE, Journal, StudyTracker

EXP = journal_writers.EXP
tag = journal_writers.tag


def test_appends_read_back_in_order(tmp_path):
    journal = Journal(tmp_path / "summary" / EXP, EXP)
    assert journal.size() == 0 and journal.read() == []
    records = [tag("r1", "a", "1"), {"op": "end", "run": "r1", "status": "FINISHED", "time": 5}, tag("r2")]
    for rec in records:
        journal.append(rec)
    assert journal.read() == records
    assert journal.size() == journal.path.stat().st_size > 0


def test_a_line_cut_short_by_a_crash_loses_only_itself(tmp_path, caplog):
    journal = Journal(tmp_path, EXP)
    journal.append(tag("r1", "a", "1"))
    with journal.path.open("a") as f:  # a crash in the middle of a write: no newline after the fragment
        f.write(json.dumps(tag("r1", "b", "2"))[:17])
    journal.append(tag("r1", "c", "3"))  # the next append must not be glued to the fragment
    with caplog.at_level(logging.WARNING):
        assert [r["key"] for r in journal.read()] == ["a", "c"]
    assert any("unreadable line" in r.getMessage() for r in caplog.records)


def test_appends_from_several_processes_survive_a_concurrent_replay(tmp_path):
    """A study's trials journal while ``python -m dcl_core.study sync`` (or the study itself) replays: a line
    appended between the replay's read and its rewrite would be lost unless both hold the journal's lock."""
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    # the processes' code lives in a module of its own: a spawned process imports only that (this one's MLflow import
    # cost 5 processes ~5 s each)
    replayer = ctx.Process(target=journal_writers.replay_until_stopped, args=(str(tmp_path), stop))
    replayer.start()
    writers = [ctx.Process(target=journal_writers.append_many, args=(str(tmp_path), w, 50)) for w in range(4)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(120)
        assert p.exitcode == 0
    stop.set()
    replayer.join(120)
    assert replayer.exitcode == 0
    records = Journal(tmp_path, EXP).read()
    assert len(records) == 200
    for w in range(4):  # every writer's lines, whole and in its own order
        assert [r["key"] for r in records if r["run"] == f"r{w}"] == [f"k{i}" for i in range(50)]


def test_rewrite_keeps_what_is_left_with_real_ids_and_grows_the_id_map(tmp_path):
    journal = Journal(tmp_path, EXP)
    placeholder = "offline-abc"
    real = {placeholder: "0123"}.get
    journal.rewrite([tag(placeholder), tag("other")], {placeholder: "0123"}, lambda r: real(r, r))
    assert [r["run"] for r in journal.read()] == ["0123", "other"]
    assert journal.known_ids() == {placeholder: "0123"}
    journal.rewrite([], {"offline-def": "4567"}, lambda r: r)  # nothing left: no journal, the map kept
    assert not journal.path.exists() and journal.size() == 0
    assert journal.known_ids() == {placeholder: "0123", "offline-def": "4567"}
    (tmp_path / "pending_mlflow_ids.json").write_text("[1, 2]")  # damaged: no ids rather than a traceback
    assert journal.known_ids() == {}


def test_a_kept_copy_outlives_its_temporary_file_until_released(tmp_path):
    journal = Journal(tmp_path / "summary" / EXP, EXP)
    plot = tmp_path / "tmp" / "q_hist.png"
    plot.parent.mkdir()
    plot.write_bytes(b"png")
    rec = journal.keep_copy({"op": "artifact", "run": "r", "path": str(plot), "artifact_path": "npc"})
    plot.unlink()
    kept = Path(rec["path"])
    assert rec["owned"] and kept.read_bytes() == b"png" and kept.is_relative_to(journal.folder)
    journal.append(rec)
    assert journal.read() == [rec]  # inside the study's folder: a line the tracker can have written
    journal.release(rec)
    assert not kept.exists()


def test_replaying_the_same_journal_twice_creates_no_run_twice(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    folder = tmp_path / "summary" / EXP
    tracker = StudyTracker(uri, EXP, artifact_root=tmp_path / "mlartifacts", journal_dir=folder).open()
    lines = [
        {"op": "trial_run", "id": "offline-1", "experiment": EXP, "trial_id": "t1", "name": "trial 1",
         "tags": {"trial_id": "t1"}, "params": {"loss.name": "dcl"}, "time": 1},
        {"op": "metrics", "run": "offline-1", "metrics": [["eval/knn_top1", 50.0, 2, 1]]},
        tag("offline-1", "note", "after the outage"),
        {"op": "end", "run": "offline-1", "status": "FINISHED", "time": 3},
    ]
    journal = Journal(folder, EXP)
    for _ in range(2):  # the second time: as if the first replay crashed before rewriting the journal
        for rec in lines:
            journal.append(rec)
        assert tracker.sync() == len(lines) and tracker.pending() == 0
    client = MlflowClient(uri)
    runs = [r for r in client.search_runs([tracker.experiment_id]) if r.info.run_id != tracker.parent_run_id]
    assert len(runs) == 1
    run = runs[0]
    assert run.data.params == {"loss.name": "dcl"} and run.data.tags["note"] == "after the outage"
    assert run.info.status == "FINISHED" and run.data.metrics["eval/knn_top1"] == 50.0
    assert not (folder / JOURNAL_FILE).exists()
