"""The MLflow journal (summary/<study>/pending_mlflow.jsonl) is replayed with the owner's MLflow rights, so it
holds only what the study's tracker can have written (issue: nothing outside the folder). Lines planted in it
cannot upload a file from outside the study's folder, delete runs, or touch another study's runs; lines that are
not operations at all (``[1]``, ``{}``) are skipped without a traceback; ``sync --name ../../x`` is refused.
A real SQLite MLflow store, the real ``python -m dcl_core.study sync`` entry point (in-process)."""

import json
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from dcl_core.study import summary_dir
from dcl_core.study.cli.sync_command import sync_main as sync
from dcl_core.study.tracking import JOURNAL_FILE, StudyTracker


@pytest.fixture
def store(tmp_path):
    """Two studies in one output folder: ``s`` (a parent run and a finished trial run) and ``other``."""
    uri = f"sqlite:///{tmp_path / 'out' / 'mlflow.db'}"
    out = tmp_path / "out"
    s = StudyTracker(uri, "s", artifact_root=out / "mlartifacts", journal_dir=summary_dir(out, "s")).open()
    trial = s.trial_run("t1", "trial", {}, {"a": "1"})
    s.end_run(trial)
    other = StudyTracker(uri, "other", artifact_root=out / "mlartifacts",
                         journal_dir=summary_dir(out, "other")).open()
    for name in ("s", "other"):
        summary_dir(out, name).mkdir(parents=True, exist_ok=True)
        (summary_dir(out, name) / "study_options.json").write_text(json.dumps({"tracking_uri": uri}))
    return {"uri": uri, "out": out, "s": s, "trial": trial, "other": other, "client": MlflowClient(uri)}


def plant(store, *records):
    with (summary_dir(store["out"], "s") / JOURNAL_FILE).open("a") as f:
        for rec in records:
            f.write((rec if isinstance(rec, str) else json.dumps(rec)) + "\n")


def artifacts(client, run_id):
    return {a.path for a in client.list_artifacts(run_id)}


def test_a_planted_line_cannot_upload_a_file_from_outside_the_study_folder(store, tmp_path):
    secret = tmp_path / "id_rsa"
    secret.write_text("PRIVATE")
    link = summary_dir(store["out"], "s") / "innocent.txt"
    link.symlink_to(secret)  # inside the folder by name, outside by its target
    plant(store, {"op": "artifact", "run": store["trial"], "path": str(secret), "artifact_path": None},
          {"op": "artifact", "run": store["trial"], "path": str(link), "artifact_path": None},
          {"op": "artifact", "run": store["trial"], "path": str(link.parent), "artifact_path": "../../x"})
    assert sync([str(store["out"]), "--name", "s"]) == 0
    assert artifacts(store["client"], store["trial"]) == set()
    assert not (summary_dir(store["out"], "s") / JOURNAL_FILE).exists()  # the planted lines are gone


def test_a_planted_line_cannot_delete_the_studys_runs(store):
    future = int(time.time() * 1000) + 10**9
    plant(store, {"op": "open", "id": "x", "experiment": "s", "overwrite": True, "tags": {}, "time": future})
    assert sync([str(store["out"]), "--name", "s"]) == 0
    run = store["client"].get_run(store["trial"])
    assert run.info.lifecycle_stage == "active"


def test_a_planted_line_cannot_touch_another_studys_runs(store):
    victim = store["other"].parent_run_id
    status = store["client"].get_run(victim).info.status
    plant(store, {"op": "tag", "run": victim, "key": "pwned", "value": "1"},
          {"op": "end", "run": victim, "status": "FAILED", "time": 1},
          {"op": "open", "id": "y", "experiment": "other", "overwrite": False, "tags": {"pwned": "1"}, "time": 1})
    assert sync([str(store["out"]), "--name", "s"]) == 1  # refused lines are reported, not counted as pushed
    run = store["client"].get_run(victim)
    assert "pwned" not in run.data.tags and run.info.status == status != "FAILED"
    runs = store["client"].search_runs([store["client"].get_experiment_by_name("other").experiment_id])
    assert len(runs) == 1  # no run created there either


