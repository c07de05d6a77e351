"""The command line shared by every study script (so ``studies/*.py`` stay thin).

A study script supplies its question (docstring), per-preset study specs, and calls :func:`main`. Everything
is validated before Ray starts: bad values exit with code 2 and one line. ``--dry-run`` then prints the trials,
their totals and an estimated cost (:mod:`dcl_core.study.cost`) instead of running them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dcl_core import cli
from dcl_core.cli import setup_logging
from dcl_core.config import ConfigError, InputError, apply_overrides, parse_overrides, preset
from dcl_core.study import ray_env, rounds
from dcl_core.study.checks import check_set_not_swept, where_it_runs
from dcl_core.study.columns import ERROR, STATUS, Status
from dcl_core.study.dry_run import dry_run_lines
from dcl_core.study.record import recorded_command, recorded_seeds
from dcl_core.study.spec import (
    PROGRESS,
    QUIET,
    VERBOSE,
    StudyInterruptedError,
    StudyOptions,
    StudySpec,
    grid_seeds,
    validate_spec,
    with_asha,
    with_base,
)
from dcl_core.study.storage import check_output_dir, redact_args

MAX_SEEDS = 1000
SpecBuilder = Callable[[argparse.Namespace], "object"]


PRESET_HELP = {
    "smoke": "tests (~1 min)", "cpu": "answers the question on 2 CPU cores (default)",
    "cpu_long": "a longer CPU protocol that reaches the NPC regime (q_B <= 0.6, under an hour)",
    "paper": "the paper's protocol for a GPU cluster",
}


def build_parser(doc: str, default_name: str, presets: tuple[str, ...] = ("smoke", "cpu", "paper")
                 ) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    g = p.add_argument_group("what to run")
    g.add_argument("--preset", choices=presets, default="cpu",
                   help="; ".join(f"{name}: {PRESET_HELP.get(name, 'see the docstring')}" for name in presets))
    g.add_argument("--smoke", dest="preset", action="store_const", const="smoke", help="same as --preset smoke")
    g.add_argument("--search", choices=("grid", "optuna"), default="grid",
                   help="grid: the paper's exact sweep; optuna: TPE search (seeded) per loss")
    g.add_argument("--num-samples", type=int, default=None, help="trials per Optuna search (default: preset's)")
    g.add_argument("--asha", action="store_true", help="early-stop poor Optuna trials with ASHA")
    g.add_argument("--losses", default=None, help="comma-separated losses (default: preset's)")
    g.add_argument("--seeds", type=int, default=None, help="number of seeds per cell (default: preset's)")
    g.add_argument("--data-root", default=None, help="dataset root (default: embedded CIFAR-10 / $DCL_DATA_ROOT)")
    g.add_argument("--dry-run", action="store_true",
                   help="print the trials, their resources, total epochs and images, and an estimated cost (CPU "
                        "minutes on this machine, GPU-hours), then exit: no Ray, nothing written")
    g.add_argument("--reanalyze", action="store_true",
                   help="train nothing: recompute the answer of this study's finished run in OUTPUT_DIR from its "
                        "stored results (the same options it ran with), rewrite its summary files and its MLflow "
                        "summary run (python -m dcl_core.study.answer OUTPUT_DIR does it for every study there)")
    cli.add_set_option(g, "override a base config key for every trial, e.g. --set optim.epochs=50")
    rounds.add_options(p)
    o = p.add_argument_group("where results go")
    o.add_argument("--name", default=default_name, help=f"study / MLflow experiment name (default: {default_name})")
    cli.add_store_options(o, "study folder: Ray results, MLflow store, summary")
    o.add_argument("--storage", default=None, help="Ray storage path or URI (default: OUTPUT_DIR/ray_results)")
    o.add_argument("--resume", action="store_true", help="continue an interrupted study from its storage")
    o.add_argument("--overwrite", action="store_true", help="delete an existing study of the same name first")
    o.add_argument("--save-checkpoints", action="store_true", help="log each trial's final checkpoint to MLflow")
    r = p.add_argument_group("resources")
    r.add_argument("--workers", type=int, default=1, help="DDP workers per trial (TorchTrainer when > 1)")
    r.add_argument("--cpus-per-worker", type=float, default=1.0, help="CPUs per worker; also its torch threads")
    r.add_argument("--gpus-per-worker", type=float, default=0.0, help="GPUs per worker (paper preset: 1)")
    r.add_argument("--max-concurrent", type=int, default=None, help="cap on concurrent trials")
    r.add_argument("--max-failures", type=int, default=2, help="retries of a crashed trial")
    r.add_argument("--address", default=None, help="Ray cluster address (default: local, or $RAY_ADDRESS)")
    r.add_argument("--num-cpus", type=int, default=None, help="CPUs for a local Ray (default: all)")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="Ray Tune's status tables and the trials' own logs (default: a progress line and one line "
                        "per finished trial)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the answer (table and verdicts)")
    return p


def base_config(args: argparse.Namespace, base: tuple[str, dict[str, Any]]) -> Any:
    """A study preset's base config: ``(core preset, overrides)``, then ``--data-root``, then ``--set``."""
    name, overrides = base
    overrides = {**overrides, **({"data.root": args.data_root} if args.data_root else {})}
    return apply_overrides(apply_overrides(preset(name), overrides), parse_overrides(args.set))


