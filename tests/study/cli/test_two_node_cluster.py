"""A real two-node Ray cluster: ``studies/cluster/two_node.sh`` builds two network namespaces joined by a veth pair
(as root), starts a Ray head with an MLflow server in one and a Ray worker in the other, submits the smoke
temperature study with docs/cluster.md's ``ray job submit`` line and kills the worker node mid-study. The results must
equal an uninterrupted single-machine run of the same study, MLflow must hold one finished run per trial, and
nothing of the cluster may outlive the script, on success or on Ctrl-C.

Needs root and network namespaces: without them the tests skip with the reason, except under ``CI=true``, where
they fail (CI runs as root on a machine that has them)."""

import contextlib
import importlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyrun
import pytest
from mlflow.tracking import MlflowClient

from dcl_core.data import resolve_data_root
from dcl_core.study import summary_dir
from dcl_core.study.analysis.tables import read_table

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "studies" / "cluster" / "two_node.sh"
pytestmark = [
    pytest.mark.skipif(not (resolve_data_root("cifar10", None) / "train").is_dir(),
                       reason="embedded CIFAR-10 not present"),
    # Under pytest-xdist, one worker: the module's one cluster_run, and two clusters at once would clash (the
    # namespaces' fixed addresses); with test_ray_job_submit.py's heads (/tmp/ray/ray_current_cluster) as well.
    pytest.mark.xdist_group("ray_heads"),
]
# Measured per run, not properties of the study: they differ between any two runs.
UNSTABLE = {"trial_id", "images_per_s"}


