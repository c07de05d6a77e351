"""A full disk loses nothing: the first trial that fails for lack of space stops the study as Ctrl-C does, and a
copy of Tune's last readable state lets ``--resume`` continue after Tune's own save was cut short.

Tune saves an experiment's state (``experiment_state-*.json``, its searcher's ``*-state-*.json``, ``tuner.pkl``)
by copying its driver's files to the study's storage; on a full disk the copy is cut short, and Tune can no longer
restore the experiment. :class:`StateBackup` keeps a copy of the last state that reads back
(``<experiment>/.dcl_state_backup/``), taken as trials start and finish and once more after Tune's final save;
:func:`restore_backup` puts it back when the state is damaged. A trial still running at the copy resumes from the
last checkpoint the copy names (from its start if none); a study that ended before its state was damaged retrains
nothing. Local storage only (a ``s3://`` store is not copied). Like the state itself, the copy holds pickles: only
state the study signed is copied, and only a copy signed so is put back (:mod:`.state_signature`).

:class:`DiskFullStop` sees each trial's end: at the first one that failed for a full disk every other trial would
fail the same way, so it ends the experiment the way Ctrl-C does (a SIGINT to the driver, Tune's documented
graceful stop: its state is saved, unfinished trials stay unfinished for ``--resume``), and the study then says in
one line that the disk is full (:data:`DISK_FULL`).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import threading
import time
from pathlib import Path
from typing import Any

from ray import tune

from dcl_core import metric_names as M
from dcl_core.config import ConfigError
from dcl_core.files import DiskFullError, disk_full, file_kind, is_regular_file, loads_json, no_space, write_files
from dcl_core.study.execution import memory_loss, state_signature
from dcl_core.study.plan import signing

log = logging.getLogger(__name__)

BACKUP_DIR = ".dcl_state_backup"
DISK_FULL = threading.Event()  # set by DiskFullStop in the driver (a restored experiment's callbacks are copies)


def _state_files(exp_dir: Path) -> list[Path]:
    """Tune's state files of an experiment folder (regular files only)."""
    names = [*exp_dir.glob("experiment_state-*.json"), *exp_dir.glob("*-state-*.json"), exp_dir / "tuner.pkl"]
    return sorted({p for p in names if is_regular_file(p)})


def readable_state(files: list[Path]) -> bool:
    """Whether Tune's state files read back: every ``experiment_state-*.json`` parses with its trials, every
    other state file is non-empty (a searcher's state and the tuner are pickles, which are not loaded here)."""
    states = [p for p in files if p.name.startswith("experiment_state-")]
    if not states:
        return False
    for p in files:
        try:
            if p in states:
                if not isinstance(loads_json(p.read_text()).get("trial_data"), list):
                    return False
            elif p.stat().st_size == 0:
                return False
        except (OSError, ValueError, AttributeError):
            return False
    return True


def _local_dir(path: Any) -> Path | None:
    """A trial's experiment folder when the study's storage is a local folder, else None."""
    storage = getattr(path, "storage", None)
    fs_path = getattr(storage, "experiment_fs_path", None)
    filesystem = getattr(storage, "storage_filesystem", None)
    if fs_path is None or getattr(filesystem, "type_name", "local") != "local":
        return None
    return Path(fs_path)


def state_reads_back(exp_dir: Path) -> bool:
    """Whether the experiment's saved state reads back (:func:`readable_state`)."""
    return readable_state(_state_files(exp_dir))


def backup(exp_dir: Path) -> bool:
    """Copy the experiment's state into ``<exp_dir>/.dcl_state_backup/`` if it reads back and is as the study signed
    it (atomically, all its files or none, the copy signed on its own: :func:`.state_signature.sign_copy`; a failed
    copy, e.g. on a full disk, leaves the previous one whole). Returns whether it was copied."""
    files = _state_files(exp_dir)
    if not readable_state(files):
        return False
    target = exp_dir / BACKUP_DIR
    if target.is_symlink() or (target.exists() and not target.is_dir()):  # planted: never written through
        log.debug("no copy of Tune's state: %s is not a folder the study made", target)
        return False
    try:
        staged = [(p, p.read_bytes()) for p in files]
        if not state_signature.sign_copy(exp_dir, target, {p.name: data for p, data in staged}):
            return False  # a copy is only of what the study signed (and put back only as signed)
        # as a whole: a disk that fills part-way leaves the previous copy, never a new searcher's state beside no
        # (or an older) experiment state, which no resume can use
        write_files({target / p.name: data for p, data in staged})
        keep = {p.name for p in files} | {state_signature.MANIFEST}
        for old in target.iterdir():
            if old.name not in keep and is_regular_file(old):
                old.unlink()
    except (OSError, ConfigError) as err:  # a full disk; a folder or a FIFO planted at a name it writes
        log.debug("no copy of Tune's state in %s: %s", target, err)
        return False
    return True


