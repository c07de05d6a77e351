"""A real two-node Ray cluster on one Linux machine, and a study submitted to it (optionally losing a node).

Does a study submitted with docs/cluster.md's `ray job submit` line run across nodes that have their own addresses,
under Ray's token auth, with MLflow on a server, and does it survive its worker node dying mid-study? As root,
two network namespaces joined by a veth pair are two hosts to Ray:

    sudo bash studies/cluster/two_node.sh                           # 2 nodes, the smoke study: ~2 min
    sudo bash studies/cluster/two_node.sh --kill-worker-after 20    # ... the worker node killed mid-study: ~3 min

1. Namespaces ``dcl<pid>h`` (head) and ``dcl<pid>w`` (worker) and a veth pair between them, addressed
   198.51.100.1 and .2 (TEST-NET-2, a documentation range) with no route anywhere else: the cluster's traffic
   stays inside the two namespaces.
2. Token auth as docs/cluster.md's recipe sets it up: ``RAY_AUTH_MODE=token``, ``ray get-auth-token --generate`` in a
   home folder of its own (the token both nodes read), mode 600.
3. In the head namespace: ``ray start --head`` (with its dashboard, 1 CPU) and an ``mlflow server``; in the
   worker namespace: ``ray start --address 198.51.100.1:6379`` (1 CPU). It waits until Ray lists 2 alive nodes.
4. In the head namespace, docs/cluster.md's line: ``ray job submit --address http://198.51.100.1:8265 --working-dir
   <checkout> -- python studies/temperature_sweep.py --smoke --seeds 1 --set optim.epochs=10 --data-root ...
   --output-dir ... --tracking-uri http://198.51.100.1:5000`` (4 trials, one per node at a time; 10
   epochs, so that a trial is killed between two of its checkpoints rather than before its first).
5. ``--kill-worker-after N``: once the trials have reported N epochs in all (Tune's result files) and a trial on
   the worker is mid-way (2 epochs done, 3 to go), every process of the worker namespace gets SIGKILL: the node
   is lost as a machine is when it powers off.
6. Checks (exit 1 if any fails): the job succeeded; every trial finished all its epochs; trials ran on both
   nodes (each trial's ``node_ip`` in Tune's results); each trial that was on the killed node continued on the
   head from the epoch after its last checkpoint (retried from its checkpoint, not from scratch).
7. Teardown, also on Ctrl-C, SIGTERM or failure: SIGTERM then SIGKILL to every process in its own two namespaces
   (nothing else on the machine), ``ip netns del`` (which removes the veth pair), its Ray temp folders.

Exit codes: 0 all checks hold, 1 a check failed, 2 it cannot run here (not root, no network namespaces, bad
option), 130 Ctrl-C, 143 SIGTERM. Outputs stay in ``--work-dir``: ``outputs/`` (the study), ``mlflow/`` (the
server's store), ``logs/``. Arguments after ``--`` replace the study's options (``--seeds 1 --set
optim.epochs=10``). What it cannot show: the "shared" filesystem both nodes use is this machine's own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
# dcl_core is imported where it is used (it imports torch: seconds), a Ctrl-C held until the import is done.

HEAD_IP, WORKER_IP, PREFIX = "198.51.100.1", "198.51.100.2", 24
GCS_PORT, DASHBOARD_PORT, MLFLOW_PORT = 6379, 8265, 5000
STUDY, EXPERIMENT = "studies/temperature_sweep.py", "temperature_sweep"
# 4 trials of 10 epochs of 800 images: a trial must outlast a new trial process's start on the worker (runtime env,
# torch's import: 20-30 s on a loaded machine), or Tune gives the waiting trial to the head's finished, reusable
# one, again and again, and the worker never trains (seen with 400 images under CI's load).
STUDY_ARGS = ("--seeds", "1", "--set", "optim.epochs=10", "--set", "data.train_per_class=80")
# A node joins in ~10 s on an idle machine; CI's two cores also run other tests' studies. A process that exits is
# reported at once, so the long bound costs only a hang's wait.
JOIN_TIMEOUT_S, JOB_TIMEOUT_S, PROBE_EVERY_S = 600, 1200, 2.0
# The probe: GET argv[1] with the bearer token in the file argv[2] (Ray's token auth), the body to stdout.
HTTP_GET = ("import sys, urllib.request; token = open(sys.argv[2]).read().strip(); "
            "request = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + token}); "
            "sys.stdout.write(urllib.request.urlopen(request, timeout=10).read().decode())")
CLAIM = ".two_node"  # in the work folder: this run owns it
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class UnusableError(Exception):
    """This machine or these options cannot run the cluster: one line, exit 2."""


class StoppedError(Exception):
    """SIGTERM or SIGHUP (the terminal closed), handled like Ctrl-C; ``args[0]`` is the signal's number."""