def _cluster_module(name: str):
    """A module of ``studies/cluster/``, imported as ``two_node.py`` imports it (the checkout first on sys.path)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module(f"studies.cluster.{name}")


def _missing_capability() -> str | None:
    if sys.platform != "linux":
        return "network namespaces are Linux only"
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    if shutil.which("ip") is None:
        return "needs the `ip` command (iproute2)"
    probe = f"dclprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    return None


def _require_capability() -> None:
    reason = _missing_capability()
    if reason and os.environ.get("CI"):
        pytest.fail(f"CI must run the two-node cluster test: {reason}")
    if reason:
        pytest.skip(reason)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
    return env | {"PYTHON": sys.executable, "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}"}


def _leftovers(first_line: str) -> list[str]:
    """What of that run is still here: its namespaces, or processes naming its Ray temp folder or work folder."""
    found = re.search(r"namespace (\S+)\), worker .* \(namespace (\S+)\).*work folder (\S+); Ray temp folders (\S+)",
                      first_line)
    assert found, first_line
    head_ns, worker_ns, work, temp = found.groups()
    left = [ns for ns in (head_ns, worker_ns) if ns in subprocess.run(["ip", "netns", "list"], capture_output=True,
                                                                      text=True).stdout.split()]
    links = subprocess.run(["ip", "link", "show"], capture_output=True, text=True).stdout
    left += [f"link {ns}" for ns in (head_ns, worker_ns) if f" {ns}@" in links or f" {ns}:" in links]
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if temp in cmdline or work in cmdline:
            left.append(f"pid {proc.name}: {cmdline[:200]}")
    return left


@pytest.fixture(scope="module")
def cluster_run(tmp_path_factory):
    _require_capability()
    work = tmp_path_factory.mktemp("two_node") / "run"
    proc = subprocess.run(["bash", str(SCRIPT), "--kill-worker-after", "20", "--work-dir", str(work)],
                          cwd=tmp_path_factory.getbasetemp(), env=_env(), capture_output=True, text=True, timeout=1200)
    return proc, work


@pytest.mark.slow  # the two-node cluster
def test_a_study_on_two_nodes_survives_losing_its_worker(cluster_run):
    proc, _ = cluster_run
    out = proc.stdout
    assert proc.returncode == 0, out[-4000:] + proc.stderr[-3000:]
    assert "== 2 nodes ran the trials" in out and "198.51.100.2 (0 trials)" not in out
    assert re.search(r"== killed the worker node 198\.51\.100\.2 .* after \d+ epochs reported", out)
    assert re.search(r"retried on the head from its checkpoint, epochs \d+-10", out)
    assert "DCL flatter across τ than InfoNCE:" in out  # the study's verdict, printed through the job's console
    # One seed: no interval (and never a zero-width one).
    assert not re.search(r"CI \[([+-]?[\d.]+), \1\]", out), out[-3000:]
    assert "Job '" in out and "' succeeded" in out
    assert _leftovers(next(line for line in out.splitlines() if line.startswith("== 2 nodes: head"))) == []


@pytest.mark.slow  # the two-node cluster and a local study
def test_its_results_equal_an_uninterrupted_single_machine_run(cluster_run, tmp_path):
    proc, work = cluster_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    job = _cluster_module("job")
    command = job.study_command(resolve_data_root("cifar10", None), tmp_path / "local", job.STUDY_ARGS)
    local = pyrun.run([sys.executable, *command[1:], "--num-cpus", "2"], cwd=REPO, capture_output=True,
                      text=True, timeout=900)
    assert local.returncode == 0, local.stderr[-3000:]

    def rows(output_dir):
        table = read_table(summary_dir(output_dir, job.EXPERIMENT) / "results.parquet")
        return {(r["loss"], r["temperature"], r["seed"]): {k: v for k, v in r.items() if k not in UNSTABLE}
                for r in table}

    cluster, single = rows(work / "outputs"), rows(tmp_path / "local")
    assert len(cluster) == 4 and cluster.keys() == single.keys()
    assert cluster == single  # every metric to the bit, the killed-and-retried trial's included


@pytest.mark.slow  # the two-node cluster
def test_mlflow_holds_one_finished_run_per_trial(cluster_run):
    proc, work = cluster_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    client = MlflowClient(f"sqlite:///{work / 'mlflow' / 'mlflow.db'}")  # the cluster's server's store
    experiment = client.get_experiment_by_name("temperature_sweep")
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "trial_id" in r.data.tags]  # the study's figure has a run too
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    assert len(children) == 4 and len({r.info.run_name for r in children}) == 4
    assert all(r.info.status == "FINISHED" for r in children)
    for run in children:  # the retried trial's epochs once each, not its retrained ones twice
        steps = [m.step for m in client.get_metric_history(run.info.run_id, "train/loss")]
        assert steps == list(range(1, 11)), (run.info.run_name, steps)


@pytest.mark.slow  # builds the two-node cluster
def test_a_closed_terminal_tears_down_its_own_cluster_whatever_follows_and_a_second_run_is_refused(tmp_path):
    """SIGHUP (the terminal closed) mid-run stops it like Ctrl-C (exit 129); SIGTERM, Ctrl-C and SIGTERM again during
    the teardown do not cut it short; nothing of the cluster is left and nothing else is touched."""
    _require_capability()
    bystander = subprocess.Popen(["sleep", "600"])  # another process of this machine
    # Two runs started at once on one empty folder: both pass the emptiness check, one claims the folder.
    runs = [subprocess.Popen(["bash", str(SCRIPT), "--work-dir", str(tmp_path / "run")], cwd=tmp_path, env=_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        deadline = time.monotonic() + 120
        while all(r.poll() is None for r in runs) and time.monotonic() < deadline:
            time.sleep(0.2)
        losers = [r for r in runs if r.poll() is not None]
        assert len(losers) == 1, "neither run was refused"
        loser_err = losers[0].stderr.read()
        assert losers[0].returncode == 2 and len(loser_err.strip().splitlines()) == 1, loser_err
        assert "is being used by another run" in loser_err or "is not a new or empty folder" in loser_err
        proc = next(r for r in runs if r is not losers[0])
        first = proc.stdout.readline()  # printed once both nodes are up
        assert first.startswith("== 2 nodes: head"), first + proc.stderr.read()[-3000:]
        time.sleep(3)
        proc.send_signal(signal.SIGHUP)
        said = [proc.stderr.readline() for _ in range(1)]
        while "tearing the cluster down" not in said[-1] and said[-1] and len(said) < 200:
            said.append(proc.stderr.readline())
        assert "two_node: stopped (SIGHUP); tearing the cluster down" in said[-1], "".join(said)[-3000:]
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGTERM):  # impatient, during the teardown
            time.sleep(0.3)
            proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 129, "".join(said) + stderr[-3000:]
        assert "Traceback" not in "".join(said) + stderr
        assert _leftovers(first) == []
        assert bystander.poll() is None
    finally:
        for p in (*runs, bystander):
            if p.poll() is None:
                p.kill()


def test_a_signal_the_moment_a_namespace_exists_leaks_no_namespace(tmp_path, monkeypatch):
    """Ctrl-C as ``ip netns add`` returns: the namespace was recorded before it was made, so the teardown removes it."""
    _require_capability()
    netns = _cluster_module("netns")
    cluster = netns.Cluster(tmp_path / "w")
    made = netns._ip

    def interrupted(*args: str) -> None:
        made(*args)
        if args[:2] == ("netns", "add"):
            raise KeyboardInterrupt  # as if Ctrl-C arrived the moment `ip` returned

    monkeypatch.setattr(netns, "_ip", interrupted)
    try:
        with pytest.raises(KeyboardInterrupt):
            cluster.create_network()
    finally:
        cluster.close()
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert cluster.head_ns not in names and cluster.worker_ns not in names


def _ctrl_c_reaches_it() -> None:
    """As in a terminal: a suite started as a background job (``cmd &`` in a script) ignores SIGINT, and its
    children would inherit that (Python then keeps it ignored until the script's own handler takes over)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_until_its_checks_begin(proc: subprocess.Popen, timeout_s: float = 120.0) -> None:
    """Until the script's own checks are under way: numpy mapped into the process (its Ctrl-C-deferred import of
    dcl_core.data, past Python's start and the script's own imports). Counting from the start let Python's start
    alone, under load, outlast 0.5 s: a Ctrl-C there kills any Python program before it has a handler."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            if "/numpy/" in Path(f"/proc/{proc.pid}/maps").read_text():
                return
        time.sleep(0.002)
    raise AssertionError(f"the script never imported numpy (exit status {proc.poll()})")


@pytest.mark.slow  # runs the two-node cluster script
@pytest.mark.parametrize("after_s", [0.0, 0.5, 2.0])  # in its deferred import, then its study's --dry-run
def test_ctrl_c_before_the_cluster_is_built_exits_130_in_one_line(tmp_path, after_s):
    """Pressed while the script checks the study's options (its --dry-run, seconds): no traceback, no namespace."""
    _require_capability()
    proc = subprocess.Popen(["bash", str(SCRIPT), "--work-dir", str(tmp_path / "w")], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_reaches_it)
    _wait_until_its_checks_begin(proc)
    time.sleep(after_s)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err[-3000:]
    # A fast machine may have begun the cluster (the script execs python: its pid names the namespaces).
    assert "interrupted before the cluster was built" in err or "tearing the cluster down" in err, err
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    assert not {f"dcl{proc.pid}h", f"dcl{proc.pid}w"} & set(names)
    if out.startswith("== 2 nodes: head"):
        assert _leftovers(out.splitlines()[0]) == []


@pytest.mark.parametrize("module", ["studies.cluster.job", "studies.cluster.netns"])
def test_ctrl_c_during_the_scripts_own_imports_is_the_same_one_line(module):
    """The window before main's checks: a Ctrl-C delivered while two_node.py imports its modules (needs no root)."""
    interrupt_at_import = (
        "import builtins, os, runpy, signal, sys\n"
        "real = builtins.__import__\n"
        "def hook(name, *args, **kwargs):\n"
        f"    if name == {module!r}:\n"
        "        os.kill(os.getpid(), signal.SIGINT)\n"
        "    return real(name, *args, **kwargs)\n"
        "builtins.__import__ = hook\n"
        f"sys.argv = [{str(SCRIPT.with_suffix('.py'))!r}, '--help']\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", interrupt_at_import], capture_output=True, text=True, timeout=60,
                          preexec_fn=_ctrl_c_reaches_it)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert proc.stderr == "two_node: interrupted before the cluster was built; nothing to tear down\n"
    assert proc.stdout == ""


