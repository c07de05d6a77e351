"""Studies section: what the study platform (Ray Tune + Optuna + MLflow) costs around the training it runs, and
what ASHA early stopping saves in a (τ, lr) search.

    python benchmarks/studies.py [--quick] [--work-dir DIR]   # runs the studies below (~12 min; quick ~1.5)
    python benchmarks/studies.py --study-dir DIR              # only analyzes a finished study's output folder

Full: the smoke temperature sweep, a one-seed CPU-default temperature sweep (8 trials), and the ASHA pair below;
quick (CI): only a tiny ASHA pair, two studies, whose search without ASHA also gives the overhead and CPU-busy
rows. Only the full run's CPU-default and ASHA rows carry goals; the smoke rows check that everything can be
measured and show the fixed costs.

Every study runs as its own process (``sys.executable studies/<script>.py … --output-dir <tmp>``, stdout and
stderr to ``<tmp>/<name>.log``), as a user runs it, on whatever else the machine is doing (the notes give the
load average and the CPU share of other processes).

Rows ``platform overhead``: ``ours`` is the study's wall time, ``baseline`` the training it ran, Σ over trials of
their own per-epoch seconds (``time/epoch_seconds``: the epoch's steps plus the kNN monitor) divided by the
concurrent trial slots (2 on 2 cores), i.e. the wall time a perfectly packed run would take; ``ratio`` is the
platform overhead 1 − baseline/ours (goal ≤ 0.10 for the CPU-default study; the smoke study's 1-2 s trials
only inform). The note splits the overhead, in % of the wall time, from what the study records anyway, read
through public interfaces only: Tune's per-trial ``result.json`` rows (``time_this_iter_s``,
``time/epoch_seconds``; ``timestamp``, whole seconds, only if MLflow has no run), the study's MLflow runs
through ``MlflowClient`` (any tracking URI: a child run per trial, its start and end and the driver's logging
time of each epoch's ``time/epoch_seconds``, all in ms; the parent/summary run), and the modification times of
the study's lock file, Tune's ``tuner.pkl`` and the summary folder's files:

* pre-study: process start to the study's lock file (Python imports, argument and dataset checks); live only.
* Ray start: lock file to the MLflow parent run's start time (``ray.init``).
* MLflow open: to the first Tune experiment's ``tuner.pkl`` (the store's tables, experiment, parent run).
* worker start-up: trial slots idle between a free slot (or the Tune start) and the next trial's start
  (``on_trial_start``, the MLflow child run's start: a new worker process, or a reused actor reset).
* trial setup: inside the trial, its first iteration beyond its first epoch and one epoch's report (data,
  model); checkpoint+report: every later iteration's ``time_this_iter_s`` − ``time/epoch_seconds`` (the
  trainer's checkpoint and metrics file, ``tune.report`` persisting the checkpoint).
* MLflow + Tune driver: the rest of each trial's span beyond its iterations and its end: the child run's
  creation, and the driver handling each result before the trial may continue (MLflow's metrics/JSON
  logging, Tune's experiment snapshot and loggers): one category, since no public record says when MLflow's
  logging of a result ends. Trial end: the last result's MLflow logging to the run's end (the function's
  return, Tune stopping or resetting the actor, MLflow's q_B plot and end).
* drain: slots idle at the end of a Tune experiment (no trial left to start); between experiments: a search
  runs one Tune experiment per loss, one after the other.
* summary: last trial's end to the MLflow summary run's end (results table, plots, summary run); exit: to the
  process's end (Ray shutdown); live only.

Slot-seconds (worker start-up … between experiments) are divided by the slots to be wall seconds; the
categories add up to the wall time. ``--study-dir`` measures from the lock file to the summary (pre-study and
exit are unknown after the fact, ~10-20 s here together). Without a readable MLflow store the trials' spans
come from ``result.json`` (±1 s), Ray start falls inside MLflow open, and the row's note says so.

Rows ``CPU busy while trials run``: ``/proc/stat`` sampled every 0.5 s during the study; the busy share of the
two cores between the first trial's start and the last trial's end (``ours``: the mean of the cores, ``ratio``
the least busy core's share; goal ≥ 0.90 for both, CPU-default study). The note gives the study's own
processes' share (its process tree, from ``/proc/<pid>/stat``) apart from other processes'. Not measurable after
the fact.

Rows ``ASHA``: ``studies/tau_lr_search.py`` with ``--asha`` and without, the same Optuna search seed (the
study's, fixed) and the same number of samples per loss. ``epochs trained``: Σ over trials of ``epochs`` from
the study's ``summary/<study>/results.csv`` (``ours`` with ASHA, ``baseline`` without, ``ratio`` ASHA/full;
goal ≤ 0.40 with every loss's best within the seed spread). ``best kNN``: per loss, the best final kNN top-1
of any trial (``ratio`` = ASHA − full, in points; goal ≥ −1.5: the seed spread is taken as 1.5 points, the
CPU-default temperature sweep (docs/results.md) having cells ±1-2 over 3 seeds; ``--study-dir`` on a several-seed
study prints its measured spread). Quick: ``--smoke`` at one loss, 2 samples and 1 CPU (plumbing only; the run
without ASHA is the one the quick overhead and CPU-busy rows measure); full: the CPU preset with 5 samples per loss
instead of 10.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dcl_core import metric_names as M
from dcl_core.files import open_fd
from dcl_core.study.plan.spec import EXPERIMENT_SEP

try:
    from benchmarks.common import Row, markdown_table
except ModuleNotFoundError:  # run as a script: python benchmarks/studies.py
    from common import Row, markdown_table

SECTION = "studies"
REPO = Path(__file__).resolve().parents[1]
STUDIES = REPO / "studies"
OVERHEAD_GOAL = 0.10  # platform overhead at most 10% of a CPU-default study's wall time
BUSY_GOAL = 0.90  # both cores at least 90% busy while trials run
ASHA_EPOCHS_GOAL = 0.40  # ASHA trains at most 40% of the epochs …
SEED_SPREAD = 1.5  # … for a best kNN within this many points of the full search's (docs/results.md: cells ±1-2)
SAMPLE_EVERY = 0.5  # seconds between /proc/stat samples
STUDY_TIMEOUT = 1800  # seconds: a study that takes longer is stuck
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
# The study's MLflow runs (dcl_core/study/tracking/runs.py): a trial's child run carries its Tune id, the parent run
# (the summary) this tag; every epoch's result logs time/epoch_seconds (always finite, unlike the loss).
TRIAL_TAG, SUMMARY_TAG, LOGGED_EVERY_EPOCH = "trial_id", "dcl.summary", M.EPOCH_SECONDS

# Categories of the overhead, in the order the notes list them.
PRE_STUDY, EXIT = "pre-study", "exit"
WALL_PHASES = ("Ray start", "MLflow open", "summary")
SLOT_PHASES = ("worker start-up", "trial setup", "checkpoint+report", "MLflow + Tune driver", "trial end", "drain",
               "between experiments")


# ------------------------------------------------------------------------------------------------------------
# CPU sampling


@dataclass
class CpuSample:
    """One reading of ``/proc/stat`` and of the sampled process tree's CPU time."""

    t: float  # time.time()
    busy: tuple[int, ...]  # per core, jiffies (user nice system irq softirq steal)
    total: tuple[int, ...]  # per core, jiffies (busy + idle + iowait)
    tree: int  # jiffies (user + system) of the sampled process tree so far, exited processes included


