"""dcl_core.files: files the project writes never follow a link planted at their name (issue: nothing outside the
folder); whole files are replaced atomically; a folder where a file belongs is refused in one line."""

import os
import stat

import pytest

from dcl_core.config import ConfigError
from dcl_core.files import UnsafePathError, open_append, open_fd, write_text


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
