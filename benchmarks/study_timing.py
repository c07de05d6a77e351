"""Where a finished study's wall time went, read from its output folder: its MLflow runs, Tune's ``result.json``
rows and the files' modification times, through public interfaces only.

:func:`analyze_study` gives the ``platform overhead`` rows of :mod:`benchmarks.studies`, whose docstring lists the
categories of the overhead and where each is read from.
"""

from __future__ import annotations

import contextlib
import csv
import json
import math
import os
import statistics
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dcl_core import metric_names as M
from dcl_core.study.plan.spec import EXPERIMENT_SEP

# The study's MLflow runs (dcl_core/study/tracking/mlflow_runs.py): a trial's child run carries its Tune id, the
# parent run (the summary) this tag; every epoch's result logs time/epoch_seconds (always finite, unlike the loss).
TRIAL_TAG, SUMMARY_TAG, LOGGED_EVERY_EPOCH = "trial_id", "dcl.summary", M.EPOCH_SECONDS

# Categories of the overhead, in the order the notes list them.
PRE_STUDY, EXIT = "pre-study", "exit"
WALL_PHASES = ("Ray start", "MLflow open", "summary")
SLOT_PHASES = ("worker start-up", "trial setup", "checkpoint+report", "MLflow + Tune driver", "trial end", "drain",
               "between experiments")


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
    """Where a study's wall time went, from its output folder (the categories: benchmarks/studies.py's
    docstring)."""

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


def study_names(output_dir: Path) -> list[str]:
    """The studies whose summary (``summary/<study>/study_options.json``) lies in ``output_dir``, sorted."""
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
    names = study_names(output_dir)
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


def results_csv(summary: Path) -> list[dict[str, str]]:
    """The rows of a study's ``results.csv`` in its summary folder (none if it has no such file)."""
    path = summary / "results.csv"
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def finite_or_none(value: str | None) -> float | None:
    """A table cell as a finite number; None when empty, not a number, or not finite."""
    try:
        v = float(value) if value not in (None, "") else None
    except ValueError:
        return None
    return v if v is not None and math.isfinite(v) else None

