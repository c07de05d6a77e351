"""A trial that fails in any way is a failed row with its cause, and the study goes on to its answer (issue 61, items
2 and 12). Before: a trial whose process died (a segmentation fault in the loss, ``os._exit``) ended the study in 2
runs of 3 as "interrupted (N trial(s) did not finish)", exit 130, no summary, with 100-190 lines of Ray's
tracebacks; a loss that raised printed Tune's traceback at every attempt; ``sys.exit(3)`` in a trial read
"RuntimeError: Should not have reached here"; the raylet's reports and Ray's C++ crash lines reached the console.

The slow tests plant the losses of ``dying_losses.py`` in a real smoke study."""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pyrun
import pytest
from mlflow.tracking import MlflowClient
from ray.exceptions import ActorDiedError, OutOfMemoryError

from dcl_core import metric_names as M
from dcl_core.data import resolve_data_root
from dcl_core.study import summary_dir
from dcl_core.study.analysis.tables import read_table
from dcl_core.study.execution import console, memory_loss, trial_failures
from dcl_core.study.tracking import trial_reporters

REPO = Path(__file__).resolve().parents[3]
LOSSES = Path(__file__).resolve().parent / "dying_losses.py"
# What faulthandler writes on a segmentation fault in a user's loss (shortened)
NOTE = """Fatal Python error: Segmentation fault

Stack (most recent call first):
  File "{stdlib}/ctypes/__init__.py", line 519 in string_at
  File "/home/me/my_losses.py", line 25 in fail
  File "/home/me/my_losses.py", line 14 in from_similarities
  File "/work/main/dcl_core/losses/base.py", line 279 in forward
"""
SEGFAULT_CAUSE = ("SIGSEGV: the trial's process died: segmentation fault in fail (/home/me/my_losses.py:25) "
                  f"(its stack: the trial's {trial_failures.FATAL_NOTE})")
needs_cifar = pytest.mark.skipif(not (resolve_data_root("cifar10", None) / "train").is_dir(),
                                 reason="embedded CIFAR-10 not present")


class Trial:
    """What the callbacks read of a Tune trial."""

    def __init__(self, trial_id: str, status: str = "RUNNING", last_result: dict | None = None,
                 error: BaseException | None = None, local_path: str | None = None) -> None:
        self.trial_id, self.status, self.last_result = trial_id, status, last_result or {}
        self.error, self.local_path, self.error_file = error, local_path, None

    def get_error(self) -> BaseException | None:
        return self.error

    def __str__(self) -> str:
        return self.trial_id


def _stdlib() -> str:
    import sysconfig

    return sysconfig.get_path("stdlib")


def test_a_fatal_signal_note_names_the_signal_and_the_frame_of_the_users_code() -> None:
    assert trial_failures.fatal_signal_cause(NOTE.format(stdlib=_stdlib())) == SEGFAULT_CAUSE
    aborted = "Fatal Python error: Aborted\n\nStack (most recent call first):\n  <no Python frame>\n"
    assert trial_failures.fatal_signal_cause(aborted).startswith("SIGABRT: the trial's process died: aborted (its")
    assert trial_failures.fatal_signal_cause("") is None and trial_failures.fatal_signal_cause("ValueError: x") is None


def test_a_dead_trial_process_is_told_from_other_failures_and_its_row_names_the_cause(tmp_path: Path) -> None:
    died = ActorDiedError()
    assert trial_failures.is_process_death(died)
    assert trial_failures.is_process_death("Failure # 1 (occurred at ...)\nThe actor died unexpectedly before ...")
    assert not trial_failures.is_process_death(ValueError("bad"))
    assert not trial_failures.is_process_death(OutOfMemoryError("1 worker(s) were killed due to the node running "
                                                                "low on memory"))  # memory_loss says that one
    assert trial_failures.row_error(died, str(tmp_path)) == trial_failures.DIED  # no note: os._exit, a kill
    (tmp_path / trial_failures.FATAL_NOTE).write_text(NOTE.format(stdlib=_stdlib()))
    assert trial_failures.row_error(died, str(tmp_path)) == SEGFAULT_CAUSE
    assert trial_failures.row_error(ValueError("bad"), str(tmp_path)) is None  # the row's own reading stands
    assert trial_failures.row_error(None, str(tmp_path)) is None


