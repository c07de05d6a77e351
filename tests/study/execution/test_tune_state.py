"""Tune's state kept readable through a full disk (study/execution/tune_state.py), and what counts as a full disk
(dcl_core/files.py): a copy of the last state that reads back, put back in place of one cut short; a copy never
taken of a damaged state; no copy through a link. The end-to-end run on a real full tmpfs is test_full_disk.py."""

import errno
import hashlib
import json

import pytest

from dcl_core.files import DiskFullError, disk_full, no_space
from dcl_core.study.execution.state_signature import vouch
from dcl_core.study.execution.tune_state import BACKUP_DIR, backup, readable_state, restore_backup

STATE = {"trial_data": [["{}", "{}"]], "runner_data": {}}


@pytest.fixture
def exp_dir(tmp_path, monkeypatch):
    """An experiment's state as the study wrote it: signed (state_signature.py), with a key in this test's cache."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    d = tmp_path / "exp"
    d.mkdir()
    (d / "experiment_state-2026-01-01_00-00-00.json").write_text(json.dumps(STATE))
    (d / "basic-variant-state-2026-01-01_00-00-00.json").write_bytes(b"\x80\x05pickled")
    (d / "tuner.pkl").write_bytes(b"\x80\x05tuner")
    assert vouch(str(d), {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in d.iterdir()})
    return d


def test_a_state_cut_short_is_put_back_from_its_last_readable_copy(exp_dir):
    state = exp_dir / "experiment_state-2026-01-01_00-00-00.json"
    assert backup(exp_dir)
    good = state.read_bytes()
    state.write_bytes(good[: len(good) // 2])  # Tune's save cut short by a full disk
    assert not readable_state(sorted(exp_dir.glob("*-state-*.json")))
    assert not backup(exp_dir)  # a damaged state never replaces the copy
    assert restore_backup(exp_dir)
    assert state.read_bytes() == good and (exp_dir / "tuner.pkl").read_bytes() == b"\x80\x05tuner"


def test_no_copy_no_restore_and_an_empty_searcher_state_is_damaged(exp_dir):
    assert not restore_backup(exp_dir)  # nothing copied yet: the caller refuses in one line
    (exp_dir / "basic-variant-state-2026-01-01_00-00-00.json").write_bytes(b"")
    assert not backup(exp_dir) and not (exp_dir / BACKUP_DIR).exists()


def test_a_link_in_the_backup_folder_is_not_restored(exp_dir, tmp_path):
    assert backup(exp_dir)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (exp_dir / BACKUP_DIR).rename(elsewhere / BACKUP_DIR)
    (exp_dir / BACKUP_DIR).symlink_to(elsewhere / BACKUP_DIR)
    assert not restore_backup(exp_dir)


def test_a_link_planted_at_the_backup_folder_is_never_written_through(exp_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (exp_dir / BACKUP_DIR).symlink_to(elsewhere)
    assert not backup(exp_dir)
    assert list(elsewhere.iterdir()) == [] and (exp_dir / BACKUP_DIR).is_symlink()


def test_what_counts_as_a_full_disk():
    assert no_space(OSError(errno.ENOSPC, "No space left on device"))
    assert no_space(OSError(errno.EDQUOT, "Disk quota exceeded"))
    wrapped = RuntimeError("upload failed")
    wrapped.__cause__ = OSError("[Errno 28] Error writing bytes to file. Detail: [errno 28] No space left on device")
    assert no_space(wrapped)
    assert no_space("(sqlite3.OperationalError) database or disk is full")
    assert not no_space(OSError(errno.EACCES, "Permission denied")) and not no_space("kNN 28.0")
    err = disk_full("/data/out", resume=True)
    assert isinstance(err, DiskFullError) and str(err) == (
        "no space left on the device holding /data/out: free some space, then run the same command with --resume "
        "(finished trials are kept)")


def test_a_failed_save_of_the_experiment_state_is_one_line(capsys, monkeypatch):
    """Tune logs a failed or timed-out sync of its experiment state with a traceback (seen in the full suite on a
    loaded machine, the study went on and finished): the study's console shows it in one line, the cause kept."""
    import logging
    import sys

    from dcl_core.study.execution import tune_state

    logger = logging.getLogger("ray.tune.execution.experiment_state")
    monkeypatch.setattr(logger, "filters", [])
    tune_state.quiet_tune_restore_advice()
    handler = logging.StreamHandler(sys.stderr)
    logger.addHandler(handler)
    try:
        try:
            raise TimeoutError("sync did not finish in 1800 s")
        except TimeoutError:
            logger.error("Saving experiment state to storage at '/out/ray_results/x' failed with exception: ",
                         exc_info=True)
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    assert err == ("Saving experiment state to storage at '/out/ray_results/x' failed with exception (TimeoutError: "
                   "sync did not finish in 1800 s); Tune saves it again at its next save\n"), err
