"""A trial that fails in any way (its code raises, calls ``sys.exit``, or its process dies: a segmentation fault in
a native library, ``os._exit``, a kill) is a failed row with its cause in one plain line, and the study goes on to
its answer; the console says each failure in one line, without Ray's tracebacks or its internal log lines.

Why a dying trial process ended the whole study as "interrupted": Tune learns of the death twice, from the
actor (its process is gone) and from the training task (``ActorDiedError``), in either order. When the actor's
report comes first, Tune has already dropped the trial's actor by the time it handles the task's error, marks the
trial ``ERROR`` in memory (its callbacks see it fail) but never writes that status into its saved experiment state,
which keeps the trial ``RUNNING`` from the start of its last attempt. The study told an interrupted experiment (a
Ctrl-C leaves trials unfinished in the saved state) from a finished one by that state, so a race lost by 2 runs
in 3 read as "interrupted". :class:`TrialFailures` records every trial Tune gave up on (:data:`GAVE_UP`), and
:func:`unfinished` leaves those out. No signal is involved: Ray sends none to the driver when a worker dies.

What each failure says:

- a process that died of a fatal signal leaves its Python stack in the trial's folder (:data:`FATAL_NOTE`,
  Python's ``faulthandler``, set up by :func:`noting_fatal_signals` in the trial's process instead of the
  worker's stderr, which Ray forwards to the console); the cause names the signal and where it struck
  (:func:`fatal_signal_cause`), and a trial that died the same way twice reports itself failed instead of dying
  again (:func:`previous_death`), as a trial failing twice with the same error does;
- a process that ended without a Python error (``os._exit``, SIGKILL, the system's OOM killer) is
  :data:`DIED` (Ray cannot tell which);
- ``sys.exit(N)`` in a trial is named as such (:func:`exit_cause`; Tune read it as "Should not have reached here");
- Tune's "Trial task failed" traceback (≈80 lines an attempt) and its closing "Trials did not complete" list stay
  off the console (:func:`quiet_tune_failures`): a retried attempt is one line (:meth:`TrialFailures.on_trial_recover`)
  and the trial's own line (``[3/4] … FAILED <cause>``) gives the cause;
- Ray's own lines forwarded to the driver (the raylet's "A worker died …" and memory-monitor reports, the C++ crash
  handler's ``*** SIGSEGV received``, ``[mutex.cc : 452] RAW:``) stay off the console (:func:`quiet_ray_lines`);
  Ray keeps them in its session's log files (``/tmp/ray/session_*/logs``).
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import re
import sys
import sysconfig
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ray import tune
from ray.exceptions import RayActorError, WorkerCrashedError

from dcl_core import metric_names as M
from dcl_core.config import ConfigError
from dcl_core.files import open_fd, read_bounded
from dcl_core.study.analysis.rows import ANSI, CAUSE, error_text
from dcl_core.study.execution import memory_loss

log = logging.getLogger(__name__)

FATAL_NOTE = ".fatal_signal.txt"  # in a trial's folder: Python's stack when its process got a fatal signal
NOTE_MAX_BYTES = 1 << 16  # a note is a few KiB (one thread's stack)
ERROR_MAX_BYTES = 8 << 20  # Tune's error file of a trial: every failure's traceback, a few KiB each
EXITED = "SystemExit: the trial called sys.exit("  # the start of the cause of sys.exit in a trial
DIED = ("ActorDiedError: the trial's process ended without a Python error (os._exit, a kill signal or the "
        "system's out-of-memory killer)")
GAVE_UP: set[str] = set()  # the trials Tune gave up on in this driver (a restored experiment's callbacks are copies)
# Python's words for the fatal signals faulthandler handles
SIGNALS = {"Segmentation fault": "SIGSEGV", "Bus error": "SIGBUS", "Floating-point exception": "SIGFPE",
           "Floating point exception": "SIGFPE", "Aborted": "SIGABRT", "Illegal instruction": "SIGILL"}
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<name>\S+)')
_DEATH_WORDS = re.compile(r"The (?:actor|worker) died unexpectedly|worker process has died|ActorDiedError|"
                          r"WorkerCrashedError")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


# ---- in the trial's process ----

@contextlib.contextmanager
def noting_fatal_signals(trial_dir: Path) -> Iterator[None]:
    """While the block runs, a fatal signal writes the Python stack to the trial's :data:`FATAL_NOTE` instead of
    the worker's stderr (which reaches the console); afterwards faulthandler writes to stderr again, as Ray set
    it, and an empty note is removed. Where the note cannot be written the block runs as before."""
    path = trial_dir / FATAL_NOTE
    try:
        fd = open_fd(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    except (OSError, ConfigError) as err:
        log.debug("no fatal-signal note at %s: %s", path, err)
        yield
        return
    faulthandler.enable(file=fd, all_threads=False)
    try:
        yield
    finally:
        try:
            faulthandler.enable(file=sys.stderr, all_threads=False)
        except (AttributeError, ValueError, OSError):  # a stderr without a file descriptor (a captured one)
            faulthandler.disable()
        os.close(fd)
        with contextlib.suppress(OSError):
            if path.stat().st_size == 0:
                path.unlink()


def previous_death(trial_dir: Path) -> str | None:
    """The cause the trial's previous attempt died of, when it left a fatal-signal note (None otherwise)."""
    return read_note_cause(trial_dir / FATAL_NOTE)


