"""Push to MLflow what a study journaled while MLflow was unreachable.

    python -m dcl_core.study.sync OUTPUT_DIR [--name STUDY] [--tracking-uri URI]

Every study under ``OUTPUT_DIR/summary/`` with a ``pending_mlflow.jsonl`` (or only ``--name STUDY``) is replayed
against the tracking URI it ran with (from its ``study_options.json``; ``--tracking-uri`` overrides, e.g. when
the recorded one has its credentials redacted). Replaying is idempotent: runs are found by their trial id or the
summary tag before any is created, and the journal keeps only what MLflow did not take. Exit code 0 when
everything was pushed, 1 when some operations are left (MLflow still unreachable), 2 on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from dcl_core import cli
from dcl_core.cli import setup_logging
from dcl_core.config import ConfigError
from dcl_core.study.spec import check_name
from dcl_core.study.storage import OPTIONS_FILE, check_no_links, default_tracking_uri, study_entries, summary_dir


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dcl_core.study.sync", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_store_options(parser, "the studies' --output-dir", output_default=None)
    parser.add_argument("--name", default=None, help="only this study (default: every study with a journal)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    setup_logging(args.verbose)

    # Imports Ray and MLflow (seconds): not needed for --help or a bad argument.
    from dcl_core.study.tracking import JOURNAL_FILE, StudyTracker, preflight, redact_uri

    out = args.output_dir.expanduser().resolve()
    if args.name:
        try:
            check_name(args.name)  # never a journal (or a lock) outside the output folder: "../../x"
        except ConfigError as err:
            return cli.error(err)
        journals = [summary_dir(out, args.name) / JOURNAL_FILE]
    else:
        journals = sorted((out / "summary").glob(f"*/{JOURNAL_FILE}"))
    journals = [j for j in journals if j.is_file() and not j.is_symlink() and not j.parent.is_symlink()]
    if not journals:
        print(f"nothing to sync: no {JOURNAL_FILE} under {out / 'summary'}"
              + (f"/{args.name}" if args.name else ""))
        return 0
    code = 0
    for journal in journals:
        study_dir = journal.parent
        experiment = study_dir.name  # the folder names the study; the journal's own lines are not trusted for it
        try:
            check_no_links(out, study_entries(experiment))  # summary/ -> ~ would sync (and rewrite) a journal there
            uri = recorded_tracking_uri(study_dir, out, args.tracking_uri)
            preflight(uri)
        except ConfigError as err:
            code = cli.error(f"{study_dir.name}: {err}")
            continue
        tracker = StudyTracker(uri, experiment, artifact_root=out / "mlartifacts", journal_dir=study_dir)
        pushed = tracker.sync()
        left = tracker.pending()
        print(f"{study_dir.name}: {pushed} operations pushed to {redact_uri(uri)}, {left} left"
              + (f" ({tracker.last_error})" if left and tracker.last_error else ""))
        if left:
            code = max(code, 1)
    return code


if __name__ == "__main__":
    sys.exit(main())
