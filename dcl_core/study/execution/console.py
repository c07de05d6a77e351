"""What a study prints while it runs: one live progress line (tqdm, on a terminal) and one line per finished trial.

Ray Tune's own status tables (hundreds of lines of configs) are shown only with ``-v``; ``-q`` prints nothing
until the answer. Tune pickles its callbacks with the experiment (``--resume`` restores them), so the bar is made
on first use and never pickled.
"""

from __future__ import annotations

import math
import sys
import time
from typing import Any

from ray import tune

from dcl_core import metric_names as M
from dcl_core.study.analysis.columns import Status
from dcl_core.study.execution import trial_failures
from dcl_core.study.plan.run_options import PROGRESS, QUIET, VERBOSE

__all__ = ["PROGRESS", "QUIET", "VERBOSE", "ConsoleProgress"]


STATUS_EVERY_S = 60.0  # off a terminal, a plain status line this often while no trial finishes


def starting(name: str, total: int, verbosity: int, resume: bool) -> None:
    """The study's first line, before Ray starts (the first trial may take minutes to finish): what it runs, and
    that a line per finished trial follows (nothing with ``-q``)."""
    if verbosity != PROGRESS:
        return
    kept = " (resumed: its finished trials are kept)" if resume else ""
    print(f"{name}: {total} trial{'' if total == 1 else 's'}{kept}; starting Ray, then a line per finished trial"
          f"{'' if sys.stderr.isatty() else ' and a status line every minute'}", flush=True)


