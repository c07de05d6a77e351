"""A trial lost to Ray's memory monitor is a failed trial like any other: retried from its last checkpoint while
``--max-failures`` allows, then recorded as failed, the study going on, each loss said in one line with what to do.

Ray's memory monitor kills a worker when the machine runs low on memory (beside other memory-hungry work, or too
many trials at once). Tune handles the kill as a trial failure only while the trial's actor is being created;
during training its actor manager raises ``RuntimeError: Caught unexpected exception`` from the
``ray.exceptions.OutOfMemoryError`` instead, which ended the whole study with ~80 lines of Tune's traceback
(``--resume`` then finished it). So:

- a memory kill of a running trial (:func:`is_memory_kill` on what ``Tuner.fit`` raised) is caught by
  :func:`fit_despite_memory_losses`: the trial the kill names (its ``pid``, Tune's last result's ``pid``), or
  else the trials running at Tune's last saved state, is charged one loss, and the experiment is restored from
  that state and goes on, as ``--resume`` would; a trial charged more losses than ``--max-failures`` is told so
  when it restarts (:func:`over_budget`) and reports itself failed (:data:`CAUSE`) instead of training again;
- a kill Tune does handle (an actor being created) is retried by Tune's own ``FailureConfig``; its traceback on
  the console (Tune's "Trial task failed" with the whole memory report) becomes one line (:func:`one_line`), and
  the trial's row names :data:`CAUSE` (:func:`row_error`).

Crashes that charge no trial (none was running at the last saved state) are bounded by
:data:`UNCHARGED_LOSSES_MAX`; then the study stops with one line, and ``--resume`` continues it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from ray import tune
from ray.exceptions import OutOfMemoryError
from ray.tune.experiment import Trial

from dcl_core.config import RunFailedError

log = logging.getLogger(__name__)

ADVICE = ("to avoid it, run fewer trials at once (--max-concurrent N, or a smaller --num-cpus) or free memory on "
          "this machine")
CAUSE = f"OutOfMemoryError: killed by Ray's memory monitor (the machine ran low on memory); {ADVICE}"
UNCHARGED_LOSSES_MAX = 3  # memory kills naming no trial that could be charged, before the study stops
# Ray's words for a memory kill, in its OutOfMemoryError (and in Tune's error.txt when only that text is kept)
RAY_WORDS = re.compile(r"killed due to (?:the node )?(?:running low on memory|memory pressure)")
KILLED_PID = re.compile(r"\bpid=(\d+)")  # the killed workers in Ray's report ("Selected to kill: ... pid=N")


def is_memory_kill(err: object) -> bool:
    """Whether ``err`` (an exception, or the text Tune kept of one) is, or was caused by, Ray's memory monitor
    killing a worker."""
    if isinstance(err, BaseException):
        return _ray_error(err) is not None
    return isinstance(err, str) and RAY_WORDS.search(err) is not None


def _ray_error(err: BaseException) -> OutOfMemoryError | None:
    """The ``OutOfMemoryError`` in ``err``'s chain (its causes and contexts), if any."""
    seen: set[int] = set()
    cur: BaseException | None = err
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OutOfMemoryError):
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


def row_error(error: object) -> str | None:
    """The cause a trial's row names for Tune's ``error``: :data:`CAUSE` for a memory kill, else None (the row's
    own reading of the error stands)."""
    return CAUSE if error is not None and (is_memory_kill(error) or is_memory_kill(str(error))) else None


def over_budget(trial_id: str, losses: dict[str, int] | None, max_failures: int) -> bool:
    """Whether a restarting trial has been lost to memory more often than ``max_failures`` allows: it then
    reports itself failed with :data:`CAUSE` instead of training again."""
    return (losses or {}).get(trial_id, 0) > max_failures


def fit_despite_memory_losses(fit: Callable[[dict[str, int], bool], Any], exp_uri: str, max_failures: int) -> Any:
    """``fit(losses, again)`` (one Tune experiment's fit: ``again`` when it continues after a memory kill, from its
    saved state; ``losses`` the memory losses charged to each trial id so far) until it ends otherwise. Raises
    :class:`~dcl_core.config.RunFailedError` (one line) after :data:`UNCHARGED_LOSSES_MAX` kills that charged no
    trial."""
    losses: dict[str, int] = {}
    uncharged = 0
    again = False
    while True:
        try:
            return fit(dict(losses), again)
        except Exception as err:
            if not is_memory_kill(err):
                raise
            charged = _charge(err, exp_uri, losses, max_failures)
            uncharged += not charged
            if uncharged >= UNCHARGED_LOSSES_MAX:
                raise RunFailedError(f"Ray's memory monitor killed this study's trials {uncharged} times (the "
                                     f"machine ran low on memory); {ADVICE}, then continue with --resume") from None
            again = True


def _charge(err: BaseException, exp_uri: str, losses: dict[str, int], max_failures: int) -> list[str]:
    """Charge the lost trials one loss each and say so (one line each); the trial names charged."""
    trials = _running_trials(exp_uri)
    pids = {int(p) for p in KILLED_PID.findall(str(_ray_error(err) or err))}
    named = [t for t in trials if (t.last_result or {}).get("pid") in pids]
    charged = named or trials
    for t in charged:
        losses[t.trial_id] = losses.get(t.trial_id, 0) + 1
        n = losses[t.trial_id]
        fate = (f"it resumes from its last checkpoint (retry {n} of {max_failures}, --max-failures)"
                if n <= max_failures else f"recorded as failed (lost {n} times, --max-failures {max_failures})")
        log.warning("trial %s was killed by Ray's memory monitor (the machine ran low on memory): %s; %s", t, fate,
                    ADVICE)
    if not charged:
        log.warning("Ray's memory monitor killed a trial of %s before Tune saved its state (the machine ran low on "
                    "memory): the experiment goes on from its last saved state; %s", exp_uri, ADVICE)
    return [str(t) for t in charged]


def _running_trials(exp_uri: str) -> list[Any]:
    """The trials Tune's last saved state of the experiment lists as unfinished (none if nothing is saved)."""
    if not tune.Tuner.can_restore(exp_uri):
        return []
    done = (Trial.TERMINATED, Trial.ERROR)
    return [t for t in tune.ExperimentAnalysis(exp_uri).trials if t.status not in done]


def one_line(record: logging.LogRecord) -> bool:
    """A logging filter for Tune's controller: its "Trial task failed for trial X" with the memory monitor's whole
    report as a traceback becomes one line (a warning: Tune retries the trial while ``--max-failures`` allows)."""
    exc = record.exc_info[1] if record.exc_info else None
    message = record.getMessage()
    if exc is None or not message.startswith("Trial task failed for trial") or not is_memory_kill(exc):
        return True
    trial = message.rpartition(" ")[2]
    record.msg = (f"trial {trial} was killed by Ray's memory monitor (the machine ran low on memory): Tune retries "
                  f"it while --max-failures allows; {ADVICE}")
    record.args, record.exc_info, record.exc_text = (), None, None
    record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
    return True
