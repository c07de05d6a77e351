"""Every study command line: the study scripts (``studies/*.py`` stay thin: a question, presets and a spec
builder), ``python -m dcl_core.study answer`` (re-analysis), ``sync`` (what MLflow did not take) and ``calibrate``
(the verdicts on simulated studies), and the EqCo MI toy's.

The command line is parsed once into a frozen :class:`StudyRequest`; everything below receives its values, never
the ``argparse`` namespace. Everything is validated before Ray starts: bad values exit with code 2 and one line.
``--dry-run`` prints the trials, their totals and an estimated cost (:mod:`dcl_core.study.plan.cost`) instead of
running them.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import logging
import os
import re
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from dcl_core import cli
from dcl_core.cli import setup_logging
from dcl_core.config import ConfigError, InputError, RunFailedError, apply_overrides, parse_overrides, preset
from dcl_core.files import disk_full, no_space
from dcl_core.study.analysis.columns import ERROR, STATUS, Status
from dcl_core.study.analysis.mi_toy import TOY
from dcl_core.study.analysis.stats import GROUP_LOOKS
from dcl_core.study.execution import rounds, stop_signals
from dcl_core.study.plan.checks import check_set_not_swept, trial_data_root
from dcl_core.study.plan.dry_run import dry_run_lines
from dcl_core.study.plan.record import check_not_moved, recorded_command, recorded_looks, recorded_round_seeds
from dcl_core.study.plan.spec import (
    PROGRESS,
    QUIET,
    VERBOSE,
    StudyInterruptedError,
    StudyOptions,
    StudySpec,
    check_name,
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
    default_tracking_uri,
    redact_args,
    storage_exists,
    storage_join,
    summary_dir,
)

MAX_SEEDS = 1000
STUDIES_DIR = Path(__file__).resolve().parents[2] / "studies"  # the study scripts of this checkout
SCRIPT_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}")

PRESET_HELP = {
    "smoke": "tests (~1 min)", "cpu": "answers the question on 2 CPU cores (default)",
    "cpu_long": "a longer CPU protocol that reaches the NPC regime (q_B <= 0.6, under an hour)",
    "paper": "the paper's protocol for a GPU cluster",
}


@dataclass(frozen=True)
class SpecArgs:
    """The options that decide what a study runs and asks, as its script's ``build_spec`` reads them. Recorded
    with the study's outputs (``study_options.json``'s ``command``), so that ``python -m dcl_core.study answer``
    rebuilds its spec without its command line."""

    preset: str = "cpu"
    search: str = "grid"
    num_samples: int | None = None
    asha: bool = False
    losses: str | None = None
    seeds: int | None = None
    data_root: str | None = None
    set: tuple[str, ...] = ()
    name: str = ""
    design: Mapping[str, int | float | None] | None = None  # the sequential design of --until-resolved, once planned
    effect_of_interest: tuple[str, ...] = ()  # --effect-of-interest KEY=VALUE, each as given

    def record(self, script: str) -> dict[str, Any]:
        """The ``command`` a study's options record: its script and these values."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {"script": script, **values, "set": list(self.set),
                "design": None if self.design is None else dict(self.design),
                "effect_of_interest": list(self.effect_of_interest)}


def spec_args_from_record(recorded: Mapping[str, Any], base: SpecArgs, where: str) -> SpecArgs:
    """``base`` with the values a study recorded (its ``study_options.json``'s ``command``), each checked with the
    command line's own types and bounds (a folder someone else wrote is input like a command line): ConfigError
    naming the first bad value, before anything runs."""

    def bad(key: str, why: str) -> ConfigError:
        return ConfigError(f"{where}'s command.{key} {why}: the file is damaged or not a study's; --overwrite "
                           "starts the study afresh")

    def integer(key: str, low: int, high: int) -> int | None:
        value = recorded.get(key)
        if value is None:
            return None
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            raise bad(key, f"must be a whole number in [{low}, {high}], got {str(value)[:40]!r}")
        return value

    def text(key: str, limit: int) -> str | None:
        value = recorded.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > limit):
            raise bad(key, f"must be text of at most {limit} characters")
        return value

    given: dict[str, Any] = {}
    for key in ("preset", "search"):
        if (value := text(key, 40)) is not None:
            given[key] = value
    if "search" in given and given["search"] not in ("grid", "optuna"):
        raise bad("search", f"must be grid or optuna, got {given['search']!r}")
    for key, high in (("num_samples", 10_000), ("seeds", MAX_SEEDS)):
        if key in recorded:
            given[key] = integer(key, 1, high)
    if "asha" in recorded:
        if not isinstance(recorded["asha"], bool):
            raise bad("asha", "must be true or false")
        given["asha"] = recorded["asha"]
    for key in ("losses", "data_root", "name"):
        if key in recorded:
            given[key] = text(key, 4096)
    if given.get("name") is None:
        given.pop("name", None)
    if "set" in recorded:
        values = recorded["set"] or []
        if not isinstance(values, list) or not all(isinstance(v, str) and len(v) <= 4096 for v in values):
            raise bad("set", "must be a list of KEY=VALUE texts")
        given["set"] = tuple(values)
    if "effect_of_interest" in recorded:
        values = recorded["effect_of_interest"] or []
        if not isinstance(values, list) or len(values) > 64 or not all(isinstance(v, str) and len(v) <= 200
                                                                       for v in values):
            raise bad("effect_of_interest", "must be a list of KEY=VALUE texts")
        given["effect_of_interest"] = tuple(values)
    if "design" in recorded:
        rounds.from_record(recorded["design"])  # its own bounds: ConfigError
        given["design"] = recorded["design"]
    return replace(base, **given)


