"""Tune's saved state, unpickled by a ``--resume`` only as this study wrote it.

Tune keeps an experiment's state as pickles: ``tuner.pkl``; the searcher's ``searcher-state-*.pkl`` (Optuna's
sampler and study) and ``*-state-*.json`` (cloudpickles, whatever their name says); ``callback-states-*.pkl``;
``experiment_state-*.json``, whose trials hold hex cloudpickles that Ray decodes as it reads them; and a failed
trial's ``<trial>/error.pkl``. Restoring an experiment, or reading its state back (``ExperimentAnalysis``), runs
whatever code they hold, and the output folder may be shared or crafted. So the study signs each of them as Tune
writes them: a manifest beside them (:data:`MANIFEST`) lists each file's SHA-256 digests, signed with this user's
key (:mod:`~dcl_core.study.plan.signing`), and a resume reads nothing it does not sign (:func:`unsigned`).

Tune saves its state into the driver's own staging folder, then copies it to the study's storage; it asks its
callbacks for their state between the two (the last step of its save), and :class:`SignState` signs there what the
staging folder holds. So every file reaches the storage already signed, and a driver killed at any moment
(``kill -9``) leaves a state that resumes: the manifest keeps each file's last :data:`KEEP` digests, for a copy
still under way. ``tuner.pkl``, which ``tune.Tuner`` writes once, straight to the storage, is signed right after
(:func:`sign_tuner`). The study's copy of its last readable state (:mod:`.tune_state`) is signed on its own
(:func:`sign_copy`, :func:`signed_copy`), and a copy put back is signed again in place (:func:`vouch`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import stat
from pathlib import Path
from typing import Any

import pyarrow
import pyarrow.fs
from ray import tune

from dcl_core.config import ConfigError
from dcl_core.files import loads_json, read_bounded, write_with
from dcl_core.study.plan import signing

log = logging.getLogger(__name__)

MANIFEST = ".dcl_signed_state"  # beside Tune's state (and in its copy): the digests the study signed
PURPOSE = "tune state"
KEEP = 16  # digests kept per file: a save's copy to the storage may still be under way at the next save
MAX_MANIFEST_BYTES = 16 * 1024 * 1024  # ~100 bytes a file and digest: far more files than a study's trials
ERROR_PICKLE = "error.pkl"  # a failed trial's exception, which Tune unpickles into its results
_CHUNK = 1 << 20

Signed = dict[str, list[str]]  # a file's path in the experiment folder -> the digests signed for it, oldest first


def is_pickled(name: str) -> bool:
    """Whether Tune may unpickle a file of this name at the top of an experiment folder: it copies every ``.json``
    and ``.pkl`` there to its driver and restores the newest of each kind (its temporary ``tmp-*`` are not read)."""
    return name.endswith((".json", ".pkl")) and not name.startswith("tmp-")


def _experiment(folder: str) -> str:
    return posixpath.basename(folder.rstrip("/"))


def _local_digest(path: str | Path) -> str | None:
    """SHA-256 of a regular file, following a link as Tune does; None for anything else (a FIFO is never waited
    on, a device never read)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        os.set_blocking(fd, True)
        return hashlib.file_digest(f, "sha256").hexdigest()


def _digest(fs: pyarrow.fs.FileSystem, info: pyarrow.fs.FileInfo) -> str | None:
    """SHA-256 of a file in the storage; None for anything but a file."""
    if info.type != pyarrow.fs.FileType.File:
        return None
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        return _local_digest(info.path)
    digest = hashlib.sha256()
    with fs.open_input_stream(info.path) as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _pickled_files(fs: pyarrow.fs.FileSystem, folder: str) -> list[tuple[str, pyarrow.fs.FileInfo]]:
    """Every file of the experiment folder that a resume may unpickle, by its path in the folder: the state at its
    top (:func:`is_pickled`, whatever it is: a folder or a FIFO there is not a file the study signed) and each
    trial's ``error.pkl``."""
    top = fs.get_file_info(pyarrow.fs.FileSelector(folder, allow_not_found=True))
    found = [(i.base_name, i) for i in top if is_pickled(i.base_name)]
    trials = [i for i in top if i.type == pyarrow.fs.FileType.Directory and not i.base_name.startswith(".")]
    if trials:
        errors = fs.get_file_info([f"{i.path}/{ERROR_PICKLE}" for i in trials])
        found += [(f"{t.base_name}/{ERROR_PICKLE}", e) for t, e in zip(trials, errors, strict=True)
                  if e.type != pyarrow.fs.FileType.NotFound]
    return found


