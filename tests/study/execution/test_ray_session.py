"""The next start of a study ends what its dead driver left of its own Ray, and nothing else: real processes stand
in for a dead session's agents (they name its folder, as Ray's do), beside bystanders of another session. The note
in the output folder counts only if the study wrote it (signed with a key in this user's own cache folder), so a
forged, edited or copied note ends nothing, whatever folder it names (issue 46, item 3: a forged note ended a
``sleep`` holding a file in a folder shaped like a session, and another Ray head)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dcl_core.study.execution import ray_session
from dcl_core.study.plan import signing

pytestmark = pytest.mark.skipif(not Path("/proc").is_dir(), reason="Linux's /proc")


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This test's own cache folder, where the signing key lives (never the user's)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _session(tmp_path: Path, pid: int) -> str:
    return str(tmp_path / "ray" / f"session_2026-11-26_12-57-16_833392_{pid}")


def _agent(session: str) -> subprocess.Popen:
    """A process that names the session folder on its command line, as Ray's raylet and GCS do."""
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", f"--log-dir={session}/logs"])


def _holding_a_file_in(folder: Path) -> subprocess.Popen:
    """A ``sleep`` whose open file sits in ``folder``, as Ray's renamed agents hold their logs."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "held.log", "w") as held:
        return subprocess.Popen(["sleep", "120"], stdout=held)


def _signed(out: Path, pid: int, session: str, study: str = "s") -> dict:
    """The note a study of driver ``pid`` writes (signed with this user's key), as a dict."""
    out.mkdir(parents=True, exist_ok=True)
    key = ray_session._key(create=True)
    assert key is not None
    host = socket.gethostname()
    note = {"pid": pid, "host": host, "session_dir": session,
            "signature": ray_session._signature(key, out, study, pid, host, session)}
    ray_session.record_path(out, study).write_text(json.dumps(note))
    return note


def test_a_dead_drivers_session_is_ended_and_nothing_else(tmp_path: Path) -> None:
    dead = _dead_pid()
    session, other = _session(tmp_path, dead), _session(tmp_path, dead + 1)
    agent, renamed, bystander = _agent(session), _holding_a_file_in(Path(session) / "logs"), _agent(other)
    try:
        _signed(tmp_path / "out", dead, session)
        assert sorted(ray_session._processes_of(session)) == sorted([agent.pid, renamed.pid])
        assert ray_session.end_dead_session(tmp_path / "out", "s") == 2
        assert agent.wait(timeout=10) is not None and renamed.wait(timeout=10) is not None  # ended
        assert bystander.poll() is None  # another session's: untouched
        assert not ray_session.record_path(tmp_path / "out", "s").exists()
    finally:
        for proc in (agent, renamed, bystander):
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


@pytest.mark.parametrize("forgery", ["unsigned", "signed with another key", "edited after signing",
                                     "copied from another folder", "another study's", "no key to check it"])
def test_a_forged_record_naming_a_process_the_test_started_ends_nothing(tmp_path: Path, forgery: str) -> None:
    """A note naming a folder shaped like a Ray session of a dead pid, well formed in every field, where a process
    this test started holds a file (a ``sleep``, or a Ray head of ``ray start --temp-dir D``, whose session name
    ends in the exited CLI's pid): only a note this user's studies signed for this folder and study counts."""
    dead, edited_pid = _dead_pid(), _dead_pid()
    session = _session(tmp_path / "anywhere", dead)
    victim = _holding_a_file_in(Path(session) / "logs")
    out = tmp_path / "out"
    try:
        if forgery == "unsigned":
            out.mkdir()
            ray_session.record_path(out, "s").write_text(json.dumps(
                {"pid": dead, "host": socket.gethostname(), "session_dir": session}))
        elif forgery == "signed with another key":
            note = _signed(out, dead, session)
            signing.key_path().unlink()
            ray_session._key(create=True)  # a new key: the note's signature is no longer this user's
            ray_session.record_path(out, "s").write_text(json.dumps(note))
        elif forgery == "edited after signing":
            note = _signed(out, edited_pid, _session(tmp_path / "anywhere", edited_pid))
            ray_session.record_path(out, "s").write_text(json.dumps({**note, "pid": dead, "session_dir": session}))
        elif forgery == "copied from another folder":
            note = _signed(tmp_path / "elsewhere", dead, session)
            out.mkdir()
            ray_session.record_path(out, "s").write_text(json.dumps(note))
        elif forgery == "another study's":
            note = _signed(out, dead, session, study="t")
            ray_session.record_path(out, "s").write_text(json.dumps(note))
        else:  # the key cannot be read privately (here: others may read it)
            _signed(out, dead, session)
            signing.key_path().chmod(0o644)
        assert ray_session.end_dead_session(out, "s") == 0
        time.sleep(0.5)
        assert victim.poll() is None
        assert not ray_session.record_path(out, "s").exists()
    finally:
        victim.kill()


@pytest.mark.parametrize("case", ["live driver", "another session's name", "another host", "relative path",
                                  "not json"])
def test_a_signed_record_ends_nothing_unless_its_driver_died_on_this_host(tmp_path: Path, case: str) -> None:
    dead = _dead_pid()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    pid = live.pid if case == "live driver" else dead
    session = {"live driver": _session(tmp_path, live.pid), "another session's name": _session(tmp_path, dead + 7),
               "relative path": f"ray/session_2026-11-26_12-57-16_1_{dead}"}.get(case, _session(tmp_path, dead))
    victim = _agent(session)
    out = tmp_path / "out"
    try:
        out.mkdir()
        key = ray_session._key(create=True)
        assert key is not None
        host = "elsewhere" if case == "another host" else socket.gethostname()
        note = {"pid": pid, "host": host, "session_dir": session,
                "signature": ray_session._signature(key, out, "s", pid, host, session)}
        ray_session.record_path(out, "s").write_text("{not json" if case == "not json" else json.dumps(note))
        assert ray_session.end_dead_session(out, "s") == 0
        assert victim.poll() is None and live.poll() is None
    finally:
        for proc in (victim, live):
            proc.kill()


def test_a_study_records_its_session_signed_and_a_link_is_replaced_not_followed(tmp_path: Path,
                                                                               own_cache: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious")
    ray_session.record_path(out, "s").symlink_to(target)
    ray_session.record_session(out, "s", "/tmp/ray/session_2026-11-26_12-57-16_833392_481")
    assert target.read_text() == "precious"
    note = json.loads(ray_session.record_path(out, "s").read_text())
    assert note["session_dir"].endswith("_481") and note["host"] == socket.gethostname()
    assert note["pid"] == os.getpid() and len(note["signature"]) == 64
    assert ray_session.record_path(out, "s").stat().st_mode & 0o077 == 0
    key = signing.key_path()
    assert key.is_relative_to(own_cache) and key.stat().st_mode & 0o777 == 0o600
    assert key.parent.stat().st_mode & 0o077 == 0


def test_a_key_that_is_a_link_is_not_used_and_nothing_is_recorded(tmp_path: Path) -> None:
    """A key planted as a link (to a file another user wrote) would let them sign notes: not used."""
    planted = tmp_path / "planted.key"
    planted.write_bytes(b"k" * signing.KEY_BYTES)
    planted.chmod(0o600)
    signing.key_path().parent.mkdir(parents=True)
    signing.key_path().symlink_to(planted)
    out = tmp_path / "out"
    out.mkdir()
    ray_session.record_session(out, "s", "/tmp/ray/session_2026-11-26_12-57-16_833392_481")
    assert not ray_session.record_path(out, "s").exists()


def test_studies_starting_together_agree_on_one_key(tmp_path: Path) -> None:
    code = "from dcl_core.study.execution import ray_session; print(ray_session._key(create=True).hex())"
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(4)]
    keys = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(keys) == 1 and len(keys.pop()) == 2 * signing.KEY_BYTES