class SpecBuilder(Protocol):
    """Builds a study's :class:`StudySpec` from its parsed :class:`SpecArgs` (each study's ``build_spec``)."""

    def __call__(self, args: SpecArgs, /) -> StudySpec:
        """The spec of the study these arguments ask for."""


@dataclass(frozen=True)
class Script:
    """A study script: its question (the docstring), its name, its presets and its spec builder."""

    doc: str
    name: str
    build_spec: SpecBuilder
    presets: tuple[str, ...] = ("smoke", "cpu", "paper")
    defaults: Mapping[str, Any] = field(default_factory=dict)

    def build(self, args: SpecArgs, data_root: str | None = None) -> StudySpec:
        """The spec ``args`` describe, validated: the script's spec with its question as description, the
        recorded or planned sequential design and, when given, the data root the trials read."""
        spec = self.build_spec(args)
        if not spec.description:  # the docstring's first paragraph: the question and the paper's table
            spec = replace(spec, description=" ".join(self.doc.strip().split("\n\n")[0].split()))
        design = rounds.from_record(args.design)
        rounds.check_within(design, len(grid_seeds(spec) or ()) or None)
        spec = with_effects_of_interest(replace(spec, design=design), args.effect_of_interest)
        validate_spec(spec)
        check_set_not_swept(spec, parse_overrides(list(args.set)))
        return spec if data_root is None else with_base(spec, {"data.root": data_root})


@dataclass(frozen=True)
class StudyRequest:
    """One invocation of a study, as parsed from its command line: what it runs (:class:`SpecArgs`), how
    (:class:`~dcl_core.study.plan.spec.StudyOptions`) and in which mode."""

    spec_args: SpecArgs
    options: StudyOptions
    dry_run: bool = False
    reanalyze: bool = False
    until_resolved: bool = False
    max_seeds: int | None = None
    max_minutes: float | None = None
    seeds_per_round: int | None = None
    argv: tuple[str, ...] | None = None  # the command line given (None: sys.argv), for the resume line
    download: bool = False  # --download: fetch the dataset to this machine before anything runs

    @property
    def quiet(self) -> bool:
        """Whether the study's console is quiet (``-q``)."""
        return self.options.verbosity == QUIET

    def check(self) -> None:
        """One-line errors for options that no single value check catches, before anything runs."""
        a, o = self.spec_args, self.options
        if a.num_samples is not None and a.num_samples < 1:
            raise ConfigError(f"--num-samples must be >= 1, got {a.num_samples}")
        if a.seeds is not None and not 1 <= a.seeds <= MAX_SEEDS:
            raise ConfigError(f"--seeds must be in [1, {MAX_SEEDS}], got {a.seeds}")
        if self.reanalyze and (o.resume or o.overwrite or self.dry_run):
            raise ConfigError("--reanalyze trains nothing and writes only the answer: drop --resume, --overwrite "
                              "and --dry-run")
        rounds.check_caps(self.until_resolved, self.max_seeds, self.max_minutes, self.seeds_per_round,
                          reanalyze=self.reanalyze, search=a.search)
        if self.download and (o.address or os.environ.get("RAY_ADDRESS")):
            raise ConfigError("--download fetches the dataset to this machine, not to a cluster's nodes: put it on "
                              "them (or on storage they share) and pass --data-root")


