"""Re-analyse finished studies without training: recompute the answer from the stored results rows and print,
write and log it exactly as the study does (``summary/<study>/table.txt``, the plots, the MLflow summary run).

    python -m dcl_core.study.answer OUTPUT_DIR [--name STUDY] [--tracking-uri URI] [-q]
    python studies/NAME.py <the options it ran with> --output-dir OUTPUT_DIR --reanalyze

The first form re-analyses every study in ``OUTPUT_DIR/summary/`` (or ``--name``): each study's
``study_options.json`` records the study script and the options that built its spec, from which the spec (and
so its questions, with today's statistics) is rebuilt; the EqCo MI toy is re-analysed from ``mi_toy.parquet``. A
study run before the options were recorded is re-analysed with the second form. A study that cannot be re-analysed
is named with one line and the others still are; exit code 0 when every study was re-analysed, else 2.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
from pathlib import Path
from typing import Any

from dcl_core.config import ConfigError
from dcl_core.study.columns import COLUMNS
from dcl_core.study.spec import StudyOptions, StudySpec
from dcl_core.study.storage import OPTIONS_FILE, check_no_links, study_entries, summary_dir

RESULTS_FILE = "results.parquet"
TOY = "eqco_mi_toy"
STUDIES_DIR = Path(__file__).resolve().parents[2] / "studies"
SCRIPT = re.compile(r"[a-z][a-z0-9_]{0,63}")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path} is not a study's options file (not a JSON object)")
    return value


def read_rows(path: Path) -> list[dict[str, Any]]:
    """A study's results rows as the study summarized them: the table's columns, with each row's ``config`` (read
    by a search's report) rebuilt from the columns that show config keys."""
    from dcl_core.study.report import read_table

    if not path.is_file():
        raise ConfigError(f"nothing to re-analyse: {path} does not exist (has the study finished there?)")
    try:
        rows = read_table(path)
    except Exception as exc:  # pyarrow's errors for a file that is not Parquet
        raise ConfigError(f"{path} is not a results table: {str(exc).splitlines()[0]}") from None
    keyed = [c for c in COLUMNS if c.key is not None]
    for r in rows:
        r["config"] = {c.key: r.get(c.name) for c in keyed}
    return rows


def _check_same_study(spec: StudySpec, recorded: dict[str, Any], path: Path) -> None:
    """The rebuilt spec must be the one that ran (its base config but the data folder, its grids and search)."""
    from dcl_core.study.record import spec_fingerprint

    before, now = recorded.get("spec"), spec_fingerprint(spec)
    if not isinstance(before, dict):
        return
    for key, value in now["base"].items():
        old = before.get("base", {}).get(key, value)
        if key != "data.root" and old != value:
            raise ConfigError(f"--reanalyze must describe the study that ran in {path.parent}: {key} was {old!r}, "
                              f"now {value!r} (give the --preset/--set it ran with)")
    for part in ("grids", "search", "num_samples"):
        if part in before and before[part] != now[part]:
            raise ConfigError(f"--reanalyze must describe the study that ran in {path.parent}: its {part} differ "
                              "(give the --preset, --losses, --seeds and --search it ran with)")


def reanalyze(spec: StudySpec, options: StudyOptions) -> Any:
    """The study's answer recomputed from ``summary/<study>/results.parquet``: the same summary a finished study
    writes (:func:`dcl_core.study.results.summarize`), on its existing MLflow summary run. Holds the study's lock
    (not while the study runs)."""
    from dcl_core.study import mlflow_view
    from dcl_core.study.results import summarize
    from dcl_core.study.storage import study_lock
    from dcl_core.study.tracking import StudyTracker, git_commit

    options = options.resolved()
    assert options.tracking_uri is not None
    check_no_links(options.output_dir, study_entries(spec.name))
    out = summary_dir(options.output_dir, spec.name)
    if (out / OPTIONS_FILE).is_file():
        _check_same_study(spec, _read_json(out / OPTIONS_FILE), out / OPTIONS_FILE)
    rows = read_rows(out / RESULTS_FILE)
    with study_lock(options.output_dir, spec.name):
        tracker = StudyTracker(options.tracking_uri, spec.name, artifact_root=options.output_dir / "mlartifacts",
                               tags={"study": spec.name, "git_commit": git_commit()}, journal_dir=out,
                               description=spec.description,
                               experiment_tags=dict([mlflow_view.compare_view(spec).tag()])).open()
        return summarize(spec, rows, options.output_dir, tracker, reanalysis=True)


