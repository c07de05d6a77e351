"""``--address auto``: checked as Ray resolves it, before Ray starts. The address file a ``ray start --head`` writes
outlives a head stopped without ``ray stop`` (docs/cluster.md's recipe kills its head), and ``ray.init`` then
waited minutes for that dead cluster; now the study says so in one line (exit 2) within seconds."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from ray._private import services

from dcl_core.config import ConfigError
from dcl_core.data import resolve_data_root
from dcl_core.study.plan.checks import auto_address, check_ray_address, local_gcs_addresses, ray_address_file

REPO = Path(__file__).resolve().parents[3]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _record(temp: Path, address: str) -> Path:
    """What ``ray start --head`` leaves in its temp folder ``temp``: the address file."""
    file = temp / "ray" / "ray_current_cluster"
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(address + "\n")
    return file


def test_the_address_file_is_in_rays_temp_folder():
    assert ray_address_file({}) == Path("/tmp/ray/ray_current_cluster")
    assert ray_address_file({"TMPDIR": "/t"}) == Path("/t/ray/ray_current_cluster")
    assert ray_address_file({"TMPDIR": "/t", "RAY_TMPDIR": "/r"}) == Path("/r/ray/ray_current_cluster")


# (running local GCS addresses, what the address file holds or None): each as Ray 2.60's ray.init resolves auto
CASES = [
    (set(), "10.9.9.9:6379"),  # the stale file: nothing runs here
    ({"127.0.0.1:7000"}, "10.9.9.9:6379"),  # one Ray running here wins over the file
    ({"127.0.0.1:7000", "127.0.0.1:7001"}, "10.9.9.9:6379"),  # several: the recorded one
    ({"127.0.0.1:7000", "127.0.0.1:7001"}, None),  # several, no file: one of them
    ({"127.0.0.1:7000"}, None),
    (set(), None),  # nothing at all
]


@pytest.mark.parametrize(("running", "recorded"), CASES)
def test_auto_resolves_as_ray_itself_does(tmp_path, monkeypatch, running, recorded):
    """Against Ray's own resolution (its process scan replaced by the same set): the same address, a running Ray
    where Ray takes one (None here: nothing to probe), and a one-line refusal where Ray finds nothing."""
    if recorded is not None:
        _record(tmp_path, recorded)
    environ = {"RAY_TMPDIR": str(tmp_path)}
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "find_gcs_addresses", lambda: frozenset(running))
    try:
        rays = services.get_ray_address_from_environment("auto", None)
    except ConnectionError:
        rays = None
    if rays is None:
        with pytest.raises(ConfigError, match=r"^--address auto: no Ray runs on this machine and no `ray start` "
                                              r"recorded a cluster \(.*ray_current_cluster does not exist\)"):
            auto_address(environ, frozenset(running))
        return
    ours = auto_address(environ, frozenset(running))
    if ours is None:
        assert rays in running
    else:
        assert ours[0] == rays == recorded and "ray_current_cluster" in ours[1]


def test_ray_address_in_the_environment_is_what_auto_means():
    assert auto_address({"RAY_ADDRESS": "10.1.2.3:6379"}, frozenset()) == (
        "10.1.2.3:6379", "$RAY_ADDRESS, which Ray takes over --address auto")
    assert auto_address({"RAY_ADDRESS": "10.1.2.3:6379"}, None)[0] == "10.1.2.3:6379"
    assert auto_address({"RAY_ADDRESS": "auto"}, None) is None  # no process list (macOS): Ray resolves it


def test_an_empty_address_file_is_nothing_to_attach_to(tmp_path):
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("")
    with pytest.raises(ConfigError, match="ray_current_cluster is empty"):
        auto_address({"RAY_TMPDIR": str(tmp_path)}, frozenset())


@pytest.mark.parametrize("plant", ["fifo", "link", "escapes", "huge"])
def test_an_address_file_planted_in_the_shared_temp_folder_is_refused_in_one_line(tmp_path, plant):
    """/tmp/ray is anyone's to write: a FIFO there must not block the study, a link is not followed, and what the
    file holds reaches the console only if it reads as an address (no newline, no terminal escape)."""
    file = tmp_path / "ray" / "ray_current_cluster"
    file.parent.mkdir()
    if plant == "fifo":
        os.mkfifo(file)
    elif plant == "link":
        (tmp_path / "elsewhere").write_text("127.0.0.1:6379")
        file.symlink_to(tmp_path / "elsewhere")
    else:
        file.write_bytes(b"127.0.0.1:1\n\x1b[2Jerror: all good" if plant == "escapes" else b"1" * 5000)
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        auto_address({"RAY_TMPDIR": str(tmp_path)}, frozenset())
    assert time.monotonic() - started < 5
    message = str(refused.value)
    assert "\n" not in message and "\x1b" not in message and str(file) in message
    assert {"fifo": "a FIFO", "link": "link", "escapes": "does not hold a cluster's HOST:PORT",
            "huge": "holds more than 1,024 bytes"}[plant] in message


def test_running_rays_are_found_by_their_raylets_command_lines(tmp_path):
    proc = tmp_path / "proc"
    planted = {
        "101": [b"/venv/lib/ray/core/src/ray/raylet/raylet", b"--gcs-address=10.1.1.1:6379", b"--node_id=abc"],
        "102": [b"python", b"worker.py", b"--gcs-address=10.2.2.2:6379"],  # not a raylet
        "103": [b"/x/raylet", b"--gcs-address=None"],  # Ray's placeholder
        "104": [b"/x/raylet --gcs-address=10.4.4.4:6379 --node-manager-port=1"],  # a retitled process: one string
        "self": [b"/x/raylet", b"--gcs-address=10.5.5.5:6379"],  # not a process number
    }
    for pid, args in planted.items():
        (proc / pid).mkdir(parents=True)
        (proc / pid / "cmdline").write_bytes(b"\0".join(args) + b"\0")
    (proc / "105").mkdir()  # a process that ended while the folder was read: no cmdline
    assert local_gcs_addresses(proc) == {"10.1.1.1:6379", "10.4.4.4:6379"}
    assert local_gcs_addresses(tmp_path / "no_proc") is None


def test_auto_naming_a_dead_cluster_is_refused_in_one_line_within_the_timeout(tmp_path):
    no_processes = tmp_path / "proc"
    no_processes.mkdir()
    port = _closed_port()
    file = _record(tmp_path, f"127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        check_ray_address("auto", timeout=2, environ={"RAY_TMPDIR": str(tmp_path)}, proc=no_processes)
    assert time.monotonic() - started < 10
    assert str(refused.value).startswith(
        f"no Ray cluster answers at auto (127.0.0.1:{port}: the cluster the last `ray start` recorded in {file}; no "
        "Ray runs on this machine) (")
    assert "\n" not in str(refused.value)
    with socket.socket() as listening:  # the recorded head answers: nothing to say
        listening.bind(("127.0.0.1", 0))
        listening.listen(1)
        _record(tmp_path, f"127.0.0.1:{listening.getsockname()[1]}")
        check_ray_address("auto", timeout=2, environ={"RAY_TMPDIR": str(tmp_path)}, proc=no_processes)
    with pytest.raises(ConfigError, match=r"^--address auto \(10.0.0.1: \$RAY_ADDRESS.*expected HOST:PORT"):
        check_ray_address("auto", environ={"RAY_ADDRESS": "10.0.0.1"}, proc=no_processes)


def _pid_namespace() -> list[str]:
    """A command prefix that runs its command as the only processes it can see (a PID namespace with its own
    /proc), so that no Ray of another test is "running on this machine"; [] where this machine cannot."""
    prefix = ["unshare", "--pid", "--fork", "--mount-proc"]
    if shutil.which("unshare") is None or subprocess.run([*prefix, "true"], capture_output=True).returncode:
        if os.environ.get("CI"):
            pytest.fail("CI must run the --address auto study test: `unshare --pid --fork --mount-proc` fails")
        pytest.skip("needs a PID namespace (`unshare --pid --fork --mount-proc`, as root)")
    return prefix


@pytest.mark.skipif(not (resolve_data_root("cifar10", None) / "train").is_dir(), reason="no embedded CIFAR-10")
def test_a_study_with_address_auto_and_a_stale_address_file_exits_2_in_one_line(tmp_path):
    """The study as a user runs it after a head was killed: before, Ray's GCS-connect warnings and no end (4 min
    and more); now one line, exit 2, nothing written."""
    prefix = _pid_namespace()
    temp = Path(tempfile.mkdtemp(prefix="dclauto", dir="/tmp"))  # as RAY_TMPDIR: short (Ray's socket paths)
    try:
        _record(temp, f"127.0.0.1:{_closed_port()}")
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")} | {"RAY_TMPDIR": str(temp)}
        out = tmp_path / "o"
        proc = subprocess.run([*prefix, sys.executable, str(REPO / "studies" / "temperature_sweep.py"), "--smoke",
                               "--address", "auto", "--output-dir", str(out)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: no Ray cluster answers at auto (127.0.0.1:"), proc.stderr
    assert "no Ray runs on this machine" in lines[0] and not out.exists()
