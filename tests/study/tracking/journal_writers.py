"""What several processes do to one study journal at once (tests/study/tracking/test_tracking_journal.py): a module
of its own, so that a spawned process imports the journal and nothing heavier."""

from pathlib import Path
from typing import Any

from dcl_core.study.tracking.journal import Journal

EXP = "s"


def tag(run: str, key: str = "k", value: str = "v") -> dict[str, str]:
    return {"op": "tag", "run": run, "key": key, "value": value}


def append_many(folder: str, writer: int, n: int) -> None:
    """``n`` appends of a 5 KB tag for run ``r<writer>``, keys ``k0`` .. in order."""
    journal = Journal(Path(folder), EXP)
    for i in range(n):
        journal.append(tag(f"r{writer}", f"k{i}", "x" * 5000))


def replay_until_stopped(folder: str, stop: Any) -> None:
    """What a tracker's replay does to the journal while others append: read it and write back what is left
    (here: everything), under the journal's lock."""
    journal = Journal(Path(folder), EXP)
    while not stop.is_set():
        with journal.lock():
            journal.rewrite(journal.read(), {}, lambda run: run)
