"""``python -m dcl_core.study answer OUTPUT_DIR``: finished studies re-analysed from their stored results, each
rebuilt from the options it recorded (``study_options.json``'s ``command``) by its own study script."""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dcl_core import cli_common
from dcl_core.config import ConfigError
from dcl_core.files import disk_full, no_space, real_path
from dcl_core.study.analysis.mi_toy_answer import TOY
from dcl_core.study.cli.options import StudyRequest, args_from_record, args_of, build_parser
from dcl_core.study.cli.script import Script, run_request
from dcl_core.study.plan.record import check_signed
from dcl_core.study.plan.run_options import PROGRESS, QUIET
from dcl_core.study.plan.spec import check_name
from dcl_core.study.plan.storage import OPTIONS_FILE, script_origin, script_sha256

STUDIES_DIR = Path(__file__).resolve().parents[3] / "studies"  # the study scripts of this checkout
SCRIPT_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")


def _load_script(name: str, path: Path | None = None) -> Script:
    """The study script ``name`` as a :class:`Script`: ``studies/<name>.py`` of this checkout, or ``path``, a file
    the user named with ``--script`` (never a path read from the outputs)."""
    if not SCRIPT_NAME.fullmatch(name):
        raise ConfigError(f"the recorded study script {name!r} is not one of {STUDIES_DIR}/*.py")
    if path is None:
        path = STUDIES_DIR / f"{name}.py"
        if not path.is_file():
            raise ConfigError(f"the recorded study script {name!r} is not one of {STUDIES_DIR}/*.py")
    found = importlib.util.spec_from_file_location(f"_study_{name}", path)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    if not callable(getattr(module, "build_spec", None)):
        raise ConfigError(f"{path} is not a study script (it defines no build_spec)")
    return Script(module.__doc__ or "", name, module.build_spec,
                  tuple(getattr(module, "PRESETS", ("smoke", "cpu", "paper"))), path=path)


def _script_of(command: Mapping[str, Any], given: Path | None, output_dir: Path, study: str) -> Script:
    """The script that re-analyses a study whose record is ``command``: ``given`` (``--script``) where the user
    named one, else this checkout's ``studies/<name>.py`` for a study one of them made; for a study a copy made,
    ConfigError in one line saying how to name it (a path read from a folder someone else may have written is
    never run unasked)."""
    name, origin = command["script"], script_origin(command)
    if given is not None:  # the user's word: --name's study, or the studies whose record names this file
        script = _load_script(name, given.resolve())
        if command.get("script_sha256") not in (None, script_sha256(given)):
            print(f"note: {given} changed since the study ran; its recorded options are re-run through it as it is "
                  "now", file=sys.stderr, flush=True)
        return script
    if origin == f"studies/{name}.py":
        return _load_script(name)
    assert origin is not None
    if len(origin) > 4096 or not origin.isprintable():
        raise ConfigError(f"{OPTIONS_FILE}'s command.script_path is damaged: re-analyse the study with its script, "
                          f"`python -m dcl_core.study answer {output_dir} --name {study} --script FILE`")
    again = f"python -m dcl_core.study answer {output_dir} --name {study} --script {origin}"
    if not Path(origin).is_file():
        raise ConfigError(f"made by {origin}, not one of {STUDIES_DIR}/*.py, and that file is missing: restore it "
                          f"and run `{again}`")
    raise ConfigError(f"made by {origin}, not one of {STUDIES_DIR}/*.py: a script named in the outputs is not run "
                      f"unasked; re-analyse it with `{again}`")


