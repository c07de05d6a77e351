"""An output folder is untrusted input (issue: "Nothing lost, nobody in, third pass"): a re-analysis or sync takes
where it writes and which server it talks to from its own command line, never from the folder; a copied or moved
folder never writes to the original; a link planted in a study's summary folder is neither uploaded nor written
through. Real MLflow (SQLite stores), the real ``answer`` and ``sync`` entry points, in-process."""

from __future__ import annotations

import hashlib
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyrun
import pytest
from mlflow.tracking import MlflowClient

from dcl_core.data import resolve_data_root
from dcl_core.study.cli.answer_command import answer_main as answer
from dcl_core.study.cli.sync_command import sync_main as sync
from dcl_core.study.plan.storage import default_tracking_uri
from dcl_core.study.plan.writers import write_table
from dcl_core.study.tracking.journal import JOURNAL_FILE

REPO = Path(__file__).resolve().parents[3]
needs_data = pytest.mark.skipif(not (resolve_data_root("cifar10", None) / "train").is_dir(),
                                reason="embedded CIFAR-10 not present")
STUDY = "temperature_sweep"

SUMMARY_RUN = "tags.`dcl.summary` = 'true'"  # the study's run (beside it: its figure's run, the trials')


class Listener:
    """A TCP port that records whether anything connected (and what it sent first)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.received: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            conn.settimeout(1)
            try:
                self.received.append(conn.recv(4096))
            except OSError:
                self.received.append(b"")
            conn.close()

    def close(self) -> list[bytes]:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()
        return self.received


@pytest.fixture
def listener():
    found = Listener()
    yield found
    found.close()


def _study(root: Path, recorded_uri: str | None = None) -> Path:
    """A finished smoke temperature study's summary folder (2 losses x 2 τ x 2 seeds), as the study records it."""
    out = root / "out"
    d = out / "summary" / STUDY
    d.mkdir(parents=True)
    rows = [{"trial_id": f"t{i}", "status": "ok", "loss": loss, "temperature": tau, "seed": seed,
             "knn_top1": 10.0 + i % 3} for i, (loss, tau, seed) in
            enumerate((lo, t, s) for lo in ("dcl", "infonce") for t in (0.1, 0.5) for s in (0, 1))]
    write_table(rows, d)
    options = {"output_dir": str(out.resolve()), "tracking_uri": recorded_uri or default_tracking_uri(out),
               "command": {"script": STUDY, "preset": "smoke"}}
    (d / "study_options.json").write_text(json.dumps(options))
    return out


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.mark.slow  # MLflow stores and a re-analysis: ~8 s
def test_answer_never_follows_a_recorded_server_or_store(tmp_path, listener, monkeypatch, capsys):
    """Issue reproduction: a recorded ``http://127.0.0.1:PORT`` received ``Authorization: Basic alice:s3cret``;
    a recorded ``sqlite:////elsewhere/evil.db`` was created outside the folder."""
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "alice")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "s3cret")
    out = _study(tmp_path, f"http://127.0.0.1:{listener.port}")
    assert answer([str(out), "-q"]) == 0
    err = capsys.readouterr().err
    assert listener.close() == []  # nothing connected: no credentials sent anywhere
    assert f"logged to MLflow at http://127.0.0.1:{listener.port}" in err and "s3cret" not in err
    assert "--tracking-uri" in err
    assert (out / "mlflow.db").is_file()  # the folder's own store took the summary run

    evil = tmp_path / "elsewhere" / "evil.db"
    evil.parent.mkdir()
    other = _study(tmp_path / "b", f"sqlite:///{evil}")
    assert answer([str(other), "-q"]) == 0
    assert not evil.exists() and (other / "mlflow.db").is_file()