# Stop the run and tear the cluster down: Ctrl-C (KeyboardInterrupt), and these, each with its exit status.
STOP_SIGNALS = {signal.SIGTERM: 143, signal.SIGHUP: 129}


def study_command(data_root: Path, output_dir: Path, study_args: tuple[str, ...]) -> list[str]:
    """The study's command line, as the job runs it (and as a single-machine run of the same study would)."""
    return ["python", STUDY, "--smoke", *study_args, "--data-root", str(data_root), "--output-dir", str(output_dir)]


def trial_lines(experiment_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Every trial's reported epochs so far (Tune's ``result.json``, one JSON line per epoch; a line being written
    is skipped)."""
    trials: dict[str, list[dict[str, Any]]] = {}
    for result in sorted(experiment_dir.glob("*/result.json")):
        lines = []
        for line in result.read_text().splitlines():
            try:
                lines.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        trials[result.parent.name] = lines
    return trials


def epoch_of(line: dict[str, Any]) -> int:
    """The epoch of a line of Tune's ``result.json``."""
    return int(line.get("epoch", line["training_iteration"]))


class Cluster:
    """Two namespaces, their veth pair and every process started in them; :meth:`close` removes all of it."""

    def __init__(self, work: Path) -> None:
        tag = f"dcl{os.getpid()}"
        self.head_ns, self.worker_ns = f"{tag}h", f"{tag}w"
        self.work, self.logs = work, work / "logs"
        self.home = work / "home"  # HOME of every process here: the Ray token both nodes read
        # Ray's temp folders hold its sockets (a path of at most 107 bytes): short ones under /tmp.
        self.temp = Path(tempfile.mkdtemp(prefix=f"{tag}-"))
        self.procs: list[subprocess.Popen] = []
        self.created: list[str] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "MLFLOW_"))}
        self.env |= {"HOME": str(self.home), "RAY_AUTH_MODE": "token", "PYTHONUNBUFFERED": "1",
                     # MLflow 3's server otherwise starts 8 job consumers (GenAI jobs, unused by a study), each
                     # importing MLflow: ~12 CPU-seconds on a head of 1 CPU
                     "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
                     # The job's `python` is this one, also under sudo (which resets PATH).
                     "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
        self.ray = str(Path(sys.executable).with_name("ray"))

    # -- network --------------------------------------------------------------------------------------------
    def create_network(self) -> None:
        """Create the two namespaces and the veth pair between them, addressed."""
        for ns in (self.head_ns, self.worker_ns):
            self.created.append(ns)  # before `ip` makes it: a signal just after would otherwise leak it
            _ip("netns", "add", ns)
        _ip("link", "add", self.head_ns, "type", "veth", "peer", "name", self.worker_ns)
        for ns, addr in ((self.head_ns, HEAD_IP), (self.worker_ns, WORKER_IP)):
            _ip("link", "set", ns, "netns", ns)  # each end named after the namespace it moves into
            _ip("-n", ns, "addr", "add", f"{addr}/{PREFIX}", "dev", ns)
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", ns, "link", "set", ns, "up")

    def exec_in(self, ns: str, cmd: list[str]) -> list[str]:
        """``cmd`` run inside the namespace ``ns``."""
        return ["ip", "netns", "exec", ns, *cmd]

    # -- processes ------------------------------------------------------------------------------------------
    def start(self, ns: str, name: str, cmd: list[str], **kwargs: Any) -> subprocess.Popen:
        """A long-running process in ``ns``, in its own session (Ctrl-C reaches this script, which stops it)."""
        self.logs.mkdir(parents=True, exist_ok=True)
        out = kwargs.pop("stdout", None) or open(self.logs / f"{name}.log", "w")  # noqa: SIM115 (kept open)
        proc = subprocess.Popen(self.exec_in(ns, cmd), env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, **kwargs)
        self.procs.append(proc)
        return proc

    def run_in(self, ns: str, cmd: list[str], timeout: float = 60) -> subprocess.CompletedProcess:
        """Run ``cmd`` in the namespace ``ns`` to the end, its output captured."""
        return subprocess.run(self.exec_in(ns, cmd), env=self.env, capture_output=True, text=True, timeout=timeout)

    def start_ray(self) -> None:
        """Start Ray's head and worker nodes with token auth; return once both are alive."""
        (self.home / ".ray").mkdir(parents=True, exist_ok=True)
        token = self.run_in(self.head_ns, [self.ray, "get-auth-token", "--generate"])
        if token.returncode != 0:
            raise RuntimeError(f"ray get-auth-token --generate failed: {_last_line(token.stderr)}")
        (self.home / ".ray" / "auth_token").chmod(0o600)
        head = self.start(self.head_ns, "ray_head", [
            self.ray, "start", "--head", "--node-ip-address", HEAD_IP, "--port", str(GCS_PORT),
            "--dashboard-host", HEAD_IP, "--dashboard-port", str(DASHBOARD_PORT), "--num-cpus", "1",
            "--temp-dir", str(self.temp / "h"), "--disable-usage-stats", "--block"])
        self.wait_for(self.head_ns, self.http_probe(f"{self.dashboard}/api/version"), "the head's job server",
                      proc=head)
        worker = self.start(self.worker_ns, "ray_worker", [
            self.ray, "start", "--address", f"{HEAD_IP}:{GCS_PORT}", "--node-ip-address", WORKER_IP,
            "--num-cpus", "1", "--temp-dir", str(self.temp / "w"), "--disable-usage-stats", "--block"])
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        while self.alive_nodes() != {HEAD_IP, WORKER_IP}:
            for name, proc in (("ray_head", head), ("ray_worker", worker)):
                if proc.poll() is not None:
                    raise RuntimeError(f"`ray start` of the {name[4:]} exited {proc.returncode} before the worker "
                                       f"joined: {self.last_log_line(name)} (logs: {self.logs})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not join within {JOIN_TIMEOUT_S} s (logs: {self.logs})")
            time.sleep(PROBE_EVERY_S)

    def start_mlflow(self) -> str:
        """Start an MLflow server on the head node; its URI once it answers."""
        store = self.work / "mlflow"
        store.mkdir(parents=True, exist_ok=True)
        self.start(self.head_ns, "mlflow_server", [
            sys.executable, "-m", "mlflow", "server", "--host", HEAD_IP, "--port", str(MLFLOW_PORT),
            "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}", "--artifacts-destination",
            str(store / "artifacts"), "--workers", "1", "--allowed-hosts", f"{HEAD_IP},{HEAD_IP}:{MLFLOW_PORT}"])
        uri = f"http://{HEAD_IP}:{MLFLOW_PORT}"
        probe = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)"
        self.wait_for(self.head_ns, [sys.executable, "-c", probe, f"{uri}/health"], "the MLflow server")
        return uri

    @property
    def dashboard(self) -> str:
        """The head's dashboard (job server) address."""
        return f"http://{HEAD_IP}:{DASHBOARD_PORT}"

    def wait_for(self, ns: str, probe: list[str], what: str, timeout: float = JOIN_TIMEOUT_S,
                 proc: subprocess.Popen | None = None) -> None:
        """Wait until ``probe`` succeeds in ``ns``; RuntimeError after ``timeout`` seconds or once ``proc`` (the
        process that should answer) has exited."""
        deadline = time.monotonic() + timeout
        while self.run_in(ns, probe).returncode != 0:
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"{what} exited {proc.returncode} before it answered (logs: {self.logs})")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not answer within {timeout:.0f} s (logs: {self.logs})")
            time.sleep(PROBE_EVERY_S)

    def http_probe(self, url: str) -> list[str]:
        """A GET of ``url`` with the cluster's token, printing the body: a bare Python, ~0.05 CPU-seconds (the
        ``ray`` CLI imports Ray, ~3 CPU-seconds a call, which starved a starting node on a loaded machine)."""
        return [sys.executable, "-c", HTTP_GET, url, str(self.home / ".ray" / "auth_token")]

    def last_log_line(self, name: str) -> str:
        """The last line of the log of the process started as ``name``."""
        try:
            return _last_line((self.logs / f"{name}.log").read_text(errors="replace"))
        except OSError:
            return "(no log)"

    def alive_nodes(self) -> set[str]:
        """The IP addresses of the cluster's live nodes, from the head's state API (none when it cannot answer)."""
        listed = self.run_in(self.head_ns, self.http_probe(f"{self.dashboard}/api/v0/nodes?limit=100"))
        if listed.returncode != 0:
            return set()
        try:
            nodes = json.loads(listed.stdout)["data"]["result"]["result"]
            return {n["node_ip"] for n in nodes if n.get("state") == "ALIVE"}
        except (json.JSONDecodeError, KeyError, TypeError):
            return set()

    def kill_namespace(self, ns: str, grace_s: float = 0.0) -> int:
        """Signal every process in ``ns`` (SIGTERM and ``grace_s`` to exit, then SIGKILL): only its own."""
        pids = self._pids(ns)
        if grace_s:
            _signal_all(pids, signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and self._pids(ns):
                time.sleep(0.2)
            pids = self._pids(ns)
        _signal_all(pids, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and self._pids(ns):
            time.sleep(0.1)
        return len(pids)

    def _pids(self, ns: str) -> list[int]:
        if ns not in self.created:
            return []
        listed = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True)
        return [int(p) for p in listed.stdout.split() if p.isdigit() and int(p) != os.getpid()]

    def close(self) -> None:
        """Everything this cluster started or created, and nothing else."""
        for ns in reversed(self.created):
            self.kill_namespace(ns, grace_s=5)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        for ns in reversed(self.created):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)  # takes its end of the veth pair
        if self.created:  # stopped between creating the pair and moving it: its ends are still out here
            subprocess.run(["ip", "link", "del", self.head_ns], capture_output=True)
        self.created.clear()
        for node in ("h", "w"):  # Ray's own logs of each node, kept with the run's (its temp folder is removed)
            logs = self.temp / node / "session_latest" / "logs"
            if logs.is_dir():
                shutil.copytree(logs, self.logs / f"ray_{'head' if node == 'h' else 'worker'}", symlinks=True,
                                dirs_exist_ok=True)
        shutil.rmtree(self.temp, ignore_errors=True)