def build_parser(doc: str, default_name: str, presets: tuple[str, ...] = ("smoke", "cpu", "paper")
                 ) -> argparse.ArgumentParser:
    """The argument parser every study script shares, its description the study's docstring."""
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
    g.add_argument("--download", action="store_true",
                   help="fetch CIFAR-10/100 or STL-10 with torchvision once, before the study starts (needs internet), "
                        "into --data-root or ~/.cache/dcl_core/<dataset>, and train on it; on a cluster, put the data "
                        "on its nodes instead")
    g.add_argument("--effect-of-interest", action="append", default=[], metavar="KEY=VALUE",
                   help="δ for a question, in its statistic's units, e.g. std_difference=1.0 (repeatable; KEY: "
                        "the statistic or <statistic>_<i>): the verdict also says whether the data rule out an effect "
                        "that large (default: the paper's like-for-like value)")
    g.add_argument("--dry-run", action="store_true",
                   help="print the trials, their resources, total epochs and images, and an estimated cost (CPU "
                        "minutes on this machine, GPU-hours), then exit: no Ray, nothing written")
    g.add_argument("--reanalyze", action="store_true",
                   help="train nothing: recompute the answer of this study's finished run in OUTPUT_DIR from its "
                        "stored results (the same options it ran with), rewrite its summary files and its MLflow "
                        "summary run (python -m dcl_core.study answer OUTPUT_DIR does it for every study there)")
    cli.add_set_option(g, "override a base config key for every trial, e.g. --set optim.epochs=50")
    r = p.add_argument_group("seeds until resolved")
    r.add_argument("--until-resolved", action="store_true",
                   help="add seeds to every cell in rounds until every question is settled (its interval "
                        "excludes 0, or its futility bound the effect of interest) or a cap is hit; "
                        f"{GROUP_LOOKS} looks, each at the group-sequential design's bounds, so that all looks "
                        "together resolve no more than 5%% of null studies and rule out a true effect of interest "
                        "in no more than 5%% (needs --max-seeds and/or --max-minutes)")
    r.add_argument("--max-seeds", type=int, default=None,
                   help="the last look: at most this many seeds per cell (default with --max-minutes: as many as "
                        "the cost estimate fits in it)")
    r.add_argument("--max-minutes", type=float, default=None,
                   help="start no round that would end after this many minutes of this run (at the last round's "
                        "pace); stopping early only removes looks")
    r.add_argument("--seeds-per-round", type=int, default=None,
                   help=f"a look every N seeds instead of {GROUP_LOOKS} looks equally spaced from the first to the "
                        "last")
    o = p.add_argument_group("where results go")
    o.add_argument("--name", default=default_name, help=f"study / MLflow experiment name (default: {default_name})")
    cli.add_store_options(o, "study folder: Ray results, MLflow store, summary")
    o.add_argument("--storage", default=None, help="Ray storage path or URI (default: OUTPUT_DIR/ray_results)")
    o.add_argument("--resume", action="store_true",
                   help="continue an interrupted study from its storage; with a larger --seeds, extend a finished "
                        "study by the new seeds only")
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


def spec_args_of(ns: argparse.Namespace) -> SpecArgs:
    """The :class:`SpecArgs` of parsed options."""
    return SpecArgs(preset=ns.preset, search=ns.search, num_samples=ns.num_samples, asha=ns.asha, losses=ns.losses,
                    seeds=ns.seeds, data_root=ns.data_root, set=tuple(ns.set), name=ns.name,
                    effect_of_interest=tuple(ns.effect_of_interest))


def request_of(ns: argparse.Namespace, argv: Sequence[str] | None = None) -> StudyRequest:
    """The frozen request of parsed options (ConfigError for an empty ``--output-dir`` or bad resources)."""
    if not str(ns.output_dir).strip():  # Path("") is the current folder
        raise ConfigError("--output-dir is empty; name a folder (default: outputs)")
    verbosity = QUIET if ns.quiet else VERBOSE if ns.verbose else PROGRESS
    options = StudyOptions(
        output_dir=Path(ns.output_dir), tracking_uri=ns.tracking_uri, storage=ns.storage, resume=ns.resume,
        overwrite=ns.overwrite, workers=ns.workers, cpus_per_worker=ns.cpus_per_worker,
        gpus_per_worker=ns.gpus_per_worker, max_concurrent=ns.max_concurrent, asha=ns.asha,
        max_failures=ns.max_failures, address=ns.address, num_cpus=ns.num_cpus,
        save_checkpoints=ns.save_checkpoints, verbosity=verbosity)
    return StudyRequest(spec_args_of(ns), options, dry_run=ns.dry_run, reanalyze=ns.reanalyze,
                        until_resolved=ns.until_resolved, max_seeds=ns.max_seeds, max_minutes=ns.max_minutes,
                        seeds_per_round=ns.seeds_per_round, argv=None if argv is None else tuple(argv),
                        download=ns.download)