def test_sync_asks_for_the_server_instead_of_following_the_recorded_one(tmp_path, listener, capsys):
    out = _study(tmp_path, f"http://127.0.0.1:{listener.port}")
    (out / "summary" / STUDY / JOURNAL_FILE).write_text(json.dumps({"op": "open", "v": 1}) + "\n")
    assert sync([str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"error: {STUDY}: ")
    assert f"http://127.0.0.1:{listener.port}" in err and "--tracking-uri" in err
    assert listener.close() == []


@pytest.mark.slow  # MLflow stores and a re-analysis: ~9 s
def test_a_copied_or_moved_folder_never_writes_to_the_original(tmp_path, capsys):
    """Issue reproduction: ``cp -a OUT OUT2; answer OUT2`` changed ``OUT/mlflow.db`` and its artifacts; ``mv OUT
    OUT3; answer OUT3`` recreated ``OUT/mlflow.db`` at the old path."""
    out = _study(tmp_path)
    assert answer([str(out), "-q"]) == 0  # the study's own store, its artifacts in out/mlartifacts
    before = _digest(out)
    copy = tmp_path / "copy"
    shutil.copytree(out, copy, symlinks=True)
    capsys.readouterr()
    assert answer([str(copy), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "outside" in err and str(out / "mlartifacts") in err
    assert _digest(out) == before
    # --resume (or extending it with more seeds) in the copy: one line saying where it continues and what works
    # here, before the spec is built (no data needed) or Ray starts; the line's answer command is the one run next
    proc = subprocess.run([sys.executable, str(REPO / "studies" / f"{STUDY}.py"), "--smoke", "--output-dir",
                           str(copy), "--resume", "--seeds", "3"], capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert f"ran in {out.resolve()}" in errors[0] and "resumes or extends only there" in errors[0]
    assert f"python -m dcl_core.study export {copy} --name {STUDY} --best" in errors[0]
    assert f"python -m dcl_core.study answer {copy} --name {STUDY} --tracking-uri sqlite:///{copy}/mlflow-here.db" in (
        errors[0]) and not (copy / "ray_results").exists()
    assert _digest(out) == before
    assert answer([str(copy), "-q", "--name", STUDY, "--tracking-uri", f"sqlite:///{copy / 'mlflow-here.db'}"]) == 0
    assert _digest(out) == before  # a new store in the copy: everything it logged is inside the copy
    client = MlflowClient(f"sqlite:///{copy / 'mlflow-here.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name(STUDY).experiment_id], SUMMARY_RUN)
    assert Path(run.info.artifact_uri.removeprefix("file://")).is_relative_to(copy)

    moved = tmp_path / "moved"
    out.rename(moved)
    assert answer([str(moved), "-q"]) == 2
    assert not out.exists()  # nothing recreated at the old path


def test_a_link_planted_in_the_summary_folder_is_neither_uploaded_nor_written_through(tmp_path):
    """Issue reproduction: ``ln -s ~/secret.txt OUT/summary/<study>/npc_q_hist.png; answer OUT`` logged the secret
    as an MLflow artifact (the summary reused an existing plot through ``is_file()``, which follows links); a link
    at a plot the summary draws was written through."""
    out = _study(tmp_path)
    secret = tmp_path / "secret.txt"
    secret.write_text("the secret")
    victim = tmp_path / "victim.png"
    victim.write_bytes(b"keep me")
    d = out / "summary" / STUDY
    (d / "npc_q_hist.png").symlink_to(secret)
    (d / f"{STUDY}.png").symlink_to(victim)
    (d / "gap_vs_npc.png").symlink_to(victim)
    assert answer([str(out), "-q"]) == 0
    assert secret.read_text() == "the secret" and victim.read_bytes() == b"keep me"
    for name in (f"{STUDY}.png", "gap_vs_npc.png"):  # the plots replaced the links with their own files
        assert not (d / name).is_symlink() and (d / name).read_bytes().startswith(b"\x89PNG")
    client = MlflowClient(default_tracking_uri(out))
    (run,) = client.search_runs([client.get_experiment_by_name(STUDY).experiment_id], SUMMARY_RUN)
    logged = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert "table.txt" in logged and "npc_q_hist.png" not in logged
    assert "the secret" not in "".join(p.read_text(errors="replace") for p in (out / "mlartifacts").rglob("*")
                                       if p.is_file())


def test_the_ray_token_is_made_private_but_a_link_there_is_not_followed(tmp_path, monkeypatch, caplog):
    """Issue reproduction: ``~/.ray/auth_token`` a link to a 0644 file elsewhere: a study chmodded the target and
    said Ray wrote it."""
    from dcl_core.study.execution.ray_env import AUTH_TOKEN, AUTH_TOKEN_PATH, protect_token_file

    monkeypatch.delenv(AUTH_TOKEN, raising=False)
    token = tmp_path / "auth_token"
    token.write_text("t0k3n")
    token.chmod(0o644)
    monkeypatch.setenv(AUTH_TOKEN_PATH, str(token))
    protect_token_file()
    assert token.stat().st_mode & 0o777 == 0o600  # Ray's own file: its owner's only

    elsewhere = tmp_path / "shared.txt"
    elsewhere.write_text("someone's file")
    elsewhere.chmod(0o644)
    link = tmp_path / "linked_token"
    link.symlink_to(elsewhere)
    monkeypatch.setenv(AUTH_TOKEN_PATH, str(link))
    with caplog.at_level("WARNING"):
        protect_token_file()
    assert elsewhere.stat().st_mode & 0o777 == 0o644  # untouched
    assert any("is a symbolic link" in r.getMessage() for r in caplog.records)


def _summary_run(out: Path):
    client = MlflowClient(default_tracking_uri(out))
    runs = client.search_runs([client.get_experiment_by_name(STUDY).experiment_id])
    (run,) = [r for r in runs if r.data.tags.get("dcl.summary") == "true"]
    return client, run


def test_a_planted_journal_cannot_forge_the_answer_or_its_note(tmp_path, capsys):
    """Issue reproduction: journal lines setting the study's verdict tags, metrics and note were replayed by
    ``sync`` ("4 operations pushed"); MLflow then showed a forged "supports the paper" and an unescaped note."""
    out = _study(tmp_path)
    assert answer([str(out), "-q"]) == 0
    client, before = _summary_run(out)
    rid = before.info.run_id
    forged = [{"op": "open", "id": "offline-x", "experiment": STUDY, "overwrite": False, "tags": {}, "time": 1},
              {"op": "tag", "run": rid, "key": "verdict", "value": "supports the paper"},
              {"op": "tag", "run": "offline-x", "key": "verdict_0", "value": "supports the paper"},
              {"op": "tag", "run": rid, "key": "mlflow.note.content",
               "value": "<img src=x onerror=alert(1)> [click](javascript:alert(1))"},
              {"op": "metrics", "run": rid, "metrics": [["verdict/std_difference_0/supports", 1.0, 0, 0]]},
              {"op": "end", "run": rid, "status": "FINISHED", "time": 2}]
    (out / "summary" / STUDY / JOURNAL_FILE).write_text("".join(json.dumps(r) + "\n" for r in forged))
    capsys.readouterr()
    assert sync([str(out)]) == 0
    printed = capsys.readouterr().out
    assert "4 not replayed" in printed and "2 operations pushed" in printed  # the open and the end
    after = client.get_run(rid)
    for key in ("verdict", "verdict_0", "mlflow.note.content"):
        assert after.data.tags[key] == before.data.tags[key]
    assert after.data.tags["verdict"] == "not resolved"
    assert "<img" not in after.data.tags["mlflow.note.content"]
    assert after.data.metrics.get("verdict/std_difference_0/supports") == 0.0


def test_an_answer_that_missed_mlflow_is_recomputed_by_sync_never_replayed(tmp_path, capsys):
    """MLflow down at the end of a study: the summary's answer is not journaled (only a marker), and ``sync``
    logs it from the study's results, as ``answer`` would."""
    from dcl_core.study.tracking import StudyTracker

    out = _study(tmp_path)
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))
    port = dead.getsockname()[1]
    dead.close()  # nothing listens there: connection refused
    d = out / "summary" / STUDY
    (d / "table.txt").write_text("a table\n")
    tracker = StudyTracker(f"http://127.0.0.1:{port}", STUDY, artifact_root=out / "mlartifacts", journal_dir=d,
                           http_retries=0, http_timeout=2).open()
    tracker.log_summary({"dcl/std": 1.5}, [d / "table.txt"], tags={"verdict": "supports the paper"})
    ops = [json.loads(line)["op"] for line in (d / JOURNAL_FILE).read_text().splitlines()]
    assert sorted(ops) == ["end", "open", "summarize"]  # no tag, metric or artifact of the answer
    capsys.readouterr()
    assert sync([str(out), "--tracking-uri", default_tracking_uri(out)]) == 0
    assert "its answer, recomputed from its results" in capsys.readouterr().out
    client, run = _summary_run(out)
    assert run.data.tags["verdict"] == "not resolved"  # the results' answer, not the one in memory
    assert "dcl/std" not in run.data.metrics or run.data.metrics["dcl/std"] != 1.5
    assert "table.txt" in {a.path for a in client.list_artifacts(run.info.run_id)}
    assert not (d / JOURNAL_FILE).exists()


def _with_options(out: Path, **changes) -> None:
    path = out / "summary" / STUDY / "study_options.json"
    options = json.loads(path.read_text())
    for key, value in changes.items():
        if key == "command":
            options["command"].update(value)
        else:
            options[key] = value
    path.write_text(json.dumps(options))


@pytest.mark.parametrize(("changes", "message"), [
    ({"command": {"design": {"first": 2, "max_seeds": 100_000, "step": 1}}}, "recorded sequential design"),
    ({"command": {"design": {"first": 2.5, "max_seeds": 5, "step": 1}}}, "recorded sequential design"),
    ({"command": {"seeds": "x"}}, "command.seeds must be a whole number"),
    ({"command": {"seeds": 0.5}}, "command.seeds must be a whole number"),
    ({"command": {"seeds": 40}, "seed_rounds": [[0, 1]]}, "disagrees with the 2 seed(s) per cell"),
    ({"command": {"set": "optim.epochs=1"}}, "command.set must be a list"),
    ({"command": {"preset": "huge"}}, "recorded preset 'huge' is not one of"),
    ({"tracking_uri": 123}, None),  # not a string: nothing recorded, the folder's own store
])
def test_every_recorded_value_is_checked_like_the_command_line(tmp_path, capsys, changes, message):
    """Issue reproduction: a recorded design with max_seeds 100000 had ``answer`` OOM-killed; ``command.seeds: 40``
    with 2 recorded seeds planned 160 trials; ``command.seeds: "x"`` and ``design.first: 2.5`` gave tracebacks."""
    out = _study(tmp_path)
    _with_options(out, **changes)
    code = answer([str(out), "-q"])
    err = capsys.readouterr().err
    if message is None:
        assert code == 0, err
        return
    assert code == 2 and "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    assert message in line, line


@pytest.mark.parametrize(("column", "value", "message"), [
    ("knn_top1", float("nan"), "knn_top1 of a finished trial must be an accuracy in [0, 100] %"),
    ("knn_top1", float("inf"), "knn_top1 must be a finite number or empty"),
    ("knn_top1", 1e302, "knn_top1 of a finished trial must be an accuracy"),
    ("q_mean", float("-inf"), "q_mean must be a finite number or empty"),
    ("temperature", "hot", "temperature must be a finite number or empty"),
    ("loss", "$\\foo{$", "loss must be a name of at most 80"),
    ("loss", "x" * 2_000_000, "loss must be a name of at most 80"),
    ("loss", "/tmp/my_loss.py:$\\foo{$", "loss must be a name of at most 80"),  # no user loss's reference either
    ("loss", "/x" * 600 + "/my_loss.py:MyLoss", "loss must be a name of at most 80"),  # one, but over 1024 chars
    ("seed", 0.5, "seed must be a whole number"),
    ("knn_top1", None, "has no column 'knn_top1'"),  # None here: the column removed
])
def test_results_rows_are_checked_before_anything_is_computed(tmp_path, capsys, column, value, message):
    """Issue reproduction: NaN/inf/text kNN, a text in the swept column, a missing column and a loss name matplotlib
    cannot render gave tracebacks; a kNN of 1e302 and a q_B of -inf were silently read as missing; a 2 MB loss
    name took minutes. Now one line each, and the table is not rewritten."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = _study(tmp_path)
    path = out / "summary" / STUDY / "results.parquet"
    rows = pq.read_table(path).to_pylist()
    for r in rows:
        if value is None:
            r.pop(column)
        elif column in ("temperature", "seed", "loss"):
            r[column] = str(r[column]) if isinstance(value, str) else float(r[column])
        else:
            r[column] = r.get(column)
    if value is not None:
        rows[0][column] = value
    pq.write_table(pa.Table.from_pylist(rows), path)
    before = path.read_bytes()
    assert answer([str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and path.read_bytes() == before
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    assert message in line and len(line) < 600, line[:600]


def test_one_damaged_study_does_not_stop_the_others_and_unknown_columns_are_kept(tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = _study(tmp_path)
    path = out / "summary" / STUDY / "results.parquet"
    rows = [{**r, "my_note": "kept"} for r in pq.read_table(path).to_pylist()]
    pq.write_table(pa.Table.from_pylist(rows), path)
    other = out / "summary" / "batch_size_sweep"
    other.mkdir()
    (other / "results.parquet").write_bytes(b"PAR1 not really")
    (other / "study_options.json").write_text(json.dumps({"command": {"script": "batch_size_sweep"}}))
    assert answer([str(out), "-q"]) == 2
    assert "=== temperature_sweep" in capsys.readouterr().out  # re-analysed after the damaged one
    assert "my_note" in pq.read_table(path).column_names  # the stored results are never rewritten


def test_answer_while_the_study_runs_says_to_wait(tmp_path, capsys):
    """Issue reproduction: ``answer`` blocked by a running study's lock said "use another --name or --output-dir"."""
    from dcl_core.study.plan.storage import study_lock

    out = _study(tmp_path)
    with study_lock(out.resolve(), STUDY):
        assert answer([str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert "is already running" in err and "wait for it to finish, then re-analyse it" in err
    assert "another --name" not in err


def test_export_to_mlflow_through_a_planted_artifact_link_is_one_line(tmp_path, capsys):
    """Issue 46, item 10: ``study export --mlflow`` where the trial run's ``backbone/`` artifact folder is a link to a
    file outside the study printed MLflow's traceback ("resolved path is outside the artifact directory"). Now one
    line, exit 2, and the file outside is untouched. A real study folder: results, the trial's real checkpoint, its
    MLflow run in the folder's own store."""
    from dcl_core.config import apply_overrides, preset, to_flat_dict
    from dcl_core.study.cli.export_command import export_main
    from dcl_core.study.tracking.mlflow_runs import TRIAL_TAG
    from dcl_core.training.builders import build_model
    from dcl_core.training.checkpoint import save_checkpoint

    out = (tmp_path / "out").resolve()
    write_table([{"trial_id": "ab_00001", "series": "dcl", "knn_top1": 33.5, "status": "ok"}], out / "summary" / "s")
    cfg = apply_overrides(preset("smoke"), {"model.width": 0.125})
    save_checkpoint({"epoch": 1, "model": build_model(cfg).state_dict(), "optimizer": {}, "scaler": {},
                     "config": to_flat_dict(cfg), "history": []},
                    out / "ray_results" / "s" / "dcl_s0_ab_00001" / "checkpoint_000000" / "checkpoint.pt")
    client = MlflowClient(tracking_uri=default_tracking_uri(out))
    experiment = client.create_experiment("s", artifact_location=(out / "mlartifacts" / "s").as_uri())
    run = client.create_run(experiment, tags={TRIAL_TAG: "ab_00001"})
    artifacts = out / "mlartifacts" / "s" / run.info.run_id / "artifacts"
    artifacts.mkdir(parents=True)
    outside = tmp_path / "precious.txt"
    outside.write_text("keep\n")
    (artifacts / "backbone").symlink_to(outside)
    code = export_main([str(out), "--best", "-o", str(tmp_path / "best.pt"), "--mlflow"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    (line,) = [x for x in err.splitlines() if x.startswith("error: ")]
    assert line == (f"error: cannot log best.pt to backbone/ of run {run.info.run_id}: Invalid path: resolved path is "
                    "outside the artifact directory")
    assert outside.read_text() == "keep\n" and outside.is_file() and not outside.is_symlink()


def test_export_to_mlflow_naming_the_folders_own_store_still_checks_where_it_writes(tmp_path, capsys):
    """``study export --mlflow --tracking-uri sqlite:///OUT/mlflow.db`` (the folder's own store, named) skipped the
    check that the store's artifact folders lie inside OUT, so ``mlartifacts/s`` linked elsewhere was written
    through; named or not, the folder's own store is checked, before anything is exported."""
    from dcl_core.study.cli.export_command import export_main
    from dcl_core.study.tracking.mlflow_runs import TRIAL_TAG

    out = (tmp_path / "out").resolve()
    write_table([{"trial_id": "ab_00001", "series": "dcl", "knn_top1": 33.5, "status": "ok"}], out / "summary" / "s")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "mlartifacts").mkdir()
    (out / "mlartifacts" / "s").symlink_to(elsewhere)
    client = MlflowClient(tracking_uri=default_tracking_uri(out))
    experiment = client.create_experiment("s", artifact_location=(out / "mlartifacts" / "s").as_uri())
    client.create_run(experiment, tags={TRIAL_TAG: "ab_00001"})
    for named in ([], ["--tracking-uri", default_tracking_uri(out)]):
        code = export_main([str(out), "--best", "-o", str(tmp_path / "best.pt"), "--mlflow", *named])
        err = capsys.readouterr().err
        assert code == 2 and "Traceback" not in err and "outside" in err, err
        assert not (tmp_path / "best.pt").exists() and list(elsewhere.iterdir()) == []




@pytest.fixture(scope="module")
def finished_study(tmp_path_factory, ray_head):
    """One finished smoke study (DCL at 2 τ), run on the suite's Ray head: its output folder and the head."""
    out = tmp_path_factory.mktemp("finished") / "out"
    proc = pyrun.run([sys.executable, str(REPO / "studies" / "temperature_sweep.py"), "--smoke", "--losses", "dcl",
                      "--output-dir", str(out), "--address", ray_head.address], capture_output=True, text=True,
                     timeout=600, cwd=REPO, env=ray_head.env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, ray_head


@pytest.mark.slow  # one smoke study on the suite's Ray head, then a command per case as a subprocess
@needs_data
@pytest.mark.parametrize(("planted", "command"), [
    (f"summary/{STUDY}/study_options.json", "answer"),
    ("mlflow.db", "answer"),
    ("mlflow.db", "resume"),
    (f"ray_results/{STUDY}/experiment_state-*.json", "resume"),
])
def test_a_fifo_planted_in_a_studys_folder_is_refused_in_seconds(finished_study, planted, command):
    """Issue 61, item 5: a FIFO at ``study_options.json`` hung ``answer``; at ``mlflow.db``, ``answer`` and
    ``--resume``; at Tune's ``experiment_state-*.json``, ``--resume``. Now one line, exit 2, within seconds, and the
    FIFO is neither opened nor replaced."""
    out, head = finished_study
    (path,) = out.glob(planted)
    kept = path.with_name(path.name + ".kept")
    path.rename(kept)
    os.mkfifo(path)
    cmd = ([sys.executable, "-m", "dcl_core.study", "answer", str(out)] if command == "answer" else
           [sys.executable, str(REPO / "studies" / "temperature_sweep.py"), "--smoke", "--losses", "dcl",
            "--output-dir", str(out), "--address", head.address, "--resume"])
    started = time.monotonic()
    try:
        proc = pyrun.run(cmd, capture_output=True, text=True, timeout=60, cwd=REPO, env=head.env)  # before: hung
        assert os.path.exists(path) and not path.is_file()  # still the FIFO: neither opened for writing nor replaced
    finally:
        path.unlink()
        kept.rename(path)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"{path} is a FIFO" in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and time.monotonic() - started < 60


def _limited_memory() -> None:
    """The command's data (heap and anonymous maps) under 2 GiB: a file read whole fails the test, not the machine."""
    resource.setrlimit(resource.RLIMIT_DATA, (2 << 30, 2 << 30))


@pytest.mark.slow  # answer and sync as subprocesses (a memory limit of their own)
@pytest.mark.parametrize(("name", "size", "command"), [
    ("study_options.json", 2_000_000_000, "answer"),
    (JOURNAL_FILE, 3_000_000_000, "sync"),
])
def test_an_options_file_or_journal_past_its_bound_is_refused_unread(tmp_path, name, size, command):
    """Issue 61, item 11: a 2 GB ``study_options.json`` (``answer``) or a 3 GB ``pending_mlflow.jsonl`` (``sync``)
    was read whole (MemoryError). Now refused by its size in one line, exit 2, before a byte of it is read (the files
    are sparse: nothing is written to the disk)."""
    out = _study(tmp_path)
    path = out / "summary" / STUDY / name
    if name == JOURNAL_FILE:
        path.write_text(json.dumps({"op": "summarize", "experiment": STUDY}) + "\n")
    os.truncate(path, size)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "dcl_core.study", command, str(out)], capture_output=True, text=True,
                          timeout=120, cwd=REPO, preexec_fn=_limited_memory)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"{path} holds more than" in errors[0] and "not read" in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and time.monotonic() - started < 60


DEEP = "[" * 30_000 + "]" * 30_000  # nested deeper than Python's parser follows; within every reader's bound


def test_json_nested_too_deep_is_read_as_damaged_by_every_reader(tmp_path, capsys):
    """Issue reproduction: a ``study_options.json`` of 100,000 nested brackets gave ``answer`` and ``--reanalyze``
    a RecursionError's traceback. Every reader of a JSON file a folder holds takes such a document as it takes any
    text that is not JSON: the record is refused in one line, the rest read as missing or damaged."""
    import pyarrow.fs

    from dcl_core.study.execution import ray_session, state_signature, trial_choice, tune_state
    from dcl_core.study.tracking import summary_run
    from dcl_core.study.tracking.journal import IDS_FILE, Journal

    out = _study(tmp_path)
    folder = out / "summary" / STUDY
    (folder / "study_options.json").write_text(DEEP)
    assert answer([str(out)]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "nested deeper than this reader follows" in errors[0] and "Traceback" not in err

    for name in (JOURNAL_FILE, IDS_FILE, summary_run.RECORD, state_signature.MANIFEST, "result.json",
                 "experiment_state-1.json", "note.json"):
        (folder / name).write_text(DEEP + "\n")
    journal = Journal(folder, STUDY)
    assert journal.read() == [] and journal.known_ids() == {}
    assert summary_run.recorded(folder) == []
    assert state_signature._read(pyarrow.fs.LocalFileSystem(), str(folder), STUDY) is None
    assert trial_choice._last_result(folder / "result.json") == {}
    assert not tune_state.readable_state([folder / "experiment_state-1.json"])
    assert ray_session._dead_session(folder / "note.json", out, STUDY) is None


def test_a_loop_of_links_or_an_overlong_name_given_as_a_folder_is_one_line_for_every_command(tmp_path, capsys):
    """Issue reproduction: ``answer``, ``sync``, ``export`` and a study given a folder whose links loop
    (``ln -s b a; ln -s a b``) printed Python's ``RuntimeError: Symlink loop`` traceback. Now one line, exit 2."""
    from dcl_core.study.cli.export_command import export_main

    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    loop = str(tmp_path / "a")
    for command in ([answer, loop], [sync, loop], [export_main, loop, "--best"],
                    [export_main, str(tmp_path), "--best", "--name", STUDY, "--storage", loop]):
        assert command[0](command[1:]) == 2, command
        err = capsys.readouterr().err
        assert err == f"error: {loop}: its symbolic links lead into a loop: not followed\n", (command, err)
    long = str(tmp_path / ("a" * 300))  # a name the filesystem cannot hold: OSError's traceback before
    for command in ([answer, long], [sync, long], [export_main, long, "--best"],
                    [export_main, str(tmp_path), "--best", "--name", STUDY, "--storage", long]):
        assert command[0](command[1:]) == 2, command
        err = capsys.readouterr().err
        assert err == f"error: {long}: a name in it is longer than its filesystem allows\n", (command, err)
