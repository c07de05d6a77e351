"""Which MLflow run holds a study's answer: the run its tracker made for it, recorded beside its summary
(``summary/<study>/summary_run.json``) and signed with this user's key (:mod:`~dcl_core.study.plan.signing`).

The tag ``dcl.summary`` names that run in MLflow's UI, but whoever can write the store can set a tag on any run
(``sqlite3 OUT/mlflow.db "insert into tags …"``): found by its tag, a trial run tagged so received the next
``answer``'s verdict, its description and every summary metric. So a study's tracker finds its summary run only by
the ids recorded here, and makes a new one (recorded here) when none of them is a live run of the study's
experiment in the store it logs to (a study logs to one store, ``answer --tracking-uri`` may log to another: the
record keeps the last :data:`KEEP` ids, and an id is a run in one store only). A record changed since the study
signed it is not followed (a warning); one no key of this user's signed (a study from before the record existed,
a folder copied from another user or machine) is not followed either: the answer then goes on a new summary run.
"""

from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from dcl_core.config import ConfigError
from dcl_core.files import loads_json, read_bounded, write_text
from dcl_core.study.plan import signing

log = logging.getLogger(__name__)

RECORD = "summary_run.json"  # in summary/<study>/, beside the study's record
KEEP = 16  # summary run ids kept: one per store the study's answer was logged to
MAX_RECORD_BYTES = 64 * 1024  # the record holds at most KEEP ids: ~1 KiB
RUN_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")  # MLflow's run ids are 32 hex digits


def _purpose(folder: Path) -> str:
    """What the record's signature is for: this study's summary runs (another study's record cannot stand in)."""
    return f"summary runs {folder.name}"


def recorded(folder: Path) -> list[str]:
    """The summary run ids the study whose summary folder is ``folder`` recorded, oldest first; empty when it
    recorded none this user's key signed as it is now."""
    path = folder / RECORD
    if not os.path.lexists(path):
        return []
    try:
        data = loads_json(read_bounded(path, MAX_RECORD_BYTES))
    except (ConfigError, ValueError) as err:
        log.warning("%s is not a record of summary runs (%s): not followed; the answer goes on a new summary run",
                    path, str(err).splitlines()[0][:120] if str(err) else type(err).__name__)
        return []
    trust = signing.json_trust(data, _purpose(folder)) if isinstance(data, dict) else signing.UNSIGNED
    if trust == signing.CHANGED:
        log.warning("%s was changed since the study wrote it: not followed; the answer goes on a new summary run",
                    path)
    runs = data.get("runs") if trust == signing.SIGNED else None
    if not (isinstance(runs, list) and all(isinstance(r, str) and RUN_ID.fullmatch(r) for r in runs)):
        return []
    return list(runs)


def record(folder: Path, run_id: str) -> None:
    """Record ``run_id`` as the study's summary run (in the store it logs to now), signed; nothing where no key can
    be kept (the next open then makes a new summary run)."""
    runs = [r for r in recorded(folder) if r != run_id] + [run_id]
    data = signing.signed_json({"runs": runs[-KEEP:]}, _purpose(folder))
    if signing.SIGNATURE not in data:
        log.warning("no private key can be kept at %s: the study's summary run is not recorded, so its next answer "
                    "goes on another (set XDG_CACHE_HOME to a private folder of yours)", signing.key_path())
        return
    try:
        write_text(folder / RECORD, json.dumps(data, indent=1))
    except (OSError, ConfigError) as err:  # a full disk, a read-only folder, a link or folder at its name
        log.warning("the study's summary run was not recorded in %s: %s", folder, err)
