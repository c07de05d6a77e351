"""MLflow faults: a tracking server that dies mid-study (training goes on, the tracking operations are journaled
and pushed later), one that hangs, bad tracking URIs found in seconds, credentials kept out of printed URIs.
Real ``mlflow server`` processes on loopback; no mock of MLflow."""

import contextlib
import json
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pyrun
import pytest
from mlflow.tracking import MlflowClient

from dcl_core.config import ConfigError
from dcl_core.data import resolve_data_root
from dcl_core.study.analysis.tables import read_table
from dcl_core.study.plan.storage import summary_dir
from dcl_core.study.tracking import (
    IDS_FILE,
    JOURNAL_FILE,
    SUMMARY_TAG,
    TRIAL_TAG,
    MLflowTrialCallback,
    StudyTracker,
    preflight,
    redact_uri,
)

REPO = Path(__file__).resolve().parents[3]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``mlflow server`` on 127.0.0.1 in its own process group (it starts uvicorn and a job runner as children,
    which must die with it), on a SQLite store and an artifact folder that outlive it."""

    def __init__(self, root: Path, port: int) -> None:
        self.root, self.port, self.proc = root, port, None
        self.uri = f"http://127.0.0.1:{port}"

    def start(self, timeout: float = 240) -> None:
        cmd = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(self.port),
               "--backend-store-uri", f"sqlite:///{self.root / 'server.db'}",
               "--artifacts-destination", str(self.root / "server-artifacts"), "--workers", "1"]
        env = os.environ | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}  # no GenAI job consumers: 8 processes
        with open(self.root / "server.log", "ab") as log_file:
            self.proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True,
                                         env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=2):
                    return
            except urllib.error.HTTPError:
                return
            except OSError as err:
                if self.proc.poll() is not None:
                    raise RuntimeError((self.root / "server.log").read_text()[-3000:]) from err
                time.sleep(0.5)
        raise TimeoutError(f"mlflow server on {self.uri}")

    def stop(self) -> None:
        if self.proc is None or (self.proc.poll() is not None and not self._listening()):
            return
        for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)  # the group this test started (start_new_session)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline and (self.proc.poll() is None or self._listening()):
                time.sleep(0.2)
            if self.proc.poll() is not None and not self._listening():
                return

    def _listening(self) -> bool:
        with socket.socket() as s:
            s.settimeout(1)
            return s.connect_ex(("127.0.0.1", self.port)) == 0


def epoch_result(trial: Any, epoch: int) -> dict:
    trial.last_result = {"epoch": epoch, "training_iteration": epoch, "train/loss": 5.0 - epoch,
                         "eval/knn_top1": 10.0 * epoch, "train/q_hist": [0.25, 0.5, 0.25]}
    return trial.last_result


def metric_steps(client: MlflowClient, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def artifact_paths(client: MlflowClient, run_id: str, path: str | None = None) -> set[str]:
    out = set()
    for a in client.list_artifacts(run_id, path):
        out |= artifact_paths(client, run_id, a.path) if a.is_dir else {a.path}
    return out


@pytest.mark.slow  # starts and kills an mlflow server
def test_a_dead_server_is_journaled_and_synced_later(tmp_path, caplog, fake_trial):
    caplog.set_level(logging.INFO, logger="dcl_core.study.tracking")
    server = Server(tmp_path, free_port())
    study = "fault_study"
    out = tmp_path / "out"
    journal_dir = summary_dir(out, study)
    try:
        server.start()
        preflight(server.uri)  # a live server passes
        tracker = StudyTracker(server.uri, study, artifact_root=out / "mlartifacts", tags={"study": study},
                               journal_dir=journal_dir, cooldown=3).open()
        parent = tracker.parent_run_id
        assert parent is not None and not parent.startswith("offline-")
        callback = MLflowTrialCallback(tracker, tag_keys={"loss": "loss.name"})
        resumed = fake_trial("trial_resumed", {"loss.name": "dcl", "optim.lr": 0.1})
        callback.on_trial_start(0, [], resumed)
        for epoch in (1, 2):
            callback.on_trial_result(0, [], resumed, epoch_result(resumed, epoch))

        server.stop()
        start = time.monotonic()
        with pytest.raises(ConfigError, match="is unreachable"):
            preflight(server.uri)
        # Tune restores its callbacks from a pickle on --resume: a second tracker, the same journal.
        restored = MLflowTrialCallback(pickle.loads(pickle.dumps(tracker)), tag_keys={"loss": "loss.name"})
        restored.on_trial_start(0, [], resumed)
        for epoch in (3, 4):
            restored.on_trial_result(0, [], resumed, epoch_result(resumed, epoch))
        restored.on_trial_complete(0, [], resumed)
        offline = fake_trial("trial_offline", {"loss.name": "infonce", "optim.lr": 0.2})
        callback.on_trial_start(0, [], offline)
        for epoch in range(1, 21):
            callback.on_trial_result(0, [], offline, epoch_result(offline, epoch))
        callback.on_trial_complete(0, [], offline)  # its q_B plot is made in a temporary folder
        table = journal_dir / "table.txt"
        table.write_text("the table\n")
        assert tracker.log_summary({"dcl/std": 1.5}, [table]) == parent
        elapsed = time.monotonic() - start
        assert elapsed < 20, f"{elapsed:.1f} s for ~50 tracking operations against a dead server"

        ops = [json.loads(line)["op"] for line in (journal_dir / JOURNAL_FILE).read_text().splitlines()]
        # the summary's answer (its metric, its table) is never journaled: a marker asks sync to recompute it
        assert ops.count("trial_run") == 2 and ops.count("metrics") == 22 and ops.count("dict") == 22
        assert ops.count("artifact") == 2 and ops.count("end") == 3 and ops.count("summarize") == 1
        assert tracker.pending() == len(ops) and tracker.pending_runs() == 3
        message = tracker.pending_message()
        assert f"{len(ops)} operations for 3 runs" in message and str(journal_dir / JOURNAL_FILE) in message
        assert f"python -m dcl_core.study sync {out} --name {study}" in message
        assert any(message in r.getMessage() for r in caplog.records)
        outage = [r for r in caplog.records if "is unreachable" in r.getMessage() and r.levelno == logging.WARNING]
        assert len(outage) == 2, [r.getMessage() for r in outage]  # one per tracker, not one per operation
        assert list((journal_dir / "pending_mlflow_files").rglob("q_hist.png"))  # a copy outlives its folder

        server.start()
        sync = [sys.executable, "-m", "dcl_core.study", "sync", str(out), "--name", study, "--tracking-uri", server.uri]
        first = pyrun.run(sync, capture_output=True, text=True, timeout=600, cwd=REPO)
        # everything journaled is pushed; the answer is recomputed from the study's results, which this
        # hand-made study has none of: said in one line (exit 2), never replayed from memory or the journal
        assert first.returncode == 2, first.stdout + first.stderr
        assert f"{len(ops) - 1} operations pushed" in first.stdout and "0 left" in first.stdout  # not the marker
        assert "the answer was not logged" in first.stderr and "Traceback" not in first.stderr
        assert tracker.pending() == 0 and not (journal_dir / JOURNAL_FILE).exists()
        assert not (journal_dir / "pending_mlflow_files").exists()

        client = MlflowClient(server.uri)
        exp = client.get_experiment_by_name(study)
        runs = client.search_runs([exp.experiment_id])
        by_trial = {r.data.tags[TRIAL_TAG]: r for r in runs if TRIAL_TAG in r.data.tags}
        assert len(runs) == 3 and set(by_trial) == {"trial_resumed", "trial_offline"}
        assert [r.info.run_id for r in runs if r.data.tags.get(SUMMARY_TAG) == "true"] == [parent]
        for run in by_trial.values():
            assert run.data.tags["mlflow.parentRunId"] == parent and run.info.status == "FINISHED"
        resumed_run, offline_run = by_trial["trial_resumed"].info.run_id, by_trial["trial_offline"].info.run_id
        assert metric_steps(client, resumed_run, "train/loss") == [1, 2, 3, 4]
        assert metric_steps(client, offline_run, "eval/knn_top1") == list(range(1, 21))
        assert by_trial["trial_offline"].data.params["optim.lr"] == "0.2"
        assert by_trial["trial_offline"].data.tags["loss"] == "infonce"
        assert "npc/q_hist.png" in artifact_paths(client, offline_run)
        assert "npc/q_hist_epoch0020.json" in artifact_paths(client, offline_run)
        assert "npc/q_hist_epoch0004.json" in artifact_paths(client, resumed_run)
        summary = client.get_run(parent)
        assert summary.info.status == "FINISHED" and "dcl/std" not in summary.data.metrics
        assert "table.txt" not in artifact_paths(client, parent)

        again = pyrun.run(sync, capture_output=True, text=True, timeout=600, cwd=REPO)
        assert again.returncode == 0 and "nothing to sync" in again.stdout, again.stdout + again.stderr
        assert tracker.sync() == 0
        assert len(client.search_runs([exp.experiment_id])) == 3

        # The callback still holds the placeholder id of the run it created offline: it resolves to the real one.
        placeholder = callback.runs["trial_offline"]
        assert placeholder.startswith("offline-")
        assert json.loads((journal_dir / IDS_FILE).read_text())[placeholder] == offline_run
        time.sleep(3)  # the tracker's cool-down
        tracker.set_tag(placeholder, "note", "after the outage")
        assert tracker.pending() == 0
        assert client.get_run(offline_run).data.tags["note"] == "after the outage"
    finally:
        server.stop()


def test_a_hung_server_costs_one_timeout_per_cooldown(tmp_path, caplog):
    """A server that accepts connections and never answers: the first call waits out a short timeout, then the
    tracker stops calling it for the cool-down, so dozens of operations take seconds (not 8 x 120 s each)."""
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)
        uri = f"http://127.0.0.1:{hung.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(ConfigError, match="unreachable"):
            preflight(uri, timeout=1)
        assert time.monotonic() - start < 5
        tracker = StudyTracker(uri, "hung", journal_dir=tmp_path / "journal", http_timeout=1, cooldown=60)
        start = time.monotonic()
        tracker.open()
        run = tracker.trial_run("t1", "t1", {}, {"a": 1})
        for step in range(40):
            tracker.log_metrics(run, {"train/loss": 1.0}, step)
        tracker.end_run(run)
        elapsed = time.monotonic() - start
    assert elapsed < 10, f"{elapsed:.1f} s"
    assert tracker.pending() == 43 and tracker.pending_runs() == 2
    assert tracker.last_error == "timed out"
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "unreachable (timed out)" in warnings[0].getMessage()


def test_a_tracker_without_journal_never_raises(tmp_path):
    tracker = StudyTracker("http://127.0.0.1:9", "nowhere", cooldown=60).open()
    run = tracker.trial_run("t1", "t1", {}, {"a": 1})
    tracker.log_metrics(run, {"train/loss": 1.0}, 1)
    tracker.log_summary({"m": 1.0}, [])
    assert tracker.pending() == 0 and tracker.dropped == 5
    assert "not logged" in tracker.pending_message()


@pytest.mark.parametrize(
    ("uri", "match"),
    [
        ("http://127.0.0.1:9", "MLflow tracking URI http://127.0.0.1:9 is unreachable: .*Connection refused"),
        ("foo://bar", "foo://bar is not a valid MLflow tracking URI: unknown scheme 'foo'"),
        ("notauri", "notauri is not a valid MLflow tracking URI: not a URI"),
        ("http://", "http:// is not a valid MLflow tracking URI: no host"),
        ("http://127.0.0.1:notaport", "not a valid MLflow tracking URI"),
        ("sqlite://", "not a valid MLflow tracking URI: expected sqlite:///"),
        ("file:///tmp/mlruns", "file store is in maintenance mode"),
        ("http://user:s3cret@127.0.0.1:9", r"http://\*\*\*@127.0.0.1:9 is unreachable"),
    ],
)
def test_preflight_refuses_bad_tracking_uris_quickly(uri, match):
    start = time.monotonic()
    with pytest.raises(ConfigError, match=match) as err:
        preflight(uri)
    assert time.monotonic() - start < 6
    assert "s3cret" not in str(err.value) and "\n" not in str(err.value)


def test_preflight_refuses_a_sqlite_file_it_cannot_create(tmp_path):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(ConfigError, match="a_file is not a writable folder"):
        preflight(f"sqlite:///{tmp_path / 'a_file' / 'mlflow.db'}")
    (tmp_path / "a_folder.db").mkdir()
    with pytest.raises(ConfigError, match=r"a_folder\.db is not a writable file"):
        preflight(f"sqlite:///{tmp_path / 'a_folder.db'}")


def test_preflight_accepts_local_stores(tmp_path, monkeypatch):
    preflight(f"sqlite:///{tmp_path / 'mlflow.db'}")  # sqlite:////abs/path
    preflight(f"sqlite:///{tmp_path / 'new' / 'deeper' / 'mlflow.db'}")  # MLflow makes the folders
    preflight("postgresql://user:pw@db.example:5432/mlflow")  # a database server: not probed
    monkeypatch.setenv("DATABRICKS_HOST", "https://example.cloud.databricks.com")
    preflight("databricks")  # configured: MLflow's own client takes it from here


@pytest.mark.slow  # starts a web server
def test_preflight_finds_a_web_server_that_is_not_mlflow(tmp_path):
    port = free_port()
    web = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"], cwd=tmp_path,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        with pytest.raises(ConfigError, match="is not a valid MLflow tracking URI: no MLflow REST API"):
            preflight(f"http://127.0.0.1:{port}")
    finally:
        web.terminate()
        web.wait(timeout=10)


def test_redact_uri():
    assert redact_uri("http://user:token@mlflow.example:5000/prefix") == "http://***@mlflow.example:5000/prefix"
    assert redact_uri("https://token@host/") == "https://***@host/"
    assert redact_uri("https://us%40er:p@ss@host:443") == "https://***@host:443"
    assert redact_uri("postgresql://mlflow:pw@db:5432/mlflow") == "postgresql://***@db:5432/mlflow"
    assert redact_uri("http://host:5000/?access_token=abc&x=1") == "http://host:5000/?access_token=***&x=1"
    for plain in ("http://127.0.0.1:5000", "sqlite:////tmp/a@b/mlflow.db", "databricks", "/abs/path"):
        assert redact_uri(plain) == plain


def test_tracker_keeps_credentials_out_of_its_uri(monkeypatch):
    """MLflow prints its URI after every run and Tune pickles the tracker: credentials go to MLflow's env vars."""
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    tracker = StudyTracker("https://alice:s3%40cret@mlflow.example:5000/prefix", "creds")
    assert tracker.tracking_uri == "https://mlflow.example:5000/prefix"
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "alice" and os.environ["MLFLOW_TRACKING_PASSWORD"] == "s3@cret"
    assert b"s3" not in pickle.dumps(tracker)


