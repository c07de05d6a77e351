"""Hostile and clumsy input to the studies (issue: nothing lost, nobody in): each case exits 2 with one line
before Ray starts, and nothing outside the study's own folders is touched. Real processes, real files."""

import json
import os
import shutil
import stat
import sys
import time
from pathlib import Path

import pyrun
import pytest

from dcl_core.config import ConfigError
from dcl_core.data import resolve_data_root
from dcl_core.study.plan.storage import storage_delete, study_lock

REPO = Path(__file__).resolve().parents[3]
needs_data = pytest.mark.skipif(
    not (resolve_data_root("cifar10", None) / "train").is_dir(), reason="embedded CIFAR-10 not present"
)


def study(out, *args, timeout=120):
    cmd = [sys.executable, str(REPO / "studies" / "temperature_sweep.py"), "--smoke", "--output-dir", str(out),
           "--num-cpus", "2", *args]
    return pyrun.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)


def assert_one_line_exit_2(proc, needle):
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


@pytest.mark.slow  # runs studies/temperature_sweep.py as a subprocess (~15 CPU-s each)
@needs_data
@pytest.mark.parametrize("name", ["../..", ".", "", "../../x", "a/b", "-rf", "x" * 101])
def test_a_study_name_cannot_escape_the_output_folder(tmp_path, name):
    # --name ../.. --overwrite once emptied the folder two levels above ray_results (here: tmp_path/a/b).
    out = tmp_path / "a" / "b" / "out"
    (out / "ray_results").mkdir(parents=True)
    keep = [tmp_path / "a" / "keep.txt", tmp_path / "a" / "b" / "keep.txt", out / "ray_results" / "other" / "k"]
    for path in keep:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("precious")
    proc = study(out, f"--name={name}", "--overwrite")
    assert_one_line_exit_2(proc, "study name")
    assert all(path.read_text() == "precious" for path in keep)
    assert not (tmp_path / "x").exists() and not (tmp_path / "a" / "x").exists()


def test_overwrite_deletes_only_strictly_inside_the_storage_root(tmp_path):
    root = tmp_path / "ray_results"
    (root / "exp").mkdir(parents=True)
    for outside in (root, tmp_path, root / ".." / "x", root / "exp" / ".." / ".."):
        with pytest.raises(ConfigError, match="refusing to delete"):
            storage_delete(str(outside), str(root))
    with pytest.raises(ConfigError, match="refusing to delete"):
        storage_delete("s3://bucket/studies/../other", "s3://bucket/studies")
    with pytest.raises(ConfigError, match="refusing to delete"):
        storage_delete("s3://other-bucket/studies/exp", "s3://bucket/studies")
    storage_delete(str(root / "exp"), str(root))
    assert root.is_dir() and not (root / "exp").exists()


