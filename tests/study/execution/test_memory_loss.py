"""A trial killed by Ray's memory monitor is a failed trial like any other (issue 46, item 12): before, a kill during
training ended the whole study with ~80 lines of Tune's traceback ending in "RuntimeError: Caught unexpected
exception", and a kill Tune did handle printed Ray's whole memory report as a traceback, per attempt.

The slow test forces Ray's own memory monitor to kill the trials for real: its documented threshold
(``RAY_memory_usage_threshold``, a fraction of the machine's memory) below what the machine already uses, checked
every ``RAY_memory_monitor_refresh_ms``."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

import pyrun
import pytest
from ray.exceptions import OutOfMemoryError

from dcl_core.config import RunFailedError
from dcl_core.data import resolve_data_root
from dcl_core.study import summary_dir
from dcl_core.study.analysis.tables import read_table
from dcl_core.study.execution import memory_loss, trainable, tune_state

REPO = Path(__file__).resolve().parents[3]
# Ray's report of a kill, as its raylet words it (shortened)
REPORT = ("1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 127.0.0.1) was "
          "2.60GB used / 23.54GB limit\nSelected to kill: (Actor(5146): task name=ImplicitFunc.train, pid=22511, "
          "actual memory used=0.55GB)")


def _tune_crash() -> RuntimeError:
    """What Tune's actor manager raises for a trial killed while it trains."""
    try:
        try:
            raise OutOfMemoryError(REPORT)
        except OutOfMemoryError as oom:
            raise RuntimeError(f"Caught unexpected exception: {oom}") from oom
    except RuntimeError as err:
        return err


def test_a_memory_kill_is_told_from_other_failures_by_its_cause_or_its_text() -> None:
    assert memory_loss.is_memory_kill(_tune_crash())
    assert memory_loss.is_memory_kill(f"Failure # 1 (occurred at 2026-11-28_00-46-27)\n{REPORT}")  # error.txt
    assert not memory_loss.is_memory_kill(RuntimeError("injected failure"))
    assert not memory_loss.is_memory_kill("Failure # 1\nValueError: bad")
    assert memory_loss.row_error(f"Failure # 1 (occurred at ...)\n{REPORT}") == memory_loss.CAUSE
    assert memory_loss.row_error(RuntimeError("x")) is None and memory_loss.row_error(None) is None
    assert "--num-cpus" in memory_loss.CAUSE and "\n" not in memory_loss.CAUSE


def test_tunes_traceback_of_a_trial_lost_to_memory_is_one_line(capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Through Tune's own controller logger, as Tune logs it ("Trial task failed for trial X", exc_info). Tune's
    loggers start without the study's filters, whatever an earlier test of this process installed (a study run in
    the process adds the filter that keeps every other failure's traceback off its console), and get them back."""
    for name in ("ray.tune.tune", "ray.tune.execution.experiment_state", "ray.tune.execution.tune_controller"):
        monkeypatch.setattr(logging.getLogger(name), "filters", [])
    tune_state.quiet_tune_restore_advice()
    logger = logging.getLogger("ray.tune.execution.tune_controller")
    handler = logging.StreamHandler(sys.stderr)
    logger.addHandler(handler)
    try:
        logger.error("Trial task failed for trial dcl_s0_t0.1_00000", exc_info=OutOfMemoryError(REPORT))
        logger.error("Trial task failed for trial dcl_s0_t0.5_00001", exc_info=ValueError("another failure"))
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    lost, other = err.split("\n", 1)
    assert lost.startswith("trial dcl_s0_t0.1_00000 was killed by Ray's memory monitor") and "--num-cpus" in lost
    assert "Selected to kill" not in err and "ValueError: another failure" in other  # another failure: as Tune logs it


def test_a_restored_experiment_deleting_a_checkpoint_already_gone_is_not_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """After a kill (a memory kill's restore, kill -9 then --resume) Tune's saved state can name a checkpoint its
    killed run had deleted already; Tune's own deletion of it then fails (nothing is lost) and it logged the
    FileNotFoundError's traceback. Ray's own deletion, on a folder that is not there."""
    from pyarrow.fs import LocalFileSystem
    from ray.train._internal.storage import _delete_fs_path  # what Tune's checkpoint manager calls

    tune_state.quiet_tune_restore_advice()
    logger = logging.getLogger("ray.tune.execution.tune_controller")
    handler = logging.StreamHandler(sys.stderr)
    logger.addHandler(handler)
    try:
        try:
            _delete_fs_path(LocalFileSystem(), str(tmp_path / "checkpoint_000022"))
        except FileNotFoundError:
            logger.exception("Trial %s: Error handling checkpoint %s", "dcl_s0_t0.1_00000", "TrainingResult(...)")
        try:
            raise FileNotFoundError("another file")
        except FileNotFoundError:
            logger.exception("Trial %s: Error handling checkpoint %s", "dcl_s0_t0.1_00000", "TrainingResult(...)")
    finally:
        logger.removeHandler(handler)
    err = capsys.readouterr().err
    assert err.count("Error handling checkpoint") == 1 and "another file" in err  # any other error is still said


def test_kills_that_charge_no_trial_stop_the_study_in_one_line(tmp_path: Path) -> None:
    """No saved state to restore from: each kill charges no trial; the third stops the study, one line."""
    calls = []

    def fit(losses: dict[str, int], again: bool) -> None:
        calls.append(again)
        raise _tune_crash()

    with pytest.raises(RunFailedError) as stopped:
        memory_loss.fit_despite_memory_losses(fit, str(tmp_path / "no_experiment"), max_failures=2)
    assert calls == [False, True, True] and len(calls) == memory_loss.UNCHARGED_LOSSES_MAX
    assert "\n" not in str(stopped.value) and "--resume" in str(stopped.value)
    with pytest.raises(ValueError):  # anything else is not a memory loss
        memory_loss.fit_despite_memory_losses(lambda losses, again: int("x"), str(tmp_path), 2)


def test_a_trial_over_its_budget_of_memory_losses_reports_itself_failed() -> None:
    assert not memory_loss.over_budget("t1", {"t1": 2}, max_failures=2)
    assert memory_loss.over_budget("t1", {"t1": 3}, max_failures=2)
    assert not memory_loss.over_budget("t2", {"t1": 9}, max_failures=0) and not memory_loss.over_budget("t", None, 0)


def _memory_used_and_limit() -> tuple[int, int]:
    """What Ray's memory monitor compares with its threshold: the container's memory (cgroup v2), else the
    machine's (MemTotal less MemAvailable), in bytes."""
    cgroup = Path("/sys/fs/cgroup")
    limit = (cgroup / "memory.max").read_text().strip() if (cgroup / "memory.max").is_file() else "max"
    if limit != "max":
        return int((cgroup / "memory.current").read_text()), int(limit)
    info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines()
            if line.split()[1:2] and line.split()[1].isdigit()}
    return info["MemTotal"] - info["MemAvailable"], info["MemTotal"]