def reanalyze_recorded(script: Script, record: Mapping[str, Any], output_dir: Path, tracking_uri: str | None,
                       quiet: bool) -> int:
    """Re-analyse a study from what its outputs recorded (``study_options.json``): the options that built its spec
    (its ``command``), and of the run options the one that changes the spec, ``asha``."""
    ns = build_parser(script.doc, script.name, script.presets).parse_args([])
    where = f"{output_dir}/summary/{script.name}/{OPTIONS_FILE}"
    args = args_from_record(record["command"], args_of(ns), where)
    if args.preset not in script.presets:
        raise ConfigError(f"the recorded preset {args.preset[:40]!r} is not one of {', '.join(script.presets)}")
    asha = record.get("asha", False)
    if not isinstance(asha, bool):
        raise ConfigError(f"{where}'s asha must be true or false: the file is damaged or not a study's")
    run = replace(args.run, output_dir=output_dir, tracking_uri=tracking_uri, asha=asha,
                  verbosity=QUIET if quiet else PROGRESS)
    return run_request(script, StudyRequest(replace(args, reanalyze=True, run=run)))


def reanalyze_folder(study_dir: Path, output_dir: Path, tracking_uri: str | None, quiet: bool,
                     given_script: Path | None = None) -> int:
    """One study of ``summary/``: rebuilt from its recorded command and re-analysed (the script's own output), by
    ``given_script`` where the user named one (``--script``)."""
    # MLflow (seconds): not for --help or bad input
    from dcl_core.study.execution.reanalysis import read_json, reanalyze_toy
    from dcl_core.study.tracking.sync import study_store

    store = study_store(study_dir, output_dir, tracking_uri)
    if (note := store.note()) is not None:
        print(f"note: {note}", file=sys.stderr, flush=True)
    if study_dir.name == TOY:
        print(reanalyze_toy(output_dir, store.uri))
        return 0
    options_file = study_dir / OPTIONS_FILE
    if not options_file.exists() and not options_file.is_symlink():  # anything else there: read_json says what
        raise ConfigError(f"{study_dir} has no {OPTIONS_FILE}: not a study's summary folder")
    recorded = read_json(options_file)
    check_signed(options_file, recorded)  # changed since the study signed it: one line, before a script is chosen
    command = recorded.get("command")
    if not isinstance(command, dict) or not isinstance(command.get("script"), str):
        raise ConfigError(f"{options_file} records no command (a study run before re-analysis was recorded): run "
                          f"`python studies/<script>.py <the options it ran with> --output-dir {output_dir} "
                          "--reanalyze`")
    script = _script_of(command, given_script, output_dir, study_dir.name)
    return reanalyze_recorded(script, recorded, output_dir, store.uri, quiet)


ANSWER_DOC = """Re-analyse finished studies without training: recompute the answer from the stored results rows and
print, write and log it exactly as the study does (``summary/<study>/table.txt``, the plots, the MLflow summary run).

    python -m dcl_core.study answer OUTPUT_DIR [--name STUDY] [--script FILE] [--tracking-uri URI] [-q]
    python studies/NAME.py <the options it ran with> --output-dir OUTPUT_DIR --reanalyze

The first form re-analyses every study in ``OUTPUT_DIR/summary/`` (or ``--name``): each study's
``study_options.json`` records the study script and the options that built its spec, from which the spec (and so
its questions, with today's statistics) is rebuilt; the EqCo MI toy is re-analysed from ``mi_toy.parquet``. A study
run before the options were recorded is re-analysed with the second form. A study made by a copy of a study
script (a file outside this checkout's ``studies/``, which it records) is re-analysed with that copy once named with
``--script FILE``; a file named only in the outputs is never run. A study that cannot be re-analysed is
named with one line and the others still are; exit code 0 when every study was re-analysed, else 2. The summary
run is logged to ``--tracking-uri``, else to the folder's own store (``OUTPUT_DIR/mlflow.db``): the tracking URI
a study recorded is named, never followed (a folder someone else wrote must not choose where your credentials go
or where you write).
"""