@pytest.mark.slow  # runs studies/temperature_sweep.py as a subprocess (~15 CPU-s each)
@needs_data
def test_bad_options_exit_2_with_one_line(tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    cases = [
        (["--set", "loss.temperature=0.2"], "--set loss.temperature: this study sets"),  # the grid would win
        (["--max-failures", "-1"], "--max-failures must be in [0, 20]"),
        (["--num-cpus", "-1"], "--num-cpus must be >= 1"),
        (["--max-concurrent", "0"], "--max-concurrent must be >= 1"),
        (["--seeds", "1000000"], "--seeds must be in [1, 1000]"),
        (["--storage", "foo://bar"], "storage foo://bar is not a filesystem Ray can use"),
        (["--storage", "hdfs://namenode/x"], "is not a filesystem Ray can use"),
        (["--workers", "2", "--cpus-per-worker", "1"], "use --cpus-per-worker 0.99"),  # 2 + 0.01 never fit 2 CPUs
        (["--cpus-per-worker", "3"], "one trial needs 3 CPUs"),
        (["--data-root", str(tmp_path / "no_data")], "CIFAR-10 not found"),
        (["--download", "--address", "127.0.0.1:9"], "--download fetches the dataset to this machine"),
    ]
    for args, needle in cases:
        t0 = time.monotonic()
        proc = study(tmp_path / "out", *args)
        assert_one_line_exit_2(proc, needle)
        assert time.monotonic() - t0 < 60, args
    proc = study(tmp_path / "a_file" / "out")
    assert_one_line_exit_2(proc, "is a file, not a folder")
    assert not (tmp_path / "out").exists()  # a refused study leaves no (empty) output folder behind


@pytest.mark.slow  # runs studies/temperature_sweep.py as a subprocess (~15 CPU-s each)
@needs_data
def test_a_second_run_of_the_same_study_into_the_same_folder_is_refused(tmp_path):
    out = tmp_path / "out"
    with study_lock(out, "temperature_sweep"):  # as a running study holds it
        proc = study(out)
        assert_one_line_exit_2(proc, "study temperature_sweep in")
        holder = json.loads((out / ".temperature_sweep.lock").read_text())
        assert holder["pid"] == os.getpid() and f'"pid": {os.getpid()}' in proc.stderr  # names the holder
    assert not (out / "ray_results").exists()
    with study_lock(out, "temperature_sweep"):  # released by the refused run, and by the holder on exit
        pass


def _smoke_spec(seeds=(0,), losses=("dcl",)):
    from dcl_core.config import preset
    from dcl_core.study import StudySpec
    from search_spaces import Grid

    return StudySpec(name="s", base=preset("smoke"), x_key="loss.temperature", x_label="tau",
                     grid={"loss.name": Grid(losses), "seed": Grid(seeds), "loss.temperature": Grid((0.1,))})


def test_resume_refuses_a_changed_study_and_stores_no_credentials(tmp_path):
    from dataclasses import replace

    from dcl_core.study import StudyOptions
    from dcl_core.study.execution.tuning import _prepare_output
    from dcl_core.study.plan.spec import tune_experiments, with_base

    spec = _smoke_spec()
    options = StudyOptions(tmp_path, tracking_uri="http://alice:s3cret@127.0.0.1:5000").resolved()
    existing = [str(tmp_path / "ray_results" / "s")]
    _prepare_output(spec, options, tune_experiments(spec), existing=[])
    stored = (tmp_path / "summary" / "s" / "study_options.json").read_text()
    assert "s3cret" not in stored and "http://***@127.0.0.1:5000" in stored
    resume = replace(options, resume=True)
    _prepare_output(spec, resume, tune_experiments(spec), existing)  # the same study: fine
    for changed, needle in ((with_base(spec, {"optim.epochs": 3}), "optim.epochs was 2, now 3"),
                            (_smoke_spec(seeds=(1,)), "can add seeds, not drop them"),
                            (_smoke_spec(losses=("dcl", "infonce")), "its grids changed"),
                            (_smoke_spec(seeds=(0, 1), losses=("dcl", "infonce")), "its grids changed")):
        with pytest.raises(ConfigError, match=needle):
            _prepare_output(changed, resume, tune_experiments(changed), existing)
    more = _smoke_spec(seeds=(0, 1, 2))  # more seeds is the one change a resume takes: a new round of them
    assert _prepare_output(more, resume, tune_experiments(more), existing) == [[0], [1, 2]]
    assert _prepare_output(more, resume, tune_experiments(more), existing) == [[0], [1, 2]]  # recorded
    with pytest.raises(ConfigError, match="can add seeds, not drop them"):
        _prepare_output(spec, resume, tune_experiments(spec), existing)
    # --overwrite clears every round the study recorded, not only the first, and starts from one round again.
    rounds = [tmp_path / "ray_results" / "s", tmp_path / "ray_results" / "s+s1-2"]
    for d in rounds:
        d.mkdir(parents=True, exist_ok=True)
    overwrite = replace(options, overwrite=True)
    assert _prepare_output(more, overwrite, tune_experiments(more), [str(rounds[0])]) == [[0, 1, 2]]
    assert not any(d.exists() for d in rounds)


def test_the_browse_hint_fits_the_store_and_hides_credentials(monkeypatch):
    from dcl_core.study.execution.results import StudyOutcome, summary_lines

    monkeypatch.delenv("MLFLOW_PORT", raising=False)

    files = [Path("r.parquet"), Path("r.csv"), Path("p.png")]
    server = summary_lines(StudyOutcome([], "table", {}, files, "s", "http://bob:tok@127.0.0.1:5000"))
    def browse(lines):
        return next(ln.strip() for ln in lines if ln.strip().startswith("browse:"))

    assert browse(server) == "browse: open http://***@127.0.0.1:5000 in a browser" and "tok" not in "".join(server)
    assert server[-1] == "table"  # the answer is the last thing printed
    local = summary_lines(StudyOutcome([], "table", {}, files, "s", "sqlite:////x/mlflow.db"))
    assert browse(local) == "browse: mlflow ui --backend-store-uri sqlite:////x/mlflow.db --host 127.0.0.1 --port 5000"


def test_the_ui_urls_port_follows_mlflow_port(monkeypatch, tmp_path):
    """`mlflow ui` serves on MLFLOW_PORT when the user set it: the printed command and the URLs use the same port
    (they said 5000 whatever the user's mlflow ui served on)."""
    from dcl_core.study.execution.results import StudyOutcome, summary_lines
    from dcl_core.study.tracking import StudyTracker

    monkeypatch.setenv("MLFLOW_PORT", "5123")
    files = [Path("r.parquet"), Path("r.csv"), Path("p.png")]
    lines = summary_lines(StudyOutcome([], "table", {}, files, "s", "sqlite:////x/mlflow.db"))
    assert any(line.strip().endswith("--host 127.0.0.1 --port 5123") for line in lines)
    tracker = StudyTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "s")
    assert tracker.runs.runs_url().startswith("http://127.0.0.1:5123/#/experiments/")
    monkeypatch.setenv("MLFLOW_PORT", "not-a-port")  # mlflow ui itself refuses it; the hint keeps MLflow's default
    assert tracker.runs.runs_url().startswith("http://127.0.0.1:5000/")
    server = StudyTracker("http://127.0.0.1:8080", "s")  # a server's own address, whatever MLFLOW_PORT says
    assert server.runs.runs_url().startswith("http://127.0.0.1:8080/#/experiments/")