def _proc_stat() -> tuple[tuple[int, ...], tuple[int, ...]]:
    busy, total = [], []
    with open("/proc/stat") as f:
        for line in f:
            if not re.match(r"cpu\d+ ", line):
                continue
            v = [int(x) for x in line.split()[1:]]
            idle = v[3] + v[4]  # idle + iowait
            b = v[0] + v[1] + v[2] + v[5] + v[6] + (v[7] if len(v) > 7 else 0)  # guest is inside user
            busy.append(b)
            total.append(b + idle)
    return tuple(busy), tuple(total)


def _tree_jiffies(root: int, seen: dict[tuple[int, int], int]) -> int:
    """CPU jiffies (user + system) spent so far by ``root`` and its descendants. ``seen`` keeps every process of
    the tree met so far ((pid, start time) -> its last jiffies), so the time of a trial's worker that has exited
    still counts (Ray's workers' time does not reliably reach their parents' cutime)."""
    parent, spent = {}, {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        pid = int(entry)
        parent[pid] = int(rest[1])
        spent[(pid, int(rest[19]))] = int(rest[11]) + int(rest[12])
    for key, jiffies in spent.items():
        p, hops = key[0], 0
        while p and p != root and hops < 64:
            p, hops = parent.get(p, 0), hops + 1
        if p == root or key in seen:
            seen[key] = jiffies
    return sum(seen.values())


class CpuSampler(threading.Thread):
    """Samples ``/proc/stat`` (and the CPU time of ``root``'s process tree) every ``interval`` seconds."""

    def __init__(self, root: int | None, interval: float = SAMPLE_EVERY) -> None:
        super().__init__(daemon=True)
        self.root, self.interval = root, interval
        self.samples: list[CpuSample] = []
        self._seen: dict[tuple[int, int], int] = {}
        self._stop_event = threading.Event()

    def _sample(self) -> None:
        busy, total = _proc_stat()
        tree = _tree_jiffies(self.root, self._seen) if self.root else 0
        self.samples.append(CpuSample(time.time(), busy, total, tree))

    def run(self) -> None:
        """Sample every ``interval`` seconds until :meth:`stop` (the thread's body)."""
        self._sample()
        while not self._stop_event.wait(self.interval):
            self._sample()

    def stop(self) -> None:
        """Stop sampling, wait for the thread, and take one last sample."""
        self._stop_event.set()
        self.join()
        self._sample()

    def utilization(self, t0: float, t1: float) -> tuple[list[float], float] | None:
        """(busy share of each core, the process tree's share of all cores) between the samples nearest inside
        ``[t0, t1]``; None if fewer than two samples fall in it."""
        inside = [s for s in self.samples if t0 - self.interval / 2 <= s.t <= t1 + self.interval / 2]
        if len(inside) < 2:
            return None
        a, b = inside[0], inside[-1]
        cores = [(b.busy[i] - a.busy[i]) / max(1, b.total[i] - a.total[i]) for i in range(len(a.busy))]
        tree = (b.tree - a.tree) / CLK_TCK / (len(cores) * (b.t - a.t))
        return cores, tree


# ------------------------------------------------------------------------------------------------------------
# Reading a finished study's output folder


@dataclass
class TrialTiming:
    """One trial's span and where its time went, from MLflow and Tune's ``result.json``."""

    trial_id: str
    start: float  # driver: MLflow child run's start (on_trial_start), else from result.json (±1 s)
    end: float  # driver: MLflow run's end, else the last result's timestamp (±1 s)
    training: float  # Σ time/epoch_seconds
    iterations: float  # Σ time_this_iter_s (time_total_s)
    setup: float  # in-trial: first iteration beyond its epoch and one report
    report: float  # in-trial: checkpoint + report of every epoch
    finish: float  # driver: the last result's MLflow logging to the run's end
    epochs: int

    @property
    def driver(self) -> float:
        """Driver: the rest of the trial's span (child run creation, each result's MLflow logging and Tune's
        handling of it while the trial waits)."""
        return (self.end - self.start) - self.iterations - self.finish


@dataclass
class StudyTiming:
    """Where a study's wall time went, from its output folder (see the module docstring)."""

    study: str
    output_dir: Path
    slots: int
    trials: list[TrialTiming]
    lock: float  # study lock file written (after imports)
    ray_ready: float  # MLflow parent run started (right after ray.init)
    tune_starts: list[float]  # each Tune experiment's tuner.pkl
    done: float  # MLflow summary run ended (or the summary folder's last file)
    slot_seconds: dict[str, float] = field(default_factory=dict)  # per slot category, summed over slots
    mlflow_error: str | None = None  # why the MLflow store gave no runs (trial spans then from result.json)

    @property
    def training(self) -> float:
        """Seconds spent training, summed over the trials."""
        return sum(t.training for t in self.trials)

    @property
    def first_start(self) -> float:
        """When the first trial started (epoch seconds)."""
        return min(t.start for t in self.trials)

    @property
    def last_end(self) -> float:
        """When the last trial ended (epoch seconds)."""
        return max(t.end for t in self.trials)

    def breakdown(self, started: float | None = None, ended: float | None = None) -> dict[str, float]:
        """Wall seconds per category (plus ``training`` = Σ training / slots); they add up to the wall time,
        from ``started`` (else the lock file) to ``ended`` (else the summary's end)."""
        out: dict[str, float] = {}
        if started is not None:
            out[PRE_STUDY] = self.lock - started
        out["Ray start"] = self.ray_ready - self.lock
        out["MLflow open"] = self.tune_starts[0] - self.ray_ready
        for k, v in self.slot_seconds.items():
            out[k] = v / self.slots
        out["training"] = self.training / self.slots
        out["summary"] = self.done - self.last_end
        if ended is not None:
            out[EXIT] = ended - self.done
        return out


def _study_names(output_dir: Path) -> list[str]:
    root = output_dir / "summary"
    return sorted(p.parent.name for p in root.glob("*/study_options.json")) if root.is_dir() else []


def _results(trial_dir: Path) -> list[dict]:
    """Tune's result rows of a trial (its ``result.json``, one JSON object a line)."""
    path = trial_dir / "result.json"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _store_exists(tracking_uri: str) -> bool:
    """Whether a local tracking store is there (MLflow's client would create an empty one); remote: True."""
    if tracking_uri.startswith("sqlite:///"):
        return Path(tracking_uri.removeprefix("sqlite:///")).exists()
    if tracking_uri.startswith("file:") or "://" not in tracking_uri:
        return Path(tracking_uri.removeprefix("file://").removeprefix("file:")).exists()
    return True


@contextlib.contextmanager
def _reader_env() -> Iterator[None]:
    """MLflow settings for reading a study's store (unless the user set them): an unreachable tracking server
    fails in seconds, not after MLflow's minutes of retries; a file store (``MLFLOW_ALLOW_FILE_STORE``, which the
    study needed too) is read, not refused."""
    wanted = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
              "MLFLOW_ALLOW_FILE_STORE": "true"}
    added = [k for k in wanted if k not in os.environ]
    os.environ.update({k: wanted[k] for k in added})
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


