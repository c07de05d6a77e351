"""The next start of a study ends what its dead driver left of its own Ray, and nothing else: real processes stand
in for a dead session's agents (they name its folder, as Ray's do, and carry the session's mark in their
environment, as every process of the study's own Ray does), beside bystanders of another session and unmarked
processes inside the same folder; the record in the output folder is untrusted (a shared folder), so a forged one
ends nothing, whatever folder and mark it names."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dcl_core.study.execution import ray_session

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="Linux's /proc")


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _session(tmp_path: Path, pid: int) -> str:
    return str(tmp_path / "ray" / f"session_2026-11-26_12-57-16_833392_{pid}")


def _mark(pid: int) -> str:
    """A mark of :func:`ray_session.marked`'s shape for a driver of pid ``pid``."""
    return f"{pid}:{secrets.token_hex(16)}"


def _agent(session: str, mark: str | None = None) -> subprocess.Popen:
    """A process that names the session folder on its command line, as Ray's raylet and GCS do, carrying ``mark``
    in its environment as every process of a study's own Ray does (none: a process the study did not start)."""
    env = {k: v for k, v in os.environ.items() if k != ray_session.MARK}
    if mark is not None:
        env[ray_session.MARK] = mark
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", f"--log-dir={session}/logs"],
                            env=env)


def _holding_a_file_in(folder: Path) -> subprocess.Popen:
    """An unrelated ``sleep`` whose open file sits in ``folder`` (nothing of Ray's)."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "held.log", "w") as held:
        return subprocess.Popen(["sleep", "120"], stdout=held,
                                env={k: v for k, v in os.environ.items() if k != ray_session.MARK})


def _record(out: Path, pid: int, session: str, host: str | None = None, mark: str | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    note = {"pid": pid, "host": host or socket.gethostname(), "session_dir": session, "mark": mark or _mark(pid)}
    ray_session.record_path(out, "s").write_text(json.dumps(note))


def test_a_dead_drivers_session_is_ended_and_nothing_else(tmp_path: Path) -> None:
    dead = _dead_pid()
    session, other = _session(tmp_path, dead), _session(tmp_path, dead + 1)
    mark = _mark(dead)
    agent, bystander = _agent(session, mark), _agent(other, mark)
    unmarked, holder = _agent(session), _holding_a_file_in(Path(session) / "logs")
    try:
        _record(tmp_path / "out", dead, session, mark=mark)
        assert ray_session._processes_of(session, mark) == [agent.pid]
        assert ray_session.end_dead_session(tmp_path / "out", "s") == 1
        assert agent.wait(timeout=10) is not None  # ended
        assert bystander.poll() is None  # another session's: untouched
        assert unmarked.poll() is None and holder.poll() is None  # in the session's folder, but not the study's
        assert not ray_session.record_path(tmp_path / "out", "s").exists()
    finally:
        for proc in (agent, bystander, unmarked, holder):
            proc.kill()


def test_a_failed_start_leaves_nothing_of_the_sessions_this_process_started(tmp_path: Path) -> None:
    """What a ``ray.init`` that timed out half-way left (its session folder ends in this pid, its processes carry
    the mark of the ``marked`` block it ran in) is ended before the second try; a session another process started
    is not, nor an unmarked process in this one's folder."""
    mine, other = _session(tmp_path, os.getpid()), _session(tmp_path, os.getpid() + 1)
    Path(mine).mkdir(parents=True)
    Path(other).mkdir(parents=True)
    with ray_session.marked() as mark:
        gcs, bystander = _agent(mine, mark), _agent(other, mark)
    holder = _holding_a_file_in(Path(mine))
    try:
        assert ray_session.end_own_sessions(tmp_path / "ray", mark) == 1
        assert gcs.wait(timeout=10) is not None
        assert bystander.poll() is None and holder.poll() is None
        assert ray_session.end_own_sessions(tmp_path / "ray", mark) == 0
    finally:
        for proc in (gcs, bystander, holder):
            proc.kill()