def test_a_failed_trials_line_reads_the_cause_tune_just_wrote_in_the_trials_folder(tmp_path: Path) -> None:
    """Tune writes a failure into the driver's copy of the trial's folder as it handles it; the study's storage has it
    only after Tune's next save (the first retry's line said "its process stopped")."""
    errors = tmp_path / "error.txt"
    errors.write_text("Failure # 1 (occurred at 2026-12-02_01-21-09)\nray::ImplicitFunc.train() (pid=1)\n  File \"x\", "
                      "line 1, in f\nValueError: the first\nFailure # 2 (occurred at 2026-12-02_01-22-18)\n"
                      "The actor died unexpectedly before finishing this task.\n\tclass_name: ImplicitFunc\n")
    trial = Trial("Segfaults_s0_t0.1_00001", local_path=str(tmp_path))
    trial.error_file = str(errors)
    assert trial_failures.trial_cause(trial) == trial_failures.DIED
    (tmp_path / trial_failures.FATAL_NOTE).write_text(NOTE.format(stdlib=_stdlib()))
    assert trial_failures.trial_cause(trial) == SEGFAULT_CAUSE
    errors.write_text("Failure # 1 (occurred at …)\nray::ImplicitFunc.train() (pid=1)\nValueError: planted\n")
    assert trial_failures.trial_cause(trial) == "ValueError: planted"


def test_sys_exit_in_a_trial_is_named_as_such() -> None:
    cause = trial_failures.exit_cause(SystemExit(3))
    assert cause == "SystemExit: the trial called sys.exit(3)"
    assert trial_failures.exit_cause(SystemExit()) == "SystemExit: the trial called sys.exit()"
    raised = trial_failures.exit_error(SystemExit(3))
    assert isinstance(raised, RuntimeError) and str(raised) == cause
    # as Tune keeps it when it gives up on the trial: Ray's wrapping around the trial's error
    wrapped = (f"ray::ImplicitFunc.train() (pid=1, ip=127.0.0.1)\n  File \"x.py\", line 1, in f\nRuntimeError: "
               f"{cause}")
    assert trial_failures.row_error(wrapped, None) == cause


def test_a_trial_tune_gave_up_on_is_finished_whatever_tunes_saved_state_says() -> None:
    """The race behind "interrupted": Tune marks a trial whose actor it had already dropped ERROR in memory only;
    its saved state keeps it RUNNING. A trial Tune did not give up on stays unfinished (a Ctrl-C)."""
    dead, interrupted = Trial("dead_00001"), Trial("running_00002")
    trial_failures.TrialFailures().on_trial_error(0, [], Trial("dead_00001", status="ERROR"))
    saved = [dead, interrupted, Trial("done_00003", status="TERMINATED"), Trial("failed_00004", status="ERROR")]
    assert trial_failures.unfinished(saved) == [interrupted]


def test_tunes_failure_tracebacks_stay_off_the_console_and_a_retry_is_one_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    trial_failures.quiet_tune_failures()
    memory = logging.getLogger("ray.tune.execution.tune_controller")
    if memory_loss.one_line not in memory.filters:
        memory.addFilter(memory_loss.one_line)
    handler = logging.StreamHandler(sys.stderr)
    loggers = [logging.getLogger(n) for n in ("ray.tune.execution.tune_controller", "ray.tune.tune",
                                              trial_failures.__name__)]
    propagate = [logger.propagate for logger in loggers]
    for logger in loggers:
        logger.addHandler(handler)
        logger.propagate = False
    try:
        memory.error("Trial task failed for trial Raises_s0_t0.1_00001", exc_info=ValueError("planted"))
        memory.error("Trial task failed for trial dcl_s0_t0.1_00000",
                     exc_info=OutOfMemoryError("1 worker(s) were killed due to the node running low on memory"))
        logging.getLogger("ray.tune.tune").error("Trials did not complete: [Raises_s0_t0.1_00001]")
        logging.getLogger("ray.tune.tune").error("another of Tune's errors")
        trial_failures.TrialFailures().on_trial_recover(0, [], Trial("Raises_s0_t0.1_00001", error=ValueError("x")))
    finally:
        for logger, before in zip(loggers, propagate, strict=True):
            logger.removeHandler(handler)
            logger.propagate = before
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and "Traceback" not in "\n".join(err), err
    assert err[0].startswith("trial dcl_s0_t0.1_00000 was killed by Ray's memory monitor")  # memory_loss's own line
    assert err[1] == "another of Tune's errors"
    assert err[2] == ("trial Raises_s0_t0.1_00001 failed (ValueError: x): retried from its last checkpoint while "
                      "--max-failures allows")


