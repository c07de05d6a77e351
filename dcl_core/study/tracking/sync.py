"""What a study journaled while MLflow was unreachable, pushed to MLflow later (``python -m dcl_core.study sync``,
whose command line is :func:`dcl_core.study.cli.sync_command.sync_main`).

Every study under ``OUTPUT_DIR/summary/`` with a ``pending_mlflow.jsonl`` (or only one named study) is replayed
against ``--tracking-uri``, else the folder's own store; a study that logged to another store (a server) names it
and asks for ``--tracking-uri``: the URI the folder records is never followed (:func:`study_store`). Replaying is
idempotent: runs are found by their trial id or the summary tag before any is created, and the journal keeps only
what MLflow did not take."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from dcl_core.config import ConfigError
from dcl_core.study.plan.storage import (
    OPTIONS_FILE,
    check_no_links,
    default_tracking_uri,
    read_options_file,
    redact_uri,
    study_entries,
    summary_dir,
)
from dcl_core.study.tracking.journal import JOURNAL_FILE, Journal
from dcl_core.study.tracking.preflight import check_store_in_folder, preflight
from dcl_core.study.tracking.tracker import StudyTracker


@dataclass(frozen=True)
class Store:
    """Where a re-analysis or sync of one study logs, and the store the study recorded when that is another one.

    ``uri`` is the command line's ``--tracking-uri``, else the folder's own SQLite store
    (``OUTPUT_DIR/mlflow.db`` of the folder as it is now). The URI a folder records is never followed: whoever
    wrote the folder would choose which host receives your ``MLFLOW_TRACKING_*`` credentials, or which file
    outside the folder is written, and a copied or moved folder would write to the original's store.
    ``recorded`` names it (credentials redacted) when it is neither ``uri`` nor the folder's own store as the
    study ran, so the caller can suggest passing it."""

    uri: str
    recorded: str | None = None

    def note(self) -> str | None:
        """One line for the user when the study logged to another store, else None."""
        if self.recorded is None:
            return None
        return (f"the study logged to MLflow at {self.recorded}; a recorded URI is not followed (the folder "
                f"would choose where your credentials go): logging to {redact_uri(self.uri)}; pass "
                "--tracking-uri to log to the study's own store")


def study_store(study_dir: Path, output_dir: Path, given: str | None) -> Store:
    """Where a re-analysis or sync of the study in ``study_dir`` logs (:class:`Store`)."""
    uri = given or default_tracking_uri(output_dir)
    try:
        recorded = read_options_file(study_dir / OPTIONS_FILE)  # bounded, a regular file only
    except (OSError, ValueError):  # ConfigError included: its reader says so
        return Store(uri)
    if not isinstance(recorded, dict) or not isinstance(recorded.get("tracking_uri"), str):
        return Store(uri)
    then = recorded["tracking_uri"]
    own_then = (isinstance(recorded.get("output_dir"), str)
                and then == f"sqlite:///{Path(recorded['output_dir']) / 'mlflow.db'}")
    if own_then or redact_uri(then) == redact_uri(uri):
        return Store(uri)
    return Store(uri, redact_uri(then[:500]))


@dataclass(frozen=True)
class Synced:
    """One study's journal replayed: its name, what was pushed, refused and left, and whether its answer must be
    recomputed (``summarize``: the study's summary never reached MLflow); or why nothing was replayed."""

    study: str
    pushed: int = 0
    left: int = 0
    uri: str = ""
    last_error: str | None = None
    refused: str | None = None  # a bad folder or store: nothing was replayed
    dropped: int = 0  # operations MLflow refused (gone for good)
    not_replayed: int = 0  # lines writing the summary run's answer: never replayed
    summarize: bool = False

    def line(self) -> str:
        """The result as one line: operations pushed, refused, not replayed, left, and the last error."""
        parts = [f"{self.pushed} operations pushed to {redact_uri(self.uri)}"]
        if self.dropped:
            parts.append(f"{self.dropped} refused by MLflow (see the warning above)")
        if self.not_replayed:
            parts.append(f"{self.not_replayed} not replayed (lines a study never journals, such as a summary run's "
                         "answer, which only the study's results give: `python -m dcl_core.study answer` logs it)")
        parts.append(f"{self.left} left" + (f" ({self.last_error})" if self.left and self.last_error else ""))
        return f"{self.study}: " + ", ".join(parts)


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
            Journal(study_dir, experiment).check()  # one no study writes (3 GB was read whole): refused unread
            store = study_store(study_dir, output_dir, tracking_uri)
            if store.recorded is not None and tracking_uri is None:
                raise ConfigError(f"its journal holds what MLflow at {store.recorded} did not take; a recorded URI "
                                  "is not followed (the folder would choose where your credentials go): pass "
                                  "--tracking-uri with that store's address to push it there")
            uri = store.uri
            preflight(uri)
            check_store_in_folder(uri, output_dir)
        except ConfigError as err:
            yield Synced(experiment, refused=str(err))
            continue
        tracker = StudyTracker(uri, experiment, artifact_root=output_dir / "mlartifacts", journal_dir=study_dir)
        tracker.sync()
        yield Synced(experiment, tracker.pushed, tracker.pending(), uri, tracker.last_error, dropped=tracker.dropped,
                     not_replayed=tracker.replay_refused, summarize=tracker.summary_missed)
