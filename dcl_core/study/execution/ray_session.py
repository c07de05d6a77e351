"""A study's own local Ray, recorded in its output folder so that the next start can end what a dead driver left.

A local study starts a private Ray instance (``ray.init(address="local")``) and stops it when it ends, Ctrl-C and
SIGTERM included. A driver killed outright (``kill -9``, the OOM killer) cannot: its raylet's agents
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) and idle workers then run on for minutes, holding memory and
ports. The study therefore notes its session (``.STUDY.ray_session`` in the output folder: the driver's pid, the
host, Ray's session folder and the session's mark), and the next start of the same study in the same folder, once
it holds the study's lock, ends the processes of that session if its driver is dead.

Only processes the study itself started are touched, never another's. The record is untrusted input (a shared
folder), so what it says is not what identifies them: every process of the study's Ray carries the session's
*mark* in its environment (:data:`MARK`, ``<driver pid>:<128 random bits>``, set by :func:`marked` around
``ray.init``, so Ray's GCS, raylet, agents and every worker the raylet starts inherit it; the driver's own later
children do not), which only that ``ray.init`` could have given them. A process is ended only if it belongs to this
user, its ``/proc/PID/environ`` holds the recorded mark exactly, and its command line or one of its open files
names the recorded session folder; the record counts only if it names a dead driver of this host, and the mark
starts with that driver's pid (a mark copied from a live study's record names a live driver). A forged record can
therefore at most make the study end nothing: a ``sleep`` holding a file open in a folder shaped like a session,
or a Ray head started by ``ray start``, carries no mark. Linux only (``/proc``); elsewhere this does nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import secrets
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from dcl_core.files import is_regular_file, write_with

log = logging.getLogger(__name__)

# Ray's name for a session folder: session_2026-11-26_12-57-16_833392_481 (its last number: the starting pid)
SESSION_NAME = re.compile(r"session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_(\d+)")
GRACE_S = 5.0  # after SIGTERM, before SIGKILL
MARK = "DCL_STUDY_RAY_MARK"  # the environment variable every process of a study's own Ray carries
MARK_BITS = 128  # random bits in a mark, after the driver's pid: not guessable
NOTE_MAX_BYTES = 4096  # a session record is ~300 bytes; a longer one is not read past this


def record_path(output_dir: Path, study: str) -> Path:
    """Where a study's local Ray session is recorded."""
    return output_dir / f".{study}.ray_session"


@contextlib.contextmanager
def marked() -> Iterator[str]:
    """Give every process started inside the block (a local ``ray.init``: its GCS, its raylet, and through the
    raylet every agent and worker it starts later) this session's mark in its environment: :data:`MARK` =
    ``<this pid>:<random hex>``. Yields the mark, which :func:`record_session` records; the driver's own
    environment is restored afterwards, so that what it starts later (a test's subprocess) is not marked."""
    mark = f"{os.getpid()}:{secrets.token_hex(MARK_BITS // 8)}"
    before = os.environ.get(MARK)
    os.environ[MARK] = mark
    try:
        yield mark
    finally:
        if before is None:
            os.environ.pop(MARK, None)
        else:
            os.environ[MARK] = before


def record_session(output_dir: Path, study: str, session_dir: str, mark: str) -> None:
    """Note this driver's local Ray session and its :func:`marked` mark in the study's output folder (replacing an
    earlier note; readable by its owner only)."""
    note = {"pid": os.getpid(), "host": socket.gethostname(), "session_dir": session_dir, "mark": mark}
    try:
        write_with(record_path(output_dir, study), lambda f: f.write(json.dumps(note).encode()), mode=0o600)
    except OSError as err:  # a convenience for the next start: never a reason to stop this one
        log.debug("Ray session not recorded: %s", err)


def end_dead_session(output_dir: Path, study: str) -> int:
    """End what is left of the study's recorded local Ray if its driver died; the number of processes ended. Call
    it holding the study's lock (so that no live run of the study owns the session)."""
    path = record_path(output_dir, study)
    if not is_regular_file(path):
        return 0
    dead = _dead_session(path)
    with contextlib.suppress(OSError):
        path.unlink()
    if dead is None:
        return 0
    session, mark = dead
    ended = _end(session, mark)
    if ended:
        log.warning("ended %d process(es) of this study's earlier Ray (its driver had died without stopping it): %s",
                    ended, session)
    return ended


def end_own_sessions(temp_root: Path, mark: str) -> int:
    """End the processes of the sessions under Ray's temp folder ``temp_root`` that this process started (their
    folder's name ends in its pid, and they carry ``mark``, the :func:`marked` block's): what a ``ray.init`` that
    failed half-way left running. The number ended."""
    ended = 0
    for folder in sorted(temp_root.glob("session_*")):
        named = SESSION_NAME.fullmatch(folder.name)
        if named and int(named.group(1)) == os.getpid():
            ended += _end(str(folder), mark)
    return ended


def _end(session: str, mark: str) -> int:
    """SIGTERM, :data:`GRACE_S`, then SIGKILL to the session's marked processes; how many there were."""
    left = _processes_of(session, mark)
    if not left:
        return 0
    _signal(left, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and _processes_of(session, mark):
        time.sleep(0.1)
    _signal(_processes_of(session, mark), signal.SIGKILL)
    return len(left)


def _dead_session(path: Path) -> tuple[str, str] | None:
    """(session folder, mark) of the record, if it is well formed, of this host, its driver is dead, and its mark
    is that driver's; else None (a record without a mark, from before marks, ends nothing)."""
    try:
        with path.open("rb") as f:
            note = json.loads(f.read(NOTE_MAX_BYTES))
        pid, host = int(note["pid"]), str(note["host"])
        session, mark = str(note["session_dir"]), str(note["mark"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    named = SESSION_NAME.fullmatch(Path(session).name)
    if (not named or int(named.group(1)) != pid or pid <= 1 or not Path(session).is_absolute()
            or host != socket.gethostname() or not _is_mark_of(mark, pid) or _alive(pid)):
        return None
    return session, mark


def _is_mark_of(mark: str, pid: int) -> bool:
    """Whether ``mark`` has :func:`marked`'s shape for a driver of pid ``pid``."""
    head, _, secret = mark.partition(":")
    return head == str(pid) and re.fullmatch(f"[0-9a-f]{{{MARK_BITS // 4}}}", secret) is not None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _processes_of(session: str, mark: str | None = None) -> list[int]:
    """This user's processes whose command line or open files name the session folder (not this process), and,
    given a ``mark``, whose environment holds it (``MARK=mark`` exactly)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    inside = session.rstrip("/") + "/"
    marker = f"{MARK}={mark}".encode()
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            if mark is not None and marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if any(w == session or inside in w or w.endswith("=" + session) for w in words):
                found.append(int(entry.name))
                continue
            for fd in (entry / "fd").iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd).startswith(inside):
                        found.append(int(entry.name))
                        break
        except OSError:  # exited meanwhile, or not ours to read
            continue
    return found


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