@pytest.mark.slow  # runs studies/temperature_sweep.py as a subprocess (~15 CPU-s each)
@needs_data
def test_a_bad_tracking_uri_is_refused_in_seconds(tmp_path):
    for uri, needle in (("http://127.0.0.1:9", "is unreachable"), ("notauri", "not a valid MLflow tracking URI"),
                        ("foo://bar", "not a valid MLflow tracking URI")):
        t0 = time.monotonic()
        proc = study(tmp_path / "out", "--tracking-uri", uri)
        assert_one_line_exit_2(proc, needle)
        assert time.monotonic() - t0 < 60
    assert not (tmp_path / "out" / "ray_results").exists()


@pytest.mark.slow  # runs studies/temperature_sweep.py as a subprocess (~15 CPU-s each)
@needs_data  # the link is refused where the study first writes, after its data is found
def test_a_link_planted_at_the_lock_is_refused_and_its_target_untouched(tmp_path):
    """Issue reproduction: ``ln -s ~/precious.txt o/.temperature_sweep.lock`` then a (refused) ``--resume`` wrote
    the holder's JSON into the target. Now one line, exit 2, the target as it was."""
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    out = tmp_path / "o"
    out.mkdir()
    (out / ".temperature_sweep.lock").symlink_to(precious)
    proc = pyrun.run([sys.executable, str(REPO / "studies" / "temperature_sweep.py"), "--smoke", "--output-dir",
                           str(out), "--resume"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("error: ") and "symbolic link" in proc.stderr and "Traceback" not in proc.stderr
    assert precious.read_text() == "keep me"


@pytest.mark.slow  # runs studies/temperature_sweep.py as a subprocess (~15 CPU-s each)
@needs_data
@pytest.mark.parametrize("entry", ["summary", "summary/temperature_sweep", "ray_results", "mlartifacts", "mlflow.db"])
def test_a_link_planted_at_a_folder_the_study_writes_is_refused_before_anything_is_written(tmp_path, entry):
    """A link planted where the study keeps its summary, Tune state, artifacts or MLflow store would make every
    file written there land outside the output folder (``summary/`` → ``~``). Now one line, exit 2, the target
    as it was."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep me")
    out = tmp_path / "o"
    (out / entry).parent.mkdir(parents=True)
    (out / entry).symlink_to(elsewhere / "keep.txt" if entry == "mlflow.db" else elsewhere)
    proc = _study_script("--output-dir", str(out))
    assert_one_line_exit_2(proc, f"{out / entry} is a symbolic link")
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]
    assert (elsewhere / "keep.txt").read_text() == "keep me"


def test_the_lock_file_keeps_no_secret_and_is_private(tmp_path, monkeypatch):
    """Issue reproduction: the lock (left after the run) held the command line with the password, mode 0644, and
    a second run printed it."""
    monkeypatch.setattr(sys, "argv", ["studies/x.py", "--tracking-uri", "http://alice:s3cr/t#x@127.0.0.1:5000",
                                      "--name=s", "--tracking-uri=https://bob:hunter2@h/mlflow"])
    with study_lock(tmp_path, "s") as lock:
        text = lock.read_text()
        assert "s3cr" not in text and "hunter2" not in text and "t#x" not in text
        assert "http://***@127.0.0.1:5000" in text and "--tracking-uri=https://***@h/mlflow" in text
        assert stat.S_IMODE(lock.stat().st_mode) == 0o600
        with pytest.raises(ConfigError) as refused, study_lock(tmp_path, "s"):
            pass
        assert "s3cr" not in str(refused.value) and "already running" in str(refused.value)


@pytest.mark.parametrize("uri", ["http://alice:pa/ss@127.0.0.1:5000", "http://alice:pa#ss@127.0.0.1:5000",
                                 "https://alice:pa?ss@host/x?token=abc"])
def test_a_password_with_reserved_characters_is_redacted_whole(uri):
    from dcl_core.study.plan.storage import redact_uri

    shown = redact_uri(uri)
    assert "pa" not in shown.split("@")[0] and "ss" not in shown.split("@")[0] and "abc" not in shown
    assert shown.startswith(uri.split("://")[0] + "://***@")


def test_the_resume_command_printed_on_ctrl_c_redacts_credentials(monkeypatch):
    from dcl_core.study.cli.script import resume_command

    monkeypatch.setattr(sys, "argv", ["studies/temperature_sweep.py"])
    line = resume_command(["--tracking-uri", "http://alice:s3cret@127.0.0.1:5000", "--overwrite"])
    assert "s3cret" not in line and "http://***@127.0.0.1:5000" in line and line.endswith("--resume")


@pytest.mark.parametrize("password", ["pa#ss", "pa/ss", "pa?ss", "p@ss/x"])
def test_a_password_with_reserved_characters_is_not_echoed_by_the_preflight(password):
    """Issue reproduction: urllib's "Port could not be cast to integer value as 'pa'" quoted the password."""
    from dcl_core.study.tracking import preflight

    with pytest.raises(ConfigError) as err:
        preflight(f"http://alice:{password}@127.0.0.1:1", timeout=2)
    text = str(err.value)
    assert "http://***@127.0.0.1:1" in text and "alice" not in text
    assert "'pa" not in text and "ss/" not in text and "ss@" not in text and "p@" not in text


@pytest.mark.parametrize("content", ["", '{"output_dir": "/x", "spe', "[]", '{"spec": []}', '{"spec": {"base": 3}}',
                                     "\udcff"])
def test_a_damaged_options_file_makes_resume_exit_2_in_one_line(tmp_path, content):
    """Issue reproduction: study_options.json truncated, empty or ``[]`` then --resume gave a traceback."""
    from dataclasses import replace

    from dcl_core.study import StudyOptions
    from dcl_core.study.execution.tuning import _prepare_output
    from dcl_core.study.plan.spec import tune_experiments

    spec = _smoke_spec()
    options = replace(StudyOptions(tmp_path).resolved(), resume=True)
    path = tmp_path / "summary" / "s" / "study_options.json"
    path.parent.mkdir(parents=True)
    path.write_text(content, errors="surrogateescape")
    with pytest.raises(ConfigError, match=r"cannot resume: .*study_options\.json is damaged"):
        _prepare_output(spec, options, tune_experiments(spec), [str(tmp_path / "ray_results" / "s")])


def test_a_folder_at_the_lock_path_exits_in_one_line(tmp_path):
    (tmp_path / ".s.lock").mkdir()
    with pytest.raises(ConfigError, match="is a folder where a file belongs"), study_lock(tmp_path, "s"):
        pass


def _study_script(*args, cwd=REPO, env=None, timeout=300):
    return pyrun.run([sys.executable, str(REPO / "studies" / "temperature_sweep.py"), "--smoke", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=cwd, env=env)


@pytest.mark.slow  # runs studies/temperature_sweep.py as a subprocess (~15 CPU-s each)
def test_an_empty_output_dir_is_refused_and_leaves_nothing_in_the_current_folder(tmp_path):
    """Issue reproduction: ``--output-dir ''`` left a lock file in the current directory."""
    proc = _study_script("--output-dir", "", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: --output-dir is empty"), proc.stderr[-2000:]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # runs studies/temperature_sweep.py as a subprocess (~15 CPU-s each)
@needs_data  # its refusals come after the data is found
def test_a_refused_run_leaves_no_folder_or_lock_behind(tmp_path):
    """Issue reproduction: a run refused under the lock (here: nothing to resume) left an empty output folder and
    its lock file."""
    out = tmp_path / "new"
    proc = _study_script("--output-dir", str(out), "--resume")
    assert proc.returncode == 2 and "nothing to resume" in proc.stderr, proc.stderr[-2000:]
    assert not out.exists()
    existing = tmp_path / "existing"
    (existing / "keep.txt").parent.mkdir()
    (existing / "keep.txt").write_text("x")
    proc = _study_script("--output-dir", str(existing), "--resume")
    assert proc.returncode == 2 and sorted(p.name for p in existing.iterdir()) == ["keep.txt"]


def test_resuming_another_studys_folder_names_the_script_that_ran_it(tmp_path):
    """Issue reproduction: running another study's script under this one's name was refused with a message that
    blamed "a changed --set"."""
    from dataclasses import replace

    from dcl_core.study import StudyOptions
    from dcl_core.study.execution.tuning import _prepare_output
    from dcl_core.study.plan.spec import tune_experiments

    spec = _smoke_spec()
    ran = replace(StudyOptions(tmp_path).resolved(), command={"script": "temperature_sweep"})
    _prepare_output(spec, ran, tune_experiments(spec), existing=[])
    other = replace(ran, resume=True, command={"script": "batch_size_sweep"})
    with pytest.raises(ConfigError, match=r"was run by studies/temperature_sweep\.py, not studies/batch_size_sweep"):
        _prepare_output(spec, other, tune_experiments(spec), [str(tmp_path / "ray_results" / "s")])
    # a copy of the same script (its own grid, the same name): told apart by the file that ran
    copy = replace(ran, resume=True, command={"script": "temperature_sweep", "script_path": "/home/me/my_sweep.py"})
    with pytest.raises(ConfigError, match=r"was run by studies/temperature_sweep\.py, not /home/me/my_sweep\.py"):
        _prepare_output(spec, copy, tune_experiments(spec), [str(tmp_path / "ray_results" / "s")])
    elsewhere = {"script": "temperature_sweep", "script_path": "/another/clone/studies/temperature_sweep.py"}
    _prepare_output(spec, replace(ran, resume=True, command=elsewhere), tune_experiments(spec),
                    [str(tmp_path / "ray_results" / "s")])  # the same script in another checkout: resumed


@pytest.mark.slow  # runs studies/temperature_sweep.py as a subprocess (~15 CPU-s each)
@pytest.mark.skipif(not (resolve_data_root("cifar10", None) / "train").is_dir(), reason="embedded CIFAR-10 absent")
@pytest.mark.parametrize(("args", "needle"), [
    (["--set", "optim.batch_size=4096"], "give no full batch of 4096"),
    (["--set", "device=cuda"], "no usable CUDA device"),
    (["--tracking-uri", "sqlite:///{tmp}/notes.txt"], "notes.txt is not an SQLite database"),
    (["--tracking-uri", "databricks"], "no Databricks configuration"),
    (["--storage", "{tmp}/notes.txt"], "is a file, not a folder"),
    (["--set", "output_dir={tmp}/elsewhere"], "--set output_dir: a study gives every trial its own folder"),
    (["--set", "data.root="], "data.root is empty; name one, or leave data.root out for its default"),
    (["--set", "data.image_size=1024", "--set", "data.train_per_class=5000"], "more than this machine's memory"),
])
def test_what_a_single_run_checks_a_study_checks_before_ray(tmp_path, args, needle):
    """Issue reproductions: these started Ray and failed a minute later with Ray's tracebacks (or were silently
    ignored: output_dir, an empty data.root). Now exit 2, one line, seconds, nothing started."""
    if torch_cuda_available() and "device=cuda" in args:
        pytest.skip("this machine has CUDA")
    (tmp_path / "notes.txt").write_text("not a database\n")
    args = [a.format(tmp=tmp_path) for a in args]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DATABRICKS")} | {"HOME": str(tmp_path)}
    started = time.monotonic()
    proc = _study_script("--output-dir", str(tmp_path / "o"), *args, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "Started a local Ray instance" not in proc.stderr
    assert time.monotonic() - started < 60 and not (tmp_path / "o").exists()


def torch_cuda_available():
    import torch

    return torch.cuda.is_available()


@pytest.mark.slow  # waits out network timeouts (20 s for gs://) and a Ray attach
@pytest.mark.parametrize(("args", "needle", "limit"), [
    pytest.param(["--storage", "gs://no-such-bucket-dcl-test/studies"], "did not answer within 20 s", 60,
                 marks=needs_data),  # storage is checked after the data
    (["--address", "127.0.0.1:1"], "no Ray cluster answers at 127.0.0.1:1", 30),
    (["--address", "localhost"], "expected HOST:PORT", 30),
])
def test_unreachable_storage_and_cluster_addresses_exit_2_in_bounded_time(tmp_path, args, needle, limit):
    """Issue reproductions: ``--storage gs://no-such-bucket/…`` hung >= 590 s with no output, inside the lock;
    ``--address 127.0.0.1:1`` retried >= 200 s after creating the output folder."""
    started = time.monotonic()
    proc = _study_script("--output-dir", str(tmp_path / "o"), *args, timeout=limit + 60)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], proc.stderr[-2000:]
    assert time.monotonic() - started < limit and not (tmp_path / "o").exists()


@pytest.mark.slow  # waits out Ray's 20 s of retries against the suite's Ray head
def test_a_cluster_refusing_the_drivers_token_is_one_line(tmp_path, ray_head):
    """Issue reproduction: a study attached to a token cluster from a shell whose token is not the cluster's (or
    that has none and RAY_AUTH_MODE unset) printed Ray's "Failed to get cluster ID" for 20 s, then a traceback.
    With the cluster's token at hand and no RAY_AUTH_MODE, a study attaches: every study on ``ray_head`` does."""
    env = ray_head.env | {"RAY_AUTH_TOKEN": "0" * 64}  # another cluster's token: Ray takes it before the file
    proc = _study_script("--output-dir", str(tmp_path / "o"), "--address", ray_head.address, env=env, timeout=200)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "refused this driver's token" in errors[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


@pytest.mark.slow  # runs the smoke study (real Ray)
@pytest.mark.skipif(not (resolve_data_root("cifar10", None) / "train").is_dir(), reason="embedded CIFAR-10 absent")
def test_a_damaged_tune_state_makes_resume_exit_2_before_anything_runs(tmp_path, ray_head):
    """Issue reproduction: a half-truncated ray_results/<study>/experiment_state-*.json turned --resume into a trial
    with params {} (full CIFAR-10, ResNet-18, 200 epochs) after a Tune traceback, with an MLflow run left
    RUNNING. Now: one line, exit 2, and nothing started."""
    out = tmp_path / "o"
    proc = _study_script("--output-dir", str(out), "--losses", "dcl", "--address", ray_head.address, env=ray_head.env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    exp_dir = out / "ray_results" / "temperature_sweep"
    (state,) = sorted(exp_dir.glob("experiment_state-*.json"))
    text = state.read_text()
    results = {p: p.read_bytes() for p in exp_dir.glob("*/result.json")}
    state.write_text(text[: len(text) // 2])
    # The study kept a copy of Tune's last readable state (a full disk cuts Tune's save short): put back, resumed,
    # nothing retrained.
    proc = _study_script("--output-dir", str(out), "--losses", "dcl", "--address", ray_head.address, "--resume",
                         env=ray_head.env)
    assert proc.returncode == 0 and "put back its last readable copy" in proc.stderr, proc.stderr[-3000:]
    assert {p: p.read_bytes() for p in exp_dir.glob("*/result.json")} == results
    # Without that copy: one line, exit 2.
    for state in exp_dir.glob("experiment_state-*.json"):  # the resume wrote its own state beside the first
        state.write_text(state.read_text()[:1000])
    shutil.rmtree(exp_dir / ".dcl_state_backup")
    started = time.monotonic()
    proc = _study_script("--output-dir", str(out), "--losses", "dcl", "--address", ray_head.address, "--resume",
                         env=ray_head.env)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot resume: Tune's saved state in" in errors[0] and "damaged" in errors[0]
    assert "Traceback" not in proc.stderr and time.monotonic() - started < 60