class _MlflowStore:
    """The study's runs in its MLflow tracking store (any tracking URI: SQLite, file, HTTP), read through
    MLflow's public client: each trial's child run (tag ``trial_id``) and the summary run (tag ``dcl.summary``).
    An unreadable store leaves it empty (the trials' spans then come from ``result.json``)."""

    def __init__(self, tracking_uri: str, study: str) -> None:
        self.runs: dict[str, tuple[float, float]] = {}  # trial id -> (start, end) seconds
        self.logged: dict[str, list[float]] = {}  # trial id -> when the driver logged each epoch's metrics (s)
        self.parent: tuple[float, float] | None = None
        self.error: str | None = None
        if not tracking_uri or not _store_exists(tracking_uri):
            self.error = f"no MLflow store at {tracking_uri or '(none)'}"
            return
        try:
            with _reader_env():
                self._read(tracking_uri, study)
        except Exception as exc:  # a benchmark of a study: its MLflow store is one of two sources
            self.error = f"MLflow store {tracking_uri} unreadable: {str(exc).splitlines()[0][:200]}"
            warnings.warn(self.error, stacklevel=2)

    def _read(self, tracking_uri: str, study: str) -> None:
        from mlflow.tracking import MlflowClient  # only here: the import takes seconds

        client = MlflowClient(tracking_uri)
        exp = client.get_experiment_by_name(study)
        if exp is None:
            self.error = f"no MLflow experiment {study!r} in {tracking_uri}"
            return

        def search(filter_string: str) -> Iterator:
            token = None
            while True:
                page = client.search_runs([exp.experiment_id], filter_string=filter_string, max_results=1000,
                                          page_token=token)
                yield from page
                token = page.token
                if not token:
                    return

        def span(run) -> tuple[float, float]:
            start = run.info.start_time
            return start / 1e3, (run.info.end_time or start) / 1e3

        for run in search(f"tags.`{SUMMARY_TAG}` = 'true'"):
            self.parent = span(run)
        for run in search(f"tags.{TRIAL_TAG} LIKE '%'"):
            trial_id = run.data.tags[TRIAL_TAG]
            self.runs[trial_id] = span(run)
            first: dict[int, int] = {}  # step -> its first logging time (ms): a retried epoch is logged again
            for m in client.get_metric_history(run.info.run_id, LOGGED_EVERY_EPOCH):
                first[m.step] = min(first.get(m.step, m.timestamp), m.timestamp)
            self.logged[trial_id] = [first[k] / 1e3 for k in sorted(first)]


