"""The next start of a study ends what its dead driver left of its own Ray, and nothing else: real processes stand
in for a dead session's agents (they name its folder, as Ray's do), beside a bystander of another session; the
record in the output folder is untrusted (a shared folder), so a forged one ends nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
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


def _agent(session: str) -> subprocess.Popen:
    """A process that names the session folder on its command line, as Ray's raylet and GCS do."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", f"--log-dir={session}/logs"])


def _record(out: Path, pid: int, session: str, host: str | None = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    note = {"pid": pid, "host": host or socket.gethostname(), "session_dir": session}
    ray_session.record_path(out, "s").write_text(json.dumps(note))


def test_a_dead_drivers_session_is_ended_and_nothing_else(tmp_path: Path) -> None:
    dead = _dead_pid()
    session, other = _session(tmp_path, dead), _session(tmp_path, dead + 1)
    agent, bystander = _agent(session), _agent(other)
    try:
        _record(tmp_path / "out", dead, session)
        assert ray_session._processes_of(session) == [agent.pid]
        assert ray_session.end_dead_session(tmp_path / "out", "s") == 1
        assert agent.wait(timeout=10) is not None  # ended
        assert bystander.poll() is None  # another session's: untouched
        assert not ray_session.record_path(tmp_path / "out", "s").exists()
    finally:
        for proc in (agent, bystander):
            proc.kill()


def test_a_failed_start_leaves_nothing_of_the_sessions_this_process_started(tmp_path: Path) -> None:
    """What a ``ray.init`` that timed out half-way left (its session folder ends in this pid) is ended before the
    second try; a session another process started is not."""
    mine, other = _session(tmp_path, os.getpid()), _session(tmp_path, os.getpid() + 1)
    Path(mine).mkdir(parents=True)
    Path(other).mkdir(parents=True)
    gcs, bystander = _agent(mine), _agent(other)
    try:
        assert ray_session.end_own_sessions(tmp_path / "ray") == 1
        assert gcs.wait(timeout=10) is not None
        assert bystander.poll() is None
        assert ray_session.end_own_sessions(tmp_path / "ray") == 0
    finally:
        for proc in (gcs, bystander):
            proc.kill()


@pytest.mark.parametrize("forgery", ["live driver", "another session's name", "another host", "relative path",
                                     "not json"])
def test_a_forged_record_ends_nothing(tmp_path: Path, forgery: str) -> None:
    dead = _dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    victims = {"live driver": _session(tmp_path, live.pid), "another session's name": _session(tmp_path, dead + 7),
               "another host": _session(tmp_path, dead), "relative path": f"ray/session_2026-11-26_12-57-16_1_{dead}",
               "not json": _session(tmp_path, dead)}
    victim = _agent(victims[forgery])
    try:
        pid = live.pid if forgery == "live driver" else dead
        _record(tmp_path / "out", pid, victims[forgery], host="elsewhere" if forgery == "another host" else None)
        if forgery == "not json":
            ray_session.record_path(tmp_path / "out", "s").write_text("{not json")
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
    ray_session.record_session(out, "s", "/tmp/ray/session_2026-11-26_12-57-16_833392_481")
    assert target.read_text() == "precious"
    note = json.loads(ray_session.record_path(out, "s").read_text())
    assert note["session_dir"].endswith("_481") and note["host"] == socket.gethostname()