def _read(fs: pyarrow.fs.FileSystem, folder: str, experiment: str) -> Signed | None:
    """The digests the manifest in ``folder`` signs for ``experiment``, or None when it is missing, damaged, or not
    signed with this user's key as it is now."""
    path = f"{folder}/{MANIFEST}"
    try:
        if isinstance(fs, pyarrow.fs.LocalFileSystem):
            raw = read_bounded(path, MAX_MANIFEST_BYTES)
        else:
            info = fs.get_file_info(path)
            if info.type != pyarrow.fs.FileType.File or info.size > MAX_MANIFEST_BYTES:
                return None
            with fs.open_input_stream(path) as f:
                raw = f.read(MAX_MANIFEST_BYTES + 1)
        data = loads_json(raw)
    except (ConfigError, OSError, ValueError, pyarrow.ArrowException):
        return None
    if not (isinstance(data, dict) and data.get("experiment") == experiment
            and signing.json_trust(data, PURPOSE) == signing.SIGNED):
        return None
    files = data.get("files")
    if not (isinstance(files, dict) and all(isinstance(v, list) and all(isinstance(d, str) for d in v)
                                            for v in files.values())):
        return None
    return {str(k): list(v) for k, v in files.items()}


def _write(fs: pyarrow.fs.FileSystem, folder: str, experiment: str, files: Signed) -> bool:
    """Write the manifest of ``files`` into ``folder``, signed (atomically, replacing a link planted at its name
    on a local disk); False where no key can be kept."""
    data = signing.signed_json({"experiment": experiment, "files": files}, PURPOSE)
    if signing.SIGNATURE not in data:
        return False
    raw = json.dumps(data).encode()
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        write_with(f"{folder}/{MANIFEST}", lambda f: f.write(raw))
    else:
        with fs.open_output_stream(f"{folder}/{MANIFEST}") as f:
            f.write(raw)
    return True


def _add(signed: Signed, name: str, digest: str) -> bool:
    """Sign ``digest`` for ``name`` (keeping its last :data:`KEEP`); whether that changed anything."""
    kept = signed.setdefault(name, [])
    if digest in kept:
        return False
    kept.append(digest)
    del kept[:-KEEP]
    return True


def unsigned(exp_uri: str) -> str | None:
    """The first file of the experiment's saved state at ``exp_uri`` that a resume would unpickle and that the study
    did not sign as it is now (its path in the experiment folder), else None."""
    try:
        fs, folder = pyarrow.fs.FileSystem.from_uri(exp_uri)
        signed = _read(fs, folder, _experiment(folder)) or {}
        for name, info in _pickled_files(fs, folder):
            if _digest(fs, info) not in signed.get(name, ()):
                return name
    except (OSError, pyarrow.ArrowException) as err:
        raise ConfigError(f"cannot resume: Tune's saved state in {exp_uri} cannot be read: "
                          f"{str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__}"
                          ) from None
    return None


def vouch(exp_uri: str, digests: dict[str, str]) -> bool:
    """Sign ``digests`` (a file's path in the experiment folder -> the digest of what the study wrote there) in the
    experiment's manifest; whether they are signed."""
    try:
        fs, folder = pyarrow.fs.FileSystem.from_uri(exp_uri)
        experiment = _experiment(folder)
        signed = _read(fs, folder, experiment) or {}
        if not any([_add(signed, name, digest) for name, digest in digests.items()]):
            return True
        return _write(fs, folder, experiment, signed)
    except (OSError, ConfigError, pyarrow.ArrowException) as err:
        log.warning("Tune's state in %s was not signed (%s): a --resume will refuse it", exp_uri, err)
        return False


def require_key() -> None:
    """ConfigError (one line) when this user's signing key cannot be kept privately: a study signs the state it
    resumes from and the record its answer is rebuilt from, so without a key no ``--resume`` (nor a round of
    ``--until-resolved``) could continue it."""
    if signing.key(create=True) is None:
        raise ConfigError(f"no private key can be kept at {signing.key_path()} (a read-only home, a link, or a file "
                          "others may read): a study signs the state it resumes from with it; set XDG_CACHE_HOME to "
                          "a private folder of yours")


def sign_tuner(exp_uri: str) -> None:
    """Sign ``tuner.pkl``, which ``tune.Tuner`` has just written to the experiment folder at ``exp_uri``."""
    try:
        fs, folder = pyarrow.fs.FileSystem.from_uri(exp_uri)
        digest = _digest(fs, fs.get_file_info(f"{folder}/tuner.pkl"))
        if digest is not None:
            vouch(exp_uri, {"tuner.pkl": digest})
    except (OSError, pyarrow.ArrowException) as err:  # the storage went away: what reads it next says so
        log.warning("Tune's state in %s was not signed (%s): a --resume will refuse it", exp_uri, err)