def exit_cause(err: SystemExit) -> str:
    """``sys.exit(3)`` in a trial, in one line."""
    code = "" if err.code is None else repr(err.code)
    return f"{EXITED}{code})"[:300]


def exit_error(err: SystemExit) -> RuntimeError:
    """What the trial raises in place of its code's ``SystemExit`` (its cause :func:`exit_cause`): an error Tune
    retries as any other. A ``SystemExit`` itself ends Tune's function trainable as finished (code 0) or fails the
    trial with "RuntimeError: Should not have reached here"."""
    error = RuntimeError(exit_cause(err))
    error.__suppress_context__ = True  # raised while the SystemExit is handled: not its traceback as well
    return error


# ---- what a death says ----

def fatal_signal_cause(note: str) -> str | None:
    """The cause a fatal-signal note (faulthandler's report) gives: the signal and the innermost frame of code
    outside Python and its installed packages (else the innermost frame); None for a text that is no such note."""
    lines = [_CONTROL.sub("?", line) for line in note.splitlines()]
    fatal = next((line for line in lines if line.startswith("Fatal Python error: ")), None)
    if fatal is None:
        return None
    what = fatal.removeprefix("Fatal Python error: ").strip()
    frames = [m for line in lines if (m := _FRAME.match(line))]
    installed = tuple(p for p in {sysconfig.get_path(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")} if p)
    own = next((m for m in frames if not m["file"].startswith(installed)), frames[0] if frames else None)
    at = f" in {own['name']} ({own['file']}:{own['line']})" if own else ""
    signal_name = SIGNALS.get(what) or "FatalError"
    return f"{signal_name}: the trial's process died: {what.lower()}{at} (its stack: the trial's {FATAL_NOTE})"[:300]


def read_note_cause(path: Path) -> str | None:
    """:func:`fatal_signal_cause` of the note at ``path`` (a regular file, read within a bound), or None."""
    try:
        text = read_bounded(path, NOTE_MAX_BYTES).decode("utf-8", "replace")
    except ConfigError:  # no note (the usual case), or not a file of this project's
        return None
    return fatal_signal_cause(text)


def is_process_death(err: object) -> bool:
    """Whether Tune's error for a trial (an exception, or the text it kept) says the trial's process died (not
    Ray's memory monitor, :mod:`.memory_loss`)."""
    if err is None or memory_loss.is_memory_kill(err) or memory_loss.is_memory_kill(str(err)):
        return False
    seen: set[int] = set()
    cur = err if isinstance(err, BaseException) else None
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, RayActorError | WorkerCrashedError):
            return True
        cur = cur.__cause__ or cur.__context__
    return _DEATH_WORDS.search(str(err)) is not None


def row_error(error: object, trial_path: str | None) -> str | None:
    """The cause a trial's row names for Tune's ``error`` when its process died: the fatal-signal note's (read
    from the trial's folder ``trial_path`` when it is a local folder), else :data:`DIED`;
    ``sys.exit`` named as such (:func:`exit_cause`, without Ray's wrapping); None for any other error (the row's own
    reading of it stands)."""
    if error is None:
        return None
    if not is_process_death(error):
        text = _plain(error)
        start = text.find(EXITED)
        return text[start:].splitlines()[0] if start >= 0 else None
    local = Path(trial_path) if trial_path and "://" not in trial_path else None
    return (read_note_cause(local / FATAL_NOTE) if local is not None else None) or DIED


def trial_cause(trial: Any) -> str | None:
    """A failed trial's cause, for the console: what it reported (a trial that gave up itself), else Tune's error
    of it read like its row (:func:`row_error`)."""
    reported = (trial.last_result or {}).get(M.ERROR)
    if reported:
        return str(reported)
    try:
        error = _tune_error(trial)
        if error is None:
            return None
        return memory_loss.row_error(error) or row_error(error, trial.local_path) or _plain(error)
    except Exception as err:  # a line or a tag saying the cause never fails the trial's callbacks
        log.debug("no cause for trial %s: %s", trial, err)
        return None


def _plain(error: object) -> str:
    """An error, or the text Tune kept of one, as a row gives it (:func:`~dcl_core.study.analysis.rows.error_text`):
    its innermost ``Type: message`` line."""
    if isinstance(error, BaseException):
        return error_text(error)
    lines = [line.strip() for line in ANSI.sub("", str(error)).splitlines() if line.strip()]
    causes = [line for line in lines if CAUSE.match(line)]
    return (causes or lines or [""])[-1][:300]


def _tune_error(trial: Any) -> object:
    """The text Tune kept of a trial's last failure: from its error file in the driver's copy of the trial's folder
    (written as Tune handles the failure; the study's storage has it only after Tune's next save), else from the
    storage's copy (``Trial.get_error``); None if neither reads."""
    local = getattr(trial, "error_file", None)
    if local:
        with contextlib.suppress(ConfigError):  # not there (yet), or not a file
            text = read_bounded(local, ERROR_MAX_BYTES).decode("utf-8", "replace")
            last = text.rpartition("Failure # ")[2].partition("\n")[2].strip()  # "N (occurred at …)\n<error>"
            if last:
                return last
    with contextlib.suppress(Exception):  # the file Tune wrote may be gone (a full disk, a moved folder)
        return trial.get_error()
    return None


# ---- in the driver ----

def unfinished(trials: list[Any]) -> list[Any]:
    """The trials of Tune's saved state left unfinished (an interrupt), less those Tune gave up on in this driver
    (their failure may be missing from the saved state; see the module's docstring)."""
    done = ("TERMINATED", "ERROR")
    return [t for t in trials if t.status not in done and t.trial_id not in GAVE_UP]


class TrialFailures(tune.Callback):
    """Records the trials Tune gives up on (:data:`GAVE_UP`) and says each retried attempt in one line."""

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Tune's hook: an attempt failed and the trial is retried from its last checkpoint."""
        error = _tune_error(trial)
        if error is not None and memory_loss.is_memory_kill(error):
            return  # said by memory_loss.one_line
        cause = trial_cause(trial) or "its process stopped"
        log.warning("trial %s failed (%s): retried from its last checkpoint while --max-failures allows", trial,
                    cause)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Tune's hook: Tune gave up on the trial (it failed more often than --max-failures allows)."""
        GAVE_UP.add(trial.trial_id)


def _tunes_failure_lines(record: logging.LogRecord) -> bool:
    """A logging filter for Tune's loggers: False (dropped) for its "Trial task failed" traceback (the study says
    each failure in one line) and its closing "Trials did not complete" list (the summary says which failed)."""
    message = record.getMessage()
    if message.startswith("Trials did not complete"):
        return False
    return not (message.startswith("Trial task failed for trial") and record.exc_info and record.exc_info[1]
                and not memory_loss.is_memory_kill(record.exc_info[1]))


def quiet_tune_failures() -> None:
    """Without ``-v``: Tune's tracebacks of failed trials and its list of the trials that did not complete stay off
    the console (:func:`_tunes_failure_lines`)."""
    for name in ("ray.tune.execution.tune_controller", "ray.tune.tune"):
        logger = logging.getLogger(name)
        if _tunes_failure_lines not in logger.filters:
            logger.addFilter(_tunes_failure_lines)


# Ray's lines forwarded to the driver ("(raylet) …", "(trainable pid=1234) …"), ANSI colours removed
_FORWARDED = re.compile(r"^\((?P<who>[^()]*)\) (?P<message>.*)$")
_RAY_INTERNAL = re.compile(
    r"^(?:\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ [DIWEF] \d+ \d+\] "  # Ray's C++ log lines
    r"|\[[\w.]+ ?: ?\d+\] RAW: "  # abseil's raw log ([mutex.cc : 452] RAW: Lock blocking …)
    r"|\*\*\* SIG[A-Z]+ received at time="  # Ray's C++ crash handler
    r"|PC: @ |\s*@ +0x[0-9a-f]+ "
    r"|Fatal Python error: |Extension modules: |Stack \(most recent call first\):|Current thread 0x)")


# Ray Train's placement-group cleaner, a detached actor beside each DDP trial's controller: its lines are about Ray
# Train's own bookkeeping (with a local Ray, which has no dashboard, "Failed to query Ray Train Controller actor
# state" every few seconds: ray_env.setup_worker). The controller runs no user code either (the workers do): on a
# loaded machine it printed "Failed to send resource request ... it's safe to ignore" with a GetTimeoutError
# traceback; a trial that fails says so in the study's own line.
_CLEANER = "PlacementGroupCleaner "
_CONTROLLER = "TrainController "


def ray_internal(line: str) -> bool:
    """Whether a line Ray forwarded to the driver is Ray's own (the raylet's messages, its C++ log and crash lines,
    Ray Train's controller and placement-group cleaner) rather than a trial's output."""
    forwarded = _FORWARDED.match(ANSI.sub("", line))
    if forwarded is None:
        return False
    who = forwarded["who"]
    return (who == "raylet" or who.startswith(("raylet,", _CLEANER, _CONTROLLER))
            or bool(_RAY_INTERNAL.match(forwarded["message"])))


class _WithoutRayLines:
    """A console stream (``sys.stdout``, ``sys.stderr``) that drops Ray's own forwarded lines (:func:`ray_internal`)
    written from Ray's threads; what the main thread writes (the study's lines, its progress bar) passes at once,
    unless ``every_thread``: while Ray shuts down, the main thread prints the lines Ray's driver held back to count
    their repeats in other processes (a crash line of two trials that died within its 5 s window)."""

    def __init__(self, stream: Any, every_thread: bool = False) -> None:
        self.stream = stream
        self.every_thread = every_thread
        self._partial = threading.local()

    def write(self, text: str) -> int:
        if not self.every_thread and threading.current_thread() is threading.main_thread():
            return int(self.stream.write(text) or 0)
        *lines, rest = (getattr(self._partial, "text", "") + text).split("\n")
        self._partial.text = rest
        kept = [line for line in lines if not ray_internal(line)]
        if kept:
            self.stream.write("\n".join(kept) + "\n")
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        rest = getattr(self._partial, "text", "")  # a line not ended yet (another thread's progress bar) goes out
        self._partial.text = ""
        if rest and not ray_internal(rest):
            self.stream.write(rest)
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def quiet_ray_lines(active: bool = True, every_thread: bool = False) -> Iterator[None]:
    """While the block runs, Ray's own lines stay off the console (:class:`_WithoutRayLines`; ``every_thread``: the
    main thread's too, around ``ray.shutdown``); all of them with ``active`` False (``-v``)."""
    if not active:
        yield
        return
    before = sys.stdout, sys.stderr
    quiet = _WithoutRayLines(sys.stdout, every_thread), _WithoutRayLines(sys.stderr, every_thread)
    sys.stdout, sys.stderr = quiet
    try:
        yield
    finally:
        sys.stdout, sys.stderr = before
        if every_thread:  # what the main thread left without its line's end
            for stream in quiet:
                stream.flush()


def shutdown_quietly() -> None:
    """``ray.shutdown`` with Ray's own lines off the console, those it held back and prints as it ends included."""
    import ray  # imported with the study already

    with quiet_ray_lines(every_thread=True):
        ray.shutdown()
