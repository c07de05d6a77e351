"""A study script's command line (``studies/*.py`` stay thin: a question, presets and a spec builder): parse
(:mod:`.options`), validate (exit 2 and one line on bad input, before Ray starts), run the study or, with
``--dry-run``, print the trials, their totals and an estimated cost (:mod:`dcl_core.study.plan.cost`), or with
``--reanalyze`` recompute a finished run's answer from its stored results.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from dcl_core import cli
from dcl_core.cli import setup_logging
from dcl_core.config import (
    ConfigError,
    InputError,
    RunFailedError,
    parse_overrides,
)
from dcl_core.files import disk_full, no_space
from dcl_core.study.analysis.columns import ERROR, STATUS, Status
from dcl_core.study.cli.options import StudyArgs, StudyRequest, args_from_record, build_parser, request_of
from dcl_core.study.execution import rounds, stop_signals
from dcl_core.study.plan.checks import check_set_not_swept, trial_data_root
from dcl_core.study.plan.dry_run import dry_run_lines
from dcl_core.study.plan.prepared import prepare
from dcl_core.study.plan.questions import with_own_question
from dcl_core.study.plan.record import check_not_moved, recorded_command, recorded_looks, recorded_round_seeds
from dcl_core.study.plan.spec import (
    VERBOSE,
    StudyInterruptedError,
    StudyOptions,
    StudySpec,
    grid_seeds,
    tune_experiments,
    validate_spec,
    with_asha,
    with_base,
    with_effects_of_interest,
)
from dcl_core.study.plan.storage import (
    OPTIONS_FILE,
    check_output_dir,
    redact_args,
    storage_exists,
    storage_join,
    study_began,
    summary_dir,
)
from dcl_core.study.plan.study_presets import PresetRun, StudyPreset


class SpecBuilder(Protocol):
    """Builds a study's :class:`StudySpec` from its parsed :class:`StudyArgs` (each study's ``build_spec``)."""

    def __call__(self, args: StudyArgs, /) -> StudySpec:
        """The spec of the study these arguments ask for."""


@dataclass(frozen=True)
class Script:
    """A study script: its question (the docstring), its name, its presets and its spec builder."""

    doc: str
    name: str
    build_spec: SpecBuilder
    presets: tuple[str, ...] = ("smoke", "cpu", "paper")
    defaults: Mapping[str, Any] = field(default_factory=dict)
    extra: tuple[str, ...] = ()  # the options only this script takes (StudyArgs fields declared ``only``)
    path: Path | None = None  # the file that defines it (recorded, so that `answer` re-analyses with the same)

    def build(self, args: StudyArgs, data_root: str | None = None) -> StudySpec:
        """The spec ``args`` describe, validated: the script's spec with its question as description, the
        recorded or planned sequential design and, when given, the data root the trials read."""
        spec = self.build_spec(args)
        if not spec.description:  # the docstring's first paragraph: the question and the paper's table
            spec = replace(spec, description=" ".join(self.doc.strip().split("\n\n")[0].split()))
        design = rounds.from_record(args.design)
        rounds.check_within(design, len(grid_seeds(spec) or ()) or None)
        spec = with_own_question(spec, args.compare, args.statistic, args.at, args.claim)
        spec = with_effects_of_interest(replace(spec, design=design), args.effect_of_interest)
        validate_spec(spec)
        check_set_not_swept(spec, parse_overrides(list(args.set)))
        return spec if data_root is None else with_base(spec, {"data.root": data_root})


def preset_run(args: StudyArgs, presets: Mapping[str, StudyPreset], *, fixed_losses: str = "",
               only_search: tuple[str, str] | None = None) -> PresetRun:
    """The preset ``--preset`` names, resolved against this command line (:meth:`StudyPreset.resolve`, which also
    refuses ``--losses`` with ``fixed_losses``'s reason and a search mode other than ``only_search``'s)."""
    return presets[args.preset].resolve(search=args.search, losses=args.losses, seeds=args.seeds,
                                        samples=args.num_samples, data_root=args.data_root, overrides=args.set,
                                        fixed_losses=fixed_losses, only_search=only_search)


def main(doc: str, default_name: str, build_spec: SpecBuilder, argv: list[str] | None = None,
         defaults: dict[str, Any] | None = None, presets: tuple[str, ...] = ("smoke", "cpu", "paper"),
         extra: tuple[str, ...] = ()) -> int:
    """A study script's command line. Parse, validate (exit 2 on bad input), run the study, print the table, plot
    path and experiment; with ``--dry-run``, print what it would run and cost instead (no Ray, nothing written);
    with ``--reanalyze``, recompute a finished run's answer from its stored results.

    ``defaults`` changes option defaults for one study (e.g. ``{"search": "optuna"}``); ``presets`` are the
    study's preset names; ``extra`` the options only this study takes (e.g. the generic sweep's ``key``)."""
    script = Script(doc, default_name, build_spec, presets, defaults or {}, extra, _defined_in(build_spec))
    parser = build_parser(doc, default_name, presets, extra)
    parser.set_defaults(**script.defaults)
    ns = parser.parse_args(argv)
    setup_logging(ns.verbose, quiet=ns.quiet)
    try:
        request = request_of(ns, argv)
    except InputError as err:
        return cli.error(err, cli.EXIT_BAD_INPUT)
    return run_request(script, request)


def run_request(script: Script, request: StudyRequest) -> int:
    """Everything :func:`main` does after parsing: Ctrl-C and SIGTERM stop it at any moment
    (:mod:`~dcl_core.study.execution.stop_signals`), one exit path."""
    with stop_signals.stop_signals() as stop:
        stop.last_words = lambda: _interrupted(request, KeyboardInterrupt(), terminated=stop.terminated)
        try:
            outcome = _execute(script, request)
        except InputError as err:  # ConfigError, DataError
            return cli.error(err, cli.EXIT_BAD_INPUT)
        except (StudyInterruptedError, KeyboardInterrupt) as err:  # Ctrl-C; a second Ctrl-C skips Tune's last save
            stop.caught()
            return _interrupted(request, err, terminated=stop.terminated)
        except RunFailedError as err:  # a full disk (DiskFullError): one line, exit 1
            return cli.error(err, cli.EXIT_FAILED)
        except Exception as err:
            if not no_space(err):
                raise
            where = request.options.output_dir.expanduser().resolve()
            return cli.error(disk_full(where, resume=not request.args.reanalyze and _began(request)), cli.EXIT_FAILED)
    if outcome is None:  # a dry run or a re-analysis: printed already
        return 0
    from dcl_core.study.execution.results import summary_lines  # imported with the study already

    print(outcome.answer if request.quiet else "\n".join(summary_lines(outcome)))
    failed = [r for r in outcome.rows if r[STATUS] != Status.OK]
    if outcome.rows and len(failed) == len(outcome.rows):
        return cli.error(f"every trial failed; the first: {failed[0].get(ERROR) or failed[0][STATUS]}", cli.EXIT_FAILED)
    return 0


def _continued(request: StudyRequest) -> StudyRequest:
    """A ``--resume`` or ``--reanalyze`` continues with every seed the study has, under its recorded design."""
    a, o = request.args, request.options
    if not (o.resume or a.reanalyze):
        return request
    out = o.output_dir.expanduser().resolve()
    recorded = recorded_command(out, a.name)
    where = str(summary_dir(out, a.name) / OPTIONS_FILE)
    checked = args_from_record({k: recorded[k] for k in ("seeds", "design") if k in recorded}, StudyArgs(), where)
    has = checked.seeds
    ran = recorded_round_seeds(out, a.name)
    if has is not None and ran is not None and has != ran:
        raise ConfigError(f"{where}'s command.seeds ({has}) disagrees with the {ran} seed(s) per cell its trials "
                          "were started with (seed_rounds): the file is damaged; --overwrite starts the study afresh")
    # --until-resolved's resume line repeats its first --seeds; the rounds since have added more
    more = a.until_resolved and has is not None and a.seeds is not None and has > a.seeds
    seeds = has if a.seeds is None or more else a.seeds
    return replace(request, args=replace(a, seeds=seeds, design=recorded.get("design")))


QUESTION_OPTIONS = ("compare", "statistic", "at", "claim", "effect_of_interest")  # what asks a study's question


def another_question(args: StudyArgs, recorded: Mapping[str, Any]) -> bool:
    """Whether ``args`` ask a question other than the one a study's ``recorded`` command asked (a record without
    a command, or from before questions were recorded, asks the study's own)."""
    if not recorded:
        return False
    given = args.record("")
    return any((given.get(k) or None) != (recorded.get(k) or None) for k in QUESTION_OPTIONS)