@pytest.mark.slow  # a real smoke study whose trials Ray's memory monitor kills while they train (one Ray start)
@pytest.mark.skipif(not (resolve_data_root("cifar10", None) / "train").is_dir(), reason="embedded CIFAR-10 not present")
def test_trials_killed_by_rays_memory_monitor_fail_and_the_study_goes_on(tmp_path: Path) -> None:
    """Each trial holds 3 GiB after each epoch from its second on; Ray's threshold lies 1.5 GiB above what the
    machine uses now, so the monitor kills the trial while it trains, on every attempt: with --max-failures 1 each
    trial is retried once from its checkpoint, then recorded as failed, and the study goes on to the next trial
    and to its end (every trial failed: exit 1, one line). Which of the kill's two reports reaches Tune first is
    Ray's race: the actor's death (Tune retries the trial itself) or the training task's OutOfMemoryError (which
    ended the study; :func:`memory_loss.fit_despite_memory_losses` restores and goes on): either is one line."""
    out = tmp_path / "o"
    used, limit = _memory_used_and_limit()
    cmd = [sys.executable, str(REPO / "studies" / "temperature_sweep.py"), "--smoke", "--losses", "dcl",
           "--output-dir", str(out), "--num-cpus", "1", "--max-concurrent", "1", "--max-failures", "1",
           "--set", "optim.epochs=4"]
    env = {**os.environ, "RAY_memory_usage_threshold": f"{(used + (3 << 29)) / limit:.4f}",
           "RAY_memory_monitor_refresh_ms": "100", trainable.HOLD_ENV: "2:3072"}
    proc = pyrun.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500, env=env)
    err = proc.stderr
    assert proc.returncode == 1, proc.stdout[-2000:] + err[-5000:]
    assert "Traceback" not in err and "Caught unexpected exception" not in err, err[-5000:]
    assert "Selected to kill" not in err  # Ray's memory report is not the study's console
    lost = [line for line in err.splitlines() if "killed by Ray's memory monitor" in line]
    assert all("--num-cpus" in line for line in lost), err[-5000:]
    for trial in ("dcl_s0_t0.1", "dcl_s0_t0.5"):  # lost, retried once, lost again: the study went on to the next
        assert sum(trial in line for line in lost) >= 2, err[-5000:]
    assert err.strip().splitlines()[-1] == f"error: every trial failed; the first: {memory_loss.CAUSE}"
    rows = read_table(summary_dir(out, "temperature_sweep") / "results.parquet")
    assert len(rows) == 2 and all(r["status"] == "error" and r["error"] == memory_loss.CAUSE for r in rows)


# A Tune experiment whose two trials fail before they report (as a trial killed by Ray's memory monitor on every
# attempt does), attached to the suite's Ray head
_NEVER_REPORTED = """
import sys
import ray
from ray import tune
def train(config):
    raise RuntimeError("killed before its first report")
ray.init(address=sys.argv[1])
tune.Tuner(train, param_space={"loss.name": "dcl", "loss.temperature": tune.grid_search([0.1, 0.5]), "seed": 0},
           run_config=tune.RunConfig(name="exp", storage_path=sys.argv[2], verbose=0)).fit()
"""


@pytest.mark.slow  # a two-trial Tune experiment on the suite's Ray head
def test_a_trial_that_never_reported_gets_its_row_from_tunes_saved_state(tmp_path: Path, ray_head: Any) -> None:
    """Tune gives a trial's config only with its last reported result: a trial killed (by Ray's memory monitor) on
    every attempt before it reported had none, its row no grid point, and the study's summary failed sorting the
    grid (TypeError: '<' not supported between 'NoneType' and 'float'). The ``params.json`` Tune writes as a trial
    starts is not a source: an experiment restored after a memory kill may never have synced it to the storage
    (removed here). The experiment state Tune saved gives each trial's config."""
    from ray import tune

    from dcl_core.study.execution.results import tune_rows

    proc = pyrun.run([sys.executable, "-c", _NEVER_REPORTED, ray_head.address, str(tmp_path)],
                     capture_output=True, text=True, timeout=600, env=ray_head.env | {"RAY_AUTH_MODE": "token"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    for params in (tmp_path / "exp").glob("*/params.json"):
        params.unlink()
    results = tune.ResultGrid(tune.ExperimentAnalysis(str(tmp_path / "exp")))
    assert all(not r.config for r in results)
    rows = tune_rows(results)
    assert sorted(r["temperature"] for r in rows) == [0.1, 0.5]
    assert all(r["seed"] == 0 and r["status"] == "error" for r in rows)

