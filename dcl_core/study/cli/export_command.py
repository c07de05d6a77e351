"""``python -m dcl_core.study export OUTPUT_DIR``: a finished study's trained encoder for another codebase."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from dcl_core import cli_common
from dcl_core.cli_common import setup_logging
from dcl_core.config import ConfigError
from dcl_core.files import real_path
from dcl_core.study.cli.answer_command import only_study
from dcl_core.study.plan.spec import check_name
from dcl_core.study.plan.storage import default_tracking_uri
from dcl_core.training.backbone_export import weights_path

EXPORT_DOC = """Export a finished study's trained encoder for another codebase: one trial's backbone as a plain state
dict that torchvision's own ResNet-18/50 loads (width 1), with a JSON of what it is.

    python -m dcl_core.study export OUTPUT_DIR --trial NAME [-o FILE] [--mlflow]
    python -m dcl_core.study export OUTPUT_DIR --best [SERIES] [-o FILE] [--mlflow]

``--trial`` takes a trial's name as the study printed it, as its MLflow run is named and as its folder in
``OUTPUT_DIR/ray_results`` is (``dcl_s0_t0.1_3aef0_00000``), or its Tune id (``3aef0_00000``); ``--best`` the
finished trial with the highest final kNN top-1 (of one series, e.g. ``--best dcl``). The trial's last checkpoint
is read from the study's Tune storage (``OUTPUT_DIR/ray_results``, or ``--storage`` where the study ran with
another local one). ``--mlflow`` also logs the two files into ``backbone/`` of the trial's MLflow run
(``--tracking-uri``, else the folder's own store). What the files hold and how to load them:
``dcl_core.training.backbone_export``. Exit code 0, or 2 with one line on bad input.
"""


def export_main(argv: Sequence[str] | None = None) -> int:
    """``python -m dcl_core.study export OUTPUT_DIR (--trial NAME | --best [SERIES])``."""
    parser = cli_common.ArgumentParser(prog="python -m dcl_core.study export", description=EXPORT_DOC,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
    cli_common.add_store_options(parser, "the study's --output-dir", output_default=None)
    parser.add_argument("--name", default=None, help="the study (default: the only one in OUTPUT_DIR)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--trial", default=None, metavar="NAME", help="the trial's name or Tune id")
    which.add_argument("--best", nargs="?", const="", default=None, metavar="SERIES",
                       help="the finished trial with the highest final kNN top-1 (of SERIES, e.g. dcl)")
    parser.add_argument("-o", "--out", default=None,
                        help="the weights file (default: TRIAL_NAME.pt here); its description goes beside it as .json")
    parser.add_argument("--storage", default=None,
                        help="the study's Tune storage, a local folder (default: OUTPUT_DIR/ray_results)")
    parser.add_argument("--mlflow", action="store_true", help="also log the files to the trial's MLflow run")
    args = parser.parse_args(argv)
    setup_logging()

    def body() -> int:
        given_out = weights_path(args.out) if args.out is not None else None  # before a trial is chosen or read
        output_dir = real_path(args.output_dir)
        study = args.name if args.name is not None else only_study(output_dir)
        check_name(study)
        if args.storage is not None and "://" in args.storage:  # Path() would read s3://b/x as the folder s3:/b/x
            raise ConfigError(f"--storage {args.storage}: export reads the study's Tune storage from a local folder; "
                              "copy the trial's folder from there into one (or mount it) and pass that")
        storage = real_path(args.storage or output_dir / "ray_results")
        uri = args.tracking_uri or default_tracking_uri(output_dir)
        if args.mlflow:
            from dcl_core.study.tracking import check_store_in_folder, preflight  # MLflow: not for --help

            preflight(uri)
            check_store_in_folder(uri, output_dir)  # the folder's own store, named or not, writes only inside it
        from dcl_core.study.execution.trial_choice import choose  # pyarrow: not for --help
        from dcl_core.training.backbone_export import describe, export  # torch and the models (seconds): not for --help

        chosen = choose(output_dir, study, storage, args.trial, args.best)
        out = given_out if given_out is not None else Path(f"{chosen.name}.pt")
        meta = export(chosen.checkpoint, out)
        print(cli_common.one_line(f"{out}: trial {chosen.name} of {study}: {describe(meta)}; described in "
                                  f"{out.with_suffix('.json')}"))  # a path's escapes never reach the terminal
        if args.mlflow:
            from dcl_core.study.tracking.mlflow_runs import log_trial_files  # MLflow: not for --help

            run_id = log_trial_files(uri, study, chosen.trial_id, [out, out.with_suffix(".json")], "backbone")
            print(f"MLflow: logged to backbone/ of run {run_id} ({chosen.name})")
        return 0

    return cli_common.run_command(body)