def restore_backup(exp_dir: Path) -> bool:
    """Put the last copy of Tune's state back in place of a damaged one, signed again in place; returns whether
    there was one that reads back and is as the study signed it (:func:`.state_signature.signed_copy`)."""
    saved = exp_dir / BACKUP_DIR
    files = _state_files(saved) if saved.is_dir() and not saved.is_symlink() else []
    if not readable_state(files):
        return False
    vouched = state_signature.signed_copy(exp_dir, saved, [p.name for p in files])
    if vouched is None:
        return False
    for damaged in _state_files(exp_dir):
        damaged.unlink()
    for p in files:
        shutil.copyfile(p, exp_dir / p.name)
    state_signature.vouch(str(exp_dir), vouched)
    log.warning("Tune's saved state in %s was damaged (a full disk cuts its save short): put back its last "
                "readable copy; trials unfinished in that copy resume from the last checkpoint it names", exp_dir)
    return True


def check_signed(uri: str) -> None:
    """ConfigError (one line), before anything of it is read, unless every file of Tune's saved state at ``uri`` that
    a resume unpickles is as the study signed it (:mod:`.state_signature`): a pickle runs its code as it is read, and
    the folder may be shared (a ``tuner.pkl`` planted there ran ``os.system`` as whoever resumed). A state cut short
    (a full disk) is put back first from the study's signed copy (:func:`restore_backup`)."""
    name = state_signature.unsigned(uri)
    local = Path(uri) if "://" not in uri else None
    if name is not None and local is not None and not state_reads_back(local) and restore_backup(local):
        name = state_signature.unsigned(uri)
    if name is None:
        return
    if local is not None and not state_reads_back(local):
        raise ConfigError(f"cannot resume: Tune's saved state in {uri} is damaged ({name} does not read back); "
                          "--overwrite starts the study afresh")
    what = (f"there is no private key at {signing.key_path()} to check Tune's saved state in {uri} with (set "
            "XDG_CACHE_HOME to a private folder of yours)" if signing.key_unusable() else
            f"{name} in Tune's saved state in {uri} is not as this study wrote it (changed since, or put there)")
    raise ConfigError(f"cannot resume: {what}; Tune's state is pickles, which run code as they are read, so none of "
                      "it was read; --overwrite starts the study afresh")


def check_only_files(exp_dir: Path) -> None:
    """ConfigError (one line), before anything of the experiment at ``exp_dir`` is read, when a FIFO, a device or a
    socket lies in it or in a trial's folder, or a state file Tune restores from (a ``.json`` or ``.pkl`` at its top)
    is not a regular file: Tune opened a FIFO planted at ``experiment_state-*.json`` and waited forever (a SIGTERM
    then took a minute), and a link there would be followed."""
    folders = [exp_dir, *(p for p in exp_dir.iterdir() if p.is_dir() and not p.is_symlink())]
    for folder in folders:
        for path in folder.iterdir():
            kind = file_kind(path)
            state = folder == exp_dir and path.name.endswith((".json", ".pkl"))
            if kind == "a regular file" or (not state and kind in ("a folder", "a symbolic link", "nothing")):
                continue
            raise ConfigError(f"cannot resume: {path} is {kind}, not a file Tune wrote: not read; remove it, or "
                              "--overwrite starts the study afresh")


def stopped_for_space(output_dir: Path, exp_uri: str) -> DiskFullError:
    """The one line a study stopped by a full disk ends with: the same command with ``--resume`` where Tune's state
    of the experiment at ``exp_uri``, or the study's copy of it, reads back; else (the disk filled before either
    could be saved, so a resume would find the state damaged) with ``--overwrite``, which starts it afresh."""
    local = Path(exp_uri) if "://" not in exp_uri else None
    if local is None or state_reads_back(local) or state_reads_back(local / BACKUP_DIR):
        return disk_full(output_dir, resume=True)
    return disk_full(output_dir, then=", then run the same command with --overwrite (the disk filled before Tune's "
                                      "state of the study could be saved, so --resume has nothing to continue)")


def _not_for_this_study(record: logging.LogRecord) -> bool:
    """False for Tune's lines that a study says better itself (a logging filter)."""
    message = record.getMessage()
    if "Tuner.restore(" in message or "Experiment has been interrupted" in message:
        return False  # the study prints its own resume line (the same command with --resume)
    if message.startswith("Stop signal received"):
        return False  # Ctrl-C, SIGTERM, a full disk's stop: the study says it in its own one line
    if "Error handling checkpoint" in message and _deleting_a_deleted_checkpoint(record):
        return False  # a resumed experiment's state names a checkpoint its killed run had already deleted
    if DISK_FULL.is_set() and record.levelno >= logging.ERROR and "Saving experiment state" in message:
        return False  # the study stops on a full disk and says so in its own line
    if message.startswith("Saving experiment state to storage") and record.exc_info:
        _one_line(record)  # a sync that failed or timed out (seen on a loaded machine): Tune saves again later
    return True


