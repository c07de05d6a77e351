"""How a study stops on Ctrl-C (SIGINT) and SIGTERM at any moment, from its first import to its summary.

SIGTERM (``kill``, a batch scheduler's time limit, ``ray job stop``) stops a study as Ctrl-C does
(docs/failure-behaviour.md): while Tune runs, Tune's own graceful stop (its state saved, nothing half-trained
summarized, unfinished trials kept for ``--resume``; a second Ctrl-C skips that last save); before and after, a
``KeyboardInterrupt``, which the command line turns into exit 130 (Ctrl-C) or 143 (SIGTERM) with one line. Four
things used to swallow or mistranslate an early signal, each handled here:

- A study started in the background of a script (``python studies/x.py ... &``) inherits SIGINT *ignored* (POSIX
  shells do that for asynchronous commands), and Python keeps it ignored: ``kill -INT`` did nothing until Tune's
  own handler took over, and the SIGTERM handler, which raised SIGINT, did nothing either (the study ran to its
  end, exit 0). :func:`stop_signals` installs its own SIGINT handler whatever the study inherited (as Tune's does
  later anyway), and its SIGTERM handler calls the SIGINT handler in place rather than raising a signal.
- A ``KeyboardInterrupt`` raised while a module is being imported can be swallowed: inside one of importlib's
  weakref callbacks Python prints it as "Exception ignored" and goes on, and a third-party ``except:`` around an
  optional import drops it (measured: 2 of 10 Ctrl-Cs during ``import torch``). Once a stop is asked for, it is
  therefore raised again every :data:`REDELIVER_S` seconds until the command line has caught it (:meth:`Stop.caught`)
  or Tune's graceful stop has taken it over. What Python could only print of it (its "Exception ignored ...
  KeyboardInterrupt" through ``sys.unraisablehook``) and the RuntimeWarning an extension module's import cut short
  gives (Cython's "failed to patch module", at ``<frozen importlib._bootstrap>``) stay off the console once a stop
  is asked for: the stop's one line says what happened.
- ``ray.init`` replaces the SIGTERM handler with Ray's own ``sys.exit(15)`` for its duration (the study exited 15
  with no message). :func:`keep_stop_signals` restores the study's handlers after ``ray.init`` and turns a
  ``SystemExit`` out of it (only Ray's SIGTERM handler raises one there) into the study's SIGTERM.
- Ray's core worker installs a C++ handler that answers SIGTERM with SIGABRT (exit 134, a stack dump) for the
  rest of the process: the same restore removes it. It is in place for the last few milliseconds of ``ray.init``
  only.
- A signal to the study's whole process group (a batch scheduler's, ``timeout``'s) while ``ray.init`` waits for
  its raylet ends Ray's GCS too, and ``ray.init`` then sits in a C call for Ray's 30 s before Python can run any
  handler (a SIGTERM took 31 s). :func:`keep_stop_signals` watches for a stop through Python's wakeup fd, which its
  C-level handler writes to at once: one that the main thread has not acted on within :data:`STUCK_S` ends the
  study from the watching thread, as the main thread would have (its Ray's processes ended, the stop's one line,
  exit 130 or 143).

Only the main thread may set handlers: elsewhere (a study run from a thread) both are no-ops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

REDELIVER_S = 1.0  # a stop not yet caught (swallowed during an import) is raised again this often
STUCK_S = 2.0  # a stop inside ray.init not acted on by then: the main thread is blocked in a C call


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


class Stop:
    """The stop a study was asked for: whether by SIGTERM (:attr:`terminated`), and the re-delivery of a stop
    that has not reached the command line yet."""

    def __init__(self) -> None:
        self.terminated = False
        # the command line's one line for the stop and its exit status, for a stop ended from another thread
        self.last_words: Callable[[], int] | None = None
        self._asked = threading.Event()  # a stop was asked for and raised as KeyboardInterrupt
        self._caught = threading.Event()  # ... and the command line caught it (or the block ended)
        self._watch: threading.Thread | None = None

    def on_sigint(self, signum: int, frame: FrameType | None) -> None:
        """The study's SIGINT handler outside Tune: ``KeyboardInterrupt``, raised again until caught (not while
        the one raised before is being handled: its ``except`` or a ``finally`` on its way out)."""
        if self._caught.is_set() or (self._asked.is_set() and isinstance(sys.exc_info()[1], KeyboardInterrupt)):
            return
        if not self._asked.is_set():
            # an import this stop cuts short may warn (an extension module's init): the stop's line says it all
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"importlib\._bootstrap")
        self._asked.set()
        if self._watch is None:
            self._watch = threading.Thread(target=self._redeliver, name="stop-redelivery", daemon=True)
            self._watch.start()
        raise KeyboardInterrupt

    def on_sigterm(self, signum: int, frame: FrameType | None) -> None:
        """SIGTERM: counted, then what Ctrl-C does now (Tune's graceful stop while Tune runs)."""
        self.terminated = True
        handler = signal.getsignal(signal.SIGINT)
        if callable(handler):
            handler(signal.SIGINT, frame)
            return
        self.on_sigint(signum, frame)

    def unraisable(self, unraisable: Any, previous: Any) -> None:
        """``sys.unraisablehook`` while the block runs: a KeyboardInterrupt of an asked-for stop that Python could
        only print (raised in a ``__del__`` or a weakref callback) is dropped, since it is raised again
        (:meth:`_redeliver`); anything else goes to the previous hook."""
        if self._asked.is_set() and isinstance(unraisable.exc_value, KeyboardInterrupt):
            return
        previous(unraisable)

    def caught(self) -> None:
        """The command line has the stop (or the block ended): no more re-delivery. After a stop, torch's
        exit-time cache statistics (INFO), which a stop inside ``import torch`` lets through to the console
        before torch has set its loggers up, stay off it (torch's own default level)."""
        self._caught.set()
        if self._asked.is_set():
            torch_log = logging.getLogger("torch")
            torch_log.setLevel(max(torch_log.getEffectiveLevel(), logging.WARNING))

    def _redeliver(self) -> None:
        """While the stop is not caught, SIGINT to this process every :data:`REDELIVER_S` seconds: this handler
        raises it again; once Tune's handler is in place instead, that one SIGINT is Tune's graceful stop."""
        while not self._caught.wait(REDELIVER_S):
            ours = getattr(signal.getsignal(signal.SIGINT), "__self__", None) is self
            os.kill(os.getpid(), signal.SIGINT)
            if not ours:
                return


@contextlib.contextmanager
def stop_signals() -> Iterator[Stop]:
    """Ctrl-C and SIGTERM stop the block at any moment (see the module's docstring); the previous handlers are
    restored afterwards. Yields the :class:`Stop`, which tells SIGTERM (exit 143) from Ctrl-C (exit 130) and is
    told when the stop was caught."""
    stop = Stop()
    if not _main_thread():
        yield stop
        return
    before_int = signal.signal(signal.SIGINT, stop.on_sigint)
    before_term = signal.signal(signal.SIGTERM, stop.on_sigterm)
    before_hook, before_filters = sys.unraisablehook, list(warnings.filters)
    sys.unraisablehook = lambda unraisable: stop.unraisable(unraisable, before_hook)
    try:
        yield stop
    finally:
        stop.caught()
        sys.unraisablehook = before_hook
        # the filter a stop adds (Stop.on_sigint) ends with the block; a list at run time, a Sequence to typeshed
        warnings.filters[:] = before_filters  # type: ignore[index]
        _restore(before_int, before_term)


@contextlib.contextmanager
def keep_stop_signals(cleanup: Callable[[], object] | None = None) -> Iterator[None]:
    """The study's SIGINT and SIGTERM handlers through ``ray.init`` (Ray replaces SIGTERM's with its own
    ``sys.exit(15)``, then its core worker's C++ handler aborts on SIGTERM): restored when the block ends, and a
    ``SystemExit`` raised inside it, which only Ray's SIGTERM handler raises there, is handed to the study's
    SIGTERM handler (a ``KeyboardInterrupt`` counted as SIGTERM). Inside a study's :func:`stop_signals`, a stop the
    main thread has not acted on within :data:`STUCK_S` (``ray.init`` blocked in C) ends the process from a
    watching thread: ``cleanup`` (what this process's Ray started), the stop's :attr:`Stop.last_words`, exit."""
    if not _main_thread():
        yield
        return
    before_int, before_term = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    stop = getattr(before_term, "__self__", None)
    watch = _StuckWatch(stop, cleanup) if isinstance(stop, Stop) else None
    try:
        yield
    except SystemExit:
        _restore(before_int, before_term)
        if not callable(before_term):  # no study handler to hand it to: Ray's exit as it was
            raise
        before_term(signal.SIGTERM, None)  # the study's: counts it, raises KeyboardInterrupt
        raise KeyboardInterrupt from None  # ray.init did not finish: nothing goes on after it
    finally:
        if watch is not None:
            watch.close()
        _restore(before_int, before_term)


class _StuckWatch:
    """A thread that reads the signals Python's C-level handler notes in its wakeup fd (written even while the main
    thread is blocked in C) and ends the study itself when a SIGINT or SIGTERM has not been acted on within
    :data:`STUCK_S` (see :func:`keep_stop_signals`)."""

    def __init__(self, stop: Stop, cleanup: Callable[[], object] | None) -> None:
        self.stop, self.cleanup = stop, cleanup
        self.read, self.write = os.pipe()
        os.set_blocking(self.write, False)
        self.previous = signal.set_wakeup_fd(self.write, warn_on_full_buffer=False)
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.acting = False
        self.thread = threading.Thread(target=self._watch, name="stop-in-ray-init", daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        seen: set[int] = set()
        while not self.done.is_set():
            seen |= set(os.read(self.read, 64)) & {signal.SIGINT, signal.SIGTERM}
            if not seen or self.done.wait(STUCK_S):
                continue
            with self.lock:
                if self.done.is_set():
                    return
                self.acting = True
            self._end(terminated=signal.SIGTERM in seen)

    def _end(self, terminated: bool) -> None:
        """The study's end, from this thread: its Ray's processes, the stop's one line, the exit status."""
        self.stop.terminated = self.stop.terminated or terminated
        code = 128 + (signal.SIGTERM if self.stop.terminated else signal.SIGINT)  # a shell's status for the signal
        try:
            if self.cleanup is not None:
                self.cleanup()
            if self.stop.last_words is not None:
                code = self.stop.last_words()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)  # the main thread is blocked in C: nothing else can end the process now

    def close(self) -> None:
        """The block ended: stop watching (unless the study is being ended from the watching thread already)."""
        with self.lock:
            self.done.set()
            acting = self.acting
        if acting:
            self.thread.join()  # never returns: the watching thread ends the process
        os.write(self.write, b"\0")  # wakes the watching thread's read (0 is no signal)
        self.thread.join()
        signal.set_wakeup_fd(self.previous)
        os.close(self.read)
        os.close(self.write)


def _restore(before_int: Any, before_term: Any) -> None:
    signal.signal(signal.SIGINT, _or_default(before_int))
    signal.signal(signal.SIGTERM, _or_default(before_term))


def _or_default(handler: Any) -> Any:
    """A handler ``signal.signal`` takes back: ``None`` (one set outside Python) becomes the default."""
    return signal.SIG_DFL if handler is None else handler
