"""A study's tracking operations (:class:`StudyTracker`): the parent run, a nested child run per trial, the summary
on the parent, each applied to MLflow now through the study's :class:`~.mlflow_runs.StudyRuns`, or kept. MLflow
being down never stops a study: what it does not take goes to the study's
:class:`~dcl_core.study.tracking.journal.Journal` and is replayed later."""

from __future__ import annotations

import contextlib
import logging
import math
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from mlflow.utils.mlflow_tags import MLFLOW_PARENT_RUN_ID

from dcl_core.study.analysis.colours import SUMMARY_COLOUR
from dcl_core.study.plan.storage import redact_uri
from dcl_core.study.tracking import transport
from dcl_core.study.tracking.journal import JOURNAL_FILE, LOCAL_ID, PARENT_TAG, SUMMARIZE, Journal
from dcl_core.study.tracking.mlflow_runs import SUMMARY_TAG, TRIAL_TAG, StudyRuns, metric_name, rounded
from dcl_core.study.tracking.mlflow_view import RUN_COLOR_TAG
from dcl_core.study.tracking.notes import NOTE_TAG, is_literal_markdown, summary_note, verdict_lines

log = logging.getLogger(__name__)

assert PARENT_TAG == MLFLOW_PARENT_RUN_ID  # the journal names MLflow's tag without importing MLflow


# What makes a run the study's summary run, a trial's run, or a child of the study's run: set only when the run is
# created (:meth:`StudyTracker.open`, :meth:`StudyTracker.trial_run`), so a ``tag`` line setting one was planted.
IDENTITY_TAGS = frozenset((SUMMARY_TAG, TRIAL_TAG, MLFLOW_PARENT_RUN_ID))

