"""What a study sets in Ray's environment: token authentication for a local instance, Tune's slow-operation
threshold on a quiet console, and what every Ray worker process of a study runs before its first task (Ray's
``worker_process_setup_hook``).

Ray 2.60 turns token authentication on for a new local instance whatever the environment says (and writes
``~/.ray/auth_token``), then warns on the console's first line that ``RAY_AUTH_MODE=disabled`` opts out, which
docs/failure-behaviour.md says never to do on a shared network. A study asks for token mode explicitly instead
(:func:`request_token_auth`): the same security, no such advice. Ray reads the mode when it is first imported,
so this is set before the runner imports Ray. A study attaching to a cluster (``--address``, ``ray job submit``)
asks for token mode when it has a token at hand (:func:`request_token_auth_to_attach`): a driver in Ray's default
mode sends no token, and a cluster started by ``ray start --head`` (token mode by default in 2.60) refused it
with 20 s of retries and a traceback; a cluster without authentication accepts a driver that sends one.

Two things a worker prints are noise on the study's console (and in a ``ray job submit`` log, which forwards
every worker's output): Ray Train's "Checkpoint successfully created at ..." (INFO) for every epoch's report,
and, when the study ends, the "Exception ignored in ..." traceback of a ``SystemExit: 1``. Ray stops its idle
workers with SIGTERM, whose handler raises SystemExit wherever the process is; inside a garbage-collection
callback Python cannot raise it and prints it instead, although nothing failed. Any worker can be there (a trial,
a Ray Train worker, one of Tune's helpers), so the hook is installed in all of them, by
:func:`dcl_core.study.execution.tuning.init_ray`. No torch or Ray import here: every worker imports this module first.
"""

from __future__ import annotations

import functools
import logging
import os
import stat
import sys
from pathlib import Path
from typing import Any

HOOK = f"{__name__}.setup_worker"  # the import path Ray's runtime_env takes
AUTH_MODE = "RAY_AUTH_MODE"  # Ray's switch for token authentication (token / disabled), in Ray's security docs
AUTH_TOKEN, AUTH_TOKEN_PATH = "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"  # the token itself / its file (same docs)
# Ray Tune's threshold for "The `process_trial_result` operation took 0.545 s, which may be a performance
# bottleneck" (default 0.5 s), in Tune's environment variables; read when ray.tune is first imported.
WARN_THRESHOLD = "TUNE_WARN_THRESHOLD_S"
QUIET_WARN_THRESHOLD_S = 30.0

log = logging.getLogger(__name__)


def request_token_auth() -> None:
    """Ask a local Ray instance for token authentication (a mode the user set is kept). Only before Ray is
    imported: Ray caches the mode at import, and a changed environment afterwards would make the driver and the
    servers it starts disagree (the servers would refuse the driver)."""
    if "ray" not in sys.modules:
        os.environ.setdefault(AUTH_MODE, "token")


def _token_file() -> Path:
    """The token file Ray reads without ``RAY_AUTH_TOKEN``: ``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``."""
    return Path(os.environ.get(AUTH_TOKEN_PATH) or Path.home() / ".ray" / "auth_token")


def token_at_hand() -> bool:
    """Whether this process has a Ray token to send: ``RAY_AUTH_TOKEN``, or the token file (:func:`_token_file`)."""
    return bool(os.environ.get(AUTH_TOKEN)) or _token_file().is_file()


def request_token_auth_to_attach() -> None:
    """Ask for token mode before attaching to a cluster, when a token is at hand and the user set no mode: the
    cluster then gets the token it may require (one started by ``ray start --head`` does), and one without
    authentication still accepts the driver. Without a token the mode stays Ray's: a token mode with nothing to
    send fails at once even where the cluster needs none. Only before Ray is imported (:func:`request_token_auth`)."""
    if "ray" not in sys.modules and token_at_hand():
        os.environ.setdefault(AUTH_MODE, "token")


def quiet_slow_loop_warnings() -> None:
    """Raise Tune's slow-operation threshold to 30 s for a study's default console (a threshold the user set is
    kept). On a busy machine the driver's per-epoch MLflow logging passes 0.5 s, and Tune then prints four
    warnings at a time that suggest reporting less often, although every epoch's report is wanted. The console's
    progress line shows the study's pace; ``-v`` keeps Tune's own threshold. Only before ray.tune is imported."""
    if "ray.tune" not in sys.modules:
        os.environ.setdefault(WARN_THRESHOLD, str(QUIET_WARN_THRESHOLD_S))


