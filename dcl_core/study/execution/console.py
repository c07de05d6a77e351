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
from dcl_core.study.plan.spec import PROGRESS, QUIET, VERBOSE

__all__ = ["PROGRESS", "QUIET", "VERBOSE", "ConsoleProgress"]


class ConsoleProgress(tune.Callback):
    """Progress of one Tune experiment of a study: ``done`` trials of the study finished before it started,
    ``total`` in the whole study, which started at ``started`` (``time.time()``). The time left is projected from
    the trials this callback saw finish since it began watching (a resumed or extended study's earlier trials,
    finished before this process, would make the pace look faster than it is)."""

    def __init__(self, name: str, total: int, done: int = 0, verbosity: int = PROGRESS,
                 started: float | None = None) -> None:
        self.name, self.total, self.done, self.verbosity = name, total, done, verbosity
        self.started = started or time.time()
        self.failed = 0
        self.running: set[str] = set()
        self._bar: Any = None
        self._watching: float | None = time.time()  # when this callback began watching (reset when unpickled)
        self._seen = 0  # trials it saw finish since then

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_bar": None, "running": set(), "_watching": None, "_seen": 0}

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
        if self._watching is None:  # restored by Tune.restore: the pace counts from now
            self._watching = time.time()
        self.running.add(trial.trial_id)
        self._refresh()

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Count the trial as finished, failed if it diverged (Tune callback)."""
        self._finished(trial, failed=bool((trial.last_result or {}).get(M.DIVERGED)))

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Count the trial as finished and failed (Tune callback)."""
        self._finished(trial, failed=True)

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        """Close the progress bar at the end of the experiment (Tune callback)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def _finished(self, trial: Any, failed: bool) -> None:
        self.running.discard(trial.trial_id)
        self.done += 1
        self.failed += failed
        self._seen += 1
        if self._watching is None:
            self._watching = time.time()
        if self.verbosity != PROGRESS:
            return
        line = f"[{self.done}/{self.total}] {trial_line(trial, failed)}"
        if self.bar is not None:
            self.bar.write(line)
            self.bar.update(1)
            self._refresh()
            return
        now = time.time()
        elapsed, watched = now - self.started, now - self._watching
        left = watched / self._seen * (self.total - self.done) if watched > 0 else math.nan
        print(f"{line}  ({elapsed / 60:.1f} min elapsed, ~{left / 60:.1f} min left)", flush=True)


def trial_line(trial: Any, failed: bool) -> str:
    """``dcl_t0.1_s0_…  kNN 35.2%  loss 4.123  41 s`` (or ``FAILED``/``diverged``)."""
    r = trial.last_result or {}
    knn, loss, secs = r.get(M.KNN_TOP1), r.get(M.TRAIN_LOSS), r.get("time_total_s")
    parts = [str(trial)]
    if failed:
        parts.append(Status.DIVERGED if r.get(M.DIVERGED) else "FAILED")
    if isinstance(knn, float) and not math.isnan(knn):
        parts.append(f"kNN {knn:.1f}%")
    if isinstance(loss, float):
        parts.append(f"loss {loss:.3f}")
    if isinstance(secs, float | int):
        parts.append(f"{secs:.0f} s")
    return "  ".join(parts)
