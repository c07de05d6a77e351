"""A study's own local Ray, recorded in its output folder so that the next start can end what a dead driver left.

A local study starts a private Ray instance (``ray.init(address="local")``) and stops it when it ends, Ctrl-C and
SIGTERM included. A driver killed outright (``kill -9``, the OOM killer) cannot: its raylet's agents
(``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) and idle workers then run on for minutes, holding memory and
ports. The study therefore notes its session (``.STUDY.ray_session`` in the output folder: the driver's pid, the
host, Ray's session folder), and the next start of the same study in the same folder, once it holds the study's
lock, ends the processes of that session if its driver is dead.

Only the study's own Ray is touched, never another's. The output folder may be shared or crafted, so a note counts
only if the study itself wrote it: each note is signed (HMAC-SHA256 over the output folder, the study and the
note's fields) with a key that never leaves this user's own cache folder (:mod:`~dcl_core.study.plan.signing`:
``~/.cache/dcl_core/ray_session.key``, mode 0600 in a folder of this user's), which whoever planted a note cannot
read. A note forged, edited, or copied from another folder ends nothing; so does a note when the key cannot be
kept (then nothing is recorded either). A signed note's session folder is the one ``ray.init`` reported, so its
processes are those of this user whose command line or open files name it (Ray's agents rename themselves, which
also overwrites the environment ``/proc`` shows, but keep their logs there open); it counts only if it names a dead
driver of this host. Linux only (``/proc``); elsewhere this does nothing.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import hmac
import json
import logging
import os
import re
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dcl_core.files import is_regular_file, loads_json, write_with
from dcl_core.study.plan import signing
from dcl_core.study.plan.signing import key as _key

log = logging.getLogger(__name__)

# Ray's name for a session folder: session_2026-11-26_12-57-16_833392_481 (its last number: the starting pid)
SESSION_NAME = re.compile(r"session_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d_\d+_(\d+)")
GRACE_S = 5.0  # after SIGTERM, before SIGKILL
NOTE_MAX_BYTES = 4096  # a session note is ~300 bytes; a longer one is not read past this


def record_path(output_dir: Path, study: str) -> Path:
    """Where a study's local Ray session is recorded."""
    return output_dir / f".{study}.ray_session"


def _signature(key: bytes, output_dir: Path, study: str, pid: int, host: str, session_dir: str) -> str:
    """The note's signature: it holds only for these fields, in this output folder, for this study."""
    return signing.mac(key, "ray session", [str(output_dir.resolve()), study, pid, host, session_dir])


def record_session(output_dir: Path, study: str, session_dir: str) -> None:
    """Note this driver's local Ray session in the study's output folder, signed (replacing an earlier note;
    readable by its owner only)."""
    key = _key(create=True)
    if key is None:
        return
    pid, host = os.getpid(), socket.gethostname()
    note = {"pid": pid, "host": host, "session_dir": session_dir,
            "signature": _signature(key, output_dir, study, pid, host, session_dir)}
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
    session = _dead_session(path, output_dir, study)
    with contextlib.suppress(OSError):
        path.unlink()
    if session is None:
        return 0
    ended = _end(session)
    if ended:
        log.warning("ended %d process(es) of this study's earlier Ray (its driver had died without stopping it): %s",
                    ended, session)
    return ended


def end_own_sessions(temp_root: Path, grace: float = GRACE_S) -> int:
    """End the processes of the sessions under Ray's temp folder ``temp_root`` that this process started (their
    folder's name ends in its pid): what a ``ray.init`` that failed or was stopped half-way left running, and what
    ``ray.shutdown`` leaves (the raylet's agents, which ran on for 30-70 s). The number ended (``grace``: seconds
    between SIGTERM and SIGKILL)."""
    ended = 0
    for folder in sorted(temp_root.glob("session_*")):
        named = SESSION_NAME.fullmatch(folder.name)
        if named and int(named.group(1)) == os.getpid():
            ended += _end(str(folder), grace)
    return ended


def temp_folders() -> list[Path]:
    """Where a local ``ray.init`` may have put its session folder: ``ray`` under /tmp (Ray's default) or the
    system's temp folder (``TMPDIR``)."""
    roots = ["/tmp", os.environ.get("TMPDIR"), tempfile.gettempdir()]
    return [Path(r) / "ray" for r in dict.fromkeys(r for r in roots if r)]


def end_own(grace: float = GRACE_S) -> int:
    """End what is left of the local Ray instances this process started (:func:`end_own_sessions` under each of
    :func:`temp_folders`); how many processes."""
    return sum(end_own_sessions(temp, grace) for temp in temp_folders())


@functools.cache  # once a process
def end_own_at_exit(shutdown: Callable[[], object]) -> None:
    """At this driver's exit, ``shutdown`` (``ray.shutdown``), then :func:`end_own`: the raylet's dashboard and
    runtime-env agents outlived ``ray.shutdown`` by 30-70 s, after a study and after one stopped while its Ray
    started. Call it before ``ray.init``: exit handlers run last-registered first, so this one shuts Ray down
    itself before ending what is left (Ray's own exit handler is then a no-op)."""

    def at_exit() -> None:
        with contextlib.suppress(Exception):
            shutdown()
        end_own()

    atexit.register(at_exit)


def _end(session: str, grace: float = GRACE_S) -> int:
    """SIGTERM, ``grace`` seconds, then SIGKILL to the session's processes; how many there were."""
    left = _processes_of(session)
    if not left:
        return 0
    _signal(left, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _processes_of(session):
        time.sleep(0.1)
    _signal(_processes_of(session), signal.SIGKILL)
    return len(left)


def _dead_session(path: Path, output_dir: Path, study: str) -> str | None:
    """The note's session folder, if the note is signed with this user's key for this folder and study, names a
    session of its driver on this host, and that driver is dead; else None."""
    try:
        with path.open("rb") as f:
            note = loads_json(f.read(NOTE_MAX_BYTES))
        pid, host, session = int(note["pid"]), str(note["host"]), str(note["session_dir"])
        signature = str(note["signature"])
    except (OSError, ValueError, TypeError, KeyError):
        return None
    key = _key(create=False)
    if key is None or not hmac.compare_digest(signature, _signature(key, output_dir, study, pid, host, session)):
        log.debug("%s is not a note this user's studies signed: it ends nothing", path)
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