def protect_token_file() -> None:
    """Make the token file Ray uses readable by its owner only. Ray 2.60 writes ``~/.ray/auth_token`` with mode
    0644 (``ray.init`` and ``ray get-auth-token --generate`` alike): on a shared machine with a readable home
    folder any other user could read the cluster's password. Only a file of this user is touched."""
    if os.environ.get(AUTH_TOKEN):
        return
    path = _token_file()
    try:  # the file itself, never what a link there points to (that may be anyone's file, anywhere)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:  # no token file (auth disabled, or the token in the environment), a link, or not readable
        if path.is_symlink():
            log.warning("%s is a symbolic link: its target's mode is left as it is (make the token a file of "
                        "your own, readable by you only: chmod 600)", path)
        return
    try:
        info = os.fstat(fd)
        if info.st_uid == os.getuid() and stat.S_ISREG(info.st_mode) and info.st_mode & 0o077:
            os.fchmod(fd, 0o600)
            log.info("%s: readable by its owner only now (Ray wrote it readable by every user)", path)
    except OSError:  # not ours to change
        return
    finally:
        os.close(fd)


def setup_worker() -> None:
    """Quiet Ray Train's per-checkpoint INFO line and Tune's "Restored on ... from checkpoint" (INFO, once per
    trial a ``--resume`` continues: the study's console stays as quiet as its first run's), and drop an
    unraisable SystemExit; idempotent (a reused actor's trainable calls it once per trial as well)."""
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    logging.getLogger("ray.tune.trainable").setLevel(logging.WARNING)
    if getattr(sys.unraisablehook, "func", None) is not quiet_exit_hook:
        sys.unraisablehook = functools.partial(quiet_exit_hook, sys.unraisablehook)
    _state_api_on_own_cluster()



def _state_api_on_own_cluster() -> None:
    """Point Ray's State API at the cluster this worker belongs to.

    Ray Train's placement-group cleaner (a detached actor beside each DDP trial's controller) asks the State API
    every few seconds whether the controller still lives, with no address. Ray then looks for "the" Ray on this
    machine: with another instance running (or a record of the last ``ray start``'s) it raised "Found multiple
    active Ray instances" or waited on a GCS long gone, and each DDP trial printed the cleaner's tracebacks and Ray
    Train's "Failed to stop PlacementGroupCleaner gracefully". A local study runs without Ray's dashboard, which
    serves the State API, so the cleaner's question then has no answer: its "Failed to query ..." warnings are
    among the lines the driver keeps off the console (:func:`~.trial_failures.ray_internal`); the placement groups
    it would clean up after a controller that died end with the study's own instance anyway. On a cluster (with
    its dashboard) the cleaner works."""
    if os.environ.get("RAY_ADDRESS"):
        return
    ray = sys.modules.get("ray")  # a Ray worker has imported it; nothing is imported here
    if ray is None or not ray.is_initialized():  # the hook called outside Ray (asking would connect to "the" Ray)
        return
    os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address


def quiet_exit_hook(previous: Any, unraisable: Any) -> None:
    """A ``sys.unraisablehook`` that drops a SystemExit (the process is exiting anyway) and hands every other
    exception Python cannot raise to ``previous``."""
    if isinstance(unraisable.exc_value, SystemExit):
        return
    previous(unraisable)


def user_modules(loss_names: list[str]) -> list[str]:
    """What a study on a cluster ships to every node with Ray's ``py_modules``: the top-level package folder (or
    the single ``.py`` file) of each user loss named by module (``my_losses:MyLoss``), found on this driver's
    ``sys.path``. Not shipped: a loss named by file (its path must hold on every node: shared storage, or a file
    inside the job's ``--working-dir``, whose copy lies at the same path on every node), the project's own modules
    and installed packages (on the nodes already)."""
    # only the driver asks this (every worker imports this module first: nothing more for them)
    import importlib.util
    import sysconfig

    from dcl_core.config import loss_reference  # torch-free: the config's reference syntax, for the driver only

    installed = {Path(p).resolve() for p in (sysconfig.get_path("purelib"), sysconfig.get_path("platlib")) if p}
    shipped: list[str] = []
    for name in loss_names:
        ref = loss_reference(name)
        if ref is None or ref.file or not ref.module:
            continue
        top = ref.module.partition(".")[0]
        if top in ("dcl_core", "search_spaces"):
            continue
        found = importlib.util.find_spec(top)
        if found is None or (not found.origin and not found.submodule_search_locations):
            continue  # a study's pre-flight check has already refused a module that cannot be imported
        locations = list(found.submodule_search_locations or [])
        path = Path(locations[0] if locations else str(found.origin)).resolve()
        if any(path.is_relative_to(p) for p in installed) or str(path) in shipped:
            continue
        shipped.append(str(path))
    return shipped
