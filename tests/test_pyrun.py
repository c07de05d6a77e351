"""tests/pyrun.py gives what a new interpreter gives: the same exit status, stdout and stderr, for the ways the
suite's commands end (a normal exit, ``sys.exit`` with a code or a message, an uncaught exception, Ctrl-C), with
the command's own working folder, environment, ``sys.argv`` and ``sys.path[0]``; a timeout raises as
``subprocess.run``'s does; an environment the fork server cannot give falls back to a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyrun
import pytest

pytestmark = pytest.mark.slow  # starts the fork server (it imports torch, MLflow, SciPy: ~8 CPU-seconds)

SCRIPT = """\
import os, sys
print("argv", sys.argv[1:], "cwd", os.path.basename(os.getcwd()), "env", os.environ.get("PYRUN_PROBE"))
print("path0", os.path.basename(sys.path[0]) or "''", "main", __name__)
print("to stderr", file=sys.stderr)
how = sys.argv[1]
if how == "code":
    sys.exit(3)
if how == "message":
    sys.exit("error: one line")
if how == "raise":
    raise ValueError("a real bug")
if how == "interrupt":
    raise KeyboardInterrupt
if how == "sleep":
    import time; time.sleep(60)
"""


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "scripts" / "probe.py"
    path.parent.mkdir()
    path.write_text(SCRIPT)
    return path


@pytest.mark.parametrize("how", ["ok", "code", "message", "raise", "interrupt"])
def test_a_script_ends_as_in_a_new_interpreter(script: Path, tmp_path: Path, how: str) -> None:
    cmd = [sys.executable, str(script), how]
    env = {**os.environ, "PYRUN_PROBE": "seen"}
    forked = pyrun.run(cmd, cwd=tmp_path, env=env, timeout=120)
    real = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert forked.returncode == real.returncode and forked.stdout == real.stdout
    assert "argv ['" + how + "'] cwd " + tmp_path.name + " env seen" in forked.stdout
    assert "path0 scripts main __main__" in forked.stdout
    last = [line for line in forked.stderr.splitlines() if line.strip()][-1]
    assert last == [line for line in real.stderr.splitlines() if line.strip()][-1]  # the same last word
    assert forked.stderr.startswith("to stderr")


def test_modules_and_code_run_as_with_dash_m_and_dash_c(tmp_path: Path) -> None:
    module = [sys.executable, "-m", "dcl_core.study", "answer", str(tmp_path / "none")]
    forked, real = pyrun.run(module, cwd=tmp_path, timeout=120), subprocess.run(
        module, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert (forked.returncode, forked.stderr) == (real.returncode, real.stderr) and forked.returncode == 2
    code = [sys.executable, "-c", "import sys; print(sys.argv, __name__)", "x"]
    assert pyrun.run(code, timeout=60).stdout == subprocess.run(code, capture_output=True, text=True).stdout


def test_a_timeout_raises_and_leaves_no_process(script: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        pyrun.run([sys.executable, str(script), "sleep"], cwd=tmp_path, timeout=3)
    assert time.monotonic() - t0 < 30


def test_an_environment_read_on_import_gets_a_real_subprocess(tmp_path: Path, monkeypatch) -> None:
    code = [sys.executable, "-c", "import sys; print('torch' in sys.modules, 'ray' in sys.modules)"]
    pyrun._forkserver()
    for key in {k for k in {*os.environ, *pyrun._server_env} if k.startswith(pyrun.IMPORT_TIME_ENV)}:
        if key in pyrun._server_env:  # the fork server's import-time environment, whatever earlier tests left
            monkeypatch.setenv(key, pyrun._server_env[key])
        else:
            monkeypatch.delenv(key, raising=False)
    # what the studies set in the test process's own environment when run in-process changes nothing: still forked
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("TUNE_WARN_THRESHOLD_S", "30")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")  # the tracker's, set in-process
    monkeypatch.setenv("PYTHONBREAKPOINT", "ray.util.rpdb.set_trace")  # what ray.init sets in its caller
    assert pyrun.run(code, timeout=60).stdout.split() == ["True", "False"]  # torch preloaded, Ray left to the study
    code = [sys.executable, "-c", "import sys; print('torch' in sys.modules)"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # torch reads it on import
    with pytest.warns(UserWarning, match="a new interpreter, for OMP_NUM_THREADS$"):
        assert pyrun.run(code, env=env, timeout=60).stdout.strip() == "False"  # a new interpreter
    real = {**os.environ, "DCL_TEST_SUBPROCESS": "1"}
    os.environ["DCL_TEST_SUBPROCESS"] = "1"
    try:
        assert pyrun.run(code, env=real, timeout=60).stdout.strip() == "False"
    finally:
        del os.environ["DCL_TEST_SUBPROCESS"]
