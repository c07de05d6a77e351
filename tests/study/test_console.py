"""The progress line's time left: projected from the trials this process saw finish, not from trials a resumed or
extended study finished before it started (which made "~0.0 min left" while 8 trials of a new round were to run)."""

import pickle
import re

from dcl_core.study.execution import console


class Finished:
    """A finished trial as the callback reads it: an id, its last result and its name."""

    def __init__(self, i):
        self.trial_id, self.last_result = f"t{i}", {"eval/knn_top1": 30.0, "time_total_s": 60.0}

    def __str__(self):
        return self.trial_id


def finish(progress, clock, monkeypatch, at, i):
    monkeypatch.setattr(console.time, "time", lambda: clock + at)
    progress.on_trial_complete(0, [], Finished(i))


def minutes_left(capsys):
    return float(re.findall(r"~([\d.]+) min left", capsys.readouterr().out)[-1])


def test_time_left_counts_only_the_trials_finished_since_this_round_began(monkeypatch, capsys):
    clock = 1_000_000.0
    monkeypatch.setattr(console.time, "time", lambda: clock)
    # a round of 8 trials after 40 finished ones; the study's clock started 30 minutes ago (earlier rounds)
    progress = console.ConsoleProgress("s", total=48, done=40, started=clock - 1800)
    finish(progress, clock, monkeypatch, 60, 0)  # 2 at a time: two trials finish a minute in
    finish(progress, clock, monkeypatch, 60, 1)
    assert minutes_left(capsys) == 3.0  # 6 more at 30 s each (2 at a time), not 6 x 1800/42 s
    finish(progress, clock, monkeypatch, 120, 2)
    assert minutes_left(capsys) == 3.3  # 5 more at 40 s each


def test_a_restored_callback_paces_from_when_it_is_restored(monkeypatch, capsys):
    clock = 1_000_000.0
    monkeypatch.setattr(console.time, "time", lambda: clock)
    progress = console.ConsoleProgress("s", total=10, done=0, started=clock)
    restored = pickle.loads(pickle.dumps(progress))  # what Tune.restore hands back, hours later
    clock += 7200
    monkeypatch.setattr(console.time, "time", lambda: clock)
    restored.on_trial_start(0, [], Finished(0))
    finish(restored, clock, monkeypatch, 60, 0)
    assert minutes_left(capsys) == 9.0  # 9 more at a minute each, not at two hours each