def test_a_forged_record_naming_a_process_the_test_started_ends_nothing(tmp_path: Path) -> None:
    """Issue 46, item 3: a note naming any folder shaped like a Ray session of a dead pid, well formed in every
    field (a mark of the right shape too), ended whatever had a file open there: here a ``sleep`` this test
    started. It carries no mark of the study's: it survives, and the note is dropped."""
    dead = _dead_pid()
    victim = _holding_a_file_in(Path(_session(tmp_path / "anywhere", dead)) / "logs")
    try:
        _record(tmp_path / "out", dead, _session(tmp_path / "anywhere", dead))
        assert ray_session.end_dead_session(tmp_path / "out", "s") == 0
        time.sleep(0.5)
        assert victim.poll() is None
        assert not ray_session.record_path(tmp_path / "out", "s").exists()
    finally:
        victim.kill()


def test_the_mark_reaches_what_the_block_starts_and_leaves_the_driver_unmarked(tmp_path: Path) -> None:
    before = os.environ.get(ray_session.MARK)
    with ray_session.marked() as mark:
        child = subprocess.run([sys.executable, "-c", f"import os; print(os.environ['{ray_session.MARK}'])"],
                               capture_output=True, text=True, check=True)
    assert child.stdout.strip() == mark and mark.startswith(f"{os.getpid()}:")
    assert os.environ.get(ray_session.MARK) == before
    with ray_session.marked() as other:
        assert other != mark  # a new secret per session


@pytest.mark.parametrize("forgery", ["live driver", "another session's name", "another host", "relative path",
                                     "not json", "no mark", "a live driver's mark", "a mark of another shape"])
def test_a_forged_record_ends_nothing(tmp_path: Path, forgery: str) -> None:
    """Even processes that do carry the mark named (they stand for a live study's Ray, whose record was copied)."""
    dead = _dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    victims = {"live driver": _session(tmp_path, live.pid), "another session's name": _session(tmp_path, dead + 7),
               "another host": _session(tmp_path, dead), "relative path": f"ray/session_2026-11-26_12-57-16_1_{dead}",
               "not json": _session(tmp_path, dead), "no mark": _session(tmp_path, dead),
               "a live driver's mark": _session(tmp_path, dead), "a mark of another shape": _session(tmp_path, dead)}
    pid = live.pid if forgery == "live driver" else dead
    mark = {"a live driver's mark": _mark(live.pid), "a mark of another shape": f"{dead}:not-hex"}.get(forgery,
                                                                                                      _mark(pid))
    victim = _agent(victims[forgery], mark)
    try:
        _record(tmp_path / "out", pid, victims[forgery], host="elsewhere" if forgery == "another host" else None,
                mark=mark)
        if forgery == "not json":
            ray_session.record_path(tmp_path / "out", "s").write_text("{not json")
        if forgery == "no mark":  # a record of the format before marks
            note = json.loads(ray_session.record_path(tmp_path / "out", "s").read_text())
            note.pop("mark")
            ray_session.record_path(tmp_path / "out", "s").write_text(json.dumps(note))
        assert ray_session.end_dead_session(tmp_path / "out", "s") == 0
        assert victim.poll() is None and live.poll() is None
    finally:
        for proc in (victim, live):
            proc.kill()


def test_a_study_records_its_session_and_a_link_is_replaced_not_followed(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious")
    ray_session.record_path(out, "s").symlink_to(target)
    ray_session.record_session(out, "s", "/tmp/ray/session_2026-11-26_12-57-16_833392_481", _mark(481))
    assert target.read_text() == "precious"
    note = json.loads(ray_session.record_path(out, "s").read_text())
    assert note["session_dir"].endswith("_481") and note["host"] == socket.gethostname()
    assert note["mark"].startswith("481:")
    assert ray_session.record_path(out, "s").stat().st_mode & 0o077 == 0  # the mark is readable by its owner only
