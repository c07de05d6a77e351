"""``python -m dcl_core.study sync OUTPUT_DIR``: what the studies journaled while MLflow was unreachable, pushed."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from dcl_core import cli_common
from dcl_core.cli_common import setup_logging
from dcl_core.config import ConfigError
from dcl_core.files import real_path
from dcl_core.study.cli.answer_command import reanalyze_folder
from dcl_core.study.plan.spec import check_name
from dcl_core.study.plan.storage import summary_dir

SYNC_DOC = """Push to MLflow what a study journaled while MLflow was unreachable.

    python -m dcl_core.study sync OUTPUT_DIR [--name STUDY] [--tracking-uri URI]

Every study under ``OUTPUT_DIR/summary/`` with a ``pending_mlflow.jsonl`` (or only ``--name STUDY``) is replayed
against ``--tracking-uri``, else the folder's own store (``OUTPUT_DIR/mlflow.db``). The tracking URI a study
recorded is never followed (whoever wrote the folder would choose where your credentials go): a study that logged to
a server names it, and is pushed there with ``--tracking-uri``. Replaying is idempotent: runs are found by their
trial id or the summary tag before any is created, and the journal keeps only what MLflow did not take. A study's
answer (the summary run's verdict, description, metrics, tables and plots) is never journaled, and a line writing
it is not replayed (whoever could write the folder could forge it): when the answer did not reach MLflow, sync
recomputes it from the study's results, as ``answer`` does. Exit code 0 when everything was pushed, 1 when some
operations are left (MLflow still unreachable) or MLflow refused some, 2 on bad input."""


def sync_main(argv: Sequence[str] | None = None) -> int:
    """``python -m dcl_core.study sync OUTPUT_DIR``: the journals replayed against MLflow."""
    parser = cli_common.ArgumentParser(prog="python -m dcl_core.study sync", description=SYNC_DOC,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
    cli_common.add_store_options(parser, "the studies' --output-dir", output_default=None)
    parser.add_argument("--name", default=None, help="only this study (default: every study with a journal)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    try:
        out = real_path(args.output_dir)
        if args.name:
            check_name(args.name)  # never a journal (or a lock) outside the output folder: "../../x"
    except ConfigError as err:
        return cli_common.error(err)
    # Imports MLflow (seconds): not needed for --help or a bad argument.
    from dcl_core.study.tracking.journal import JOURNAL_FILE
    from dcl_core.study.tracking.sync import journals, sync_journals

    found = journals(out, args.name)
    if not found:
        print(f"nothing to sync: no {JOURNAL_FILE} under {out / 'summary'}" + (f"/{args.name}" if args.name else ""))
        return 0
    code = 0
    for synced in sync_journals(out, found, args.tracking_uri):
        if synced.refused is not None:
            code = cli_common.error(f"{synced.study}: {synced.refused}")
            continue
        print(synced.line(), flush=True)
        if synced.left or synced.dropped:
            code = max(code, 1)
        if synced.summarize and not synced.left:  # the answer is never replayed: recomputed from the results
            print(f"{synced.study}: its answer, recomputed from its results and logged on its summary run:",
                  flush=True)
            try:
                code = max(code, reanalyze_folder(summary_dir(out, synced.study), out, args.tracking_uri, True))
            except ConfigError as err:
                code = cli_common.error(f"{synced.study}: the answer was not logged: {err}")
    return code
