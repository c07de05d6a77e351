"""``subprocess.run([sys.executable, ...])`` without paying for the imports each time.

A study or training command run as a subprocess spends ~7 CPU-seconds importing torch, torchvision, MLflow,
Optuna and SciPy before it reads its first option; the suite runs a few hundred of them on 2 cores. ``run`` starts
each command instead as a fresh process forked from a standard-library fork server (``multiprocessing``'s
``forkserver``) that imported those third-party packages once: the command itself (the project's modules, Ray,
its options, its files, its exit status, its stdout and stderr) runs exactly as in a new interpreter, from the
script's own ``__main__``. The fork server is single-threaded, so forking it is safe. Ray is not preloaded: a
study sets Ray's environment before importing it.

What the fork server cannot give, ``run`` leaves to a real subprocess: a command that is not ``python`` with a
script, ``-m module`` or ``-c code``; an environment that changes a variable the preloaded packages read on
import (``OMP_*``, ``CUDA_*``, ...); or ``DCL_TEST_SUBPROCESS=1``, which runs everything as real subprocesses (the
way to check that the two agree). ``--help`` timings and import-time behaviour are tested with real subprocesses.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Third-party packages every study or training command imports (the project's own modules are not preloaded:
# each command imports them afresh, as a user's does). Not Ray: a study sets Ray's and Tune's environment
# (token authentication, Tune's warning threshold) before it imports them, and they read it on import.
PRELOAD = [
    "torch", "torchvision", "torchvision.transforms.v2", "mlflow", "mlflow.store.tracking.sqlalchemy_store",
    "optuna", "scipy.stats", "matplotlib", "pyarrow.parquet",
]
# Read by the preloaded packages when imported: a command that sets one differently gets a real subprocess.
# (MLflow reads its MLFLOW_* variables at each call, which the study's tracker sets in a test's own process.)
IMPORT_TIME_ENV = ("OMP_", "MKL_", "CUDA_", "TORCH", "PYTORCH", "PYTHON", "LD_", "MPL")
# ... except those read at each use: Python consults PYTHONBREAKPOINT at every breakpoint() call, and ray.init sets
# it in the process that calls it (a test running a study in-process), which would send every later command to a
# new interpreter.
READ_AT_USE = frozenset({"PYTHONBREAKPOINT"})

_context: Any = None
_server_env: dict[str, str] = {}


def _forkserver() -> Any:
    global _context, _server_env
    if _context is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _context, _server_env = ctx, dict(os.environ)
    return _context


def _preloadable(env: dict[str, str]) -> bool:
    keys = {k for k in set(env) | set(_server_env) if k.startswith(IMPORT_TIME_ENV) and k not in READ_AT_USE}
    differ = sorted(k for k in keys if env.get(k) != _server_env.get(k))
    if differ:  # said, so that a variable drifting in the test process cannot quietly slow the suite down
        warnings.warn(f"pyrun: a new interpreter, for {', '.join(differ)}", stacklevel=3)
    return not differ


def _child(argv: list[str], cwd: str, env: dict[str, str], out: str, err: str, new_session: bool) -> None:
    """Run ``python *argv`` in this freshly forked process, as a new interpreter would, and exit with its status."""
    if new_session:
        os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for path, fd in ((out, 1), (err, 2)):
        target = os.open(path, os.O_WRONLY | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    stdin = os.open(os.devnull, os.O_RDONLY)
    os.dup2(stdin, 0)
    os.close(stdin)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    code = 0
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path.insert(0, cwd)
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path.insert(0, "")
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        else:
            sys.argv = list(argv)
            sys.path.insert(0, str(Path(argv[0]).resolve().parent))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException as exc:
        import traceback

        traceback.print_exc()
        # an uncaught KeyboardInterrupt ends an interpreter by SIGINT (status -2), anything else with status 1
        code = -signal.SIGINT if isinstance(exc, KeyboardInterrupt) else 1
    finally:
        atexit._run_exitfuncs()  # what an interpreter runs at exit (Ray's shutdown, logging's flush, MLflow's)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
    if code == -signal.SIGINT:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _python_argv(cmd: Sequence[Any]) -> list[str] | None:
    argv = [str(a) for a in cmd]
    if len(argv) < 2 or argv[0] != sys.executable or os.environ.get("DCL_TEST_SUBPROCESS") == "1":
        return None
    if argv[1] in ("-m", "-c"):
        return argv[1:] if len(argv) >= 3 else None
    return argv[1:] if not argv[1].startswith("-") else None


def _text(data: bytes) -> str:
    return data.decode().replace("\r\n", "\n").replace("\r", "\n")


def run(cmd: Sequence[Any], *, timeout: float | None = None, cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None, capture_output: bool = True, text: bool = True,
        start_new_session: bool = False) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(cmd, capture_output=True, ...)`` for ``cmd = [sys.executable, ...]``: the same status and
    output, forked from the fork server where that is the same as a new interpreter (the module docstring)."""
    assert capture_output, "run captures the output"
    env = dict(os.environ if env is None else env)
    argv = _python_argv(cmd)
    ctx = _forkserver() if argv is not None else None
    if argv is None or not _preloadable(env):
        return subprocess.run(list(cmd), capture_output=True, text=text, timeout=timeout, cwd=cwd, env=env,
                              start_new_session=start_new_session)
    with tempfile.TemporaryDirectory(prefix="pyrun") as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        out.touch()
        err.touch()
        child = ctx.Process(target=_child, args=(argv, str(Path(cwd or os.getcwd()).resolve()), env, str(out),
                                                 str(err), start_new_session))
        child.start()
        child.join(timeout)
        if child.exitcode is None:
            child.kill()
            child.join()
            raise subprocess.TimeoutExpired(list(cmd), timeout or 0, out.read_bytes(), err.read_bytes())
        stdout, stderr = out.read_bytes(), err.read_bytes()
    code = child.exitcode  # -N: killed by signal N, as subprocess says
    if text:
        return subprocess.CompletedProcess(list(cmd), code, _text(stdout), _text(stderr))
    return subprocess.CompletedProcess(list(cmd), code, stdout, stderr)