def test_tracker_pickles_without_its_client(tmp_path):
    tracker = StudyTracker(f"sqlite:///{tmp_path / 'm.db'}", "pickled", journal_dir=tmp_path / "j").open()
    copy = pickle.loads(pickle.dumps(tracker))
    assert copy.runs._client is None and copy.parent_run_id == tracker.parent_run_id
    assert copy.experiment_id == tracker.experiment_id and copy.runs.on_refused == copy._drop
    assert copy.pending() == 0 and not (tmp_path / "j" / JOURNAL_FILE).exists()


def test_a_tracker_pickled_before_the_journal_existed_still_works(tmp_path):
    """Tune restores its callbacks (and their tracker) from the pickle an older version wrote."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    old_state = {"tracking_uri": uri, "experiment": "old", "artifact_root": None, "tags": {}, "experiment_id": None,
                 "parent_run_id": None, "_client": None}
    tracker = StudyTracker.__new__(StudyTracker)
    tracker.__setstate__(old_state)
    run = tracker.open().trial_run("t1", "t1", {}, {"a": 1})
    tracker.log_metrics(run, {"train/loss": 1.0}, 1)
    assert tracker.pending() == 0 and tracker.dropped == 0
    assert MlflowClient(uri).get_run(run).data.metrics == {"train/loss": 1.0}


def test_a_tracker_pickled_when_it_held_its_mlflow_state_itself_hands_it_to_its_runs(tmp_path):
    """A study started before the tracker held its runs (``StudyRuns``) resumes with the tracker Tune pickled then:
    its experiment, its runs and placeholder ids reach the runs; none of it stays on the tracker."""
    uri = f"sqlite:///{tmp_path / 'm.db'}"
    first = StudyTracker(uri, "flat", journal_dir=tmp_path / "j", description="Q?").open()
    flat = {k: v for k, v in first.__getstate__().items() if k != "runs"} | {
        "description": "Q?", "experiment_tags": {}, "artifact_root": None, "experiment_id": first.experiment_id,
        "_client": None, "_ids": {"offline-x": first.parent_run_id}, "_mine": {first.parent_run_id},
        "_summary_ids": {first.parent_run_id}, "_env_added": []}
    tracker = StudyTracker.__new__(StudyTracker)
    tracker.__setstate__(flat)
    assert tracker.experiment_id == first.experiment_id and tracker.runs.description == "Q?"
    assert tracker.runs.real("offline-x") == first.parent_run_id and tracker.runs.is_summary_run(first.parent_run_id)
    assert not {"_ids", "_mine", "experiment_id", "description"} & set(vars(tracker))
    run = tracker.open().trial_run("t1", "t1", {}, {"a": 1})
    assert tracker.parent_run_id == first.parent_run_id and run != first.parent_run_id


def test_temporary_artifacts_are_copied_only_when_journaled(tmp_path):
    tracker = StudyTracker("http://127.0.0.1:9", "copies", journal_dir=tmp_path / "j", cooldown=60).open()
    with tempfile.TemporaryDirectory() as d:
        png = Path(d) / "q_hist.png"
        png.write_bytes(b"\x89PNG")
        tracker.log_artifact(tracker.parent_run_id, png, "npc", temporary=True)
    record = json.loads((tmp_path / "j" / JOURNAL_FILE).read_text().splitlines()[-1])
    assert record["op"] == "artifact" and record["owned"] and Path(record["path"]).read_bytes() == b"\x89PNG"


@pytest.mark.slow  # a study (real Ray) and an mlflow server
@pytest.mark.skipif(
    not (resolve_data_root("cifar10", None) / "train").is_dir(), reason="embedded CIFAR-10 not present"
)
def test_a_study_outlives_its_mlflow_server_and_syncs_afterwards(tmp_path, ray_head):
    """The issue's case: the tracking server dies mid-study. Training goes on, the summary is written, the
    study says what is pending, and the sync command pushes it once a server is back."""
    server = Server(tmp_path, free_port())
    server.start()
    out, epochs = tmp_path / "out", 6
    cmd = [sys.executable, str(REPO / "studies" / "temperature_sweep.py"), "--smoke", "--losses", "dcl",
           "--output-dir", str(out), "--address", ray_head.address, "--tracking-uri", server.uri,
           "--set", f"optim.epochs={epochs}"]  # attached to the suite's Ray head (conftest.py's ray_head)
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ray_head.env)
    exp = out / "ray_results" / "temperature_sweep"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # the server dies once a trial has logged epoch 2
            logged = [d for d in exp.glob("dcl_*") if (d / "result.json").exists()
                      and len((d / "result.json").read_text().splitlines()) >= 2] if exp.exists() else []
            if logged:
                break
            time.sleep(0.2)
        assert logged, "no trial reached epoch 2"
        server.stop()
        t0 = time.monotonic()
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()
    assert proc.returncode == 0, stdout[-2000:] + stderr[-3000:]
    assert time.monotonic() - t0 < 240  # no minutes of HTTP retries per call
    assert "pending_mlflow.jsonl" in stdout + stderr and "Traceback" not in stderr
    rows = read_table(summary_dir(out, "temperature_sweep") / "results.parquet")
    assert len(rows) == 2 and all(r["status"] == "ok" and r["epochs"] == epochs for r in rows)

    server.start()
    try:
        # the recorded server is named, never followed: sync asks for it, then pushes where it is told
        refused = pyrun.run([sys.executable, "-m", "dcl_core.study", "sync", str(out)], cwd=REPO,
                                 capture_output=True, text=True, timeout=300)
        assert refused.returncode == 2 and "pass --tracking-uri" in refused.stderr, refused.stderr[-2000:]
        sync = pyrun.run([sys.executable, "-m", "dcl_core.study", "sync", str(out), "--tracking-uri", server.uri],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        assert sync.returncode == 0, sync.stdout[-2000:] + sync.stderr[-2000:]
        client = MlflowClient(tracking_uri=server.uri)
        runs = client.search_runs([client.get_experiment_by_name("temperature_sweep").experiment_id])
        (parent,) = [r for r in runs if r.data.tags.get("dcl.summary") == "true"]
        trials = [r for r in runs if TRIAL_TAG in r.data.tags]
        assert len(trials) == 2 and all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in trials)
        assert all(r.info.status == "FINISHED" for r in [parent, *trials])
        for r in trials:
            assert sorted(metric_steps(client, r.info.run_id, "train/loss")) == list(range(1, epochs + 1))
        assert "results.parquet" in artifact_paths(client, parent.info.run_id)
    finally:
        server.stop()
