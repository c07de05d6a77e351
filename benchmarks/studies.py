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
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dcl_core.files import open_fd

try:
    from benchmarks.common import Row, markdown_table
    from benchmarks.cpu_sampler import CpuSampler
    from benchmarks.study_timing import StudyTiming, analyze_study, finite_or_none, results_csv, study_names
except ModuleNotFoundError:  # run as a script: python benchmarks/studies.py
    from common import Row, markdown_table
    from cpu_sampler import CpuSampler
    from study_timing import StudyTiming, analyze_study, finite_or_none, results_csv, study_names

SECTION = "studies"
REPO = Path(__file__).resolve().parents[1]
STUDIES = REPO / "studies"
OVERHEAD_GOAL = 0.10  # platform overhead at most 10% of a CPU-default study's wall time
BUSY_GOAL = 0.90  # both cores at least 90% busy while trials run
ASHA_EPOCHS_GOAL = 0.40  # ASHA trains at most 40% of the epochs …
SEED_SPREAD = 1.5  # … for a best kNN within this many points of the full search's (docs/results.md: cells ±1-2)
STUDY_TIMEOUT = 1800  # seconds: a study that takes longer is stuck


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
    rows = results_csv(timing.output_dir / "summary" / timing.study)
    keys = ("series", "framework", "temperature", "batch_size", "base_lr", "sigma", "alpha", "queue_size",
            "epoch_budget")
    cells: dict[tuple, list[float]] = {}
    for r in rows:
        knn = finite_or_none(r.get("knn_top1"))
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
    rows = [r for r in results_csv(run_.output_dir / "summary" / study) if r.get("status") == "ok"]
    best: dict[str, float] = {}
    for r in rows:
        knn = finite_or_none(r.get("knn_top1"))
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
    for study in study_names(Path(output_dir)):
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
