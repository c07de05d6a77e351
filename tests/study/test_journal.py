"""The MLflow journal (summary/<study>/pending_mlflow.jsonl) is replayed with the owner's MLflow rights, so it
holds only what the study's tracker can have written (issue: nothing outside the folder). Lines planted in it
cannot upload a file from outside the study's folder, delete runs, or touch another study's runs; lines that are
not operations at all (``[1]``, ``{}``) are skipped without a traceback; ``sync --name ../../x`` is refused.
A real SQLite MLflow store, the real ``python -m dcl_core.study sync`` entry point (in-process)."""

import json
import time

import pytest
from mlflow.tracking import MlflowClient

from dcl_core.study import summary_dir
from dcl_core.study.cli import sync_main as sync
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