def answer_main(argv: Sequence[str] | None = None) -> int:
    """``python -m dcl_core.study answer OUTPUT_DIR``: every finished study there re-analysed."""
    parser = cli_common.ArgumentParser(prog="python -m dcl_core.study answer", description=ANSWER_DOC,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
    cli_common.add_store_options(parser, "the studies' --output-dir", output_default=None)
    parser.add_argument("--name", default=None, help="only this study (default: every study in OUTPUT_DIR)")
    parser.add_argument("--script", type=Path, default=None, metavar="FILE",
                        help="the study script a study was made by, where it is not one of this checkout's studies/ "
                             "(a copy with its own grid): used for the studies it made, or for --name")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the answers")
    args = parser.parse_args(argv)
    cli_common.setup_logging(quiet=args.quiet)
    try:
        output_dir = real_path(args.output_dir)
        if not (output_dir / "summary").is_dir():
            raise ConfigError(f"{output_dir} holds no finished study (no summary/ folder)")
        if args.name is not None:
            check_name(args.name)
        dirs = finished_studies(output_dir, args.name)
        if not dirs:
            raise ConfigError(f"no finished study{f' named {args.name}' if args.name else ''} in {output_dir}/summary")
        if args.script is not None:
            if args.script.suffix != ".py" or not args.script.is_file():
                raise ConfigError(f"--script {args.script}: not a study script (a .py file)")
            if args.name is None and not any(_for(args, d) for d in dirs):
                raise ConfigError(f"--script {args.script}: no study in {output_dir} was made by it; name the study "
                                  "it should re-analyse with --name")
        if args.tracking_uri:  # the store every answer logs to: refused in one line as a study refuses it
            from dcl_core.study.tracking import preflight  # MLflow (seconds): not for --help or bad input

            preflight(args.tracking_uri)
    except ConfigError as err:
        return cli_common.error(err)
    code = 0
    for i, d in enumerate(dirs):  # one study that cannot be re-analysed does not stop the others
        if len(dirs) > 1:
            print(f"{'' if i == 0 else chr(10)}=== {d.name}", flush=True)
        try:
            code = max(code, reanalyze_folder(d, output_dir, args.tracking_uri, args.quiet, _for(args, d)))
        except ConfigError as err:
            code = cli_common.error(f"{d.name}: {err}")
        except Exception as err:  # one line, and the other studies are still re-analysed
            if no_space(err):
                code = max(code, cli_common.error(f"{d.name}: {disk_full(output_dir)}", cli_common.EXIT_FAILED))
                continue
            logging.getLogger(__name__).debug("re-analysis of %s failed", d.name, exc_info=True)
            code = cli_common.error(f"{d.name}: could not be re-analysed ({type(err).__name__}: "
                             f"{str(err).strip().splitlines()[0][:200] if str(err).strip() else 'no message'})")
    return code


def _for(args: argparse.Namespace, study_dir: Path) -> Path | None:
    """The ``--script`` for the study in ``study_dir``: for ``--name``'s study, or one whose record names it."""
    if args.script is None or args.name is not None:
        return args.script
    from dcl_core.study.execution.reanalysis import read_json  # MLflow: not for --help

    with contextlib.suppress(ConfigError, OSError):
        origin = script_origin(read_json(study_dir / OPTIONS_FILE).get("command"))
        if origin is not None and Path(origin) == args.script.resolve():
            return args.script
    return None


def finished_studies(output_dir: Path, name: str | None = None, toy: bool = True) -> list[Path]:
    """The ``summary/<study>`` folders of the finished studies in ``output_dir`` (only ``name``'s when given): those
    holding a study's results, or with ``toy`` the MI toy's table."""
    from dcl_core.study.execution.reanalysis import RESULTS_FILE, TOY_FILE  # MLflow: not for --help

    summary = output_dir / "summary"
    dirs = sorted(d for d in summary.iterdir() if d.is_dir() and not d.is_symlink()
                  and (name is None or d.name == name)) if summary.is_dir() else []
    return [d for d in dirs if (d / RESULTS_FILE).is_file() or (toy and d.name == TOY and (d / TOY_FILE).is_file())]


def only_study(output_dir: Path) -> str:
    """The name of the one finished study in ``output_dir``; ConfigError when there is none or several."""
    names = [d.name for d in finished_studies(output_dir, toy=False)]
    if len(names) != 1:
        raise ConfigError(f"{output_dir} holds {'no finished study' if not names else 'studies ' + ', '.join(names)}"
                          + (": choose one with --name" if names else ""))
    return names[0]
