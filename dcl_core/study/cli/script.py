"""A study script's command line (``studies/*.py`` stay thin: a question, presets and a spec builder): parse
(:mod:`.options`), prepare (:func:`~dcl_core.study.plan.study_plan.prepare_plan`: every check, exit 2 and one line on
bad input, before Ray starts), then run it (:func:`~dcl_core.study.execution.rounds.run_plan`) or, with
``--dry-run``, print the trials, their totals and an estimated cost (:mod:`dcl_core.study.plan.cost`), or with
``--reanalyze`` recompute a finished run's answer from its stored results.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from dcl_core import cli_common
from dcl_core.cli_common import setup_logging
from dcl_core.config import InputError, RunFailedError
from dcl_core.files import disk_full, no_space
from dcl_core.study.analysis.columns import ERROR, STATUS, Status
from dcl_core.study.cli.options import StudyArgs, StudyRequest, build_parser, request_of
from dcl_core.study.execution import stop_signals
from dcl_core.study.plan.script import Script, SpecBuilder, defined_in  # re-exported: the scripts' own vocabulary
from dcl_core.study.plan.spec import StudyInterruptedError
from dcl_core.study.plan.storage import OPTIONS_FILE, default_tracking_uri, redact_args, study_began
from dcl_core.study.plan.study_plan import StudyPlan, prepare_plan
from dcl_core.study.plan.study_presets import PresetRun, StudyPreset

__all__ = ["Script", "SpecBuilder", "main", "preset_run", "resume_command", "run_request"]


def preset_run(args: StudyArgs, presets: Mapping[str, StudyPreset], *, fixed_losses: str = "",
               only_search: tuple[str, str] | None = None) -> PresetRun:
    """The preset ``--preset`` names, resolved against this command line (:meth:`StudyPreset.resolve`, which also
    refuses ``--losses`` with ``fixed_losses``'s reason and a search mode other than ``only_search``'s)."""
    return presets[args.preset].resolve(search=args.search, losses=args.losses, seeds=args.seeds,
                                        samples=args.num_samples, data_root=args.data_root, overrides=args.set,
                                        fixed_losses=fixed_losses, only_search=only_search)


def main(doc: str, default_name: str, build_spec: SpecBuilder, argv: list[str] | None = None,
         defaults: dict[str, Any] | None = None, presets: Iterable[str] = ("smoke", "cpu", "paper"),
         extra: tuple[str, ...] = ()) -> int:
    """A study script's command line. Parse, validate (exit 2 on bad input), run the study, print the table, plot
    path and experiment; with ``--dry-run``, print what it would run and cost instead (no Ray, nothing written);
    with ``--reanalyze``, recompute a finished run's answer from its stored results.

    ``defaults`` changes option defaults for one study (e.g. ``{"search": "optuna"}``); ``presets`` are the
    study's presets (their names: the script's ``PRESETS`` mapping itself); ``extra`` the options only this study
    takes (e.g. the generic sweep's ``key``)."""
    script = Script(doc, default_name, build_spec, tuple(presets), defaults or {}, extra, defined_in(build_spec))
    parser = build_parser(doc, default_name, script.presets, extra)
    parser.set_defaults(**script.defaults)
    ns = parser.parse_args(argv)
    setup_logging(ns.verbose, quiet=ns.quiet)
    try:
        request = request_of(ns, argv)
    except InputError as err:
        return cli_common.error(err, cli_common.EXIT_BAD_INPUT)
    return run_request(script, request)


def run_request(script: Script, request: StudyRequest) -> int:
    """Everything :func:`main` does after parsing: Ctrl-C and SIGTERM stop it at any moment
    (:mod:`~dcl_core.study.execution.stop_signals`), one exit path."""
    with stop_signals.stop_signals() as stop:
        stop.last_words = lambda: _interrupted(request, KeyboardInterrupt(), terminated=stop.terminated)
        try:
            outcome = _execute(script, request)
        except InputError as err:  # ConfigError, DataError
            return cli_common.error(err, cli_common.EXIT_BAD_INPUT)
        except (StudyInterruptedError, KeyboardInterrupt) as err:  # Ctrl-C; a second Ctrl-C skips Tune's last save
            stop.caught()
            return _interrupted(request, err, terminated=stop.terminated)
        except RunFailedError as err:  # a full disk (DiskFullError): one line, exit 1
            return cli_common.error(err, cli_common.EXIT_FAILED)
        except Exception as err:
            if not no_space(err):
                raise
            where = request.options.output_dir.expanduser().resolve()
            return cli_common.error(disk_full(where, resume=not request.args.reanalyze and _began(request)),
                                    cli_common.EXIT_FAILED)
    if outcome is None:  # a dry run or a re-analysis: printed already
        return 0
    from dcl_core.study.execution.results import summary_lines  # imported with the study already

    print(outcome.answer if request.quiet else "\n".join(summary_lines(outcome)))
    failed = [r for r in outcome.rows if r[STATUS] != Status.OK]
    if outcome.rows and len(failed) == len(outcome.rows):
        return cli_common.error(f"every trial failed; the first: {failed[0].get(ERROR) or failed[0][STATUS]}",
                                cli_common.EXIT_FAILED)
    return 0


def _execute(script: Script, request: StudyRequest) -> Any:
    """The study the request asks for, prepared once (:func:`~dcl_core.study.plan.study_plan.prepare_plan`): a dry
    run or a re-analysis (printed; returns None), else the study's outcome (after every round with
    ``--until-resolved``)."""
    plan = prepare_plan(script, request)
    if plan.args.dry_run:
        print("\n".join(plan.dry_run))
        return None
    if plan.args.reanalyze:
        _reanalyze(plan, request.quiet)
        return None
    from dcl_core.study.execution.rounds import run_plan  # Ray, Optuna, MLflow (seconds): bad input refused before

    return run_plan(plan, say=(lambda line: None) if request.quiet else print)


def _reanalyze(plan: StudyPlan, quiet: bool) -> None:
    """The answer of the stored results (no data, no GPU, no Ray), written as the study's; another question than
    the recorded one is printed only."""
    # MLflow and Optuna (seconds): not for --help or bad input
    from dcl_core.study.execution.reanalysis import ask, reanalyze
    from dcl_core.study.execution.results import summary_lines  # with the above

    spec, options = plan.spec, plan.options
    if plan.another_question:
        print(ask(spec, options))
        print(f"\n(another question than the one {spec.name} recorded, asked of its stored results and written "
              "nowhere: its table.txt and MLflow summary run keep the recorded question's answer, which "
              f"`python -m dcl_core.study answer {shlex.quote(str(options.output_dir))} --name {spec.name}` "
              "prints)")
        return
    own = default_tracking_uri(options.resolved().output_dir)  # the folder's store: checked where it is opened
    if options.tracking_uri and options.tracking_uri != own:  # another, given: refused in one line as a study does
        from dcl_core.study.tracking import preflight  # with the above

        preflight(options.tracking_uri)
    outcome = reanalyze(spec, options)
    print(outcome.answer if quiet else "\n".join(summary_lines(outcome)))


def _interrupted(request: StudyRequest, err: BaseException, terminated: bool) -> int:
    """Ctrl-C or SIGTERM: what was kept and the command that continues the study (nothing, before it began)."""
    code = cli_common.EXIT_TERMINATED if terminated else cli_common.EXIT_INTERRUPTED
    why = "; ".join((["SIGTERM"] if terminated else []) + ([str(err)] if str(err) else []))
    why = f" ({why})" if why else ""
    if not _began(request):  # stopped before its Tune experiment began: there is nothing to resume
        recorded = (request.options.output_dir.expanduser() / "summary" / request.args.name / OPTIONS_FILE).exists()
        done = "nothing was run" if recorded else "nothing was run or written"
        sys.stderr.write(f"interrupted{why} before the study started: {done}, so there is nothing to resume; run the "
                         "same command again\n")
        return code
    line = resume_command(None if request.argv is None else list(request.argv))
    hint = ("\n  (credentials are shown as ***: give your --tracking-uri again, or set "
            "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD)" if "***" in line else "")
    sys.stderr.write(f"interrupted{why}: finished trials and checkpoints are kept, nothing was summarized. "
                     f"Continue with:\n  {line}{hint}\n")
    return code


def _began(request: StudyRequest) -> bool:
    """Whether the study ran far enough for ``--resume`` to continue it: it recorded its options and its Tune
    experiment exists (a stop while its Ray started, after the options were written, left nothing to resume)."""
    options = request.options.resolved()
    assert options.storage is not None
    return ((options.output_dir / "summary" / request.args.name / OPTIONS_FILE).exists()
            and study_began(options.storage, request.args.name))


def resume_command(argv: list[str] | None) -> str:
    """The command line that continues this study: the same options, ``--resume`` instead of ``--overwrite``."""
    args = [a for a in (sys.argv[1:] if argv is None else argv) if a not in ("--overwrite", "--resume")]
    return " ".join(shlex.quote(a) for a in redact_args([sys.executable, sys.argv[0], *args, "--resume"]))
