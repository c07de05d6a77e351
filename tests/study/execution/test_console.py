"""The progress line's time left: the trials still to run at the mean duration of those this process saw finish,
spread over as many as ran at once, less what the running ones have done. Trials a resumed or extended study
finished before it started do not count (they made "~0.0 min left" while 8 trials of a new round were to run); the
first of two trials running side by side does not double the estimate (it swung 64.6, 32.1, ... min for a 23-min
run). Off a terminal a status line comes every minute while no trial finishes."""

import pickle
import re

from dcl_core.study.execution import console


class Finished:
    """A finished trial as the callback reads it: an id, its last result and its name."""

    def __init__(self, i, seconds=60.0):
        self.trial_id, self.last_result = f"t{i}", {"eval/knn_top1": 30.0, "time_total_s": seconds}

    def __str__(self):
        return self.trial_id


def at(monkeypatch, clock, seconds):
    monkeypatch.setattr(console.time, "time", lambda: clock + seconds)


def start(progress, clock, monkeypatch, t, i):
    at(monkeypatch, clock, t)
    progress.on_trial_start(0, [], Finished(i))


def finish(progress, clock, monkeypatch, t, i, seconds=60.0):
    at(monkeypatch, clock, t)
    progress.on_trial_complete(0, [], Finished(i, seconds))


def minutes_left(capsys):
    return float(re.findall(r"~([\d.]+) min left", capsys.readouterr().out)[-1])


def test_time_left_counts_only_the_trials_finished_since_this_round_began(monkeypatch, capsys):
    clock = 1_000_000.0
    at(monkeypatch, clock, 0)
    # a round of 8 trials after 40 finished ones; the study's clock started 30 minutes ago (earlier rounds)
    progress = console.ConsoleProgress("s", total=48, done=40, started=clock - 1800)
    start(progress, clock, monkeypatch, 0, 0)
    start(progress, clock, monkeypatch, 0, 1)  # 2 at a time
    finish(progress, clock, monkeypatch, 60, 0)
    assert minutes_left(capsys) == 3.0  # 6 waiting at 60 s, 2 at a time; the other running one is done too
    start(progress, clock, monkeypatch, 60, 2)
    finish(progress, clock, monkeypatch, 60, 1)
    assert minutes_left(capsys) == 3.0  # the same: 5 waiting and one just started, not 6 x 1800/42 s
    start(progress, clock, monkeypatch, 60, 3)
    finish(progress, clock, monkeypatch, 130, 2, seconds=70.0)
    assert minutes_left(capsys) == 2.1  # mean 63.3 s: 4 waiting, 2 at a time; t3 has run 70 s, past the mean


def test_the_first_of_two_trials_side_by_side_does_not_double_the_estimate(monkeypatch, capsys):
    clock = 1_000_000.0
    at(monkeypatch, clock, 0)
    progress = console.ConsoleProgress("s", total=20, started=clock)
    for i in (0, 1):
        start(progress, clock, monkeypatch, 5, i)  # after Ray's start
    finish(progress, clock, monkeypatch, 65, 0)
    first = minutes_left(capsys)
    start(progress, clock, monkeypatch, 65, 2)
    finish(progress, clock, monkeypatch, 66, 1)
    second = minutes_left(capsys)
    assert first == 9.0 and abs(second - first) <= 0.1  # 18 to go at a minute each, 2 at a time


def test_a_restored_callback_paces_from_when_it_is_restored(monkeypatch, capsys):
    clock = 1_000_000.0
    at(monkeypatch, clock, 0)
    progress = console.ConsoleProgress("s", total=10, done=0, started=clock)
    restored = pickle.loads(pickle.dumps(progress))  # what Tune.restore hands back, hours later
    clock += 7200
    start(restored, clock, monkeypatch, 0, 0)
    finish(restored, clock, monkeypatch, 60, 0)
    assert minutes_left(capsys) == 9.0  # 9 more at a minute each, not at two hours each


def test_off_a_terminal_a_status_line_comes_every_minute_while_no_trial_finishes(monkeypatch, capsys):
    clock = 1_000_000.0
    at(monkeypatch, clock, 0)
    progress = console.ConsoleProgress("temperature_sweep", total=8, started=clock)
    start(progress, clock, monkeypatch, 3, 0)
    assert capsys.readouterr().out.count("0 of 8 trials done, 1 running") == 1  # the first start's line
    for t in (30, 62):
        at(monkeypatch, clock, t)
        progress.on_step_end(0, [])
    assert capsys.readouterr().out == ""
    at(monkeypatch, clock, 64)
    progress.on_step_end(0, [])
    assert capsys.readouterr().out == ("temperature_sweep: 0 of 8 trials done, 1 running, 0 failed  (1.1 min elapsed, "
                                       "time left: after the first trial)\n")
    finish(progress, clock, monkeypatch, 100, 0)
    at(monkeypatch, clock, 150)
    progress.on_step_end(0, [])  # a trial's line came at 100 s: the next status line a minute after it
    assert capsys.readouterr().out.count("trials done") == 0
    at(monkeypatch, clock, 161)
    progress.on_step_end(0, [])
    assert "1 of 8 trials done, 0 running" in capsys.readouterr().out