def losses_arg(args: argparse.Namespace, default: tuple[str, ...]) -> tuple[str, ...]:
    """``--losses infonce,dcl`` as a tuple; a loss named twice would run every one of its trials twice."""
    if not args.losses:
        return default
    losses = tuple(x.strip() for x in args.losses.split(","))
    twice = sorted({x for x in losses if losses.count(x) > 1})
    if twice:
        raise ConfigError(f"--losses names {twice[0]} twice; each loss runs once per cell (use --seeds for repeats)")
    return losses


# The options that decide what a study runs and asks (recorded with its outputs, so that ``python -m
# dcl_core.study.answer`` can rebuild its spec and re-analyse it without its command line).
SPEC_ARGS = ("preset", "search", "num_samples", "asha", "losses", "seeds", "data_root", "set", "name", "design")


def main(doc: str, default_name: str, build_spec: SpecBuilder, argv: list[str] | None = None,
         defaults: dict[str, Any] | None = None, presets: tuple[str, ...] = ("smoke", "cpu", "paper")) -> int:
    """Parse, validate (exit 2 on bad input), run the study, print the table, plot path and experiment; with
    ``--dry-run``, print what it would run and cost instead (no Ray, nothing written); with ``--reanalyze``,
    recompute a finished run's answer from its stored results.

    ``defaults`` changes option defaults for one study (e.g. ``{"search": "optuna"}``); ``presets`` are the
    study's preset names."""
    parser = build_parser(doc, default_name, presets)
    parser.set_defaults(**(defaults or {}))
    args = parser.parse_args(argv)
    return run_parsed(args, doc, default_name, build_spec, argv)


def reanalyze_recorded(doc: str, script: str, build_spec: SpecBuilder, presets: tuple[str, ...],
                       recorded: dict[str, Any], output_dir: Path, tracking_uri: str | None, quiet: bool) -> int:
    """Re-analyse a study from the options its outputs recorded (``study_options.json``'s ``command``)."""
    args = build_parser(doc, script, presets).parse_args([])
    for key in SPEC_ARGS:
        if key in recorded:
            setattr(args, key, recorded[key])
    args.output_dir, args.tracking_uri, args.reanalyze, args.quiet = str(output_dir), tracking_uri, True, quiet
    return run_parsed(args, doc, script, build_spec, None, logging_set=True)


def run_parsed(args: argparse.Namespace, doc: str, default_name: str, build_spec: SpecBuilder,
               argv: list[str] | None, logging_set: bool = False) -> int:
    """Everything :func:`main` does after parsing."""
    if not logging_set:
        setup_logging(args.verbose, quiet=args.quiet)
    args.verbosity = QUIET if args.quiet else VERBOSE if args.verbose else PROGRESS
    with _sigterm_as_ctrl_c() as terminated:
        return _run(args, doc, default_name, build_spec, argv, terminated)