def base_config(args: SpecArgs, base: tuple[str, dict[str, Any]]) -> Any:
    """A study preset's base config: ``(core preset, overrides)``, then ``--data-root``, then ``--set``."""
    name, overrides = base
    overrides = {**overrides, **({"data.root": args.data_root} if args.data_root else {})}
    return apply_overrides(apply_overrides(preset(name), overrides), parse_overrides(list(args.set)))


def losses_arg(args: SpecArgs, default: tuple[str, ...]) -> tuple[str, ...]:
    """``--losses infonce,dcl`` as a tuple; a loss named twice would run every one of its trials twice."""
    if not args.losses:
        return default
    losses = tuple(x.strip() for x in args.losses.split(","))
    twice = sorted({x for x in losses if losses.count(x) > 1})
    if twice:
        raise ConfigError(f"--losses names {twice[0]} twice; each loss runs once per cell (use --seeds for repeats)")
    return losses


def main(doc: str, default_name: str, build_spec: SpecBuilder, argv: list[str] | None = None,
         defaults: dict[str, Any] | None = None, presets: tuple[str, ...] = ("smoke", "cpu", "paper")) -> int:
    """A study script's command line. Parse, validate (exit 2 on bad input), run the study, print the table, plot
    path and experiment; with ``--dry-run``, print what it would run and cost instead (no Ray, nothing written);
    with ``--reanalyze``, recompute a finished run's answer from its stored results.

    ``defaults`` changes option defaults for one study (e.g. ``{"search": "optuna"}``); ``presets`` are the
    study's preset names."""
    script = Script(doc, default_name, build_spec, presets, defaults or {})
    parser = build_parser(doc, default_name, presets)
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
            return cli.error(disk_full(where, resume=not request.reanalyze), cli.EXIT_FAILED)
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
    a, o = request.spec_args, request.options
    if not (o.resume or request.reanalyze):
        return request
    out = o.output_dir.expanduser().resolve()
    recorded = recorded_command(out, a.name)
    where = str(summary_dir(out, a.name) / OPTIONS_FILE)
    checked = spec_args_from_record({k: recorded[k] for k in ("seeds", "design") if k in recorded}, SpecArgs(), where)
    has = checked.seeds
    ran = recorded_round_seeds(out, a.name)
    if has is not None and ran is not None and has != ran:
        raise ConfigError(f"{where}'s command.seeds ({has}) disagrees with the {ran} seed(s) per cell its trials "
                          "were started with (seed_rounds): the file is damaged; --overwrite starts the study afresh")
    # --until-resolved's resume line repeats its first --seeds; the rounds since have added more
    more = request.until_resolved and has is not None and a.seeds is not None and has > a.seeds
    seeds = has if a.seeds is None or more else a.seeds
    return replace(request, spec_args=replace(a, seeds=seeds, design=recorded.get("design")))


def _with_command(options: StudyOptions, script: Script, args: SpecArgs) -> StudyOptions:
    return replace(options, command=args.record(script.name))