def _ip(*args: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise UnusableError(f"cannot build the two-node network (`ip {' '.join(args)}`): {_last_line(done.stderr)}")


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # exited meanwhile
            os.kill(pid, sig)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def _tee(stream: TextIO, log: Path) -> threading.Thread:
    """Copy the job's console to ours and to its log, line by line, as it runs."""
    def copy() -> None:
        with open(log, "w") as f:
            for line in stream:
                sys.stdout.write(line)
                sys.stdout.flush()
                f.write(line)
    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread


@contextlib.contextmanager
def ctrl_c_deferred() -> Iterator[None]:
    """Hold a Ctrl-C until the block is done, then raise it: torch's import runs C++ that a KeyboardInterrupt
    cannot cross (the process aborted with "terminate called after throwing ... pybind11::error_already_set")."""
    pressed: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: pressed.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if pressed:
        raise KeyboardInterrupt


def planned_trials(study_args: tuple[str, ...], data_root: Path) -> tuple[int, int]:
    """The study's trials and epochs per trial, from its own ``--dry-run`` (which also rejects bad options)."""
    cmd = [sys.executable, str(REPO / STUDY), "--smoke", *study_args, "--data-root", str(data_root), "--dry-run"]
    dry = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if dry.returncode != 0:
        raise UnusableError(f"the study's options are refused: {_last_line(dry.stderr or dry.stdout)}")
    total = re.search(r"^total: (\d+) trials, ([\d,]+) epochs", dry.stdout, re.M)
    if not total:
        raise UnusableError("the study's --dry-run printed no 'total:' line")
    trials, epochs = int(total[1]), int(total[2].replace(",", ""))
    return trials, epochs // trials


class Run:
    """One submission to the cluster: the job, the optional kill, and the checks on Tune's results."""

    def __init__(self, cluster: Cluster, trials: int, epochs: int, kill_after: int | None) -> None:
        self.cluster, self.trials, self.epochs, self.kill_after = cluster, trials, epochs, kill_after
        self.output_dir = cluster.work / "outputs"
        self.experiment_dir = self.output_dir / "ray_results" / EXPERIMENT
        self.killed: dict[str, int] = {}  # trial -> last epoch it reported on the worker

    def submit(self, command: list[str]) -> int:
        """Submit the study as a Ray job, killing the worker when asked; the job's exit status."""
        c = self.cluster
        job = c.start(c.head_ns, "job", [c.ray, "job", "submit", "--address", c.dashboard, "--working-dir", str(REPO),
                                         "--", *command], stdout=subprocess.PIPE, text=True, cwd=REPO)
        tee = _tee(job.stdout, c.logs / "job.log")
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while job.poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the job did not end within {JOB_TIMEOUT_S} s (logs: {c.logs})")
            if self.kill_after is not None and not self.killed:
                self._maybe_kill()
            time.sleep(0.1)
        tee.join(timeout=10)
        return job.returncode

    def _maybe_kill(self) -> None:
        trials = trial_lines(self.experiment_dir)
        reported = sum(len(lines) for lines in trials.values())
        # A trial on the worker between two checkpoints, with enough epochs left that it is still training when
        # the kill lands (Tune's result file trails the trial by a report).
        mid = {name: epoch_of(lines[-1]) for name, lines in trials.items()
               if lines and lines[-1].get("node_ip") == WORKER_IP and 2 <= epoch_of(lines[-1]) <= self.epochs - 3}
        if reported < self.kill_after or not mid:
            return
        n = self.cluster.kill_namespace(self.cluster.worker_ns)
        self.killed = mid
        running = ", ".join(f"{name} (epoch {epoch} of {self.epochs})" for name, epoch in mid.items())
        print(f"== killed the worker node {WORKER_IP} ({n} processes, SIGKILL) after {reported} epochs reported; "
              f"running there: {running}", flush=True)

    def check(self, job_code: int) -> list[str]:
        """The failed checks, each in one line (none: the run did what it should)."""
        failed = [] if job_code == 0 else [f"the job failed (ray job submit exited {job_code})"]
        with ctrl_c_deferred():
            from dcl_core.study import summary_dir
            from dcl_core.study.analysis.report import read_table

        table = summary_dir(self.output_dir, EXPERIMENT) / "results.parquet"
        rows = read_table(table) if table.exists() else []
        done = [r for r in rows if r["status"] == "ok" and r["epochs"] == self.epochs]
        if len(done) != self.trials:
            failed.append(f"{len(done)} of {self.trials} trials finished all {self.epochs} epochs")
        trials = trial_lines(self.experiment_dir)
        nodes = {line.get("node_ip") for lines in trials.values() for line in lines}
        per_node = {ip: sum(any(x.get("node_ip") == ip for x in lines) for lines in trials.values())
                    for ip in (HEAD_IP, WORKER_IP)}
        print(f"== {len(nodes)} nodes ran the trials: " + ", ".join(f"{ip} ({n} trials)" for ip, n in per_node.items()))
        if not all(per_node.values()):
            failed.append(f"trials ran on {len(nodes)} node(s), not on both: {sorted(map(str, nodes))}")
        if self.kill_after is not None:
            failed += self._check_retried(trials)
        return failed

    def _check_retried(self, trials: dict[str, list[dict[str, Any]]]) -> list[str]:
        if not self.killed:
            return [f"the worker was never killed: no trial of it was mid-way after {self.kill_after} epochs"]
        failed = []
        for name, last in self.killed.items():
            lines = trials.get(name, [])
            on_worker = [epoch_of(x) for x in lines if x.get("node_ip") == WORKER_IP]
            on_head = [epoch_of(x) for x in lines if x.get("node_ip") == HEAD_IP]
            resumed_at = min(on_head) if on_head else None
            if resumed_at is None or not 1 < resumed_at <= max(on_worker) + 1 or max(on_head) != self.epochs:
                failed.append(f"{name} was not retried from its checkpoint on the head (worker epochs {on_worker}, "
                              f"head epochs {on_head})")
            else:
                print(f"== {name}: epochs 1-{max(on_worker)} on the worker, killed at epoch {last}; retried on the "
                      f"head from its checkpoint, epochs {resumed_at}-{max(on_head)}")
        return failed


def parse(argv: list[str] | None) -> tuple[argparse.Namespace, tuple[str, ...]]:
    """This script's options and the study arguments after ``--`` (the default study's without them)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    study_args = tuple(argv[argv.index("--") + 1:]) if "--" in argv else STUDY_ARGS
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kill-worker-after", type=int, metavar="N",
                   help="kill the worker node once the trials have reported N epochs (and one of its trials is "
                        "mid-way); its trials must then finish on the head from their checkpoints")
    p.add_argument("--work-dir", type=Path, help="a new or empty folder for outputs, MLflow and logs "
                                                 "(default: a new one under /tmp)")
    p.add_argument("--data-root", type=Path, help="CIFAR-10 (ImageFolder); default: the embedded copy")
    return p.parse_args(argv), study_args


def preflight(args: argparse.Namespace, study_args: tuple[str, ...]) -> tuple[Path, Path, int, int]:
    """Everything that can be refused before a namespace exists: one line each."""
    if sys.platform != "linux":
        raise UnusableError("network namespaces are Linux only")
    if os.geteuid() != 0:
        raise UnusableError("run as root: network namespaces need CAP_SYS_ADMIN (sudo bash studies/cluster/...)")
    if shutil.which("ip") is None:
        raise UnusableError("the `ip` command (iproute2) is not installed")
    if not Path(sys.executable).with_name("ray").exists():
        raise UnusableError(f"no `ray` command beside {sys.executable}: install the project (pip install -e .)")
    with ctrl_c_deferred():
        from dcl_core.data import resolve_data_root

    data_root = resolve_data_root("cifar10", str(args.data_root) if args.data_root else None).resolve()
    if not (data_root / "train").is_dir():
        raise UnusableError(f"no CIFAR-10 at {data_root}: pass --data-root")
    work = args.work_dir.resolve() if args.work_dir else None
    if work is not None and work.exists() and (not work.is_dir() or any(work.iterdir())):
        raise UnusableError(f"--work-dir {work} is not a new or empty folder")
    trials, epochs = planned_trials(study_args, data_root)
    if args.kill_worker_after is not None and not 0 < args.kill_worker_after < trials * epochs - epochs:
        raise UnusableError(f"--kill-worker-after must be between 1 and {trials * epochs - epochs - 1} "
                       f"(the study reports {trials * epochs} epochs), got {args.kill_worker_after}")
    work = work or Path(tempfile.mkdtemp(prefix="dcl-two-node-"))
    work.mkdir(parents=True, exist_ok=True)
    try:  # claimed atomically: of two runs started on one empty folder, the second stops here
        os.close(os.open(work / CLAIM, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        raise UnusableError(f"--work-dir {work} is being used by another run") from None
    return work, data_root, trials, epochs


def main(argv: list[str] | None = None) -> int:
    """Build the two-node cluster, run the study on it, check the outcome and tear it down; the exit status."""
    args, study_args = parse(argv)
    try:
        work, data_root, trials, epochs = preflight(args, study_args)
    except UnusableError as err:
        print(f"two_node: {err}", file=sys.stderr)
        return EXIT_USAGE
    cluster = Cluster(work)

    stopping = False

    def stop(signum: int, _frame: Any) -> None:
        """The first Ctrl-C, SIGTERM or SIGHUP stops the run; any later one waits for the teardown it started."""
        nonlocal stopping
        if stopping:
            return
        stopping = True
        raise KeyboardInterrupt if signum == signal.SIGINT else StoppedError(signum)

    try:
        for sig in (signal.SIGINT, *STOP_SIGNALS):
            signal.signal(sig, stop)
        cluster.create_network()
        cluster.start_ray()
        print(f"== 2 nodes: head {HEAD_IP} (namespace {cluster.head_ns}), worker {WORKER_IP} "
              f"(namespace {cluster.worker_ns}); token auth; work folder {work}; Ray temp folders {cluster.temp}",
              flush=True)
        tracking_uri = cluster.start_mlflow()
        run = Run(cluster, trials, epochs, args.kill_worker_after)
        command = [*study_command(data_root, run.output_dir, study_args), "--tracking-uri", tracking_uri]
        print(f"== ray job submit --address {cluster.dashboard} --working-dir {REPO} -- {' '.join(command)}",
              flush=True)
        failed = run.check(run.submit(command))
    except UnusableError as err:
        print(f"two_node: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("two_node: interrupted; tearing the cluster down", file=sys.stderr)
        return 130
    except StoppedError as stopped:
        sig = signal.Signals(stopped.args[0])
        print(f"two_node: stopped ({sig.name}); tearing the cluster down", file=sys.stderr)
        return STOP_SIGNALS[sig]
    except (RuntimeError, subprocess.TimeoutExpired) as err:
        print(f"two_node: {err}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        stopping = True  # nothing cuts the teardown short: a Ctrl-C, SIGTERM or SIGHUP now waits until it is done
        cluster.close()
        signal.signal(signal.SIGINT, signal.default_int_handler)
    for line in failed:
        print(f"two_node: FAILED: {line}", file=sys.stderr)
    if not failed:
        print(f"== OK: every trial finished on a 2-node cluster{' that lost its worker' if run.killed else ''}; "
              f"outputs in {work}")
    return EXIT_FAILED if failed else EXIT_OK


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # before main's own handlers (the checks before the cluster, its imports)
        print("two_node: interrupted before the cluster was built; nothing to tear down", file=sys.stderr)
        sys.exit(130)