def git_commit() -> str:
    """The repository's HEAD commit (``unknown`` outside a git checkout, e.g. under ``ray job submit``)."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, cwd=Path(__file__).parent
        )
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"




class StudyTracker:
    """A study's MLflow experiment through one ``MlflowClient``: the parent run, a child run per trial, the
    summary on the parent.

    MLflow being unreachable never stops the study: every operation that fails (or that comes while the
    tracker knows MLflow is down) is appended to a journal, ``journal_dir/pending_mlflow.jsonl``, with what it
    needs to be replayed; a run created offline gets a placeholder id (``offline-…``), mapped to its MLflow id
    when replayed (``pending_mlflow_ids.json``). One warning per outage; while down, MLflow is not called for
    ``cooldown`` seconds after a failure, and each call gives up after ``http_retries`` retries of
    ``http_timeout`` seconds (MLflow's defaults retry for minutes). The next call after the cool-down, and
    :meth:`sync`, replay the journal first, in order; a replayed run creation first looks the run up by its
    trial id (the summary run by the id the study recorded), so runs are never duplicated, and the journal keeps
    only what MLflow did not take. :meth:`open` (so a ``--resume``) and ``python -m dcl_core.study sync`` replay it too.
    Without a ``journal_dir`` failed operations are logged and dropped.

    What MLflow does with each operation is its :class:`~dcl_core.study.tracking.mlflow_runs.StudyRuns`'
    (``runs``: the experiment, the summary run, the trials' runs); this class decides when an operation is
    applied, journaled, replayed or dropped.

    Picklable (Tune saves its callbacks with the experiment, and restores them on ``--resume``): the client is
    dropped when pickled and made again on first use.
    """

    def __init__(self, tracking_uri: str, experiment: str, artifact_root: Path | None = None,
                 tags: Mapping[str, str] | None = None, journal_dir: Path | None = None, *,
                 cooldown: float = 30.0, http_timeout: int = 10, http_retries: int = 1, description: str = "",
                 experiment_tags: Mapping[str, str] | None = None) -> None:
        self.tracking_uri = transport.move_credentials(tracking_uri)
        self.experiment = experiment
        self.tags = dict(tags or {})
        self.journal_dir = Path(journal_dir).resolve() if journal_dir is not None else None
        self.cooldown = cooldown
        self.http_timeout = http_timeout
        self.http_retries = http_retries
        self.runs = StudyRuns(self.tracking_uri, experiment, artifact_root=artifact_root,
                              journal_dir=self.journal_dir, description=description,
                              experiment_tags=experiment_tags, http_timeout=http_timeout)
        self.runs.on_refused = self._drop
        self.parent_run_id: str | None = None
        self.dropped = 0  # operations lost: refused by MLflow, or failed without a journal
        self.last_error: str | None = None
        self._offline_until = 0.0  # time.monotonic() before which MLflow is not called
        self._outage = False  # warned about the current outage
        self._warned_refused: set[str] = set()
        self._unjournaled = False  # within log_summary's answer: what MLflow does not take now is not journaled
        self.summary_missed = False  # the answer did not reach MLflow (log_summary; a replayed SUMMARIZE marker)
        self.replay_refused = 0  # journal lines a replay refused to apply (:meth:`_replay_problem`)
        self.markers = 0  # SUMMARIZE markers replayed (nothing for MLflow)
        self.pushed = 0  # journaled operations a replay delivered to MLflow
        self._flushed = (0, 0, 0)  # the last replay's operations pushed, refused by MLflow, not replayed

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_offline_until": 0.0, "_outage": False}

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Defaults first: a study started before the journal existed resumes with its pickled tracker.
        state = dict(state)
        StudyTracker.__init__(self, state["tracking_uri"], state["experiment"],
                              artifact_root=state.get("artifact_root"), journal_dir=state.get("journal_dir"),
                              description=state.get("description", ""), experiment_tags=state.get("experiment_tags"),
                              http_timeout=state.get("http_timeout", 10))
        if "runs" not in state:  # pickled when the tracker held its MLflow state itself: hand that to its runs
            self.runs.experiment_id = state.get("experiment_id")
            self.runs.ids.update(state.get("_ids") or {})
            self.runs._mine.update(state.get("_mine") or ())
            self.runs._summary_ids.update(state.get("_summary_ids") or ())
        for key in _RUNS_STATE:
            state.pop(key, None)
        self.__dict__.update(state)
        self.runs.on_refused = self._drop

    @property
    def experiment_id(self) -> str | None:
        """The experiment's id, once MLflow was asked (None before, or while it was unreachable)."""
        return self.runs.experiment_id

    def _real(self, run_id: str) -> str:
        return self.runs.real(run_id)

    def _apply(self, rec: dict[str, Any]) -> str | None:
        """One operation record against MLflow. A SUMMARIZE marker is nothing for MLflow: whoever replays it
        recomputes the answer (`sync`). A replayed ``open`` makes the parent run's placeholder real."""
        if rec["op"] == SUMMARIZE:
            self.summary_missed = True
            self.markers += 1
            return None
        result = self.runs.apply(rec)
        if rec["op"] == "open" and self.parent_run_id in (None, rec["id"]):
            self.parent_run_id = result
        return result

    @property
    def journal(self) -> Path | None:
        """The journal file (whether or not it exists yet); None without a ``journal_dir``."""
        return None if self.journal_dir is None else self.journal_dir / JOURNAL_FILE

    def _journal(self) -> Journal | None:
        return None if self.journal_dir is None else Journal(self.journal_dir, self.experiment)

    def _pending_ops(self) -> list[dict[str, Any]]:
        journal = self._journal()
        return journal.read() if journal is not None and journal.size() else []

    # -- the study's operations: each is one journal record, applied now or journaled ------------------------

    def open(self, overwrite: bool = False) -> StudyTracker:
        """Replay what an earlier run of the study journaled; get or create the experiment (local stores get an
        absolute artifact folder); with ``overwrite`` soft-delete its runs started before now; then find (a
        resumed study) or create the parent run. If MLflow is unreachable the parent run is a placeholder."""
        if (journal := self._journal()) is not None:
            journal.check()  # a journal no study writes (a 3 GB one was read whole): one line, before any replay
        rec = {"op": "open", "id": _local_id(), "experiment": self.experiment, "overwrite": overwrite,
               "tags": {SUMMARY_TAG: "true", RUN_COLOR_TAG: SUMMARY_COLOUR, **self.tags}, "time": _now_ms()}
        self.parent_run_id = self._real(self._apply_or_journal(rec))
        return self

    def trial_run(self, trial_id: str, name: str, tags: Mapping[str, str], params: Mapping[str, Any]) -> str:
        """The child run of a trial: found by its trial id (a resumed or retried trial), else created with
        the study's tags, ``tags`` and every param. A placeholder id while MLflow is unreachable."""
        all_tags = {**self.tags, **tags, TRIAL_TAG: trial_id, MLFLOW_PARENT_RUN_ID: self.parent_run_id or ""}
        rec = {"op": "trial_run", "id": _local_id(), "experiment": self.experiment, "trial_id": trial_id,
               "name": name, "tags": {k: str(v) for k, v in all_tags.items()},
               "params": {k: str(v) for k, v in params.items()}, "time": _now_ms()}
        return self._apply_or_journal(rec)

    def log_metrics(self, run_id: str, metrics: Mapping[str, float], step: int = 0) -> None:
        """Finite numbers only (a NaN marks a missing measurement, not a value to plot), :func:`rounded`."""
        now = _now_ms()
        items = [[metric_name(k), rounded(float(v)), now, int(step)] for k, v in metrics.items()
                 if isinstance(v, int | float) and math.isfinite(v)]
        if items:
            self._apply_or_journal({"op": "metrics", "run": run_id, "metrics": items})

    def last_step(self, run_id: str, key: str) -> int:
        """The last step of metric ``key`` MLflow holds for the run (0 if none, or if it cannot say now): a
        resumed trial retrains the epochs after its checkpoint, which may already be logged."""
        if time.monotonic() < self._offline_until or run_id.startswith("offline-"):
            return 0
        try:
            with self._short_http():
                history = self.runs.client.get_metric_history(self._real(run_id), metric_name(key))
        except Exception:  # tracking never stops the study; a duplicate point is the worst outcome
            return 0
        return max((m.step for m in history), default=0)

    def log_params(self, run_id: str, params: Mapping[str, Any]) -> None:
        """Params the run does not have yet (a resumed study's summary keeps its first values)."""
        if params:
            self._apply_or_journal({"op": "params", "run": run_id, "params": {k: str(v) for k, v in params.items()}})

    def set_tag(self, run_id: str, key: str, value: str) -> None:
        """Set a tag on the run (now, or journaled when MLflow is down)."""
        self._apply_or_journal({"op": "tag", "run": run_id, "key": key, "value": str(value)})

    def log_dict(self, run_id: str, data: Mapping[str, Any], path: str) -> None:
        """Log ``data`` as a JSON artifact at ``path`` of the run (now, or journaled)."""
        self._apply_or_journal({"op": "dict", "run": run_id, "data": dict(data), "path": path})

    def log_artifact(self, run_id: str, path: Path, artifact_path: str | None = None,
                     temporary: bool = False) -> None:
        """A file or a folder's contents. ``temporary``: ``path`` is deleted soon (a temporary folder), so a
        journaled operation logs a copy kept in the journal folder."""
        rec = {"op": "artifact", "run": run_id, "path": str(Path(path).resolve()), "artifact_path": artifact_path}
        self._apply_or_journal(rec, temporary=temporary)

    def end_run(self, run_id: str, failed: bool = False) -> None:
        """End the run, FAILED or FINISHED (now, or journaled)."""
        status = "FAILED" if failed else "FINISHED"
        self._apply_or_journal({"op": "end", "run": run_id, "status": status, "time": _now_ms()})

    def log_summary(self, metrics: Mapping[str, float], artifacts: list[Path],
                    params: Mapping[str, Any] | None = None, tags: Mapping[str, str] | None = None,
                    headline: str | None = None, cells: tuple[str, Sequence[Sequence[str]]] = ("", ())) -> str:
        """The study summary on the parent run (metrics, the results table, the plots), which then finishes. Its
        description (:func:`summary_note`) is ``headline`` (default: the verdicts' words, tag ``verdict``), the
        verdict lines of ``tags``, the ``cells`` table and the study's plot (the artifact named after the
        experiment), so MLflow's runs table (column Description) and run page show the answer.

        A resumed study summarizes all its trials again: metrics get a new point, artifacts are replaced. The
        study's last operation: if anything is still journaled, one more :meth:`sync` (cool-down or not), then a
        warning saying what is left and how to push it. Returns the parent run's id (a placeholder if MLflow
        never answered)."""
        if self.parent_run_id is None:
            self.open()
        rid = self.parent_run_id
        assert rid is not None

        def content() -> None:  # the answer: applied now, never journaled (a journal line could be forged)
            self._unjournaled = True
            try:
                self.log_params(rid, params or {})
                for key, value in (tags or {}).items():
                    self.set_tag(rid, key, value)
                plot = next((p.name for p in artifacts if p.name == f"{self.experiment}.png"), None)
                words = headline if headline is not None else (tags or {}).get("verdict", "")
                note = summary_note(verdict_lines(tags or {}), words, plot, self._real(rid), cells)
                if note:
                    self.set_tag(rid, NOTE_TAG, note)
                self.log_metrics(rid, metrics)
                for path in artifacts:
                    self.log_artifact(rid, path)
                figure = next((p for p in artifacts if p.name == f"{self.experiment}.png"), None)
                if figure is not None:
                    self._apply_or_journal({"op": "figure", "run": rid, "path": str(figure.resolve()),
                                            "name": f"{self.experiment}: figure"})
            finally:
                self._unjournaled = False

        self.summary_missed = False
        content()
        self.end_run(rid)
        if self.pending():
            self.sync()
        if self.summary_missed and not self.pending() and time.monotonic() >= self._offline_until:
            self.summary_missed = False  # MLflow is back: the answer is logged now
            content()
        if self.summary_missed:  # a marker only: `sync` recomputes the answer from the study's results
            self._append({"op": SUMMARIZE, "experiment": self.experiment})
        message = self.pending_message()
        if message:
            log.warning("%s", message)
        return self._real(rid)

    # -- the journal --------------------------------------------------------------------------------------------

    def sync(self) -> int:
        """Replay the journal now, cool-down or not; returns how many operations MLflow took (:meth:`pending`
        counts what is left, :attr:`last_error` says why)."""
        journal = self._journal()
        if journal is None or not journal.size():
            return 0
        journal.check()
        with self._short_http():
            done, error = self._flush()
        if error is None:
            self._back_online(done)
        else:
            self._went_offline(error)
        return done

    def pending(self) -> int:
        """How many operations the journal holds (0 without a journal)."""
        return len(self._pending_ops())

    def pending_runs(self) -> int:
        """How many runs the journaled operations touch."""
        return len({rec.get("run") or rec.get("id") for rec in self._pending_ops()} - {None})

    def pending_message(self) -> str | None:
        """One line for the end of a study: what is still to be pushed to MLflow and how, else None."""
        n = self.pending()
        if n and self.journal_dir is not None:
            out = self.journal_dir.parent.parent if self.journal_dir.parent.name == "summary" else None
            command = (f"`python -m dcl_core.study sync {out} --name {self.journal_dir.name}`" if out else
                       f"StudyTracker(..., journal_dir={str(self.journal_dir)!r}).sync()")
            answer = ("; it also logs the study's answer, recomputed from its results (an answer is never journaled)"
                      if any(r["op"] == SUMMARIZE for r in self._pending_ops()) else "")
            return (f"MLflow was unreachable: {n} operations for {self.pending_runs()} runs are in {self.journal}; "
                    f"{command} (or the study's --resume) pushes them{answer}")
        if self.dropped:
            return f"MLflow: {self.dropped} tracking operations were not logged (see the warnings above)"
        return None

    def _apply_or_journal(self, rec: dict[str, Any], temporary: bool = False) -> Any:
        """Apply ``rec`` now, after the journal (so MLflow takes everything in order); if MLflow is down (or
        known to be, within the cool-down) journal it (``temporary``: with a copy of its file). Returns what the
        operation returns (a run id; a placeholder when journaled)."""
        if time.monotonic() >= self._offline_until:
            try:
                with self._short_http():
                    done = 0
                    journal = self._journal()
                    if journal is not None and journal.size():
                        done, error = self._flush()
                        if error is not None:
                            raise error
                    result = self._apply(rec)
                self.runs.ids.pop(rec.get("id", ""), None)  # only runs made by a replay need the id map
                self._back_online(done)
                return result
            except Exception as exc:  # tracking never stops the study
                if transport.is_refused(exc):
                    self._drop(rec, exc)
                    return rec.get("id")
                self._went_offline(exc)
        self._append(rec, temporary)
        return rec.get("id")

    def _flush(self) -> tuple[int, BaseException | None]:
        """Replay the journal in order until an operation fails transiently; keep only what is left. Returns
        (lines done with: applied, refused by MLflow or not replayed; the transient error or None); how many of
        each this replay saw: ``_flushed`` (pushed, refused, not replayed)."""
        journal = self._journal()
        assert journal is not None
        done, error = 0, None
        before = (self.pushed, self.dropped, self.replay_refused)
        with journal.lock():
            records = journal.read()
            try:
                for rec in records:
                    try:
                        if (why := self._replay_problem(rec)) is not None:
                            self._refuse_replay(rec, why)
                        else:
                            self._apply(rec)
                            self.pushed += rec["op"] != SUMMARIZE
                    except Exception as exc:
                        if not transport.is_refused(exc):
                            error = exc
                            break
                        self._drop(rec, exc)
                    journal.release(rec)
                    done += 1
            finally:
                journal.rewrite(records[done:], self.runs.ids, self._real)
                self._flushed = (self.pushed - before[0], self.dropped - before[1], self.replay_refused - before[2])
        return done, error

    def _replay_problem(self, rec: dict[str, Any]) -> str | None:
        """Why a journal line must not be replayed, else None. A tracker never journals the summary run's answer
        (its verdict tags, description, metrics, params, tables and plots: :meth:`log_summary`), so such a line
        was planted by whoever could write the folder: `sync` recomputes the answer from the study's results.
        Nor does it journal a tag that makes a run the summary run or a trial's (:data:`IDENTITY_TAGS`), MLflow's
        own ``mlflow.*`` tags other than a description, or a description it did not escape (:func:`literal_markdown`):
        a planted ``dcl.summary=true`` on a trial run would have the next answer written onto that trial."""
        tags = rec.get("tags", {}) if rec["op"] in ("open", "trial_run") else {rec.get("key"): rec.get("value")}
        if rec["op"] == "trial_run" and (SUMMARY_TAG in tags or tags.get(TRIAL_TAG) != rec["trial_id"]):
            return "a trial's run tagged as another run (the summary run, or another trial)"
        if rec["op"] == "tag" and (rec["key"] in IDENTITY_TAGS
                                   or (rec["key"].startswith("mlflow.") and rec["key"] != NOTE_TAG)):
            return f"a line setting the tag {rec['key'][:80]!r}, which a tracker sets only as it creates a run"
        if NOTE_TAG in tags and not is_literal_markdown(str(tags[NOTE_TAG])):
            return "a run description that is not literal text (a tracker escapes every description it writes)"
        if rec["op"] not in ("tag", "metrics", "params", "dict", "artifact"):
            return None
        if self.runs.is_summary_run(self._real(rec["run"])):
            return ("a line writing a summary run's answer (never journaled: `python -m dcl_core.study answer` "
                    "logs it from the study's results)")
        return None

    def _refuse_replay(self, rec: dict[str, Any], why: str) -> None:
        self.replay_refused += 1
        if self.replay_refused == 1:
            log.warning("not replaying %s of %s: %s", rec["op"], self.journal, why)

    def _append(self, rec: dict[str, Any], temporary: bool = False) -> None:
        if self._unjournaled:  # the summary's answer: recomputed by `sync`, never replayed from the journal
            self.summary_missed = True
            return
        journal = self._journal()
        if journal is None:
            self.dropped += 1
            return
        if rec["op"] == "open" and rec.get("overwrite"):  # the journal never deletes runs (a planted line could)
            rec = {**rec, "overwrite": False}
            log.warning("--overwrite: MLflow is unreachable, so the earlier runs of %s were not soft-deleted; they "
                        "stay beside the new ones (delete them in the UI, or run with --overwrite again)",
                        self.experiment)
        try:
            journal.append(journal.keep_copy(rec) if temporary else rec)
        except OSError as err:  # a full disk must not stop the study either
            self.dropped += 1
            log.warning("could not journal an MLflow operation in %s: %s", self.journal_dir, err)

    @contextlib.contextmanager
    def _short_http(self) -> Iterator[None]:
        """This tracker's calls: few retries, a short timeout (:func:`transport.short_http`)."""
        with transport.short_http(self.http_retries, self.http_timeout) as added:
            self.runs.env_added = added
            try:
                yield
            finally:
                self.runs.env_added = []

    def _went_offline(self, exc: BaseException) -> None:
        self._offline_until = time.monotonic() + self.cooldown
        self.last_error = transport.reason(exc)
        if self._outage:
            log.debug("MLflow still unreachable: %s", self.last_error)
            return
        self._outage = True
        where = f"journaled in {self.journal}" if self.journal is not None else "dropped (no journal folder)"
        log.warning("MLflow at %s is unreachable (%s); training goes on, tracking operations are %s and MLflow "
                    "is tried again every %g s", redact_uri(self.tracking_uri), self.last_error, where,
                    self.cooldown)

    def _back_online(self, done: int) -> None:
        """MLflow answered again after ``done`` journal lines were dealt with (:meth:`_flush`)."""
        self._offline_until = 0.0
        self.last_error = None
        if self._outage or done:
            pushed, refused, not_replayed = self._flushed if done else (0, 0, 0)
            log.info("MLflow at %s is reachable: %d journaled operations pushed, %d refused by MLflow, %d not "
                     "replayed, %d left", redact_uri(self.tracking_uri), pushed, refused, not_replayed,
                     self.pending())
        self._outage = False

    def _drop(self, rec: dict[str, Any], exc: BaseException) -> None:
        """An operation MLflow will never take: warned once per kind of operation, then counted."""
        self.dropped += 1
        journal = self._journal()
        if journal is not None:
            journal.release(rec)
        if rec["op"] in self._warned_refused:
            log.debug("MLflow refused %s: %s", rec["op"], transport.reason(exc))
            return
        self._warned_refused.add(rec["op"])
        log.warning("MLflow refused an operation (%s on run %s): %s; it is dropped", rec["op"],
                    rec.get("run") or rec.get("trial_id") or self.experiment, transport.reason(exc))


# What a tracker pickled by an older version held itself and its runs hold now (:meth:`StudyTracker.__setstate__`).
_RUNS_STATE = ("description", "experiment_tags", "artifact_root", "experiment_id", "_client", "_ids", "_mine",
               "_summary_ids", "_env_added")


def _local_id() -> str:
    return LOCAL_ID + uuid.uuid4().hex


def _now_ms() -> int:
    return int(time.time() * 1000)


