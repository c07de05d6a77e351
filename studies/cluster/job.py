"""The study submitted to the two-node cluster as a Ray job: its command line and planned trials, the worker
node's kill mid-study, and the checks on Tune's results (every trial finished, both nodes used, a killed trial
retried from its checkpoint).
"""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from studies.cluster.netns import HEAD_IP, WORKER_IP, Cluster, UnusableError, last_line

REPO = Path(__file__).resolve().parents[2]
# dcl_core is imported where it is used (it imports torch: seconds), a Ctrl-C held until the import is done.

STUDY, EXPERIMENT = "studies/temperature_sweep.py", "temperature_sweep"
# 4 trials of 10 epochs of 800 images: a trial must outlast a new trial process's start on the worker (runtime env,
# torch's import: 20-30 s on a loaded machine), or Tune gives the waiting trial to the head's finished, reusable
# one, again and again, and the worker never trains (seen with 400 images under CI's load).
STUDY_ARGS = ("--seeds", "1", "--set", "optim.epochs=10", "--set", "data.train_per_class=80")
# A job that ends is seen at once, so the long bound costs only a hang's wait.
JOB_TIMEOUT_S = 1200


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
        raise UnusableError(f"the study's options are refused: {last_line(dry.stderr or dry.stdout)}")
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
            from dcl_core.study.analysis.tables import read_table

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