def _trial_timing(trial_dir: Path, store: _MlflowStore) -> TrialTiming | None:
    results = _results(trial_dir)
    # Tune's trial id ("71ac0_00003") ends the folder's name.
    trial_id = str(results[0]["trial_id"]) if results else "_".join(trial_dir.name.rsplit("_", 2)[-2:])
    epoch_s = [float(r.get(M.EPOCH_SECONDS, 0.0)) for r in results]
    iter_s = [float(r.get("time_this_iter_s", 0.0)) for r in results]
    if trial_id in store.runs:
        start, end = store.runs[trial_id]
        logged = store.logged.get(trial_id)
        finish = max(0.0, end - logged[-1]) if logged else 0.0
    elif results:  # no MLflow run: Tune's timestamps, whole seconds (time.time() truncated, so + 0.5)
        start = float(results[0]["timestamp"]) + 0.5 - iter_s[0]
        end, finish = float(results[-1]["timestamp"]) + 0.5, 0.0
    else:
        return None
    extras = [max(0.0, t - e) for t, e in zip(iter_s, epoch_s, strict=True)]
    per_report = statistics.median(extras[1:]) if len(extras) > 1 else 0.0
    setup = max(0.0, extras[0] - per_report) if extras else 0.0
    return TrialTiming(trial_id, start, end, sum(epoch_s), sum(iter_s), setup, sum(extras) - setup, finish,
                       len(results))