def _run(args: argparse.Namespace, doc: str, default_name: str, build_spec: SpecBuilder,
         argv: list[str] | None, terminated: list[int]) -> int:
    try:
        if args.num_samples is not None and args.num_samples < 1:
            raise ConfigError(f"--num-samples must be >= 1, got {args.num_samples}")
        if args.seeds is not None and not 1 <= args.seeds <= MAX_SEEDS:
            raise ConfigError(f"--seeds must be in [1, {MAX_SEEDS}], got {args.seeds}")
        if args.reanalyze and (args.resume or args.overwrite or args.dry_run):
            raise ConfigError("--reanalyze trains nothing and writes only the answer: drop --resume, --overwrite "
                              "and --dry-run")
        rounds.check_args(args)
        if args.resume or args.reanalyze:  # continue with every seed the study has, under its recorded design
            recorded = recorded_command(Path(args.output_dir).expanduser().resolve(), args.name)
            has = recorded_seeds(recorded)
            # --until-resolved's resume line repeats its first --seeds; the rounds since have added more
            more = args.until_resolved and has is not None and args.seeds is not None and has > args.seeds
            args.seeds = has if args.seeds is None or more else args.seeds
            args.design = recorded.get("design")
        spec, options = _study(args, doc, default_name, build_spec)
        if args.reanalyze:  # no data, no GPU, no Ray: the stored results only
            from dcl_core.study.reanalysis import reanalyze
            from dcl_core.study.results import summary_lines

            outcome = reanalyze(spec, options)
            print(outcome.answer if args.quiet else "\n".join(summary_lines(outcome)))
            return 0
        root, local_problems = where_it_runs(args, spec)
        data_root = str(Path(root).expanduser().resolve()) if root is not None else None

        def study() -> tuple[StudySpec, StudyOptions]:  # the spec and options ``args`` now describe
            return _study(args, doc, default_name, build_spec, data_root)

        spec, options = study()
        if args.until_resolved:
            wall_seconds_at = _plan_rounds(args, spec, options, study)
            spec, options = study()
        if args.dry_run:
            spec = with_asha(spec, options.asha)
            check_output_dir(options.resolved().output_dir)  # checked only: nothing is created
            lines = dry_run_lines(spec, options, args, local_problems)
            if args.until_resolved:
                lines += rounds.dry_run_lines(spec.design, args.max_minutes, wall_seconds_at)
            print("\n".join(lines))
            return 0
        if not (options.address or os.environ.get("RAY_ADDRESS")):  # a local Ray: ask for its token mode
            ray_env.request_token_auth()
        if options.verbosity < VERBOSE:
            ray_env.quiet_slow_loop_warnings()
        # Ray, Optuna and MLflow take seconds to import: bad input is refused before.
        from dcl_core.study.results import summary_lines
        from dcl_core.study.runner import run_study
        from dcl_core.study.tracking import preflight

        if options.tracking_uri:  # a bad or unreachable MLflow store: one line now, not minutes after Ray starts
            preflight(options.tracking_uri)

        begun = time.monotonic()
        outcome = run_study(spec, options)
        if args.until_resolved:
            def next_round(n: int) -> Any:
                args.seeds, args.resume, args.overwrite = n, True, False
                return run_study(*study())

            outcome, why = rounds.run(outcome, spec.design, len(grid_seeds(spec) or ()),
                                      time.monotonic() - begun, args.max_minutes, next_round,
                                      say=(lambda line: None) if args.quiet else print)
            if not args.quiet:
                print(why, end="\n\n")
    except InputError as err:  # ConfigError, DataError
        return cli.error(err, cli.EXIT_BAD_INPUT)
    except (StudyInterruptedError, KeyboardInterrupt) as err:  # Ctrl-C; a second Ctrl-C skips Tune's last save
        return _interrupted(args, argv, err, terminated=bool(terminated))
    print(outcome.answer if args.quiet else "\n".join(summary_lines(outcome)))
    failed = [r for r in outcome.rows if r[STATUS] != Status.OK]
    if outcome.rows and len(failed) == len(outcome.rows):
        return cli.error(f"every trial failed; the first: {failed[0].get(ERROR) or failed[0][STATUS]}", cli.EXIT_FAILED)
    return 0