def _one_line(record: logging.LogRecord) -> None:
    """The record's message with its exception's type and first line instead of the traceback."""
    assert record.exc_info is not None
    exc = record.exc_info[1]
    why = f"{type(exc).__name__}: {str(exc).splitlines()[0]}" if exc is not None and str(exc) else type(exc).__name__
    record.msg, record.args = f"{record.getMessage().rstrip(': ')} ({why}); Tune saves it again at its next save", ()
    record.exc_info, record.exc_text = None, None


def _deleting_a_deleted_checkpoint(record: logging.LogRecord) -> bool:
    """Whether the record's error is Tune failing to delete a checkpoint folder that is gone already (nothing is
    lost: the checkpoint was one Tune keeps no more; the new one is registered)."""
    exc = record.exc_info[1] if record.exc_info else None
    if not isinstance(exc, FileNotFoundError):
        return False
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_name != "_delete_fs_path":
        tb = tb.tb_next
    return tb is not None


def quiet_tune_restore_advice() -> None:
    """Without ``-v``: no ``Tuner.restore(path=...)`` advice (a study resumes with ``--resume``), no "Stop signal
    received" (the study's own line says it was interrupted), no list of the trials whose results Tune could not
    read (each ``--resume`` after ``kill -9``, Ctrl-C or a full disk printed "Failed to fetch metrics ...
    FileNotFoundError" for trials whose result file never reached the storage), no traceback of Tune deleting a
    checkpoint that a killed run had deleted already, no traceback of Tune's last save on a full disk (the study says
    so in one line), a failed save of the experiment state in one line, and a trial lost to Ray's memory monitor in
    one line (:func:`memory_loss.one_line`). Called before a study first reads Tune's state."""
    for name in ("ray.tune.tune", "ray.tune.execution.experiment_state", "ray.tune.execution.tune_controller"):
        logger = logging.getLogger(name)
        if _not_for_this_study not in logger.filters:
            logger.addFilter(_not_for_this_study)
    controller = logging.getLogger("ray.tune.execution.tune_controller")
    if memory_loss.one_line not in controller.filters:  # a trial lost to memory: one line, not Ray's whole report
        controller.addFilter(memory_loss.one_line)
    logging.getLogger("ray.tune.analysis.experiment_analysis").setLevel(logging.ERROR)


class StateBackup(tune.Callback):
    """Copies an experiment's Tune state (:func:`backup`) as trials start and finish: at the first chance, then at
    most every ``every`` seconds (a large study's state is megabytes), at every trial's end, and after Tune's final
    save. A trial's end comes before Tune saves the state that lists it finished (and, for a short trial, before
    the save that lists its last checkpoint): without the last copy, a study whose state was damaged after it
    ended would retrain its last trials from scratch."""

    def __init__(self, every: float = 10.0) -> None:
        self.every = every
        self._last: dict[Path, float] = {}

    def _backup(self, trial: Any, force: bool) -> None:
        exp_dir = _local_dir(trial)
        if exp_dir is None:
            return
        now = time.monotonic()
        if exp_dir in self._last and not force and now - self._last[exp_dir] < self.every:
            return
        if backup(exp_dir):
            self._last[exp_dir] = now

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Tune's hook: a trial started (the first copy comes before any trial can fill the disk)."""
        self._backup(trial, force=False)

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Tune's hook: a trial finished."""
        self._backup(trial, force=True)

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        """Tune's hook: the experiment ended, after its final save of the state (also on Ctrl-C)."""
        for exp_dir in {d for d in map(_local_dir, trials) if d is not None}:
            if backup(exp_dir):
                self._last[exp_dir] = time.monotonic()


class DiskFullStop(tune.Callback):
    """Ends the experiment as Ctrl-C does at the first trial that failed for a full disk (:data:`DISK_FULL`)."""

    def _check(self, cause: object) -> None:
        if DISK_FULL.is_set() or not no_space(cause if isinstance(cause, BaseException) else str(cause)):
            return
        DISK_FULL.set()
        log.error("a trial failed: no space left on its device; stopping the study (finished trials are kept)")
        os.kill(os.getpid(), signal.SIGINT)  # Tune's graceful stop: its state saved, unfinished trials kept

    def on_trial_result(self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any],
                        **info: Any) -> None:
        """Tune's hook: a trial reported (a trial that gave up reports ``failed`` with its cause)."""
        if result.get(M.FAILED):
            self._check(result.get(M.ERROR, ""))

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Tune's hook: a trial raised."""
        self._check(trial.get_error() or "")
