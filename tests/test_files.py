"""dcl_core.files: files the project writes never follow a link planted at their name (issue: nothing outside the
folder); whole files are replaced atomically; a folder where a file belongs is refused in one line."""

import json
import os
import re
import signal
import stat
from pathlib import Path

import pytest

from dcl_core.config import ConfigError
from dcl_core.files import (
    UnsafePathError,
    check_output_file,
    loads_json,
    open_append,
    open_fd,
    read_bounded,
    write_text,
)


@pytest.fixture
def precious(tmp_path):
    p = tmp_path / "precious.txt"
    p.write_text("keep me")
    return p


def test_write_text_replaces_a_planted_link_itself_never_its_target(tmp_path, precious):
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").symlink_to(precious)
    write_text(out / "config.json", "{}")
    assert precious.read_text() == "keep me"
    assert not (out / "config.json").is_symlink() and (out / "config.json").read_text() == "{}"
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]  # no temporary file left


def test_append_and_open_refuse_a_planted_link(tmp_path, precious):
    (tmp_path / "metrics.jsonl").symlink_to(precious)
    with pytest.raises(UnsafePathError, match="is a symbolic link"), open_append(tmp_path / "metrics.jsonl") as f:
        f.write("x")
    with pytest.raises(ConfigError, match="symbolic link"):
        open_fd(tmp_path / "metrics.jsonl", os.O_RDWR | os.O_CREAT)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")  # O_CREAT through a dangling link would create it
    with pytest.raises(UnsafePathError):
        open_fd(tmp_path / "dangling", os.O_RDWR | os.O_CREAT)
    assert precious.read_text() == "keep me" and not (tmp_path / "nowhere").exists()


def test_a_folder_where_a_file_belongs_is_refused_in_one_line(tmp_path):
    (tmp_path / "table.txt").mkdir()
    with pytest.raises(UnsafePathError, match="is a folder where a file belongs"):
        write_text(tmp_path / "table.txt", "x")
    with pytest.raises(UnsafePathError, match="is a folder"):
        open_fd(tmp_path / "table.txt", os.O_RDWR | os.O_CREAT)


def test_write_text_and_append_create_regular_files_with_the_given_mode(tmp_path):
    old = os.umask(0o022)
    try:
        write_text(tmp_path / "a.txt", "1", mode=0o600)
        with open_append(tmp_path / "b.txt") as f:
            f.write("2")
        with open_append(tmp_path / "b.txt") as f:
            f.write("3")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "b.txt").stat().st_mode) == 0o644 and (tmp_path / "b.txt").read_text() == "23"


def _nodes(tmp_path):
    """A real character device (1, 3: the one /dev/null is), a real FIFO and a real socket, in ``tmp_path``."""
    import socket

    os.mknod(tmp_path / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    os.mkfifo(tmp_path / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    sock.close()
    return {"null": stat.S_ISCHR, "fifo": stat.S_ISFIFO, "sock": stat.S_ISSOCK}


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root")
def test_nothing_written_ever_replaces_a_device_a_fifo_or_a_socket(tmp_path):
    """Issue 46, item 2: ``write_with`` renamed its file over a device (``-o /dev/null`` made /dev/null a file)."""
    for name, kind in _nodes(tmp_path).items():
        with pytest.raises(UnsafePathError, match=f"{name} is a (character device|FIFO|socket), not a regular file"):
            write_text(tmp_path / name, "x")
        assert kind(os.lstat(tmp_path / name).st_mode), name  # still the node it was
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "null", "sock"]  # no temporary file left


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root")
def test_appending_never_writes_to_a_device_and_never_blocks_on_a_fifo(tmp_path):
    """A FIFO planted at a metrics or journal file blocked its writer's open forever; a device took the lines."""
    def hung(*_):
        raise TimeoutError("the open blocked")

    before = signal.signal(signal.SIGALRM, hung)
    signal.alarm(10)
    try:
        for name, kind in _nodes(tmp_path).items():
            with pytest.raises(UnsafePathError, match=f"{name} is a .*, not a regular file: refusing to write to it"), \
                    open_append(tmp_path / name) as f:
                f.write("x")
            with pytest.raises(UnsafePathError, match="not a regular file"):
                open_fd(tmp_path / name, os.O_RDWR | os.O_CREAT)
            assert kind(os.lstat(tmp_path / name).st_mode), name
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, before)
    with open_append(tmp_path / "ok.jsonl") as f:  # a regular file's writes block as ever (no O_NONBLOCK left)
        assert os.get_blocking(f.fileno())