def _assign_slots(trials: list[TrialTiming], tune_start: float, slots: int) -> tuple[float, float]:
    """(worker start-up, drain) slot-seconds of one Tune experiment: each trial takes the slot freed earliest;
    the wait from that slot's freeing (or the Tune start) to the trial's start is start-up, the slots' idle
    time after their last trial until the experiment's last trial ends is drain."""
    free = [tune_start] * slots
    startup = 0.0
    for t in sorted(trials, key=lambda t: t.start):
        i = min(range(slots), key=free.__getitem__)
        startup += max(0.0, t.start - free[i])
        free[i] = max(free[i], t.end)
    end = max(t.end for t in trials)
    return startup, sum(end - f for f in free)


def analyze_study(output_dir: Path, study: str | None = None) -> StudyTiming:
    """Where the wall time of the finished study ``study`` (the only one in ``output_dir`` if None) went."""
    output_dir = Path(output_dir).resolve()
    names = _study_names(output_dir)
    if study is None:
        if len(names) != 1:
            raise ValueError(f"{output_dir}: expected one study under summary/, found {names or 'none'}")
        study = names[0]
    opts = json.loads((output_dir / "summary" / study / "study_options.json").read_text())
    storage = Path(str(opts.get("storage") or output_dir / "ray_results").removeprefix("file://"))
    per_trial_cpus = max(1, int(opts.get("workers") or 1)) * float(opts.get("cpus_per_worker") or 1.0)
    slots = max(1, int((opts.get("num_cpus") or os.cpu_count() or 1) // per_trial_cpus))
    if opts.get("max_concurrent"):
        slots = min(slots, int(opts["max_concurrent"]))
    store = _MlflowStore(str(opts.get("tracking_uri") or ""), study)

    experiments = [p for p in storage.iterdir()
                   if p.is_dir() and (p.name == study or p.name.startswith(study + EXPERIMENT_SEP))
                   and any(p.glob("experiment_state-*.json"))] if storage.is_dir() else []
    if not experiments:
        raise ValueError(f"{storage}: no Tune experiment of study {study}")
    groups: list[tuple[float, list[TrialTiming]]] = []
    for exp in experiments:
        trials = [t for d in exp.iterdir() if d.is_dir() and (d / "params.json").exists()
                  if (t := _trial_timing(d, store)) is not None]
        if not trials:
            continue
        marker = next((exp / n for n in ("tuner.pkl", ".validate_storage_marker") if (exp / n).exists()), None)
        tune_start = marker.stat().st_mtime if marker else min(t.start for t in trials)
        groups.append((min(tune_start, min(t.start for t in trials)), trials))
    if not groups:
        raise ValueError(f"{storage}: study {study} has no trial with results")
    groups.sort(key=lambda g: g[0])

    lock_file = output_dir / f".{study}.lock"
    lock = lock_file.stat().st_mtime if lock_file.exists() else groups[0][0]
    summary = output_dir / "summary" / study
    done = max([p.stat().st_mtime for p in summary.iterdir() if p.name != "study_options.json"]
               + [store.parent[1] if store.parent else 0.0])
    ray_ready = store.parent[0] if store.parent else lock
    all_trials = [t for _, ts in groups for t in ts]
    slot: dict[str, float] = dict.fromkeys(SLOT_PHASES, 0.0)
    for i, (tune_start, trials) in enumerate(groups):
        startup, drain = _assign_slots(trials, tune_start, slots)
        slot["worker start-up"] += startup
        slot["drain"] += drain
        if i + 1 < len(groups):
            slot["between experiments"] += slots * max(0.0, groups[i + 1][0] - max(t.end for t in trials))
    for t in all_trials:
        slot["trial setup"] += t.setup
        slot["checkpoint+report"] += t.report
        slot["MLflow + Tune driver"] += t.driver
        slot["trial end"] += t.finish
    return StudyTiming(study, output_dir, slots, all_trials, lock, ray_ready, [g[0] for g in groups], done, slot,
                       store.error)


def _results_csv(summary: Path) -> list[dict[str, str]]:
    path = summary / "results.csv"
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _float(value: str | None) -> float | None:
    try:
        v = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return v if v is not None and math.isfinite(v) else None


# ------------------------------------------------------------------------------------------------------------
# Rows


def overhead_row(timing: StudyTiming, label: str, goal: bool, started: float | None = None,
                 ended: float | None = None) -> Row:
    """The platform-overhead row of ``timing``; ``started``/``ended``: the process's start and end if it was
    run live (else the wall time runs from the lock file to the summary)."""
    parts = timing.breakdown(started, ended)
    wall = sum(parts.values())
    useful = parts.pop("training")
    overhead = 1.0 - useful / wall
    shares = sorted(((v / wall, k) for k, v in parts.items() if v / wall >= 0.005), reverse=True)
    split = ", ".join(f"{k} {100 * s:.0f}%" for s, k in shares)
    mean_trial = statistics.mean(t.end - t.start for t in timing.trials)
    when = "live" if started is not None else "post hoc: lock file to summary, without imports and exit"
    note = (f"{len(timing.trials)} trials of {mean_trial:.1f} s on {timing.slots} slots, Σ training "
            f"{timing.training:.0f} s; wall {wall:.0f} s ({when}); overhead = {split}")
    if timing.mlflow_error:
        note += (f"; {timing.mlflow_error}: trial spans from result.json (whole seconds), Ray start inside MLflow "
                 "open, the driver's share unseen")
    return Row(SECTION, f"{label}: platform overhead", wall, useful, overhead,
               f"<= {OVERHEAD_GOAL:.2f}" if goal else "", overhead <= OVERHEAD_GOAL if goal else None, "s", note)


def busy_row(timing: StudyTiming, sampler: CpuSampler, label: str, load: float, goal: bool) -> Row:
    """The CPUs' mean busy share while the trials ran, as a row; with ``goal``, each core checked against BUSY_GOAL."""
    t0, t1 = timing.first_start, timing.last_end
    util = sampler.utilization(t0, t1)
    if util is None:
        return Row(SECTION, f"{label}: CPU busy while trials run", math.nan, unit="%",
                   note="trial phase shorter than the sampling interval")
    cores, tree = util
    mean = statistics.mean(cores)
    note = (f"{t1 - t0:.0f} s from the first trial's start to the last trial's end; cores "
            f"{'/'.join(f'{100 * c:.0f}' for c in cores)}%; the study's processes {100 * tree:.0f}%, others "
            f"{100 * max(0.0, mean - tree):.0f}% of the cores; load average before {load:.2f}; not measurable "
            "post hoc (--study-dir)")
    return Row(SECTION, f"{label}: CPU busy while trials run", 100 * mean, None, min(cores),
               f">= {BUSY_GOAL:.2f} both cores" if goal else "", min(cores) >= BUSY_GOAL if goal else None, "%",
               note)


def seed_spread_row(timing: StudyTiming) -> Row | None:
    """The mean over cells of the kNN std over seeds, for a study of several seeds (None otherwise)."""
    rows = _results_csv(timing.output_dir / "summary" / timing.study)
    keys = ("series", "framework", "temperature", "batch_size", "base_lr", "sigma", "alpha", "queue_size",
            "epoch_budget")
    cells: dict[tuple, list[float]] = {}
    for r in rows:
        knn = _float(r.get("knn_top1"))
        if r.get("status") == "ok" and knn is not None:
            cells.setdefault(tuple(r.get(k) for k in keys), []).append(knn)
    stds = [statistics.stdev(v) for v in cells.values() if len(v) >= 2]
    if not stds:
        return None
    return Row(SECTION, f"{timing.study}: kNN top-1 std over seeds", statistics.mean(stds), unit="pp",
               note=f"mean over {len(stds)} cells (max {max(stds):.2f}); the ASHA rows take {SEED_SPREAD} pp")


@dataclass
class Launch:
    """A study run as a subprocess: its output folder, wall time and CPU samples."""

    output_dir: Path
    started: float
    ended: float
    sampler: CpuSampler
    load: float

    @property
    def wall(self) -> float:
        """Seconds from launch to exit."""
        return self.ended - self.started


def launch(script: str, args: Sequence[str], output_dir: Path) -> Launch:
    """Run ``studies/<script>`` with ``args`` into ``output_dir`` (its log next to it), sampling the CPUs."""
    output_dir = output_dir.resolve()
    log = output_dir.parent / f"{output_dir.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open("/proc/loadavg") as f:
        load = float(f.read().split()[0])
    cmd = [sys.executable, str(STUDIES / script), *args, "--output-dir", str(output_dir)]
    # never through a link planted at the log's name (dcl_core.files.open_fd: O_NOFOLLOW, regular files only)
    with os.fdopen(open_fd(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), "w") as out:
        started = time.time()
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        sampler = CpuSampler(proc.pid)
        sampler.start()
        try:
            rc = proc.wait(timeout=STUDY_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        ended = time.time()
        sampler.stop()
    if rc != 0:
        tail = "\n".join(log.read_text().splitlines()[-15:])
        raise RuntimeError(f"{' '.join(cmd)} exited with {rc}; the end of {log}:\n{tail}")
    return Launch(output_dir, started, ended, sampler, load)


def efficiency_rows(run_: Launch, label: str, goal: bool) -> list[Row]:
    """The platform-overhead and CPU-busy rows of a study run by :func:`launch`."""
    timing = analyze_study(run_.output_dir)
    return [overhead_row(timing, label, goal, run_.started, run_.ended),
            busy_row(timing, run_.sampler, label, run_.load, goal)]


@dataclass
class SearchResult:
    """What a ``tau_lr_search`` run found: its size, the best kNN top-1 per loss and its wall time."""

    epochs: int
    trials: int
    best: dict[str, float]  # loss -> best final kNN top-1
    wall: float


def _search_result(run_: Launch, study: str = "tau_lr_search") -> SearchResult:
    rows = [r for r in _results_csv(run_.output_dir / "summary" / study) if r.get("status") == "ok"]
    best: dict[str, float] = {}
    for r in rows:
        knn = _float(r.get("knn_top1"))
        if knn is not None:
            best[r["loss"]] = max(best.get(r["loss"], -math.inf), knn)
    return SearchResult(sum(int(float(r.get("epochs") or 0)) for r in rows), len(rows), best, run_.wall)


# The (τ, lr) search with and without ASHA: (its arguments, what they mean), quick and full.
SEARCH = {True: (["--smoke", "--losses", "dcl", "--num-samples", "2", "--num-cpus", "1"],
                 "smoke preset, dcl only, 2 samples, 2 epochs, 1 CPU: one trial process (plumbing only)"),
          False: (["--num-samples", "5"], "CPU preset (6 epochs, 2,500 images) with 5 samples per loss instead of 10")}


def asha_rows(quick: bool, full_run: Launch, asha_run: Launch) -> list[Row]:
    """The ASHA comparison's rows from the search run without (``full_run``) and with ASHA."""
    full, asha = _search_result(full_run), _search_result(asha_run)
    deltas = {loss: asha.best[loss] - full.best[loss] for loss in full.best if loss in asha.best}
    within = bool(deltas) and all(d >= -SEED_SPREAD for d in deltas.values())
    ratio = asha.epochs / full.epochs if full.epochs else math.nan
    goal = not quick  # the smoke search only checks that both sides run and can be compared
    rows = [Row(
        SECTION, "tau_lr_search ASHA vs full budget: epochs trained", asha.epochs, full.epochs, ratio,
        f"<= {ASHA_EPOCHS_GOAL:.2f}, best within {SEED_SPREAD} pp" if goal else "",
        (ratio <= ASHA_EPOCHS_GOAL and within) if goal else None, "epochs",
        f"{SEARCH[quick][1]}; same search seed; {asha.trials} vs {full.trials} trials; wall {asha.wall:.0f} s vs "
        f"{full.wall:.0f} s")]
    for loss, delta in sorted(deltas.items()):
        rows.append(Row(
            SECTION, f"tau_lr_search ASHA vs full budget: best kNN top-1, {loss}", asha.best[loss], full.best[loss],
            delta, f">= -{SEED_SPREAD} pp" if goal else "", delta >= -SEED_SPREAD if goal else None, "%",
            f"ratio = ASHA − full in points; seed spread {SEED_SPREAD} pp (docs/results.md: CPU-default cells ±1-2)"))
    return rows


def run(quick: bool, work_dir: Path | None = None) -> list[Row]:
    """The section's rows. Quick (two studies, ~1.5 min on 2 idle cores): a tiny (τ, lr) search with and
    without ASHA, the overhead and CPU-busy rows from the one without. Full (~12 min): the smoke and a one-seed
    CPU-default temperature sweep (overhead, CPU busy), and a reduced CPU (τ, lr) search with and without ASHA.
    Studies write to ``work_dir`` (kept) or a temporary folder (deleted)."""
    if work_dir is None:
        with tempfile.TemporaryDirectory(prefix="bench_studies_") as tmp:
            return run(quick, Path(tmp))
    work = Path(work_dir).resolve()
    rows: list[Row] = []
    if not quick:
        rows += efficiency_rows(launch("temperature_sweep.py", ["--smoke"], work / "temperature_smoke"),
                                "temperature_sweep --smoke", goal=False)
        rows += efficiency_rows(launch("temperature_sweep.py", ["--seeds", "1"], work / "temperature_cpu"),
                                "temperature_sweep CPU default, 1 seed", goal=True)
    args = SEARCH[quick][0]
    full = launch("tau_lr_search.py", args, work / "search_full")
    if quick:
        rows += efficiency_rows(full, "tau_lr_search --smoke, dcl, 2 samples (no ASHA)", goal=False)
    asha = launch("tau_lr_search.py", [*args, "--asha"], work / "search_asha")
    return rows + asha_rows(quick, full, asha)


def study_dir_rows(output_dir: Path) -> tuple[list[Row], list[StudyTiming]]:
    """The overhead row (and the seed spread, for several seeds) of every study in a finished output folder."""
    rows, timings = [], []
    for study in _study_names(Path(output_dir)):
        timing = analyze_study(Path(output_dir), study)
        timings.append(timing)
        rows.append(overhead_row(timing, f"{study} ({output_dir})", goal=True))
        rows.append(Row(SECTION, f"{study}: CPU busy while trials run", math.nan, unit="%",
                        note="not measurable post hoc: run the study through this benchmark to sample /proc/stat"))
        spread = seed_spread_row(timing)
        if spread is not None:
            rows.append(spread)
    return rows, timings


def _breakdown_text(timing: StudyTiming) -> str:
    parts = timing.breakdown()
    wall = sum(parts.values())
    lines = [f"{timing.study}: wall {wall:.1f} s from the lock file to the summary, {len(timing.trials)} trials, "
             f"{timing.slots} slots, trial phase {timing.last_end - timing.first_start:.1f} s"]
    lines += [f"  {k:<20} {v:8.1f} s  {100 * v / wall:5.1f}%" for k, v in parts.items()]
    return "\n".join(lines)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="two smoke-sized searches only (~1.5 min)")
    parser.add_argument("--study-dir", type=Path, default=None,
                        help="only analyze this finished study output folder (--output-dir of a study)")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the studies' output folders here")
    cli = parser.parse_args()
    t_start = time.perf_counter()
    if cli.study_dir is not None:
        found, timings = study_dir_rows(cli.study_dir)
        print(markdown_table(found))
        for t in timings:
            print("\n" + _breakdown_text(t))
    else:
        print(markdown_table(run(quick=cli.quick, work_dir=cli.work_dir)))
    print(f"\n({time.perf_counter() - t_start:.0f} s)")
