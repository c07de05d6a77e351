"""What a study journaled while MLflow was unreachable, pushed to MLflow later (``python -m dcl_core.study sync``,
whose command line is :func:`dcl_core.study.cli.sync_main`).

Every study under ``OUTPUT_DIR/summary/`` with a ``pending_mlflow.jsonl`` (or only one named study) is replayed
against the tracking URI it ran with (from its ``study_options.json``; a given URI overrides, e.g. when the recorded
one has its credentials redacted). Replaying is idempotent: runs are found by their trial id or the summary tag
before any is created, and the journal keeps only what MLflow did not take.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dcl_core.config import ConfigError
from dcl_core.study.plan.storage import (
    OPTIONS_FILE,
    check_no_links,
    default_tracking_uri,
    redact_uri,
    study_entries,
    summary_dir,
)
from dcl_core.study.tracking.journal import JOURNAL_FILE
from dcl_core.study.tracking.preflight import preflight
from dcl_core.study.tracking.tracker import StudyTracker


def recorded_tracking_uri(study_dir: Path, output_dir: Path, given: str | None) -> str:
    """``given``, else the tracking URI the study recorded in its ``study_options.json`` (refused when its
    credentials are redacted), else the folder's default store."""
    if given:
        return given
    options = study_dir / OPTIONS_FILE
    uri = None
    if options.exists():
        try:
            uri = json.loads(options.read_text()).get("tracking_uri")
        except ValueError:
            uri = None
    if uri and "***" in uri:
        raise ConfigError(f"the tracking URI recorded in {options} has its credentials redacted ({uri}); pass "
                          "--tracking-uri, or set MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD and pass it "
                          "without them")
    return uri or default_tracking_uri(output_dir)


@dataclass(frozen=True)
class Synced:
    """One study's journal replayed: its name, and either what was pushed and what is left, or why not."""

    study: str
    pushed: int = 0
    left: int = 0
    uri: str = ""
    last_error: str | None = None
    refused: str | None = None  # a bad folder or store: nothing was replayed

    def line(self) -> str:
        """The result as one line: operations pushed, left, and the last error."""
        return (f"{self.study}: {self.pushed} operations pushed to {redact_uri(self.uri)}, {self.left} left"
                + (f" ({self.last_error})" if self.left and self.last_error else ""))


def journals(output_dir: Path, name: str | None) -> list[Path]:
    """The journals to replay: ``summary/<name>/`` or every study's, never through a link."""
    found = [summary_dir(output_dir, name) / JOURNAL_FILE] if name else sorted(
        (output_dir / "summary").glob(f"*/{JOURNAL_FILE}"))
    return [j for j in found if j.is_file() and not j.is_symlink() and not j.parent.is_symlink()]


def sync_journals(output_dir: Path, found: list[Path], tracking_uri: str | None) -> Iterator[Synced]:
    """Replay each journal of ``found`` (from :func:`journals`) against its study's tracking URI."""
    for journal in found:
        study_dir = journal.parent
        experiment = study_dir.name  # the folder names the study; the journal's own lines are not trusted for it
        try:
            check_no_links(output_dir, study_entries(experiment))  # summary/ -> ~ would sync (and rewrite) a journal
            uri = recorded_tracking_uri(study_dir, output_dir, tracking_uri)
            preflight(uri)
        except ConfigError as err:
            yield Synced(experiment, refused=str(err))
            continue
        tracker = StudyTracker(uri, experiment, artifact_root=output_dir / "mlartifacts", journal_dir=study_dir)
        pushed = tracker.sync()
        yield Synced(experiment, pushed, tracker.pending(), uri, tracker.last_error)