def test_a_users_output_is_a_new_path_or_a_regular_file_never_a_link_a_folder_or_a_node(tmp_path, precious):
    """Issue 46, item 2: ``-o FILE`` is checked before any work; a symbolic link there is refused, not replaced."""
    if os.geteuid() == 0:  # mknod of a device needs root
        for name, kind in _nodes(tmp_path).items():
            with pytest.raises(UnsafePathError, match=f"{name} is a .*, not a regular file: refusing to replace"):
                check_output_file(tmp_path / name)
            assert kind(os.lstat(tmp_path / name).st_mode), name
    assert check_output_file(tmp_path / "new" / "backbone.pt") == tmp_path / "new" / "backbone.pt"
    assert (tmp_path / "new").is_dir() and not list((tmp_path / "new").iterdir())  # its folder made, nothing left
    assert check_output_file(precious) == precious and precious.read_text() == "keep me"
    (tmp_path / "link.pt").symlink_to(precious)
    with pytest.raises(UnsafePathError, match=r"link\.pt is a symbolic link: refusing to write through it or replace"):
        check_output_file(tmp_path / "link.pt")
    (tmp_path / "dangling.pt").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UnsafePathError, match="symbolic link"):
        check_output_file(tmp_path / "dangling.pt")
    (tmp_path / "dir.pt").mkdir()
    with pytest.raises(UnsafePathError, match="is a folder where a file belongs"):
        check_output_file(tmp_path / "dir.pt")
    with pytest.raises(ConfigError, match=r"^cannot write /proc/self/x: "):  # a folder no file can be made in
        check_output_file("/proc/self/x")
    with pytest.raises(ConfigError, match=r"^cannot write "):
        check_output_file(precious / "x.pt")  # under a file


@pytest.mark.skipif(os.geteuid() != 0, reason="mknod of a device needs root")
def test_a_bounded_read_takes_regular_files_only_and_looks_before_reading(tmp_path, precious):
    """Issue 46, item 4: a metrics file linked to /dev/zero read gigabytes; a FIFO hung the reader."""
    assert read_bounded(precious, 7) == b"keep me"
    with pytest.raises(ConfigError, match=r"precious.txt holds more than 6 bytes \(7\)"):
        read_bounded(precious, 6)
    os.mknod(tmp_path / "zero", 0o666 | stat.S_IFCHR, os.makedev(1, 5))  # the device /dev/zero is
    os.mkfifo(tmp_path / "fifo")  # opened for reading, a FIFO without a writer blocks forever
    (tmp_path / "link").symlink_to(precious)
    (tmp_path / "to_zero").symlink_to(tmp_path / "zero")
    for name, kind in (("zero", "a character device"), ("fifo", "a FIFO"), ("link", "a symbolic link"),
                       ("to_zero", "a symbolic link"), ("", "a folder")):
        with pytest.raises(ConfigError, match=f"is {kind}, not a regular file: not read"):
            read_bounded(tmp_path / name, 1 << 20)
    with pytest.raises(ConfigError, match=r"^cannot read .*missing: No such file"):
        read_bounded(tmp_path / "missing", 10)


def test_json_nested_too_deep_is_text_that_is_not_json():
    """Python's parser raises RecursionError, which no reader expects, for a document nested ~1,000 deep."""
    deep = "[" * 5000 + "]" * 5000
    with pytest.raises(RecursionError):
        json.loads(deep)
    for text in (deep, deep.encode(), '{"a": ' + deep + "}"):
        with pytest.raises(json.JSONDecodeError, match="nested deeper than this reader follows"):
            loads_json(text)
    assert loads_json(b'{"a": [[1]]}') == {"a": [[1]]}


# json.loads of text that comes from outside the process is loads_json; these parse what this process or its own
# child wrote, or catch RecursionError themselves
OWN_JSON = {"dcl_core/losscheck/isolation.py", "dcl_core/study/plan/signing.py",
            "dcl_core/study/tracking/mlflow_view.py", "dcl_core/config/user_loss.py", "dcl_core/data/packed.py",
            "dcl_core/files.py"}


def test_every_reader_of_outside_json_uses_loads_json():
    repo = Path(__file__).resolve().parents[1]
    found = {str(p.relative_to(repo)) for p in (repo / "dcl_core").rglob("*.py")
             if re.search(r"\bjson\.loads?\(", p.read_text())}
    assert found - OWN_JSON == set(), "parse outside JSON with dcl_core.files.loads_json"


def test_an_output_file_whose_temporary_sibling_the_filesystem_cannot_name_is_refused_before_the_work(tmp_path):
    """Issue reproduction: ``export -o`` a 240-character name exported the weights, then failed (exit 1) writing
    them through ``.NAME.<12 hex>.tmp``, 18 bytes longer. Now refused before any work, in one line."""
    with pytest.raises(ConfigError, match=r"its name is 3 bytes longer than its folder's filesystem allows"):
        check_output_file(tmp_path / ("c" * 240))  # 240 + 18 = 258 > 255
    assert check_output_file(tmp_path / ("c" * 237)) == tmp_path / ("c" * 237)  # 255: fits
    write_text(tmp_path / ("c" * 237), "fits")
    assert list(tmp_path.iterdir()) == [tmp_path / ("c" * 237)]