def _defined_in(build_spec: SpecBuilder) -> Path | None:
    """The file of the module that defines ``build_spec``: the study script that called :func:`main`."""
    module = sys.modules.get(getattr(build_spec, "__module__", ""))
    file = getattr(module, "__file__", None)
    return Path(file).resolve() if isinstance(file, str) and Path(file).is_file() else None


def _with_command(options: StudyOptions, script: Script, args: StudyArgs) -> StudyOptions:
    return replace(options, command=args.record(script.name, script.path))


def _execute(script: Script, request: StudyRequest) -> Any:
    """The study the request asks for: a dry run or a re-analysis (printed; returns None), else the study's
    outcome (after every round with ``--until-resolved``)."""
    request.check()
    request = _continued(request)
    args, spec = _with_download(script, request.args, script.build(request.args))
    options = _with_command(request.options, script, args)
    if args.reanalyze:  # no data, no GPU, no Ray: the stored results only
        # MLflow and Optuna (seconds): not for --help or bad input
        from dcl_core.study.execution.reanalysis import ask, reanalyze
        from dcl_core.study.execution.results import summary_lines

        recorded = recorded_command(options.output_dir.expanduser().resolve(), spec.name)
        if another_question(args, recorded):
            print(ask(spec, options))
            print(f"\n(another question than the one {spec.name} recorded, asked of its stored results and written "
                  "nowhere: its table.txt and MLflow summary run keep the recorded question's answer, which "
                  f"`python -m dcl_core.study answer {shlex.quote(str(options.output_dir))} --name {spec.name}` "
                  "prints)")
            return None
        outcome = reanalyze(spec, options)
        print(outcome.answer if request.quiet else "\n".join(summary_lines(outcome)))
        return None
    root, local_problems = trial_data_root(spec, options, args.dry_run)
    data_root = str(Path(root).expanduser().resolve()) if root is not None else None
    if data_root is not None:
        spec = with_base(spec, {"data.root": data_root})
    wall_seconds_at: Callable[[int], float | None] = lambda n: None  # noqa: E731
    if args.until_resolved:
        design, wall_seconds_at = _plan_rounds(script, request, spec, options, data_root)
        args = replace(args, design=rounds.to_record(design))
        options = _with_command(options, script, args)
        spec = replace(spec, design=design)
    if args.dry_run:
        _print_dry_run(spec, options, args, local_problems, wall_seconds_at)
        return None
    return _run(script, request.quiet, args, spec, options, data_root)


