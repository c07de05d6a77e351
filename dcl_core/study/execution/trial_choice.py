"""A study's trained encoder for another codebase: the trial of a cell (by its name) or the best trial (``--best``),
found in the study's results and its Tune storage, exported by :func:`dcl_core.training.backbone_export.export`. The
command line is ``python -m dcl_core.study export`` (:mod:`dcl_core.study.cli.export_command`)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dcl_core.config import ConfigError
from dcl_core.files import is_regular_file, loads_json
from dcl_core.study.analysis.columns import KNN_TOP1, SERIES, Status
from dcl_core.study.execution.reanalysis import RESULTS_FILE, read_rows
from dcl_core.study.plan.spec import EXPERIMENT_SEP
from dcl_core.study.plan.storage import summary_dir

TRIAL_ID = re.compile(r"[A-Za-z0-9_]{1,64}")  # Tune's trial ids: "3aef0_00001"
MAX_RESULT_BYTES = 64 * 2**20  # a trial's result.json: one line per epoch; a 1,000-epoch run is a few MB


@dataclass(frozen=True)
class Chosen:
    """The trial to export: its results row, its name (Tune's folder and the MLflow run's), its checkpoint."""

    row: dict[str, Any]
    name: str
    checkpoint: Path

    @property
    def trial_id(self) -> str:
        """Tune's id of the trial (its MLflow run's ``trial_id`` tag)."""
        return str(self.row["trial_id"])


def choose_row(rows: Sequence[dict[str, Any]], study: str, trial: str | None, best: str | None) -> dict[str, Any]:
    """The row of ``trial`` (its Tune id or folder name, which ends in the id) or, with ``best`` (``""`` for any
    series, else a series name), the finished trial with the highest final kNN top-1 (the earliest trial id on a
    tie). ConfigError (one line) naming what there is when nothing matches."""
    if trial is not None:
        found = [r for r in rows if trial == r["trial_id"] or trial.endswith(f"_{r['trial_id']}")]
        if not found:
            ids = ", ".join(sorted(str(r["trial_id"]) for r in rows)[:6])
            more = ", …" if len(rows) > 6 else ""
            raise ConfigError(f"study {study} has no trial {trial!r} (its trial ids: {ids}{more}; a trial's folder "
                              "name and its MLflow run's name end in its id)")
        (row,) = found[:1]
        if row["status"] != Status.OK:
            raise ConfigError(f"trial {trial} of study {study} did not finish (status {row['status']}): "
                              "no trained encoder to export")
        return row
    ok = [r for r in rows if r["status"] == Status.OK and isinstance(r.get(KNN_TOP1), int | float)
          and math.isfinite(r[KNN_TOP1]) and (not best or r.get(SERIES) == best)]
    if not ok:
        series = sorted({str(r.get(SERIES)) for r in rows})
        raise ConfigError(f"study {study} has no finished trial{f' of series {best!r}' if best else ''} to export"
                          + (f" (its series: {', '.join(series)})" if best else ""))
    return max(sorted(ok, key=lambda r: str(r["trial_id"])), key=lambda r: float(r[KNN_TOP1]))


def trial_folder(storage: Path, study: str, trial_id: str) -> Path:
    """The trial's folder in the study's Tune experiments (``<storage>/<study>`` and ``<storage>/<study>+…``: a
    search's, a part's or a round's of seeds)."""
    if not TRIAL_ID.fullmatch(trial_id):
        raise ConfigError(f"{trial_id[:40]!r} is not a Tune trial id (letters, digits and _)")
    found = []
    for experiment in sorted(storage.iterdir()) if storage.is_dir() else []:
        if experiment.name != study and not experiment.name.startswith(f"{study}{EXPERIMENT_SEP}"):
            continue
        if experiment.is_symlink() or not experiment.is_dir():
            continue
        found += [d for d in experiment.iterdir() if d.is_dir() and not d.is_symlink()
                  and (d.name == trial_id or d.name.endswith(f"_{trial_id}"))]
    if not found:
        raise ConfigError(f"trial {trial_id} of study {study} has no folder in {storage} (its Tune storage; "
                          "--storage names another)")
    return found[0]


def final_checkpoint(folder: Path, storage: Path) -> Path:
    """The trial's last ``checkpoint.pt``: Tune's in the trial's folder, or for a DDP trial the Ray Train run's,
    whose folder the trial's last result names (it must lie in ``storage``)."""
    kept = sorted(p for p in folder.glob("checkpoint_*/checkpoint.pt") if is_regular_file(p))
    if kept:
        return kept[-1]
    named = _last_result(folder / "result.json").get("checkpoint_path")
    if isinstance(named, str) and named:
        path = Path(named.removeprefix("file://")) / "checkpoint.pt"
        parts = path.parts
        if not path.resolve().is_relative_to(storage.resolve()) and folder.parent.name in parts:
            # a study folder moved or copied from where it ran: the same place under this storage
            at = len(parts) - 1 - parts[::-1].index(folder.parent.name)
            path = folder.parent.joinpath(*parts[at + 1:])
        if not path.resolve().is_relative_to(storage.resolve()):
            raise ConfigError(f"{folder}: its last result names a checkpoint outside the study's storage "
                              f"({storage}): not followed")
        if is_regular_file(path):
            return path
    raise ConfigError(f"{folder} holds no checkpoint (was the study run with checkpoints kept?)")


def _last_result(path: Path) -> dict[str, Any]:
    """The last line of a trial's ``result.json`` as an object ({} when there is none)."""
    if not is_regular_file(path) or path.stat().st_size > MAX_RESULT_BYTES:
        return {}
    lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    try:
        last = loads_json(lines[-1]) if lines else {}
    except ValueError:
        return {}
    return last if isinstance(last, dict) else {}


def choose(output_dir: Path, study: str, storage: Path, trial: str | None, best: str | None) -> Chosen:
    """The trial to export from the finished study ``study`` in ``output_dir`` (see :func:`choose_row`)."""
    rows = read_rows(summary_dir(output_dir, study) / RESULTS_FILE)
    row = choose_row(rows, study, trial, best)
    folder = trial_folder(storage, study, str(row["trial_id"]))
    return Chosen(row, folder.name, final_checkpoint(folder, storage))