RAY_LINES = [
    "\x1b[33m(raylet)\x1b[0m A worker died or was killed while executing a task by an unexpected system error.",
    "(raylet) Task was killed due to the node running low on memory.",
    "(trainable pid=12335) *** SIGSEGV received at time=1796174469 on cpu 0 ***",
    "(trainable pid=12335) PC: @     0x7f4e29974219  (unknown)  (unknown)",
    "(trainable pid=12335)     @     0x7f4e2985a050  (unknown)  (unknown)",
    "\x1b[36m(trainable pid=12335)\x1b[0m [2026-12-02 01:21:09,228 E 12335 12637] logging.cc:474: *** SIGSEGV",
    "(pid=4242) [mutex.cc : 452] RAW: Lock blocking 0x600002cd0cd8   @",
    "(trainable pid=12335) Fatal Python error: Segmentation fault",
    "\x1b[36m(PlacementGroupCleaner pid=1225)\x1b[0m Failed to query Ray Train Controller actor state. State API may "
    "be temporarily unavailable. Continuing to monitor.\x1b[32m [repeated 10x across cluster]\x1b[0m",
    # Ray Train's controller on a loaded machine (seen in the full suite), its traceback forwarded line by line
    "\x1b[36m(TrainController pid=31781)\x1b[0m Failed to send resource request for train-bc488edfbc07. If this only "
    "happens transiently during network partition or CPU being overloaded, it's safe to ignore this error.",
    "\x1b[36m(TrainController pid=31781)\x1b[0m Traceback (most recent call last):",
    "\x1b[36m(TrainController pid=31781)\x1b[0m ray.exceptions.GetTimeoutError: Get timed out: some object(s) not "
    "ready.",
]
TRIAL_LINES = ["(trainable pid=12335) WARNING my_losses: the loss saw a NaN", "[1/4] dcl_s0_t0.1_00000  kNN 10.0%",
               "(trainable pid=1, ip=10.0.0.2) restarting the trial from scratch: its latest checkpoint is unreadable",
               "(RayTrainWorker pid=22080) WARNING my_losses: the loss saw a NaN"]


def test_rays_own_lines_stay_off_the_console_and_the_trials_lines_reach_it(capsys: pytest.CaptureFixture[str]) -> None:
    assert all(trial_failures.ray_internal(line) for line in RAY_LINES)
    assert not any(trial_failures.ray_internal(line) for line in TRIAL_LINES)

    def ray_print_logs() -> None:  # as Ray's log thread prints: print() writes the line, then its end
        for line in [*RAY_LINES, *TRIAL_LINES]:
            print(line, file=sys.stderr)
            print(line)

    with trial_failures.quiet_ray_lines():
        thread = threading.Thread(target=ray_print_logs)
        thread.start()
        thread.join()
        print("the study's own line", end="")  # the main thread's writes pass at once (a progress bar's \r)
        seen = capsys.readouterr()
    assert seen.out == "\n".join(TRIAL_LINES) + "\nthe study's own line"
    assert seen.err == "\n".join(TRIAL_LINES) + "\n"
    with trial_failures.quiet_ray_lines(active=False):  # -v: everything
        print(RAY_LINES[0], file=sys.stderr)
    assert capsys.readouterr().err == RAY_LINES[0] + "\n"


