"""Two network namespaces joined by a veth pair, as two hosts to Ray: the network, Ray's head and worker nodes and
an MLflow server started in it, and its teardown (every process of its own namespaces, nothing else).

The head is 198.51.100.1 and the worker .2 (TEST-NET-2, a documentation range) with no route anywhere else: the
cluster's traffic stays inside the two namespaces. ``studies/cluster/two_node.py`` builds it and runs a study on it.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HEAD_IP, WORKER_IP, PREFIX = "198.51.100.1", "198.51.100.2", 24
GCS_PORT, DASHBOARD_PORT, MLFLOW_PORT = 6379, 8265, 5000
# A node joins in ~10 s on an idle machine; CI's two cores also run other tests' studies. A process that exits is
# reported at once, so the long bound costs only a hang's wait.
JOIN_TIMEOUT_S, PROBE_EVERY_S = 600, 2.0
# The probe: GET argv[1] with the bearer token in the file argv[2] (Ray's token auth), the body to stdout.
HTTP_GET = ("import sys, urllib.request; token = open(sys.argv[2]).read().strip(); "
            "request = urllib.request.Request(sys.argv[1], headers={'Authorization': 'Bearer ' + token}); "
            "sys.stdout.write(urllib.request.urlopen(request, timeout=10).read().decode())")


class UnusableError(Exception):
    """This machine or these options cannot run the cluster: one line, exit 2."""


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
            raise RuntimeError(f"ray get-auth-token --generate failed: {last_line(token.stderr)}")
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
            return last_line((self.logs / f"{name}.log").read_text(errors="replace"))
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
        raise UnusableError(f"cannot build the two-node network (`ip {' '.join(args)}`): {last_line(done.stderr)}")


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # exited meanwhile
            os.kill(pid, sig)


def last_line(text: str) -> str:
    """The last non-blank line of a command's output, stripped (``(no output)`` when there is none)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"