def test_lines_that_are_not_operations_are_skipped_without_a_traceback(store, capsys):
    plant(store, "[1]", "{}", '{"op": "metrics", "run": 3, "metrics": "x"}', '"text"', "null",
          {"op": "metrics", "run": store["trial"], "metrics": [["m", 1.5, 0, 1]]})  # the one good line
    assert sync([str(store["out"]), "--name", "s"]) == 0
    assert "Traceback" not in capsys.readouterr().err
    assert [m.value for m in store["client"].get_metric_history(store["trial"], "m")] == [1.5]


def test_sync_refuses_a_name_outside_the_output_folder(store, tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / JOURNAL_FILE).write_text(json.dumps({"op": "tag", "run": store["trial"], "key": "k",
                                                           "value": "v"}) + "\n")
    assert sync([str(store["out"]), "--name", "../../x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == [JOURNAL_FILE]  # no lock created there
    assert "k" not in store["client"].get_run(store["trial"]).data.tags


def test_sync_refuses_a_summary_folder_that_is_a_planted_link(store, tmp_path, capsys):
    """``summary/`` replaced by a link to a folder elsewhere holding a journal: sync would replay (and rewrite) it."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "s").mkdir(parents=True)
    line = json.dumps({"op": "tag", "run": store["trial"], "key": "k", "value": "v"}) + "\n"
    (elsewhere / "s" / JOURNAL_FILE).write_text(line)
    (elsewhere / "s" / "study_options.json").write_text(json.dumps({"tracking_uri": store["uri"]}))
    summary = store["out"] / "summary"
    summary.rename(tmp_path / "summary.real")
    summary.symlink_to(elsewhere)
    assert sync([str(store["out"])]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: s: ") and "is a symbolic link" in err and len(err.strip().splitlines()) == 1
    assert (elsewhere / "s" / JOURNAL_FILE).read_text() == line
    assert "k" not in store["client"].get_run(store["trial"]).data.tags


def test_an_overwrite_while_mlflow_is_down_is_journaled_without_deleting(tmp_path, caplog):
    from dcl_core.study.tracking import journal_problem

    journal = tmp_path / "j"
    StudyTracker("http://127.0.0.1:9", "s", journal_dir=journal, cooldown=60, http_retries=0).open(overwrite=True)
    (rec,) = [json.loads(line) for line in (journal / JOURNAL_FILE).read_text().splitlines()]
    assert rec["op"] == "open" and rec["overwrite"] is False
    assert "were not soft-deleted" in caplog.text
    assert journal_problem(rec, "s", journal) is None


@pytest.mark.parametrize(("rec", "why"), [
    ({"op": "drop_table"}, "unknown operation"),
    ({"op": "open", "id": "a", "experiment": "t", "tags": {}, "time": 1}, "another experiment"),
    ({"op": "trial_run", "id": "a", "experiment": "s", "tags": {}, "time": 1}, "malformed trial_run"),
    ({"op": "tag", "run": "r", "key": 1, "value": "v"}, "malformed tag"),
    ({"op": "dict", "run": "r", "data": {}, "path": "../escape.json"}, "malformed dict"),
    ({"op": "end", "run": "r", "status": "DELETED", "time": 1}, "malformed end"),
])
def test_journal_problem_names_what_is_wrong(tmp_path, rec, why):
    from dcl_core.study.tracking import journal_problem

    assert why in journal_problem(rec, "s", tmp_path)


# -- a replay deletes only what the study staged (issue 46, item 1) ------------------------------------------------

def _victim(tmp_path, name="victim"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "keep").write_text("precious")
    return folder


def test_a_planted_line_cannot_delete_a_folder_anywhere(store, tmp_path, monkeypatch):
    """Lines naming a path and ``owned`` (what a kept copy's line carries) on operations MLflow refuses or that
    are refused: replaying them deleted the path's folder (``shutil.rmtree(Path(path).parent)``): a folder
    outside the output folder, the folder sync runs from (``"path": "x"``), the study's own summary folder."""
    outside, cwd = _victim(tmp_path), _victim(tmp_path, "cwd")
    monkeypatch.chdir(cwd)
    summary = summary_dir(store["out"], "s")
    (summary / "results.csv").write_text("kept")
    ghost = "0123456789abcdef0123456789abcdef"
    plant(store,
          {"op": "tag", "run": ghost, "key": "k", "value": "v", "path": str(outside / "x"), "owned": True},
          {"op": "end", "run": ghost, "status": "FINISHED", "time": 1, "path": "x", "owned": True},
          {"op": "artifact", "run": ghost, "path": str(summary / "results.csv"), "artifact_path": None,
           "owned": True},
          {"op": "artifact", "run": store["trial"], "path": str(summary / "results.csv"), "artifact_path": None,
           "owned": True},
          {"op": "tag", "run": store["trial"], "key": "k", "value": "v", "path": str(outside / "x"), "owned": True})
    sync([str(store["out"]), "--name", "s"])
    assert (outside / "keep").read_text() == "precious"
    assert (cwd / "keep").read_text() == "precious"
    assert (summary / "results.csv").read_text() == "kept"
    assert "k" not in store["client"].get_run(store["trial"]).data.tags  # a line with foreign fields is refused


def test_release_deletes_only_a_folder_the_journal_staged(tmp_path):
    from dcl_core.study.tracking.journal import FILES_DIR, Journal

    journal = Journal(tmp_path / "summary" / "s", "s")
    plot = tmp_path / "q_hist.png"
    plot.write_bytes(b"png")
    staged = journal.keep_copy({"op": "artifact", "run": "r", "path": str(plot), "artifact_path": None})
    outside = _victim(tmp_path)
    hexname = "0" * 32
    (journal.folder / FILES_DIR / hexname).symlink_to(outside)  # a link shaped like a staged folder
    for path in (outside / "x", journal.folder / "x", journal.folder / FILES_DIR / "x",
                 journal.folder / FILES_DIR / hexname / "keep", tmp_path / FILES_DIR / hexname / "x",
                 journal.folder / FILES_DIR / Path(staged["path"]).parent.name / ".." / "x"):
        journal.release({"op": "artifact", "run": "r", "path": str(path), "artifact_path": None, "owned": True})
    for op in ("tag", "end", "dict"):  # another operation naming the staged copy: not a staged artifact
        journal.release({"op": op, "run": "r", "path": staged["path"], "owned": True})
    assert (outside / "keep").exists() and journal.folder.is_dir() and Path(staged["path"]).exists()
    journal.release(staged)
    assert not Path(staged["path"]).parent.exists()


def test_a_link_planted_at_the_staging_folder_is_not_written_through(tmp_path):
    from dcl_core.study.tracking.journal import FILES_DIR, Journal

    journal = Journal(tmp_path / "summary" / "s", "s")
    journal.folder.mkdir(parents=True)
    outside = _victim(tmp_path)
    (journal.folder / FILES_DIR).symlink_to(outside)
    plot = tmp_path / "q_hist.png"
    plot.write_bytes(b"png")
    with pytest.raises(OSError, match="symbolic link"):
        journal.keep_copy({"op": "artifact", "run": "r", "path": str(plot), "artifact_path": None})
    assert sorted(p.name for p in outside.iterdir()) == ["keep"]


@pytest.mark.parametrize("field", ["path", "owned", "note"])
def test_a_line_with_a_field_a_tracker_never_writes_is_refused(tmp_path, field):
    from dcl_core.study.tracking import journal_problem

    rec = {"op": "tag", "run": "r", "key": "k", "value": "v", field: "x"}
    assert "fields a tracker never writes" in journal_problem(rec, "s", tmp_path)


# -- a replay sets no run's identity and no unescaped description (issue 46, item 8) -------------------------------

def test_a_planted_line_cannot_make_a_trial_run_the_summary_run(store, capsys):
    plant(store, {"op": "tag", "run": store["trial"], "key": "dcl.summary", "value": "true"},
          {"op": "tag", "run": store["trial"], "key": "trial_id", "value": "t2"},
          {"op": "tag", "run": store["trial"], "key": "mlflow.parentRunId", "value": store["other"].parent_run_id},
          {"op": "trial_run", "id": "offline-1", "experiment": "s", "trial_id": "t9", "name": "n",
           "tags": {"dcl.summary": "true", "trial_id": "t9"}, "params": {}, "time": 1})
    assert sync([str(store["out"]), "--name", "s"]) == 0
    assert "4 not replayed" in capsys.readouterr().out
    tags = store["client"].get_run(store["trial"]).data.tags
    assert "dcl.summary" not in tags and tags["trial_id"] == "t1"
    assert tags["mlflow.parentRunId"] == store["s"].parent_run_id
    exp = store["client"].get_experiment_by_name("s").experiment_id
    summaries = store["client"].search_runs([exp], "tags.`dcl.summary` = 'true'")
    assert [r.info.run_id for r in summaries] == [store["s"].parent_run_id]


def test_a_planted_description_is_not_replayed_unless_the_tracker_escaped_it(store, capsys):
    from dcl_core.study.tracking.notes import NOTE_TAG, literal_markdown

    plant(store, {"op": "tag", "run": store["trial"], "key": NOTE_TAG, "value": "<img src=x onerror=alert(1)>"})
    assert sync([str(store["out"]), "--name", "s"]) == 0
    assert "1 not replayed" in capsys.readouterr().out
    assert NOTE_TAG not in store["client"].get_run(store["trial"]).data.tags
    note = literal_markdown("tau=0.1: <b>diverged</b> at [1](x) *2* `3` \\ &lt;")  # as the trial callback writes it
    plant(store, {"op": "tag", "run": store["trial"], "key": NOTE_TAG, "value": note})
    assert sync([str(store["out"]), "--name", "s"]) == 0
    assert store["client"].get_run(store["trial"]).data.tags[NOTE_TAG] == note


def test_sync_says_what_mlflow_refused_instead_of_calling_it_pushed(store, caplog, capsys):
    ghost = "0123456789abcdef0123456789abcdef"
    plant(store, *({"op": "tag", "run": ghost, "key": f"k{i}", "value": "v"} for i in range(3)),
          {"op": "tag", "run": store["trial"], "key": "ok", "value": "v"})
    with caplog.at_level("INFO"):
        assert sync([str(store["out"]), "--name", "s"]) == 1
    line = next(r.getMessage() for r in caplog.records if "is reachable" in r.getMessage())
    assert "1 journaled operations pushed, 3 refused by MLflow, 0 not replayed, 0 left" in line
    assert "1 operations pushed" in capsys.readouterr().out


def test_a_fifo_at_the_journal_or_its_id_map_never_blocks(tmp_path):
    """A FIFO planted at pending_mlflow.jsonl is refused by the append (never opened to read its last byte), and
    one at the id map reads as no ids: neither blocks the study."""
    import os
    import threading

    from dcl_core.files import UnsafePathError
    from dcl_core.study.tracking.journal import IDS_FILE, Journal

    journal = Journal(tmp_path / "summary" / "tau", "tau")
    journal.folder.mkdir(parents=True)
    os.mkfifo(journal.path)
    os.mkfifo(journal.folder / IDS_FILE)
    outcome = []

    def work():
        try:
            journal.append({"op": "x"})
        except (UnsafePathError, OSError) as err:
            outcome.append(type(err).__name__)
        outcome.append(journal.known_ids())

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and outcome[-1] == {}, outcome