def _with_download(script: Script, args: StudyArgs, spec: StudySpec) -> tuple[StudyArgs, StudySpec]:
    """With ``--download`` (not re-analysing): the torchvision release, fetched once here (trials only read it), is
    then the study's data root, as if given with --data-root (so the same command line resumes it). A dry run
    names it, fetching nothing."""
    if not args.download or args.reanalyze:
        return args, spec
    data = spec.base.data
    from dcl_core.data import fetch_dataset, resolve_data_root  # torchvision (seconds): not for --help

    fetched = resolve_data_root(data.dataset, args.data_root, download=True) if args.dry_run else \
        fetch_dataset(data.dataset, args.data_root)
    args = replace(args, data_root=str(fetched))
    spec = script.build(args)
    if args.dry_run:  # its pre-flight: the data a real run fetches first
        spec = with_base(spec, {"data.download": True})
    return args, spec


def _print_dry_run(spec: StudySpec, options: StudyOptions, args: StudyArgs, local_problems: Any,
                   wall_seconds_at: Callable[[int], float | None]) -> None:
    """What the study would run and cost: no Ray, nothing written."""
    spec = with_asha(spec, options.asha)
    check_output_dir(options.resolved().output_dir)  # checked only: nothing is created
    lines = dry_run_lines(spec, options, args.preset, local_problems)
    lines += _existing_study_lines(spec, options)
    if args.until_resolved:
        assert spec.design is not None
        lines += rounds.dry_run_lines(spec.design, args.max_minutes, wall_seconds_at)
    print("\n".join(lines))