def _plan_rounds(args: argparse.Namespace, spec: StudySpec, options: StudyOptions,
                 study: Callable[[], tuple[StudySpec, StudyOptions]]) -> Callable[[int], float | None]:
    """Fix the ``--until-resolved`` design before the first look (recorded in ``args.design``); returns the
    estimated wall-clock seconds of the study at ``n`` seeds per cell (what --dry-run's worst case prints)."""
    from dcl_core.study.dry_run import estimate_study

    seeds = args.seeds

    def wall_seconds_at(n: int) -> float | None:
        args.seeds = n
        try:
            return estimate_study(*study())[2].wall_seconds
        finally:
            args.seeds = seeds

    first = len(grid_seeds(spec) or ())
    design = rounds.plan(args, spec, options, lambda: (w / first if (w := wall_seconds_at(first)) else None))
    args.design = rounds.to_record(design)
    return wall_seconds_at


def _study(args: argparse.Namespace, doc: str, default_name: str, build_spec: SpecBuilder,
           data_root: str | None = None) -> tuple[StudySpec, StudyOptions]:
    """The spec and options ``args`` describe, validated: the script's spec with its question as description,
    the recorded or planned sequential design, the data root the trials read, and the options that record what
    built it."""
    options = dataclasses.replace(
        StudyOptions.from_namespace(args),
        command={"script": default_name, **{k: getattr(args, k) for k in SPEC_ARGS}})
    spec = build_spec(args)
    if not spec.description:  # the docstring's first paragraph: the question and the paper's table
        spec = dataclasses.replace(spec, description=" ".join(doc.strip().split("\n\n")[0].split()))
    design = rounds.from_record(args.design)
    rounds.check_within(design, len(grid_seeds(spec) or ()) or None)
    spec = dataclasses.replace(spec, design=design)
    validate_spec(spec)
    check_set_not_swept(spec, parse_overrides(args.set))
    return (spec if data_root is None else with_base(spec, {"data.root": data_root})), options


def _interrupted(args: argparse.Namespace, argv: list[str] | None, err: BaseException, terminated: bool) -> int:
    """Ctrl-C or SIGTERM: what was kept and the command that continues the study (nothing, before it began)."""
    code = cli.EXIT_TERMINATED if terminated else cli.EXIT_INTERRUPTED
    why = "; ".join((["SIGTERM"] if terminated else []) + ([str(err)] if str(err) else []))
    why = f" ({why})" if why else ""
    began = (Path(args.output_dir).expanduser() / "summary" / args.name / "study_options.json").exists()
    if not began:  # stopped before the study wrote anything: there is nothing to resume
        sys.stderr.write(f"interrupted{why} before the study started: nothing was run or written; run the same "
                         "command again\n")
        return code
    line = resume_command(argv)
    hint = ("\n  (credentials are shown as ***: give your --tracking-uri again, or set "
            "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD)" if "***" in line else "")
    sys.stderr.write(f"interrupted{why}: finished trials and checkpoints are kept, nothing was summarized. "
                     f"Continue with:\n  {line}{hint}\n")
    return code


@contextlib.contextmanager
def _sigterm_as_ctrl_c() -> Iterator[list[int]]:
    """SIGTERM (``kill``, a batch scheduler's time limit, ``ray job stop``) stops the study as Ctrl-C does: Tune
    saves its state, nothing half-trained is summarized, the resume line is printed (exit 143). Yields the list the
    handler appends the signal to, so the caller can tell SIGTERM from Ctrl-C; the previous handler is restored."""
    received: list[int] = []

    def on_sigterm(signum: int, _frame: Any) -> None:
        received.append(signum)
        signal.raise_signal(signal.SIGINT)  # Tune's graceful-stop handler while it runs, else KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield received
        return
    before = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, before if before is not None else signal.SIG_DFL)


def resume_command(argv: list[str] | None) -> str:
    """The command line that continues this study: the same options, ``--resume`` instead of ``--overwrite``."""
    args = [a for a in (sys.argv[1:] if argv is None else argv) if a not in ("--overwrite", "--resume")]
    return " ".join(shlex.quote(a) for a in redact_args([sys.executable, sys.argv[0], *args, "--resume"]))