def _execute(script: Script, request: StudyRequest) -> Any:
    """The study the request asks for: a dry run or a re-analysis (printed; returns None), else the study's
    outcome (after every round with ``--until-resolved``)."""
    request.check()
    request = _continued(request)
    args = request.spec_args
    spec = script.build(args)
    if request.download and not request.reanalyze:
        # The torchvision release, fetched once here (trials only read it), is then the study's data root, as if
        # given with --data-root (so the same command line resumes it). A dry run names it, fetching nothing.
        data = spec.base.data
        from dcl_core.data import fetch_dataset, resolve_data_root  # torchvision (seconds): not for --help

        fetched = resolve_data_root(data.dataset, args.data_root, download=True) if request.dry_run else \
            fetch_dataset(data.dataset, args.data_root)
        args = replace(args, data_root=str(fetched))
        spec = script.build(args)
        if request.dry_run:  # its pre-flight: the data a real run fetches first
            spec = with_base(spec, {"data.download": True})
    options = _with_command(request.options, script, args)
    if request.reanalyze:  # no data, no GPU, no Ray: the stored results only
        # MLflow and Optuna (seconds): not for --help or bad input
        from dcl_core.study.execution.reanalysis import reanalyze
        from dcl_core.study.execution.results import summary_lines

        outcome = reanalyze(spec, options)
        print(outcome.answer if request.quiet else "\n".join(summary_lines(outcome)))
        return None
    root, local_problems = trial_data_root(spec, options, request.dry_run)
    data_root = str(Path(root).expanduser().resolve()) if root is not None else None
    if data_root is not None:
        spec = with_base(spec, {"data.root": data_root})
    wall_seconds_at: Callable[[int], float | None] = lambda n: None  # noqa: E731
    if request.until_resolved:
        design, wall_seconds_at = _plan_rounds(script, request, spec, options, data_root)
        args = replace(args, design=rounds.to_record(design))
        options = _with_command(options, script, args)
        spec = replace(spec, design=design)
    if request.dry_run:
        spec = with_asha(spec, options.asha)
        check_output_dir(options.resolved().output_dir)  # checked only: nothing is created
        lines = dry_run_lines(spec, options, args.preset, local_problems)
        lines += _existing_study_lines(spec, options)
        if request.until_resolved:
            assert spec.design is not None
            lines += rounds.dry_run_lines(spec.design, request.max_minutes, wall_seconds_at)
        print("\n".join(lines))
        return None
    if options.resume:  # a moved or copied folder: one line saying what works here, before Ray's imports
        check_not_moved(options.resolved().output_dir, spec.name)
    # Ray, Optuna and MLflow take seconds to import: bad input is refused before.
    from dcl_core.study.execution import ray_env

    if not (options.address or os.environ.get("RAY_ADDRESS")):  # a local Ray: ask for its token mode
        ray_env.request_token_auth()
    if options.verbosity < VERBOSE:
        ray_env.quiet_slow_loop_warnings()
    from dcl_core.study.execution.tuning import run_study  # Ray, Optuna, MLflow: as above
    from dcl_core.study.tracking import check_store_in_folder, preflight

    if options.tracking_uri:  # a bad or unreachable MLflow store: one line now, not minutes after Ray starts
        preflight(options.tracking_uri)
    resolved = options.resolved()  # a copied or moved folder's store would write to the original's folders
    assert resolved.tracking_uri is not None
    check_store_in_folder(resolved.tracking_uri, resolved.output_dir)
    begun = time.monotonic()
    outcome = run_study(spec, options)
    if not request.until_resolved:
        return outcome
    assert spec.design is not None

    def next_round(n: int) -> Any:  # the study at n seeds per cell: a resume that adds the new seeds
        more = replace(args, seeds=n)
        return run_study(script.build(more, data_root),
                         replace(_with_command(options, script, more), resume=True, overwrite=False))

    outcome, why = rounds.until_resolved(outcome, spec.design, len(grid_seeds(spec) or ()),
                                         time.monotonic() - begun, request.max_minutes, next_round,
                                         say=(lambda line: None) if request.quiet else print)
    if not request.quiet:
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
        return estimate_study(script.build(replace(request.spec_args, seeds=n), data_root), options)[2].wall_seconds

    first = len(grid_seeds(spec) or ())
    design = rounds.plan(spec, request.spec_args.design, request.max_seeds, request.max_minutes,
                         request.seeds_per_round, lambda: (w / first if (w := wall_seconds_at(first)) else None),
                         recorded_looks(options.resolved().output_dir, spec.name) if options.resume else ())
    return design, wall_seconds_at


def _interrupted(request: StudyRequest, err: BaseException, terminated: bool) -> int:
    """Ctrl-C or SIGTERM: what was kept and the command that continues the study (nothing, before it began)."""
    code = cli.EXIT_TERMINATED if terminated else cli.EXIT_INTERRUPTED
    why = "; ".join((["SIGTERM"] if terminated else []) + ([str(err)] if str(err) else []))
    why = f" ({why})" if why else ""
    began = (request.options.output_dir.expanduser() / "summary" / request.spec_args.name / OPTIONS_FILE).exists()
    if not began:  # stopped before the study wrote anything: there is nothing to resume
        sys.stderr.write(f"interrupted{why} before the study started: nothing was run or written; run the same "
                         "command again\n")
        return code
    line = resume_command(None if request.argv is None else list(request.argv))
    hint = ("\n  (credentials are shown as ***: give your --tracking-uri again, or set "
            "MLFLOW_TRACKING_USERNAME/MLFLOW_TRACKING_PASSWORD)" if "***" in line else "")
    sys.stderr.write(f"interrupted{why}: finished trials and checkpoints are kept, nothing was summarized. "
                     f"Continue with:\n  {line}{hint}\n")
    return code


def resume_command(argv: list[str] | None) -> str:
    """The command line that continues this study: the same options, ``--resume`` instead of ``--overwrite``."""
    args = [a for a in (sys.argv[1:] if argv is None else argv) if a not in ("--overwrite", "--resume")]
    return " ".join(shlex.quote(a) for a in redact_args([sys.executable, sys.argv[0], *args, "--resume"]))




# ---- python -m dcl_core.study answer | sync | calibrate ---------------------------------------------------------