@pytest.mark.slow  # runs the two-node cluster script
@pytest.mark.parametrize(("args", "message"), [
    (["--kill-worker-after", "1000"], "--kill-worker-after must be between 1 and"),
    (["--", "--seeds", "two"], "the study's options are refused"),
])
def test_bad_options_exit_2_in_one_line_before_any_namespace(tmp_path, args, message):
    proc = subprocess.run(["bash", str(SCRIPT), "--work-dir", str(tmp_path / "w"), *args], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)
    if os.geteuid() != 0:
        assert proc.returncode == 2 and "run as root" in proc.stderr
        return
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not (tmp_path / "w").exists()


@pytest.mark.slow  # runs the two-node cluster script
def test_a_non_empty_work_folder_is_refused(tmp_path):
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "results.csv").write_text("earlier run\n")
    proc = subprocess.run(["bash", str(SCRIPT), "--work-dir", str(tmp_path / "w")], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert ("is not a new or empty folder" if os.geteuid() == 0 else "run as root") in proc.stderr
    assert (tmp_path / "w" / "results.csv").read_text() == "earlier run\n"


def _plant(experiment_dir: Path, trials: dict[str, list[tuple[str, int]]]) -> None:
    for name, lines in trials.items():
        (experiment_dir / name).mkdir(parents=True)
        (experiment_dir / name / "result.json").write_text(
            "".join(f'{{"node_ip": "{ip}", "epoch": {epoch}, "training_iteration": {epoch}}}\n' for ip, epoch in lines))


@pytest.mark.parametrize(("head_epochs", "verdict"), [
    (range(7, 11), None),  # continued after its last checkpoint (epoch 6)
    (range(1, 11), "was not retried from its checkpoint"),  # restarted from scratch
    (range(7, 9), "was not retried from its checkpoint"),  # never finished
    ((), "was not retried from its checkpoint"),  # never ran again
])
def test_the_retry_check_tells_a_resumed_trial_from_a_restarted_one(tmp_path, head_epochs, verdict):
    """The script's own check, on planted Tune results (the cluster test sees only the case that happened)."""
    job, netns = _cluster_module("job"), _cluster_module("netns")
    run = job.Run(type("C", (), {"work": tmp_path})(), trials=2, epochs=10, kill_after=5)
    head, worker = netns.HEAD_IP, netns.WORKER_IP
    _plant(run.experiment_dir, {"a": [(head, e) for e in range(1, 11)],
                                "b": [(worker, e) for e in range(1, 7)] + [(head, e) for e in head_epochs]})
    run.killed = {"b": 6}
    failed = run._check_retried(job.trial_lines(run.experiment_dir))
    assert (failed == []) if verdict is None else (len(failed) == 1 and verdict in failed[0])
    run.killed = {}
    assert "the worker was never killed" in run._check_retried(job.trial_lines(run.experiment_dir))[0]
