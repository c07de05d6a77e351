"""The command-line layer: ``--set`` parsing, the shared logging setup, and both evaluation entry points."""

import subprocess
import sys
from pathlib import Path

import pytest

from dcl_core.config import ConfigError, parse_overrides

REPO = Path(__file__).resolve().parents[1]


def test_parse_overrides_splits_at_the_first_equals_sign():
    assert parse_overrides([]) == {}
    assert parse_overrides([" loss.temperature = 0.2", "data.root=/a=b", "loss.alpha="]) == {
        "loss.temperature": "0.2",
        "data.root": "/a=b",
        "loss.alpha": "",
    }
    with pytest.raises(ConfigError, match=r"--set expects KEY=VALUE, got 'data\.root'"):
        parse_overrides(["data.root"])


@pytest.mark.parametrize(
    ("kwargs", "shown"),
    [("", ["INFO", "WARNING"]), ("verbose=True", ["DEBUG", "INFO", "WARNING"]), ("quiet=True", ["WARNING"])],
)
def test_setup_logging_levels_and_format(kwargs, shown):
    code = (
        "import logging; from dcl_core.cli import setup_logging; "
        f"setup_logging({kwargs}); log = logging.getLogger('dcl_core.x'); "
        "log.debug('d'); log.info('i'); log.warning('w')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    lines = out.stderr.splitlines()
    assert [line.split()[1] for line in lines] == shown, out.stderr
    # 12:34:56 INFO dcl_core.x: i
    assert all(len(line.split()[0]) == 8 and line.split()[2] == "dcl_core.x:" for line in lines)


@pytest.mark.parametrize("module", ["dcl_core.evaluate", "dcl_core.eval"])
def test_evaluation_command_help(module):
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: python -m {module} ")
    assert "--linear" in out.stdout and "--no-knn" in out.stdout


def test_evaluation_command_rejects_a_missing_checkpoint_in_one_line(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "dcl_core.eval", str(tmp_path / "none.pt"), "--device", "cpu"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2 and len(errors) == 1 and "none.pt" in errors[0], out.stderr