def _load_script(name: str) -> Script:
    """``studies/<name>.py`` of this checkout as a :class:`Script` (never a path read from the outputs)."""
    path = STUDIES_DIR / f"{name}.py"
    if not SCRIPT_NAME.fullmatch(name) or not path.is_file():
        raise ConfigError(f"the recorded study script {name!r} is not one of {STUDIES_DIR}/*.py")
    found = importlib.util.spec_from_file_location(f"_study_{name}", path)
    assert found is not None and found.loader is not None
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return Script(module.__doc__ or "", name, module.build_spec,
                  tuple(getattr(module, "PRESETS", ("smoke", "cpu", "paper"))))


def reanalyze_recorded(script: Script, recorded: Mapping[str, Any], output_dir: Path, tracking_uri: str | None,
                       quiet: bool) -> int:
    """Re-analyse a study from the options its outputs recorded (``study_options.json``'s ``command``)."""
    ns = build_parser(script.doc, script.name, script.presets).parse_args([])
    args = spec_args_from_record(recorded, spec_args_of(ns), f"{output_dir}/summary/{script.name}/{OPTIONS_FILE}")
    if args.preset not in script.presets:
        raise ConfigError(f"the recorded preset {args.preset[:40]!r} is not one of {', '.join(script.presets)}")
    options = StudyOptions(output_dir=output_dir, tracking_uri=tracking_uri, asha=args.asha,
                           verbosity=QUIET if quiet else PROGRESS)
    return run_request(script, StudyRequest(args, options, reanalyze=True))


def reanalyze_folder(study_dir: Path, output_dir: Path, tracking_uri: str | None, quiet: bool) -> int:
    """One study of ``summary/``: rebuilt from its recorded command and re-analysed (the script's own output)."""
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
    if not options_file.is_file():
        raise ConfigError(f"{study_dir} has no {OPTIONS_FILE}: not a study's summary folder")
    command = read_json(options_file).get("command")
    if not isinstance(command, dict) or not isinstance(command.get("script"), str):
        raise ConfigError(f"{options_file} records no command (a study run before re-analysis was recorded): run "
                          f"`python studies/<script>.py <the options it ran with> --output-dir {output_dir} "
                          "--reanalyze`")
    return reanalyze_recorded(_load_script(command["script"]), command, output_dir, store.uri, quiet)


ANSWER_DOC = """Re-analyse finished studies without training: recompute the answer from the stored results rows and
print, write and log it exactly as the study does (``summary/<study>/table.txt``, the plots, the MLflow summary run).

    python -m dcl_core.study answer OUTPUT_DIR [--name STUDY] [--tracking-uri URI] [-q]
    python studies/NAME.py <the options it ran with> --output-dir OUTPUT_DIR --reanalyze

The first form re-analyses every study in ``OUTPUT_DIR/summary/`` (or ``--name``): each study's
``study_options.json`` records the study script and the options that built its spec, from which the spec (and so
its questions, with today's statistics) is rebuilt; the EqCo MI toy is re-analysed from ``mi_toy.parquet``. A study
run before the options were recorded is re-analysed with the second form. A study that cannot be re-analysed is
named with one line and the others still are; exit code 0 when every study was re-analysed, else 2. The summary
run is logged to ``--tracking-uri``, else to the folder's own store (``OUTPUT_DIR/mlflow.db``): the tracking URI
a study recorded is named, never followed (a folder someone else wrote must not choose where your credentials go
or where you write).
"""


