"""The check of a loss in a process of its own, each property within a time bound: the user's code (imported,
built and called only there) cannot end the checker with a false success (``sys.exit(0)`` or ``os._exit(0)`` at
import, in ``__init__`` or in the loss), nor hang it. A study's pre-flight of a user loss runs there too
(:func:`preflight_isolated`), so that such a loss is refused in one line rather than ending or hanging the study.

The parent starts ``python -m dcl_core.losscheck.isolation REQUEST`` and reads the JSON lines it appends to a file
as it goes: ``ready`` once torch is imported (the user's code loads next), ``start`` before each property,
``check`` after it, ``input_error`` when the loss or its reference cannot be loaded, ``done`` at the end. A
process that ends before ``done`` fails the property it was in (the loading counts as the contract), and one that
overruns its bound is killed with every process it started (the DDP check's ranks) and fails it likewise. This
module imports no torch in the parent: the child does.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dcl_core.config import InputError
from dcl_core.losscheck.rows import Check, contract_failed

STEP_TIMEOUT_S = 120.0  # each property's bound (loading the loss included); the DDP check's is longer
DDP_EXTRA_S = 150.0  # its 2 ranks start fresh interpreters that import torch and the loss
STARTUP_S = 300.0  # the child's interpreter importing torch, before it reports "ready" and loads the loss
POLL_S = 0.05
LOADING = ("contract", "loading the loss")


def run_isolated(name: str, params: str = "{}", reference: str | None = None, ddp: bool = True,
                 timeout: float = STEP_TIMEOUT_S) -> list[Check]:
    """Every property on loss ``name`` (and ``reference``, ``module:function`` or ``file.py:function``), in a
    child process, each within ``timeout`` seconds.

    Raises:
        InputError: the loss or the reference cannot be loaded or built (the child's one line).
    """
    checks, stopped = _in_child({"name": name, "params": params, "reference": reference, "ddp": ddp}, timeout)
    if stopped is None:
        return checks
    current, why = stopped
    return _stopped(checks, current, f"{why} during this check: it did not finish")


def preflight_isolated(name: str, params: str = "{}", timeout: float | None = None) -> None:
    """A study's pre-flight of the user's loss ``name``
    (:func:`~dcl_core.losscheck.properties.check_user_contract`: it imports, takes its arguments and meets the
    contract on a small batch) in a child process, within ``timeout`` seconds (default :data:`STEP_TIMEOUT_S`):
    a loss that exits, kills or hangs its process there is refused like one that raises.

    Raises:
        InputError: one line naming what failed.
    """
    _, stopped = _in_child({"name": name, "params": params, "preflight": True},
                           STEP_TIMEOUT_S if timeout is None else timeout)
    if stopped is not None:
        raise InputError(f"loss.name={name}: {stopped[1]}, as it was loaded, built and run on a small batch "
                         f"(python -m dcl_core.losses check {name} runs every check)")


Stop = tuple[tuple[str, str] | None, str]  # the property that was running, and why the child stopped in it


def _in_child(request: dict[str, Any], timeout: float) -> tuple[list[Check], Stop | None]:
    """The rows a child reports for ``request`` and, unless it reported them all, where and why it stopped."""
    with tempfile.TemporaryDirectory(prefix="dcl-loss-check-") as tmp:
        events = Path(tmp) / "events.jsonl"
        file = Path(tmp) / "request.json"
        file.write_text(json.dumps({**request, "events": str(events), "sys_path": sys.path}))
        proc = subprocess.Popen([sys.executable, "-m", "dcl_core.losscheck.isolation", str(file)],
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            return _follow(proc, events, timeout)
        finally:
            _kill(proc)


def _follow(proc: subprocess.Popen[bytes], events: Path, timeout: float) -> tuple[list[Check], Stop | None]:
    """The rows the child reports, until it is done, ends or overruns a property's bound (then where and why)."""
    checks: list[Check] = []
    current: tuple[str, str] | None = LOADING  # the property running, None between two
    started, offset, ready = time.monotonic(), 0, False
    while True:
        ended = proc.poll() is not None
        text = events.read_text() if events.exists() else ""
        complete = text[: text.rfind("\n") + 1]
        for line in complete[offset:].splitlines():
            event: dict[str, Any] = json.loads(line)
            kind = event.pop("event")
            if kind == "input_error":
                raise InputError(event["message"])
            if kind == "done":
                return checks, None
            if kind == "ready":
                ready, started = True, time.monotonic()
            elif kind == "start":
                current, started = (event["name"], event["setting"]), time.monotonic()
            elif kind == "check":
                checks.append(Check(**event))
                current = None
        offset = len(complete)
        if ended:
            status = proc.returncode
            why = (f"the loss's code ended the check's process (exit status {status})" if status >= 0
                   else f"the check's process died of signal {-status}")
            return checks, (current, why)
        bound = STARTUP_S if not ready else timeout + (DDP_EXTRA_S if current and current[0] == "ddp" else 0.0)
        if current and time.monotonic() - started > bound:
            return checks, (current, f"no result within {bound:g} s: the loss's code did not return")
        time.sleep(POLL_S)


def _stopped(checks: list[Check], current: tuple[str, str] | None, why: str) -> list[Check]:
    """The rows so far, a failed row for the property that was running, and the one that says the rest did not run."""
    name, setting = current or ("others", "after the last row")
    rows = [*checks, Check(name, setting, False, detail=why)]
    if name == "contract" or (checks and not checks[0].ok):
        return contract_failed(rows)
    return [*rows, Check("others", "not run", False, detail="the check stopped at the row above")]


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """End the child and every process it started (its own session), and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # also after the child ended: its DDP ranks may outlive it
    proc.wait()


def child(request_file: str) -> int:
    """The child's side: load the loss, run every property (or a study's pre-flight), report each as a JSON line."""
    request = json.loads(Path(request_file).read_text())
    sys.path[:] = request["sys_path"]  # the parent's: a module named relative to its folder resolves alike
    # torch and the user's code load here, in the child only
    from dcl_core.losscheck.core import loss_factory
    from dcl_core.losscheck.properties import check_user_contract
    from dcl_core.losscheck.suite import measure, steps
    from dcl_core.losses.user import LossExitedError, load_function

    with open(request["events"], "a", encoding="utf-8") as out:
        def emit(event: str, **fields: Any) -> None:
            out.write(json.dumps({"event": event, **fields}) + "\n")
            out.flush()

        emit("ready")
        if request.get("preflight"):
            emit("start", name="contract", setting="LossOutput")
            try:
                check_user_contract(request["name"], request["params"])
            except InputError as err:  # a sys.exit at import or in __init__ too: one line, as the study says it
                emit("input_error", message=str(err))
                return 2
            emit("done")
            return 0
        try:
            make = loss_factory(request["name"], request["params"])
            reference = load_function(request["reference"]) if request["reference"] else None
        except LossExitedError as err:  # sys.exit at import or in __init__: the exit it is, as os._exit's
            raise SystemExit(err.code) from None
        except InputError as err:
            emit("input_error", message=str(err))
            return 2
        for i, step in enumerate(steps(make, request["name"], request["params"], reference, request["ddp"])):
            emit("start", name=step.name, setting=step.setting)
            check = measure(step)
            emit("check", **check.as_dict())
            if i == 0 and not check.ok:
                emit("check", **contract_failed([])[0].as_dict())
                break
        emit("done")
    return 0


if __name__ == "__main__":
    sys.exit(child(sys.argv[1]))