def test_a_trial_that_reported_itself_failed_is_counted_failed(monkeypatch, capsys):
    """A trial that gave up (failed the same way twice, or lost to Ray's memory monitor more often than
    --max-failures allows) ends with a report marked failed: its line says FAILED, as a diverged one's says so."""
    clock = 1_000_000.0
    at(monkeypatch, clock, 0)
    progress = console.ConsoleProgress("s", total=2, started=clock)
    start(progress, clock, monkeypatch, 0, 0)
    gave_up = Finished(0)
    gave_up.last_result = {"failed": 1.0, "time_total_s": 5.0}
    at(monkeypatch, clock, 5)
    progress.on_trial_complete(0, [], gave_up)
    assert "[1/2] t0  FAILED" in capsys.readouterr().out and progress.failed == 1


def test_a_resumed_experiment_counts_the_trials_its_saved_state_holds_finished(monkeypatch, capsys):
    """Tune restores the callback as its last saved state pickled it (here before any trial had finished): a
    --resume after a crash with 8 of 16 trials finished printed "0 of 16 trials done" and "[1/16]" for the ninth."""
    clock = 1_000_000.0
    at(monkeypatch, clock, 0)
    # a study's second experiment of 16 trials, after 4 trials of its first; pickled before any of these finished
    progress = pickle.loads(pickle.dumps(console.ConsoleProgress("s", total=20, done=4, started=clock)))
    trials = [Finished(i) for i in range(16)]
    for i, t in enumerate(trials):
        t.status = "TERMINATED" if i < 8 else "PENDING"  # finished before the crash; to run (or resume)
    trials[7].last_result = {"diverged": 1.0, "time_total_s": 5.0}
    progress.on_step_begin(0, trials)
    assert (progress.done, progress.failed) == (12, 1)
    start(progress, clock, monkeypatch, 0, 8)
    finish(progress, clock, monkeypatch, 60, 8)
    assert "[13/20] t8" in capsys.readouterr().out
    progress.on_step_begin(1, trials)  # counted once: later steps leave the counts to the trials' own events
    assert (progress.done, progress.failed) == (13, 1)


def test_off_a_terminal_the_study_speaks_before_ray_starts_and_when_its_first_trial_starts(monkeypatch, capsys):
    """With the output going to a file, the first line used to come after the first trial finished, or a minute
    later (two minutes of silence at the CPU defaults)."""
    clock = 1_000_000.0
    at(monkeypatch, clock, 0)
    console.starting("s", 40, console.PROGRESS, resume=False)
    console.starting("s", 40, console.QUIET, resume=True)  # -q: nothing until the answer
    assert capsys.readouterr().out == ("s: 40 trials; starting Ray, then a line per finished trial and a status line "
                                       "every minute\n")
    progress = console.ConsoleProgress("s", total=40, started=clock)
    start(progress, clock, monkeypatch, 20, 0)
    assert capsys.readouterr().out.startswith("s: 0 of 40 trials done, 1 running, 0 failed  (0.3 min elapsed")
    start(progress, clock, monkeypatch, 21, 1)  # the first start only
    assert capsys.readouterr().out == ""


def test_a_study_asks_for_ray_token_mode_before_anything_imports_ray(tmp_path):
    """Ray reads ``RAY_AUTH_MODE`` when it is first imported; a local instance started without it prints "Token
    authentication is enabled ... Set RAY_AUTH_MODE=disabled to opt out" on the console's first line. A study sets
    the mode before the first import of Ray (the run phase once imported Ray's modules first, and the line came
    back). Watched in a study that stops at its MLflow store's check, after Ray's import and before Ray starts."""
    import os
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    import pytest

    from tests.cifar10_present import cifar10_present

    if not cifar10_present():
        pytest.skip("needs the embedded CIFAR-10 (a study checks its data before Ray)")
    script = Path(__file__).resolve().parents[3] / "studies" / "temperature_sweep.py"
    watch = textwrap.dedent(f"""
        import os, runpy, sys
        seen = []
        class Watch:
            def find_spec(self, name, path=None, target=None):
                if name == "ray" and not seen:
                    seen.append(os.environ.get("RAY_AUTH_MODE"))
        sys.meta_path.insert(0, Watch())
        sys.argv = [{str(script)!r}, "--smoke", "--output-dir", {str(tmp_path / "out")!r},
                    "--tracking-uri", "http://127.0.0.1:9"]
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
        except SystemExit as stop:
            print("exit", stop.code, "mode when Ray was imported:", seen)
        """)
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    proc = subprocess.run([sys.executable, "-c", watch], env=env, capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[3])
    assert "exit 2 mode when Ray was imported: ['token']" in proc.stdout, proc.stdout + proc.stderr[-2000:]