def sign_copy(exp_dir: Path, copy_dir: Path, files: dict[str, bytes]) -> bool:
    """Before the copy ``files`` (name -> content) of Tune's state is written into ``copy_dir``: whether each is
    content the study signed in ``exp_dir``; if so the copy's own manifest signs them, beside what the copy holds
    until they are written (so a copy cut short still reads file by file as signed), else nothing is to be copied."""
    fs, experiment = pyarrow.fs.LocalFileSystem(), exp_dir.name
    live = _read(fs, str(exp_dir), experiment) or {}
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}
    if any(digest not in live.get(name, ()) for name, digest in digests.items()):
        return False
    copy = _read(fs, str(copy_dir), experiment) or {}
    for name, digest in digests.items():
        _add(copy, name, digest)
    return _write(fs, str(copy_dir), experiment, {name: copy[name] for name in digests})


def signed_copy(exp_dir: Path, copy_dir: Path, names: list[str]) -> dict[str, str] | None:
    """The digests of the files ``names`` of the copy in ``copy_dir`` when its manifest signs each as it is now,
    else None (a copy the study did not sign is never put back)."""
    copy = _read(pyarrow.fs.LocalFileSystem(), str(copy_dir), exp_dir.name) or {}
    digests = {name: _local_digest(copy_dir / name) for name in names}
    if any(d is None or d not in copy.get(name, ()) for name, d in digests.items()):
        return None
    return {name: d for name, d in digests.items() if d is not None}


def _staged(staging: Path) -> list[tuple[str, Path]]:
    """The files of Tune's staging folder that reach the storage as files a resume may unpickle."""
    found: list[tuple[str, Path]] = []
    try:
        entries = list(os.scandir(staging))
    except OSError:
        return found
    for entry in entries:
        if is_pickled(entry.name) and entry.is_file(follow_symlinks=False):
            found.append((entry.name, Path(entry.path)))
        elif entry.is_dir(follow_symlinks=False) and not entry.name.startswith("."):
            error = Path(entry.path, ERROR_PICKLE)
            if error.is_file():
                found.append((f"{entry.name}/{ERROR_PICKLE}", error))
    return found


class SignState(tune.Callback):
    """Signs Tune's state as Tune saves it: asked for its state (:meth:`get_state`, the last step of Tune's save,
    after the experiment's state and its searcher's are in the driver's staging folder and before they are copied
    to the storage), it signs what the staging folder holds in the experiment's manifest. It keeps no state itself
    (so Tune saves no callback state), and reads the manifest again when restored."""

    def __init__(self) -> None:
        self._trials: list[Any] | None = None
        self._signed: Signed | None = None
        self._warned = False

    def __getstate__(self) -> dict[str, Any]:
        # pickled with the tuner (tuner.pkl): a restored copy starts afresh and reads the manifest in the storage
        return {"_trials": None, "_signed": None, "_warned": False}

    def on_step_begin(self, iteration: int, trials: list[Any], **info: Any) -> None:
        """Tune's hook: a step begins; ``trials`` is Tune's own list of the experiment's trials (it grows in place,
        so the first save, at the end of the first step, already finds the trials added then)."""
        self._trials = trials

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Tune's hook, right after a failed trial's ``error.pkl`` was written into the staging folder (which a copy
        still under way may take to the storage before the next save): sign it now."""
        self._trials = trials
        self.get_state()

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        """Tune's hook, as :meth:`on_trial_recover`, for a trial that failed for good."""
        self._trials = trials
        self.get_state()

    def on_experiment_end(self, trials: list[Any], **info: Any) -> None:
        """Tune's hook, after its final save has reached the storage: sign it (an experiment that took no step, a
        resumed one whose trials had all finished, saved without asking a callback that had seen its trials)."""
        self._trials = trials
        self.get_state()

    def get_state(self) -> dict[str, Any] | None:
        """Tune's hook, the last step of its save: sign the state it saved (returns no state of its own)."""
        storage = next((t.storage for t in self._trials or () if getattr(t, "storage", None) is not None), None)
        if storage is None:
            return None
        try:
            self._sign(Path(storage.experiment_driver_staging_path), storage.storage_filesystem,
                       storage.experiment_fs_path)
        except (OSError, ConfigError, pyarrow.ArrowException) as err:  # a full disk: Tune's own save fails too
            if not self._warned:
                self._warned = True
                log.warning("Tune's state in %s was not signed (%s): a --resume will refuse what it saves now",
                            storage.experiment_fs_path, err)
        return None

    def _sign(self, staging: Path, fs: pyarrow.fs.FileSystem, folder: str) -> None:
        experiment = _experiment(folder)
        if self._signed is None:
            self._signed = _read(fs, folder, experiment) or {}
        changed = False
        for name, path in _staged(staging):
            digest = _local_digest(path)
            if digest is not None:
                changed = _add(self._signed, name, digest) or changed
        if changed and not _write(fs, folder, experiment, self._signed) and not self._warned:
            self._warned = True
            log.warning("no private key can be kept at %s: Tune's state is not signed, so a --resume of this study "
                        "will refuse it (set XDG_CACHE_HOME to a private folder of yours)", signing.key_path())