def reanalyze_toy(output_dir: Path, tracking_uri: str) -> str:
    """The MI toy's answer recomputed from ``summary/eqco_mi_toy/mi_toy.parquet`` (:func:`dcl_core.mi_toy.toy_answer`),
    written to its ``table.txt`` and logged on its summary run; returns the text."""
    from dcl_core.mi_toy import toy_answer
    from dcl_core.study.storage import atomic_write_text, study_lock
    from dcl_core.study.tracking import StudyTracker, git_commit

    check_no_links(output_dir, study_entries(TOY))
    out = summary_dir(output_dir, TOY)
    rows = read_rows(out / "mi_toy.parquet")
    if not rows or not {"true_mi", "k", "method", "mi_estimate"} <= set(rows[0]):
        raise ConfigError(f"{out / 'mi_toy.parquet'} is not the MI toy's table")
    ks = tuple(sorted({int(r["k"]) for r in rows}))
    table, metrics, tags = toy_answer(rows, ks)
    with study_lock(output_dir, TOY):
        atomic_write_text(out / "table.txt", table + "\n")
        tracker = StudyTracker(tracking_uri, TOY, artifact_root=output_dir / "mlartifacts",
                               tags={"study": TOY, "git_commit": git_commit()}, journal_dir=out).open()
        tracker.log_summary(metrics, [out / "table.txt"], tags=tags)
    return table


def _import_script(name: str) -> Any:
    """``studies/<name>.py`` of this checkout as a module (never a path read from the outputs)."""
    path = STUDIES_DIR / f"{name}.py"
    if not SCRIPT.fullmatch(name) or not path.is_file():
        raise ConfigError(f"the recorded study script {name!r} is not one of {STUDIES_DIR}/*.py")
    spec = importlib.util.spec_from_file_location(f"_study_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def reanalyze_folder(study_dir: Path, output_dir: Path, tracking_uri: str | None, quiet: bool) -> int:
    """One study of ``summary/``: rebuilt from its recorded command and re-analysed (the script's own output)."""
    from dcl_core.study.sync import recorded_tracking_uri
    from dcl_core.study_cli import reanalyze_recorded

    if study_dir.name == TOY:
        print(reanalyze_toy(output_dir, recorded_tracking_uri(study_dir, output_dir, tracking_uri)))
        return 0
    options_file = study_dir / OPTIONS_FILE
    if not options_file.is_file():
        raise ConfigError(f"{study_dir} has no {OPTIONS_FILE}: not a study's summary folder")
    recorded = _read_json(options_file)
    command = recorded.get("command")
    if not isinstance(command, dict) or not isinstance(command.get("script"), str):
        raise ConfigError(f"{options_file} records no command (a study run before re-analysis was recorded): run "
                          f"`python studies/<script>.py <the options it ran with> --output-dir {output_dir} "
                          "--reanalyze`")
    module = _import_script(command["script"])
    presets = tuple(getattr(module, "PRESETS", ("smoke", "cpu", "paper")))
    return reanalyze_recorded(module.__doc__ or "", command["script"], module.build_spec, presets, command,
                              output_dir, recorded_tracking_uri(study_dir, output_dir, tracking_uri), quiet)


def main(argv: list[str] | None = None) -> int:
    from dcl_core import cli

    parser = argparse.ArgumentParser(prog="python -m dcl_core.study.answer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_store_options(parser, "the studies' --output-dir", output_default=None)
    parser.add_argument("--name", default=None, help="only this study (default: every study in OUTPUT_DIR)")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only the answers")
    args = parser.parse_args(argv)
    cli.setup_logging(quiet=args.quiet)
    try:
        output_dir = args.output_dir.expanduser().resolve()
        if not (output_dir / "summary").is_dir():
            raise ConfigError(f"{output_dir} holds no finished study (no summary/ folder)")
        if args.name is not None:
            from dcl_core.study.spec import check_name

            check_name(args.name)
        dirs = sorted(d for d in (output_dir / "summary").iterdir()
                      if d.is_dir() and not d.is_symlink() and (args.name is None or d.name == args.name))
        dirs = [d for d in dirs if (d / RESULTS_FILE).is_file() or (d.name == TOY and (d / "mi_toy.parquet").is_file())]
        if not dirs:
            raise ConfigError(f"no finished study{f' named {args.name}' if args.name else ''} in {output_dir}/summary")
    except ConfigError as err:
        return cli.error(err)
    code = 0
    for i, d in enumerate(dirs):  # one study that cannot be re-analysed does not stop the others
        if len(dirs) > 1:
            print(f"{'' if i == 0 else chr(10)}=== {d.name}", flush=True)
        try:
            code = max(code, reanalyze_folder(d, output_dir, args.tracking_uri, args.quiet))
        except ConfigError as err:
            code = cli.error(f"{d.name}: {err}")
    return code