def _run(script: Script, quiet: bool, args: StudyArgs, spec: StudySpec, options: StudyOptions,
         data_root: str | None) -> Any:
    """The study itself, after its last checks (every round with ``--until-resolved``)."""
    study = prepare(spec, options)
    if options.resume:  # a moved or copied folder: one line saying what works here, before Ray's imports
        check_not_moved(study.options.output_dir, spec.name)
    # Ray, Optuna and MLflow take seconds to import: bad input is refused before.
    from dcl_core.study.execution import ray_env

    if not (options.address or os.environ.get("RAY_ADDRESS")):  # a local Ray: ask for its token mode
        ray_env.request_token_auth()
    else:  # a cluster: send the token at hand, which it may require
        ray_env.request_token_auth_to_attach()
    if options.verbosity < VERBOSE:
        ray_env.quiet_slow_loop_warnings()
    from dcl_core.study.execution.trial_failures import quiet_ray_lines  # with Ray, as above
    from dcl_core.study.execution.tuning import end_ray, run_study  # Ray, Optuna, MLflow: as above
    from dcl_core.study.tracking import check_store_in_folder, preflight

    if options.tracking_uri:  # a bad or unreachable MLflow store: one line now, not minutes after Ray starts
        preflight(options.tracking_uri)
    # a copied or moved folder's store would write to the original's folders
    check_store_in_folder(study.tracking_uri, study.options.output_dir)
    # Ray's own lines stay off the console (not with -v) from the first round to the end of Ray, which comes before
    # the answer is printed: nothing Ray forwards can follow the verdict
    begun = time.monotonic()
    with quiet_ray_lines(options.verbosity < VERBOSE):
        outcome = _rounds(script, quiet, args, spec, options, data_root, run_study(study), begun)
        end_ray(options.verbosity)
    return outcome


def _rounds(script: Script, quiet: bool, args: StudyArgs, spec: StudySpec, options: StudyOptions,
            data_root: str | None, outcome: Any, begun: float) -> Any:
    """With ``--until-resolved``, the rounds after the first (whose ``outcome`` is given, begun at ``begun`` on the
    monotonic clock), each adding seeds."""
    if not args.until_resolved:
        return outcome
    assert spec.design is not None
    from dcl_core.study.execution.tuning import run_study  # imported with the study already

    def next_round(n: int) -> Any:  # the study at n seeds per cell: a resume that adds the new seeds
        more = replace(args, seeds=n)
        return run_study(prepare(script.build(more, data_root),
                                 replace(_with_command(options, script, more), resume=True, overwrite=False)))

    outcome, why = rounds.until_resolved(outcome, spec.design, len(grid_seeds(spec) or ()),
                                         time.monotonic() - begun, args.max_minutes, next_round,
                                         say=(lambda line: None) if quiet else print)
    if not quiet:
        print(why, end="\n\n")
    return outcome


def _existing_study_lines(spec: StudySpec, options: StudyOptions) -> list[str]:
    """A dry run's note that the study already has output where the real run would write (which refuses it
    without --resume or --overwrite)."""
    storage = options.resolved().storage
    existing = [u for u in (storage_join(str(storage), e.name) for e in tune_experiments(spec)) if storage_exists(u)]
    if not existing or options.resume or options.overwrite:
        return []
    return ["", f"note: study output exists at {existing[0]}: this command would be refused; add --resume to "
                "continue it (with a larger --seeds: only its new seeds run) or --overwrite to replace it"]


def _plan_rounds(script: Script, request: StudyRequest, spec: StudySpec, options: StudyOptions,
                 data_root: str | None) -> tuple[Any, Callable[[int], float | None]]:
    """The ``--until-resolved`` design, fixed before the first look, and the estimated wall-clock seconds of the
    study at ``n`` seeds per cell (what --dry-run's worst case prints)."""
    from dcl_core.study.plan.dry_run import estimate_study  # torch, for the FLOP counts: only with rounds

    def wall_seconds_at(n: int) -> float | None:
        return estimate_study(script.build(replace(request.args, seeds=n), data_root), options)[2].wall_seconds

    first = len(grid_seeds(spec) or ())
    a = request.args
    design = rounds.plan(spec, a.design, a.max_seeds, a.max_minutes, a.seeds_per_round,
                         lambda: (w / first if (w := wall_seconds_at(first)) else None),
                         recorded_looks(options.resolved().output_dir, spec.name) if options.resume else ())
    return design, wall_seconds_at


def _interrupted(request: StudyRequest, err: BaseException, terminated: bool) -> int:
    """Ctrl-C or SIGTERM: what was kept and the command that continues the study (nothing, before it began)."""
    code = cli.EXIT_TERMINATED if terminated else cli.EXIT_INTERRUPTED
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