@pytest.mark.slow  # starts Ray
def test_the_lines_ray_held_back_for_their_repeats_stay_off_the_console_when_ray_ends(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray holds a line that repeats in another process back for 5 s, to count its repeats, and prints what it holds
    when it shuts down, from the main thread: a segfault study's crash lines, its last two attempts within 5 s of its
    end, reached the console under CI's load. The trials' own held-back lines still reach it."""
    import ray
    from ray._private.ray_logging import stderr_deduplicator

    from dcl_core.study.execution.tuning import end_ray

    @ray.remote(num_cpus=0)
    class Trial:  # an actor a process: the same line from two of them is a repeat Ray holds back
        def say(self, line: str) -> None:
            print(line, file=sys.stderr, flush=True)

        def ready(self) -> None:
            pass

    # Ray's own 5 s window, widened: on a loaded machine the repeats may reach the driver later than that
    monkeypatch.setattr(stderr_deduplicator, "agg_window_s", 600)
    crash, own = "*** SIGSEGV received at time=1796366124 on cpu 1 ***", "WARNING my_losses: the loss saw a NaN"
    ray.init(address="local", num_cpus=1, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        with trial_failures.quiet_ray_lines():
            trials = [Trial.remote() for _ in range(3)]  # type: ignore[attr-defined]
            ray.get([t.ready.remote() for t in trials])  # every process started
            ray.get([t.say.remote(line) for t in trials for line in (crash, own)])
            deadline = time.monotonic() + 60
            while len(_held_back()) < 2 and time.monotonic() < deadline:  # both repeats reached the driver
                time.sleep(0.1)
            assert len(_held_back()) == 2, "Ray held no repeat back: the test would test nothing"
            end_ray(verbosity=0)
    finally:
        ray.shutdown()
    err = capsys.readouterr().err
    # the trial's line once as it came, once as Ray's count of its repeats, which ray.shutdown prints
    assert "SIGSEGV" not in err and err.count(own) == 2 and "[repeated 2x across cluster]" in err, err


def _held_back() -> list[str]:
    """The lines Ray's driver holds back, each seen again in another process since it was printed."""
    from ray._private.ray_logging import stderr_deduplicator

    return [state.line for state in stderr_deduplicator.recent.values() if state.count > 0]


def test_a_trial_whose_end_is_told_twice_is_counted_once_and_a_failed_trial_says_why(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Tune tells of a trial's end twice when a callback fails on it (its end then becomes an error): one finished
    trial was printed as [1/4] twice."""
    progress = console.ConsoleProgress("s", total=4)
    done = Trial("dcl_s0_t0.1_00000", last_result={M.KNN_TOP1: 10.0, "time_total_s": 5.0})
    progress.on_trial_complete(0, [], done)
    progress.on_trial_error(0, [], done)
    gave_up = Trial("Raises_s0_t0.1_00001", last_result={M.FAILED: 1.0, M.ERROR: "ValueError: planted"})
    progress.on_trial_complete(0, [], gave_up)
    died = Trial("ExitsHard_s0_t0.5_00003", error=ActorDiedError())
    progress.on_trial_error(0, [], died)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert [line.split()[0] for line in lines] == ["[1/4]", "[2/4]", "[3/4]"] and progress.done == 3
    assert "FAILED" not in lines[0]
    assert re.match(r"\[2/4\] Raises_s0_t0.1_00001  FAILED  ValueError: planted  \(", lines[1])
    assert f"FAILED  {trial_failures.DIED}  (" in lines[2]


def test_a_trial_sees_one_folder_whether_tune_reused_its_process_or_not(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    """Tune gives a new actor's trial its staging folder and a reused actor's its working directory: a retried trial's
    attempts kept their failures (and a fatal signal's note) in two folders, so the second of two equal failures went
    unseen and the trial ran a third time."""
    staged = tmp_path / "exp" / "driver_artifacts" / "Raises_s0_t0.1_00001"
    working = tmp_path / "exp" / "working_dirs" / "Raises_s0_t0.1_00001"
    staged.mkdir(parents=True)
    working.mkdir(parents=True)
    monkeypatch.chdir(working)
    for given in (staged, working):
        context: Any = type("Context", (), {"get_trial_dir": lambda self, d=given: str(d),
                                            "get_trial_id": lambda self: "00001"})()
        monkeypatch.setattr(trial_reporters.tune, "get_context", lambda c=context: c)
        assert trial_reporters.trial_context() == ("00001", staged.resolve(), working.resolve())


@pytest.mark.slow  # a process of its own that dies of a segmentation fault
def test_a_segmentation_fault_leaves_its_note_and_the_next_attempt_reads_it(tmp_path: Path) -> None:
    code = ("import ctypes, sys; from pathlib import Path\n"
            "from dcl_core.study.execution.trial_failures import noting_fatal_signals\n"
            "with noting_fatal_signals(Path(sys.argv[1])):\n"
            "    ctypes.string_at(0)\n")
    proc = pyrun.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -11 and "Fatal Python error" not in proc.stderr, proc.stderr[-2000:]
    cause = trial_failures.previous_death(tmp_path)
    assert cause is not None and cause.startswith("SIGSEGV: the trial's process died: segmentation fault in <module> ")
    ok = ("import sys; from pathlib import Path\n"
          "from dcl_core.study.execution.trial_failures import noting_fatal_signals\n"
          "with noting_fatal_signals(Path(sys.argv[1])):\n"
          "    pass\n")
    assert pyrun.run([sys.executable, "-c", ok, str(tmp_path)], timeout=300).returncode == 0
    assert not (tmp_path / trial_failures.FATAL_NOTE).exists()  # an attempt that lived leaves none


def _study(out: Path, losses: str, *args: str) -> Any:
    cmd = [sys.executable, str(REPO / "studies" / "temperature_sweep.py"), "--smoke", "--losses", losses,
           "--output-dir", str(out), "--num-cpus", "1", *args]
    return pyrun.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500, env=dict(os.environ))


def _quiet(proc: Any) -> str:
    """The console, with the checks every failure shares: no traceback, none of Ray's own lines."""
    console_text = proc.stdout + proc.stderr
    for noise in ("Traceback (most recent call last)", "(raylet)", "SIGSEGV received", "Fatal Python error",
                  "Should not have reached here", "Trials did not complete", "Trial task failed",
                  "interrupted"):
        assert noise not in console_text, (noise, proc.stdout[-3000:] + proc.stderr[-5000:])
    return console_text


@pytest.mark.slow  # a real smoke study (one Ray start) whose planted losses fail in their trials
@needs_cifar
def test_trials_that_segfault_exit_raise_or_call_sys_exit_fail_with_their_cause_and_the_study_answers(
        tmp_path: Path) -> None:
    """Each failing trial once (--max-failures 0: Tune gives up on it at its first failure, the case where its saved
    state kept a dead trial RUNNING most often; the next test retries)."""
    out = tmp_path / "o"
    names = ("Segfaults", "ExitsHard", "Raises", "SysExits")
    proc = _study(out, ",".join(["dcl", *(f"{LOSSES}:{n}" for n in names)]), "--max-failures", "0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]  # some trials finished
    text = _quiet(proc)
    assert len(text.splitlines()) < 80, text  # was 100-190 lines of tracebacks for one dying loss
    assert "results: " in proc.stdout and "Verdict" in proc.stdout
    counted = re.findall(r"^\[(\d+)/10\] (\S+)", proc.stdout, re.MULTILINE)
    assert sorted(int(n) for n, _ in counted) == list(range(1, 11)), proc.stdout  # each trial once
    assert len({name for _, name in counted}) == 10
    rows = read_table(summary_dir(out, "temperature_sweep") / "results.parquet")
    by_loss = {name: [r for r in rows if r["loss"].endswith(f":{name}")] for name in names}
    assert [r["status"] for r in rows if r["loss"] == "dcl"] == ["ok", "ok"]
    expected = {
        "Segfaults": lambda e: e.startswith(f"SIGSEGV: the trial's process died: segmentation fault in fail ({LOSSES}"),
        "ExitsHard": lambda e: e == trial_failures.DIED,
        "Raises": lambda e: e == "ValueError: planted failure in the loss",
        "SysExits": lambda e: e == "SystemExit: the trial called sys.exit(3)",
    }
    for name, check in expected.items():
        assert len(by_loss[name]) == 2, rows
        for r in by_loss[name]:
            assert r["status"] == "error" and check(r["error"]), (name, r["error"])
            assert f"  {r['error']}  (" in proc.stdout, proc.stdout  # its line ([3/10] … FAILED … <cause>) names it
    client = MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    exp_id = client.get_experiment_by_name("temperature_sweep").experiment_id
    runs = {r.data.tags["trial_name"]: r for r in client.search_runs([exp_id]) if "trial_id" in r.data.tags}
    failed = [r for name, r in runs.items() if not name.startswith("dcl_")]
    assert len(failed) == 8 and all(r.info.status == "FAILED" and r.data.tags.get("error") for r in failed)


@pytest.mark.slow  # a real smoke study (one Ray start) whose every trial dies
@needs_cifar
def test_a_trial_that_died_twice_alike_is_not_retried_and_a_study_whose_every_trial_died_exits_1(
        tmp_path: Path) -> None:
    """--max-failures 2 (the default): each trial dies, is retried (one line), dies again of the same segmentation
    fault, and its third attempt reports it failed at once, with the cause its note gave."""
    out = tmp_path / "o"
    proc = _study(out, f"{LOSSES}:Segfaults")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-5000:]
    _quiet(proc)
    cause = f"SIGSEGV: the trial's process died: segmentation fault in fail ({LOSSES}"
    assert proc.stderr.strip().splitlines()[-1].startswith(f"error: every trial failed; the first: {cause}")
    retried = [line for line in proc.stderr.splitlines() if "retried from its last checkpoint" in line]
    assert len(retried) == 4 and all(cause in line for line in retried), proc.stderr[-3000:]  # twice a trial
    rows = read_table(summary_dir(out, "temperature_sweep") / "results.parquet")
    assert len(rows) == 2 and all(r["status"] == "error" and r["error"].startswith(cause) for r in rows)
    exp = out / "ray_results" / "temperature_sweep"
    for trial in exp.glob("Segfaults_*"):  # two deaths, then the third attempt gave up at once
        assert len((trial / ".failures").read_text().splitlines()) == 2
        assert (trial / trial_failures.FATAL_NOTE).read_text().startswith("Fatal Python error: Segmentation fault")
