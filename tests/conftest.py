"""Test-suite-wide hooks."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

# The suite runs 2 pytest workers on 2 cores, each starting studies, Ray and torch processes of its own, so torch's
# OpenMP threads always share cores with other processes. Left to spin while they wait (libgomp's default), they
# burn the cores the other processes need: tests/training took 158 s over 2 workers, 108 s with PASSIVE (sleep while
# waiting; same results, scheduling only). Set before any test module imports torch; every subprocess inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from _pytest.nodeid import coerce_node_id  # pytest 9.2's node ids: the one way to give an item a new one

pytest_plugins = ["ci_select"]  # --changed-since and --record-durations: .ci/run's per-change selection


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``--dist loadgroup``: keep each ``xdist_group`` on one worker under pytest 9.2.

    pytest-xdist 3.8 groups a test by appending ``@group`` to its node id through ``item._nodeid``, which pytest 9.2
    no longer reads (a node's id is ``item._id``), so every group was spread over the workers: a module fixture
    computed once per worker, two-node clusters built twice. This appends the suffix the way pytest 9.2 stores it,
    and does nothing where xdist's own suffix took.
    """
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                        for m in item.iter_markers("xdist_group")})
        if names and "@" not in item.nodeid.rsplit("]", 1)[-1]:
            item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(names)}")


@dataclass(frozen=True)
class RayHead:
    """A running local Ray head: its GCS address, and the environment a study attached to it needs: where its token
    lies (``RAY_AUTH_TOKEN_PATH``), without ``RAY_AUTH_MODE``, as in a shell that forgot docs/cluster.md's ``export``
    (a study asks for token mode itself when it has a token; a plain ``ray.init`` needs ``RAY_AUTH_MODE=token``)."""

    address: str
    env: dict[str, str]


HEAD_STARTS = 3  # a head whose `ray start` gives up (Ray waits 30 s for its raylet: too short on a loaded machine)


def _start_head(ray: Path, home: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str, str, IO[str]]:
    """``ray start --head --block`` on a free port with a temp folder of its own: (process, address, temp, log)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    temp = tempfile.mkdtemp(prefix="dclray", dir="/tmp")  # short: Ray's socket paths live under it
    log = (home / "head.log").open("w")
    head = subprocess.Popen([str(ray), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
                             "--num-cpus=1", "--include-dashboard=false", "--disable-usage-stats",
                             f"--temp-dir={temp}"],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    return head, f"127.0.0.1:{port}", temp, log


@pytest.fixture(scope="session")
def ray_head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayHead]:
    """One local Ray head (1 CPU, token auth, ``--include-dashboard=false``) per pytest process, for the studies
    whose subject is not Ray's start, stop or a driver's death: they attach with ``--address`` (as on a cluster)
    instead of each starting and stopping a Ray of its own (~9 CPU-seconds of Ray's daemons and ~8 s wall each,
    measured on 2 idle cores). Its own ``--temp-dir``: a ``ray start --head`` writes the address file
    ``ray_current_cluster`` there, never in /tmp/ray, where docs/cluster.md's recipe and the two-node cluster keep
    theirs. ``--block``: stopping this one process stops the whole head. A ``ray start`` that gives up before its
    runtime started ("The current node timed out during startup": Ray allows its raylet 30 s to register, which a
    machine loaded by the other pytest worker's studies can exceed) is started again, up to ``HEAD_STARTS`` times."""
    home = tmp_path_factory.mktemp("ray_head")
    token = home / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env |= {"RAY_AUTH_TOKEN_PATH": str(token), "RAY_USAGE_STATS_ENABLED": "0"}
    head_env = env | {"RAY_AUTH_MODE": "token"}
    ray = Path(sys.executable).parent / "ray"
    head, address, temp, log = _start_head(ray, home, head_env)
    try:
        # Its "Ray runtime started." line first (reading a file is free), then `ray status` (~3 CPU-seconds a call:
        # polled every second from the start, it slowed the head it waited for on a loaded machine).
        deadline = time.monotonic() + 300
        started, starts = False, 1
        while not (started := started or "Ray runtime started" in (home / "head.log").read_text(errors="replace")) \
                or subprocess.run([str(ray), "status", "--address", address], env=head_env,
                                  capture_output=True).returncode:
            if head.poll() is not None and not started and starts < HEAD_STARTS:
                log.close()
                shutil.rmtree(temp, ignore_errors=True)
                head, address, temp, log = _start_head(ray, home, head_env)
                starts += 1
                deadline = time.monotonic() + 300
            elif head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the shared Ray head did not start ({starts} start(s)): "
                            f"{(home / 'head.log').read_text()[-2000:]}")
            time.sleep(0.5 if not started else 2)
        yield RayHead(address, env)
    finally:
        head.terminate()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        log.close()
        shutil.rmtree(temp, ignore_errors=True)
