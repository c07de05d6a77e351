"""A study's own local Ray, recorded in its output folder so that the next start can end what a dead driver left.

A local study starts a private Ray instance (``ray.init(address="local")``) and stops it when it ends, Ctrl-C and
SIGTERM included. A driver killed outright (``kill -9``, the OOM killer) cannot: its raylet's agents
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) and idle workers then run on for minutes, holding memory and
ports. The study therefore notes its session (``.STUDY.ray_session`` in the output folder: the driver's pid, the
host, Ray's session folder), and the next start of the same study in the same folder, once it holds the study's
lock, ends the processes of that session if its driver is dead.

Only that session's processes are touched, never another's: the record is untrusted input (a shared folder), so
it counts only if the session folder's name is Ray's (``session_<date>_<time>_<n>_<pid>``) and names the recorded
driver, the host is this one, and that driver is dead; a process is the session's if it belongs to this user and
its command line or one of its open files names the session folder (Ray's agents rename themselves, but keep their
logs there open). Linux only (``/proc``); elsewhere this does nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import time
from pathlib import Path

from dcl_core.files import is_regular_file, write_with

log = logging.getLogger(__name__)

# Ray's name for a session folder: session_2026-11-26_12-57-16_833392_481 (its last number: the starting pid)
SESSION_NAME = re.compile(r"session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_(\d+)")
GRACE_S = 5.0  # after SIGTERM, before SIGKILL


def record_path(output_dir: Path, study: str) -> Path:
    """Where a study's local Ray session is recorded."""
    return output_dir / f".{study}.ray_session"


def record_session(output_dir: Path, study: str, session_dir: str) -> None:
    """Note this driver's local Ray session in the study's output folder (replacing an earlier note)."""
    note = {"pid": os.getpid(), "host": socket.gethostname(), "session_dir": session_dir}
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
    session = _dead_session(path)
    with contextlib.suppress(OSError):
        path.unlink()
    if session is None:
        return 0
    ended = _end(session)
    if ended:
        log.warning("ended %d process(es) of this study's earlier Ray (its driver had died without stopping it): %s",
                    ended, session)
    return ended


def end_own_sessions(temp_root: Path) -> int:
    """End the processes of the sessions under Ray's temp folder ``temp_root`` that this process started (their
    folder's name ends in its pid): what a ``ray.init`` that failed half-way left running. The number ended."""
    ended = 0
    for folder in sorted(temp_root.glob("session_*")):
        named = SESSION_NAME.fullmatch(folder.name)
        if named and int(named.group(1)) == os.getpid():
            ended += _end(str(folder))
    return ended


def _end(session: str) -> int:
    """SIGTERM, :data:`GRACE_S`, then SIGKILL to the session's processes; how many there were."""
    left = _processes_of(session)
    if not left:
        return 0
    _signal(left, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and _processes_of(session):
        time.sleep(0.1)
    _signal(_processes_of(session), signal.SIGKILL)
    return len(left)


def _dead_session(path: Path) -> str | None:
    """The recorded session folder, if the record is well formed, of this host, and its driver is dead."""
    try:
        with path.open("rb") as f:
            note = json.loads(f.read(4096))
        pid, host, session = int(note["pid"]), str(note["host"]), str(note["session_dir"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    named = SESSION_NAME.fullmatch(Path(session).name)
    if (not named or int(named.group(1)) != pid or pid <= 1 or not Path(session).is_absolute()
            or host != socket.gethostname() or _alive(pid)):
        return None
    return session


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _processes_of(session: str) -> list[int]:
    """This user's processes whose command line or open files name the session folder (not this process)."""
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    inside = session.rstrip("/") + "/"
    found = []
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
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
