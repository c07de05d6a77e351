"""The command-line layer: ``--set`` parsing, the shared logging setup, and both evaluation entry points."""

import subprocess
import sys
import time
from pathlib import Path

import pyrun
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
        "import logging; from dcl_core.cli_common import setup_logging; "
        f"setup_logging({kwargs}); log = logging.getLogger('dcl_core.x'); "
        "log.debug('d'); log.info('i'); log.warning('w')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    lines = out.stderr.splitlines()
    assert [line.split()[1] for line in lines] == shown, out.stderr
    # 12:34:56 INFO dcl_core.x: i
    assert all(len(line.split()[0]) == 8 and line.split()[2] == "dcl_core.x:" for line in lines)


@pytest.mark.parametrize("module", ["dcl_core.evaluate", "dcl_core.evaluate"])
@pytest.mark.slow  # a fresh interpreter: ~7 s each
def test_evaluation_command_help(module):
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True, cwd=REPO, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: python -m {module} ")
    assert "--linear" in out.stdout and "--no-knn" in out.stdout


@pytest.mark.slow  # a command in a subprocess (the fork server's start: ~30 s)
def test_evaluation_command_rejects_a_missing_checkpoint_in_one_line(tmp_path):
    out = pyrun.run(
        [sys.executable, "-m", "dcl_core.evaluate", str(tmp_path / "none.pt"), "--device", "cpu"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert out.returncode == 2 and len(errors) == 1 and "none.pt" in errors[0], out.stderr


def test_run_command_is_the_one_exit_path(capsys):
    from dcl_core.cli_common import EXIT_BAD_INPUT, EXIT_FAILED, run_command
    from dcl_core.config import InputError, RunFailedError
    from dcl_core.data import DataError
    from dcl_core.training.checkpoint import CheckpointError
    from dcl_core.training.trainer import NonFiniteLossError, RunOutputError

    def raising(err):
        def body():
            raise err
        return body

    assert run_command(lambda: 0) == 0
    for err in (ConfigError("bad value"), DataError("no data"), CheckpointError("/x.pt", "damaged")):
        assert isinstance(err, InputError)
        assert run_command(raising(err)) == EXIT_BAD_INPUT
        assert capsys.readouterr().err == f"error: {err}\n"  # one line, one write
    for err in (NonFiniteLossError("loss is nan"), RunOutputError("cannot write /x")):
        assert isinstance(err, RunFailedError)
        assert run_command(raising(err)) == EXIT_FAILED
        assert capsys.readouterr().err == f"error: {err}\n"
    with pytest.raises(KeyError):  # a bug is not bad input: its traceback is kept
        run_command(raising(KeyError("x")))


@pytest.mark.slow  # commands in subprocesses (the fork server's start: ~20 s a worker)
@pytest.mark.parametrize("command", [
    ["-m", "dcl_core.train", "--preset", "nope"],
    ["-m", "dcl_core.evaluate", "/no/such/checkpoint.pt"],
    ["-m", "dcl_core.study", "sync", "/no/such/folder", "--name", "../x"],
    ["-m", "dcl_core.study", "answer", "/no/such/folder"],
    ["-m", "dcl_core.study", "export", "/no/such/folder", "--best"],
    ["-m", "dcl_core.export", "/no/such/checkpoint.pt"],
    ["studies/temperature_sweep.py", "--smoke", "--set", "nope=1", "--dry-run"],
    ["studies/eqco_mi_toy.py", "--alpha", "-1"],
])
def test_every_command_line_answers_bad_input_with_exit_2_and_one_line(command):
    proc = pyrun.run([sys.executable, *command], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]


@pytest.mark.parametrize(("command", "needle"), [
    (["studies/temperature_sweep.py", "--seeds", "nan"], "argument --seeds: invalid int value: 'nan'"),
    (["studies/temperature_sweep.py", "--preset", "foo"], "argument --preset: invalid choice: 'foo'"),
    (["studies/temperature_sweep.py", "--bogus"], "unrecognized arguments: --bogus"),
    # an issue reproduction: the last of the two was taken, silently
    (["studies/temperature_sweep.py", "--smoke", "--preset", "paper"], "--preset: not allowed with argument --smoke"),
    (["-m", "dcl_core.study", "answer"], "the following arguments are required: output_dir"),
    (["-m", "dcl_core.study", "nope"], "choose a command: answer, sync, export, calibrate (got 'nope')"),
    (["-m", "dcl_core.losses", "check"], "the following arguments are required: loss"),
    (["-m", "dcl_core.train", "--epochs"], "argument --epochs: expected one argument"),
    # issue reproductions: an empty folder ("$OUT" with OUT unset) was the current one, an empty URI the default
    (["-m", "dcl_core.study", "answer", ""], "argument output_dir: is empty; name the folder (. for this one)"),
    (["-m", "dcl_core.study", "sync", ""], "argument output_dir: is empty"),
    (["-m", "dcl_core.study", "export", "", "--best"], "argument output_dir: is empty"),
    (["-m", "dcl_core.study", "answer", "x", "--tracking-uri", ""], "argument --tracking-uri: is empty"),
    (["studies/temperature_sweep.py", "--tracking-uri", " "], "argument --tracking-uri: is empty"),
    (["studies/eqco_mi_toy.py", "--output-dir", ""], "argument --output-dir: is empty"),
    (["-m", "dcl_core.pack", "", "-o", "out"], "argument root: is empty; name the folder (. for this one)"),
])
def test_a_bad_option_is_one_line_not_the_usage(command, needle):
    """Argparse's own errors printed the whole usage (22 lines for a study) and a line starting with the script's
    name; every bad option is now the one ``error:`` line every other bad input is, pointing to --help."""
    proc = pyrun.run([sys.executable, *command], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
    assert needle in proc.stderr and "--help)" in proc.stderr, proc.stderr


def test_a_study_help_shows_where_it_writes_and_how_resume_extends():
    """``--help`` names ``--output-dir``'s default and says that ``--resume`` with more ``--seeds`` extends a
    finished study."""
    from dcl_core.study.cli.options import build_parser

    text = " ".join(build_parser("doc", "temperature_sweep").format_help().split())
    assert "(default: outputs/; outputs/smoke/ with --smoke, so that a smoke study and the real one live side by " \
        "side)" in text
    assert "with a larger --seeds, extend a finished study by the new seeds only" in text


def test_a_smoke_study_has_its_own_default_folder_beside_the_real_study_s():
    """The README's quick start runs ``--smoke`` and then the real study: they must not meet in one folder."""
    from dcl_core.study.cli.options import args_of, build_parser

    parser = build_parser("doc", "temperature_sweep")
    assert args_of(parser.parse_args(["--smoke"])).run.output_dir == Path("outputs/smoke")
    assert args_of(parser.parse_args(["--preset", "smoke"])).run.output_dir == Path("outputs/smoke")
    assert args_of(parser.parse_args([])).run.output_dir == Path("outputs")
    assert args_of(parser.parse_args(["--preset", "paper"])).run.output_dir == Path("outputs")
    assert args_of(parser.parse_args(["--smoke", "--output-dir", "mine"])).run.output_dir == Path("mine")


def test_an_error_is_one_line_that_cannot_drive_the_terminal(capsys, tmp_path):
    r"""Issue reproduction: a user loss raising ``RuntimeError("\x1b[2J...")`` cleared the screen through the
    checker's error line, and one whose message held 50 lines printed 52; a folder named with escapes (``answer
    $'\e[31mred'``) coloured the terminal. Every error line is one line, its unprintable characters escaped."""
    from dcl_core.cli_common import EXIT_BAD_INPUT, error
    from dcl_core.study.cli.answer_command import answer_main

    assert error("raised RuntimeError: \x1b[2J\x1b]0;title\x07\nline2\r\n\tend é 中") == EXIT_BAD_INPUT
    shown = r"raised RuntimeError: \x1b[2J\x1b]0;title\x07\nline2\r\n\tend é 中"
    assert capsys.readouterr().err == f"error: {shown}\n"
    folder = tmp_path / "\x1b[31mred\x07"
    folder.mkdir()
    assert answer_main([str(folder)]) == EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "\\x1b[31mred\\x07" in err and "\x1b" not in err, err


def test_ctrl_c_and_sigterm_are_one_line_and_release_what_the_command_holds(capsys):
    """Ctrl-C printed a traceback (train, evaluate, export, losses check: 24 to 170 lines), and SIGTERM ended a
    command where it stood: ``losses check`` left its child process (the user's loss) running, orphaned."""
    import os
    import signal

    from dcl_core import cli_common

    released = []

    def until_stopped(how):
        def body():
            try:
                if how == "sigterm":
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(30)  # the handler raises here
                raise KeyboardInterrupt
            finally:
                released.append(how)
        return body

    before = signal.getsignal(signal.SIGTERM)
    assert cli_common.run_command(until_stopped("ctrl-c"), interrupted="kept: x") == cli_common.EXIT_INTERRUPTED
    assert capsys.readouterr().err == "interrupted (Ctrl-C): kept: x\n"
    assert cli_common.run_command(until_stopped("sigterm")) == cli_common.EXIT_TERMINATED
    assert capsys.readouterr().err == "interrupted (SIGTERM)\n"
    assert released == ["ctrl-c", "sigterm"] and signal.getsignal(signal.SIGTERM) is before


def test_a_log_line_cannot_drive_the_terminal():
    """A run logged its output folder as given: a name holding ESC ] 0 ; title BEL set the terminal's title."""
    code = ("import logging; from dcl_core.cli_common import setup_logging; setup_logging(); "
            "logging.getLogger('dcl_core.x').info('in %s', 'o\\x1b]0;pwn\\x07\\nnext')")
    proc = pyrun.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0 and "\x1b" not in proc.stderr and "\x07" not in proc.stderr, repr(proc.stderr)
    first, second = proc.stderr.splitlines()
    assert first.endswith("INFO dcl_core.x: in o\\x1b]0;pwn\\x07") and second == "next", repr(proc.stderr)


@pytest.mark.parametrize("given", ["https://bob:hunter2@example.com/ck.pt", "s3://key:hunter2@bucket/ck.pt"])
def test_an_error_line_hides_the_password_of_a_url_given_as_a_path(given):
    """A URL given where a file was expected was echoed back, password and all, as the missing path."""
    proc = pyrun.run([sys.executable, "-m", "dcl_core.evaluate", given], capture_output=True, text=True, cwd=REPO,
                     timeout=120)
    assert proc.returncode == 2 and "hunter2" not in proc.stderr and "/***@" in proc.stderr, proc.stderr
