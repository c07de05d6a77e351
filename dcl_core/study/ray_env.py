"""What a study sets in Ray's environment: token authentication for a local instance, and what every Ray worker
process of a study runs before its first task (Ray's ``worker_process_setup_hook``).

Ray 2.60 turns token authentication on for a new local instance whatever the environment says (and writes
``~/.ray/auth_token``), then warns on the console's first line that ``RAY_AUTH_MODE=disabled`` opts out, which
the README says never to do on a shared network. A study asks for token mode explicitly instead
(:func:`request_token_auth`): the same security, no such advice. Ray reads the mode when it is first imported,
so this is set before the runner imports Ray; a cluster's mode is the cluster's (``--address``, ``ray job
submit``): a study attaching to one leaves it to Ray, which uses a token when it finds one.

Two things a worker prints are noise on the study's console (and in a ``ray job submit`` log, which forwards
every worker's output): Ray Train's "Checkpoint successfully created at ..." (INFO) for every epoch's report,
and, when the study ends, the "Exception ignored in ..." traceback of a ``SystemExit: 1``. Ray stops its idle
workers with SIGTERM, whose handler raises SystemExit wherever the process is; inside a garbage-collection
callback Python cannot raise it and prints it instead, although nothing failed. Any worker can be there (a trial,
a Ray Train worker, one of Tune's helpers), so the hook is installed in all of them, by
:func:`dcl_core.study.runner.init_ray`. No torch or Ray import here: every worker imports this module first.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any

HOOK = f"{__name__}.setup_worker"  # the import path Ray's runtime_env takes
AUTH_MODE = "RAY_AUTH_MODE"  # Ray's switch for token authentication (token / disabled), in Ray's security docs


def request_token_auth() -> None:
    """Ask a local Ray instance for token authentication (a mode the user set is kept). Only before Ray is
    imported: Ray caches the mode at import, and a changed environment afterwards would make the driver and the
    servers it starts disagree (the servers would refuse the driver)."""
    if "ray" not in sys.modules:
        os.environ.setdefault(AUTH_MODE, "token")


def setup_worker() -> None:
    """Quiet Ray Train's per-checkpoint INFO line and drop an unraisable SystemExit; idempotent (a reused
    actor's trainable calls it once per trial as well)."""
    logging.getLogger("ray.train").setLevel(logging.WARNING)
    if getattr(sys.unraisablehook, "func", None) is not quiet_exit_hook:
        sys.unraisablehook = functools.partial(quiet_exit_hook, sys.unraisablehook)


def quiet_exit_hook(previous: Any, unraisable: Any) -> None:
    """A ``sys.unraisablehook`` that drops a SystemExit (the process is exiting anyway) and hands every other
    exception Python cannot raise to ``previous``."""
    if isinstance(unraisable.exc_value, SystemExit):
        return
    previous(unraisable)