class ConsoleProgress(tune.Callback):
    """Progress of one Tune experiment of a study: ``done`` trials of the study finished before it started,
    ``total`` in the whole study, which started at ``started`` (``time.time()``).

    The time left is the trials still to run at the mean duration of those this callback saw finish, spread over
    as many at a time as it saw run at once, less what the running ones have done: stable from the first finished
    trial on (dividing the time watched by the trials finished counted the first of two that ran side by side as
    if it had run alone, and doubled the estimate). Trials a resumed or extended study finished before this process
    do not count. Off a terminal, a status line every :data:`STATUS_EVERY_S` seconds while none finishes."""

    def __init__(self, name: str, total: int, done: int = 0, verbosity: int = PROGRESS,
                 started: float | None = None) -> None:
        self.name, self.total, self.done, self.verbosity = name, total, done, verbosity
        self.before = done  # the study's trials finished before this experiment began
        self.started = started or time.time()
        self.failed = 0
        self._restored = False  # set when Tune restores the callback: its counts are recounted from the trials
        self.running: set[str] = set()
        self._bar: Any = None
        self._watching: float | None = time.time()  # when this callback began watching (reset when unpickled)
        self._started_at: dict[str, float] = {}  # trial id -> when this process saw it start
        self._durations: list[float] = []  # seconds of each trial it saw finish
        self._peak = 0  # the most trials it saw running at once
        self._last_line = time.time()  # when it last printed a line
        self._first_start = True  # off a terminal, the first trial's start gets a status line at once
        self._counted: set[str] = set()  # the trials counted finished: each once (Tune may tell of an end twice)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_bar": None, "running": set(), "_watching": None, "_started_at": {},
                "_durations": [], "_peak": 0, "_restored": True, "_first_start": True}

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        """Restored by ``--resume`` (Tune unpickles the callback as its last saved state had it, counts included):
        count the trials Tune's restored state holds finished, before any trial starts (Tune callback)."""
        if not self._restored:
            return
        self._restored = False
        finished = [t for t in trials if t.status in ("TERMINATED", "ERROR")]
        self._counted = {t.trial_id for t in finished}
        self.done = self.before + len(finished)
        self.failed = sum(t.status == "ERROR" or _failed(t) for t in finished)

    def time_left(self, now: float) -> float:
        """Seconds until the experiment's last trial finishes, projected; nan before a trial finished."""
        if not self._durations:
            return math.nan
        mean = sum(self._durations) / len(self._durations)
        waiting = max(self.total - self.done - len(self.running), 0)
        partial = sum(max(mean - (now - self._started_at.get(t, now)), 0.0) for t in self.running)
        return (mean * waiting + partial) / max(self._peak, 1)

    def _clock(self, now: float) -> str:
        left = self.time_left(now)
        ahead = "time left: after the first trial" if math.isnan(left) else f"~{left / 60:.1f} min left"
        return f"({(now - self.started) / 60:.1f} min elapsed, {ahead})"

    @property
    def bar(self) -> Any:
        """The tqdm bar over the study's trials, made on first use on a terminal; None elsewhere."""
        if self._bar is None and self.verbosity == PROGRESS and sys.stderr.isatty():
            from tqdm import tqdm  # only on a terminal

            self._bar = tqdm(total=self.total, initial=self.done, desc=self.name, unit="trial", file=sys.stderr,
                             dynamic_ncols=True)
        return self._bar

    def _refresh(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"running {len(self.running)}, failed {self.failed}")

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Count the trial as running (Tune callback)."""
        now = time.time()
        if self._watching is None:  # restored by Tune.restore: the pace counts from now
            self._watching = now
        self.running.add(trial.trial_id)
        self._started_at[trial.trial_id] = now
        self._peak = max(self._peak, len(self.running))
        self._refresh()
        if self._first_start and self.verbosity == PROGRESS and self.bar is None:
            self._status(now)
        self._first_start = False

    def on_step_end(self, iteration: int, trials: list[Any], **info: Any) -> None:
        """Off a terminal, a status line when none was printed for :data:`STATUS_EVERY_S` (Tune callback)."""
        now = time.time()
        if self.verbosity != PROGRESS or self.bar is not None or now - self._last_line < STATUS_EVERY_S:
            return
        self._status(now)

    def _status(self, now: float) -> None:
        self._last_line = now
        print(f"{self.name}: {self.done} of {self.total} trials done, {len(self.running)} running, {self.failed} "
              f"failed  {self._clock(now)}", flush=True)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Count the trial as finished, failed if it diverged or reported itself failed (Tune callback)."""
        self._finished(trial, failed=_failed(trial))

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Count the trial as finished and failed (Tune callback)."""
        self._finished(trial, failed=True)

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        """Close the progress bar at the end of the experiment (Tune callback)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _finished(self, trial: Any, failed: bool) -> None:
        now = time.time()
        self.running.discard(trial.trial_id)
        if trial.trial_id in self._counted:  # told again: Tune reports an end a callback failed on as an error
            return
        self._counted.add(trial.trial_id)
        self.done += 1
        self.failed += failed
        if self._watching is None:
            self._watching = now
        secs = (trial.last_result or {}).get("time_total_s")
        started = self._started_at.pop(trial.trial_id, self._watching)
        self._durations.append(float(secs) if isinstance(secs, float | int) else now - started)
        self._peak = max(self._peak, 1)
        if self.verbosity != PROGRESS:
            return
        line = f"[{self.done}/{self.total}] {trial_line(trial, failed)}"
        if self.bar is not None:
            self.bar.write(line)
            self.bar.update(1)
            self._refresh()
            return
        self._last_line = now
        print(f"{line}  {self._clock(now)}", flush=True)


def _failed(trial: Any) -> bool:
    """Whether a finished trial diverged or reported itself failed."""
    last = trial.last_result or {}
    return bool(last.get(M.DIVERGED) or last.get(M.FAILED))


def trial_line(trial: Any, failed: bool) -> str:
    """``dcl_t0.1_s0_…  kNN 35.2%  loss 4.123  41 s`` (or ``FAILED``/``diverged``; a failure's cause last)."""
    r = trial.last_result or {}
    knn, loss, secs = r.get(M.KNN_TOP1), r.get(M.TRAIN_LOSS), r.get("time_total_s")
    parts = [str(trial)]
    cause = None if not failed or r.get(M.DIVERGED) else trial_failures.trial_cause(trial)
    if failed:
        parts.append(Status.DIVERGED if r.get(M.DIVERGED) else "FAILED")
    if isinstance(knn, float) and not math.isnan(knn):
        parts.append(f"kNN {knn:.1f}%")
    if isinstance(loss, float):
        parts.append(f"loss {loss:.3f}")
    if isinstance(secs, float | int):
        parts.append(f"{secs:.0f} s")
    if cause:
        parts.append(cause)
    return "  ".join(parts)