def answer_main(argv: Sequence[str] | None = None) -> int:
    """``python -m dcl_core.study answer OUTPUT_DIR``: every finished study there re-analysed."""
    parser = argparse.ArgumentParser(prog="python -m dcl_core.study answer", description=ANSWER_DOC,
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
            check_name(args.name)
        dirs = finished_studies(output_dir, args.name)
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
        except Exception as err:  # one line, and the other studies are still re-analysed
            if no_space(err):
                code = max(code, cli.error(f"{d.name}: {disk_full(output_dir)}", cli.EXIT_FAILED))
                continue
            logging.getLogger(__name__).debug("re-analysis of %s failed", d.name, exc_info=True)
            code = cli.error(f"{d.name}: could not be re-analysed ({type(err).__name__}: "
                             f"{str(err).strip().splitlines()[0][:200] if str(err).strip() else 'no message'})")
    return code


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
    parser = argparse.ArgumentParser(prog="python -m dcl_core.study sync", description=SYNC_DOC,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_store_options(parser, "the studies' --output-dir", output_default=None)
    parser.add_argument("--name", default=None, help="only this study (default: every study with a journal)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    setup_logging(args.verbose)
    out = args.output_dir.expanduser().resolve()
    if args.name:
        try:
            check_name(args.name)  # never a journal (or a lock) outside the output folder: "../../x"
        except ConfigError as err:
            return cli.error(err)
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
            code = cli.error(f"{synced.study}: {synced.refused}")
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
                code = cli.error(f"{synced.study}: the answer was not logged: {err}")
    return code


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
``dcl_core.training.export``. Exit code 0, or 2 with one line on bad input.
"""


def export_main(argv: Sequence[str] | None = None) -> int:
    """``python -m dcl_core.study export OUTPUT_DIR (--trial NAME | --best [SERIES])``."""
    parser = argparse.ArgumentParser(prog="python -m dcl_core.study export", description=EXPORT_DOC,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    cli.add_store_options(parser, "the study's --output-dir", output_default=None)
    parser.add_argument("--name", default=None, help="the study (default: the only one in OUTPUT_DIR)")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--trial", default=None, metavar="NAME", help="the trial's name or Tune id")
    which.add_argument("--best", nargs="?", const="", default=None, metavar="SERIES",
                       help="the finished trial with the highest final kNN top-1 (of SERIES, e.g. dcl)")
    parser.add_argument("-o", "--out", type=Path, default=None,
                        help="the weights file (default: TRIAL_NAME.pt here); its description goes beside it as .json")
    parser.add_argument("--storage", type=Path, default=None,
                        help="the study's Tune storage, a local folder (default: OUTPUT_DIR/ray_results)")
    parser.add_argument("--mlflow", action="store_true", help="also log the files to the trial's MLflow run")
    args = parser.parse_args(argv)
    setup_logging()

    def body() -> int:
        output_dir = args.output_dir.expanduser().resolve()
        study = args.name if args.name is not None else _only_study(output_dir)
        check_name(study)
        storage = (args.storage or output_dir / "ray_results").expanduser().resolve()
        uri = args.tracking_uri or default_tracking_uri(output_dir)
        if args.mlflow:
            from dcl_core.study.tracking import check_store_in_folder, preflight  # MLflow: not for --help

            preflight(uri)
            check_store_in_folder(uri, output_dir)  # the folder's own store, named or not, writes only inside it
        from dcl_core.study.execution.export import choose  # pyarrow: not for --help
        from dcl_core.training.export import describe, export  # torch and the models (seconds): not for --help

        chosen = choose(output_dir, study, storage, args.trial, args.best)
        out = args.out if args.out is not None else Path(f"{chosen.name}.pt")
        meta = export(chosen.checkpoint, out)
        print(f"{out}: trial {chosen.name} of {study}: {describe(meta)}; described in {out.with_suffix('.json')}")
        if args.mlflow:
            from dcl_core.study.tracking.runs import log_trial_files  # MLflow: not for --help

            run_id = log_trial_files(uri, study, chosen.trial_id, [out, out.with_suffix(".json")], "backbone")
            print(f"MLflow: logged to backbone/ of run {run_id} ({chosen.name})")
        return 0

    return cli.run_command(body)


def finished_studies(output_dir: Path, name: str | None = None, toy: bool = True) -> list[Path]:
    """The ``summary/<study>`` folders of the finished studies in ``output_dir`` (only ``name``'s when given): those
    holding a study's results, or with ``toy`` the MI toy's table."""
    from dcl_core.study.execution.reanalysis import RESULTS_FILE, TOY_FILE  # MLflow: not for --help

    summary = output_dir / "summary"
    dirs = sorted(d for d in summary.iterdir() if d.is_dir() and not d.is_symlink()
                  and (name is None or d.name == name)) if summary.is_dir() else []
    return [d for d in dirs if (d / RESULTS_FILE).is_file() or (toy and d.name == TOY and (d / TOY_FILE).is_file())]


def _only_study(output_dir: Path) -> str:
    """The name of the one finished study in ``output_dir``; ConfigError when there is none or several."""
    names = [d.name for d in finished_studies(output_dir, toy=False)]
    if len(names) != 1:
        raise ConfigError(f"{output_dir} holds {'no finished study' if not names else 'studies ' + ', '.join(names)}"
                          + (": choose one with --name" if names else ""))
    return names[0]


def calibrate_main(argv: Sequence[str] | None = None) -> int:
    """``python -m dcl_core.study calibrate``: the verdicts' error rates on simulated studies."""
    from dcl_core.study.analysis.calibration import (  # numpy, scipy: not for --help
        GROUP_EFFECTS,
        KINDS,
        SETTINGS,
        calibrate,
        format_group_rows,
        format_report,
        group_row,
    )

    p = argparse.ArgumentParser(prog="python -m dcl_core.study calibrate",
                                description="Simulate studies with a known truth through the verdict code and "
                                            "print resolution rates and coverage (the calibration table).")
    p.add_argument("--studies", type=int, default=1000, help="simulated studies per kind × setting × seeds block")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--design", action="store_true",
                   help="instead: --until-resolved's group-sequential design against the fixed design with 80%% "
                        "power at δ (mean seeds, power, error rates; --studies per truth and kind)")
    args = p.parse_args(argv)
    if args.design:
        rows = [group_row(k, args.studies) for k in KINDS if k.name in GROUP_EFFECTS]
        print(f"{args.studies:,} simulated studies per truth and kind ({SETTINGS[0].name}; first look at 3 seeds, "
              "last at the fewest seeds that give the design 80% power at δ)")
        print(format_group_rows(rows))
        return 0
    report = calibrate(studies=args.studies, rng_seed=args.seed)
    n = args.studies * len(SETTINGS)
    print(f"{n:,} simulated studies per cell ({args.studies:,} in each of {len(SETTINGS)} settings: "
          + "; ".join(s.name for s in SETTINGS) + ")")
    print(format_report(report))
    return 0


COMMANDS: dict[str, Callable[[Sequence[str] | None], int]] = {
    "answer": answer_main, "sync": sync_main, "export": export_main, "calibrate": calibrate_main}


def module_main(argv: Sequence[str] | None = None) -> int:
    """``python -m dcl_core.study {answer,sync,export,calibrate} ...``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        usage = ("usage: python -m dcl_core.study {answer,sync,export,calibrate} ...\n"
                 "  answer OUTPUT_DIR   re-analyse the finished studies in OUTPUT_DIR\n"
                 "  sync OUTPUT_DIR     push to MLflow what the studies journaled while it was unreachable\n"
                 "  export OUTPUT_DIR   a trial's trained encoder for another codebase (--trial NAME or --best)\n"
                 "  calibrate           the verdicts' error rates on simulated studies\n")
        if argv and argv[0] in ("-h", "--help"):
            sys.stdout.write(usage)
            return 0
        sys.stderr.write(usage)
        return cli.error(f"choose a command: {', '.join(COMMANDS)}" + (f" (got {argv[0]!r})" if argv else ""))
    return COMMANDS[argv[0]](argv[1:])


# ---- the EqCo MI toy (studies/eqco_mi_toy.py) ---------------------------------------------------------------------


def toy_main(doc: str, presets: Mapping[str, Mapping[str, Any]], argv: Sequence[str] | None = None) -> int:
    """The MI toy study's command line: its presets (true MIs, Ks, steps, evaluation batches, seeds), α, where the
    results go; ``--dry-run`` times a few steps instead."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", choices=tuple(presets), default="cpu",
                   help="cpu (default: the paper's scale, 3 critics per cell at MI 10), paper (1 critic per cell) "
                        "or smoke")
    p.add_argument("--smoke", dest="preset", action="store_const", const="smoke")
    p.add_argument("--alpha", type=float, default=512.0, help="EqCo alpha (paper: 512)")
    cli.add_store_options(p, "study folder shared with the other studies: MLflow store, summary/eqco_mi_toy/")
    p.add_argument("--num-cpus", type=int, default=None)
    p.add_argument("--dry-run", action="store_true", help="print the runs and an estimated time, then exit")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the answer (table and verdict)")
    args = p.parse_args(argv)
    cli.setup_logging(quiet=args.quiet)
    if not args.alpha > 0:
        return cli.error(f"--alpha must be > 0, got {args.alpha}")
    from dcl_core.study.execution import mi_toy  # torch: not for --help or a bad argument

    pr = presets[args.preset]
    configs = mi_toy.toy_configs(pr["mis"], pr["ks"], pr["steps"], pr["repeats"], pr["seeds"], args.alpha)
    if args.dry_run:
        print(mi_toy.dry_run(configs, args.num_cpus or os.cpu_count() or 1))
        return 0
    # MLflow (seconds): not for --help, a bad argument or a dry run
    from dcl_core.study.tracking import preflight

    root = Path(args.output_dir).expanduser().resolve()
    uri = args.tracking_uri or default_tracking_uri(root)
    try:
        preflight(uri)
    except ConfigError as err:
        return cli.error(err)
    params = {"alpha": args.alpha, "steps": pr["steps"], "repeats": pr["repeats"], "seeds": pr["seeds"]}
    table, plot = mi_toy.run_toy_study(configs, root, uri, args.num_cpus, params, pr["ks"])
    if not args.quiet:
        print(f"plot: {plot}\nMLflow: experiment 'eqco_mi_toy' at {uri}\n")
    print(table)
    return 0
