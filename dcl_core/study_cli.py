"""The command line shared by every study script (so ``studies/*.py`` stay thin).

A study script supplies its question (docstring), per-preset study specs, and calls :func:`main`. Everything
is validated before Ray starts: bad values exit with code 2 and one line. ``--dry-run`` then prints the trials,
their totals and an estimated cost (:mod:`dcl_core.study.cost`) instead of running them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import shlex
import signal
import socket
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dcl_core import cli
from dcl_core.cli import setup_logging
from dcl_core.config import ConfigError, InputError, apply_overrides, parse_overrides, preset
from dcl_core.study.columns import ERROR, STATUS, Status
from dcl_core.study.spec import (
    DDP_TRIAL_CPU,
    StudyInterruptedError,
    StudyOptions,
    StudySpec,
    validate_spec,
    with_asha,
    with_base,
)
from dcl_core.study.storage import check_output_dir, redact_args
from search_spaces import keys_of

if TYPE_CHECKING:
    from dcl_core.study.cost import ExperimentPlan, TrialWork

MAX_SEEDS = 1000
MAX_TRIAL_LINES = 16  # a dry run lists an experiment's cells one per line up to this many, else summarizes them
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
SPEC_ARGS = ("preset", "search", "num_samples", "asha", "losses", "seeds", "data_root", "set", "name")


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
    args.verbosity = 0 if args.quiet else 2 if args.verbose else 1
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
        options = dataclasses.replace(
            StudyOptions.from_namespace(args),
            command={"script": default_name, **{k: getattr(args, k) for k in SPEC_ARGS}})
        spec = build_spec(args)
        if not spec.description:  # the docstring's first paragraph: the question and the paper's table
            spec = dataclasses.replace(spec, description=" ".join(doc.strip().split("\n\n")[0].split()))
        validate_spec(spec)
        _check_set_not_swept(spec, parse_overrides(args.set))
        if args.reanalyze:  # no data, no GPU, no Ray: the stored results only
            from dcl_core.study.reanalysis import reanalyze
            from dcl_core.study.results import summary_lines

            outcome = reanalyze(spec, options)
            print(outcome.answer if args.quiet else "\n".join(summary_lines(outcome)))
            return 0
        root, local_problems = _where_it_runs(args, spec)
        if root is not None:
            spec = with_base(spec, {"data.root": str(Path(root).expanduser().resolve())})
        if args.dry_run:
            spec = with_asha(spec, options.asha)
            check_output_dir(options.resolved().output_dir)  # checked only: nothing is created
            lines = dry_run_lines(spec, options, args, local_problems)
            print("\n".join(lines))
            return 0
        # Ray, Optuna and MLflow take seconds to import: bad input is refused before.
        from dcl_core.study.results import summary_lines
        from dcl_core.study.runner import run_study
        from dcl_core.study.tracking import preflight

        if options.tracking_uri:  # a bad or unreachable MLflow store: one line now, not minutes after Ray starts
            preflight(options.tracking_uri)

        outcome = run_study(spec, options)
    except InputError as err:  # ConfigError, DataError
        return cli.error(err, cli.EXIT_BAD_INPUT)
    except (StudyInterruptedError, KeyboardInterrupt) as err:  # Ctrl-C; a second Ctrl-C skips Tune's last save
        return _interrupted(args, argv, err, terminated=bool(terminated))
    print(outcome.answer if args.quiet else "\n".join(summary_lines(outcome)))
    failed = [r for r in outcome.rows if r[STATUS] != Status.OK]
    if outcome.rows and len(failed) == len(outcome.rows):
        return cli.error(f"every trial failed; the first: {failed[0].get(ERROR) or failed[0][STATUS]}", cli.EXIT_FAILED)
    return 0


def _where_it_runs(args: argparse.Namespace, spec: StudySpec) -> tuple[str | None, list[str]]:
    """(the data root the trials read, what this machine lacks). On a cluster the data lives on its nodes (the
    driver checks the address and the output folder); locally the data, each trial's fit and the GPUs are
    checked now. What only this machine lacks (the data, a GPU) stops a run; a dry run, which may plan a cluster
    run, reports it instead."""
    import torch

    from dcl_core.data import DataError, check_dataset, resolve_data_root

    data = spec.base.data
    on_cluster = bool(args.address or os.environ.get("RAY_ADDRESS"))
    local_problems: list[str] = []
    if on_cluster and not args.dry_run:
        check_ray_address(args.address or os.environ.get("RAY_ADDRESS", ""))
    if on_cluster:  # the data lives on the cluster's nodes, not necessarily on this driver
        root: str | None = data.root or str(resolve_data_root(data.dataset, None, data.download))
        if not Path(args.output_dir).expanduser().is_absolute():
            # Under `ray job submit --working-dir .` a relative folder is inside the job's temporary copy.
            raise ConfigError("on a cluster, pass an absolute --output-dir on storage that outlives the job "
                              "(a relative one lands in the job's temporary working directory)")
        if not args.storage:
            logging.getLogger(__name__).warning(
                "no --storage: Ray results go to %s/ray_results; with trials on several nodes it must be "
                "shared storage (NFS, s3://, gs://)", args.output_dir)
    else:
        try:
            root = str(check_dataset(data.dataset, data.root, data.download))
        except DataError as err:
            if not args.dry_run:
                raise
            root = None
            local_problems.append(str(err))
        if not args.dry_run:  # what a single run checks before compute, for every trial the study can run
            check_trials_fit(spec, args.workers)
        if args.gpus_per_worker > 0 and not torch.cuda.is_available():
            message = ("--gpus-per-worker needs GPUs, and the local Ray has none (no CUDA device here); "
                       "submit to a GPU cluster (--address or ray job submit)")
            if not args.dry_run:
                raise ConfigError(message)
            local_problems.append(message)
    return root, local_problems


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


def check_ray_address(address: str, timeout: float = 5.0) -> None:
    """ConfigError (one line, within ``timeout``) unless something listens at a ``HOST:PORT`` (or ``ray://``)
    cluster address: ``ray.init`` would retry a dead one for minutes. ``auto`` and job-server URLs are Ray's."""
    target = address.removeprefix("ray://")
    if not target or target == "auto" or "://" in target:
        return
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"--address {address}: expected HOST:PORT (e.g. 127.0.0.1:6379), ray://HOST:PORT or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as err:
        raise ConfigError(f"no Ray cluster answers at {address} ({err.strerror or err}); start one with `ray start "
                          "--head`, or drop --address to run locally") from None


def check_trials_fit(spec: StudySpec, workers: int) -> None:
    """ConfigError (one line) before Ray if a trial of the study could not run on this machine: its device does
    not exist, its batch is larger than its pretraining images, or those images, decoded, exceed the machine's memory
    (each checked at every grid point, seeds aside; DataError for the last)."""
    from dcl_core.config import apply_overrides, check_device
    from dcl_core.data import check_fits_in_memory, pretraining_images
    from dcl_core.study.spec import grid_points
    from dcl_core.training.trainer import steps_per_epoch

    seen = set()
    for grid in spec.grids:
        for point in grid_points({k: v for k, v in grid.items() if k != "seed"}):
            cfg = apply_overrides(spec.base, point)
            dc = cfg.data
            key = (cfg.device, dc.dataset, dc.train_per_class, cfg.optim.batch_size, dc.image_size, dc.loader)
            if key in seen:
                continue
            seen.add(key)
            check_device(cfg.device)
            n = pretraining_images(dc.dataset, dc.root, dc.download, dc.train_per_class)
            if n is not None:
                steps_per_epoch(n, cfg.optim.batch_size, workers)
                if dc.loader == "memory":  # every trial decodes its images into one uint8 tensor
                    check_fits_in_memory(n * 3 * dc.image_size**2, f"{n} {dc.dataset} images at {dc.image_size} px")


def _check_set_not_swept(spec: Any, overrides: dict[str, str]) -> None:
    """``--set`` of a key the study itself sets per trial would be silently overridden: refused; so is an empty
    ``data.root``, which would silently fall back to the default data."""
    if "output_dir" in overrides:
        raise ConfigError("--set output_dir: a study gives every trial its own folder; use --output-dir")
    if "data.root" in overrides and not overrides["data.root"].strip():
        raise ConfigError("--set data.root is empty; name the data folder (or drop it for the default data)")
    swept = set().union(*map(keys_of, spec.grids)) | (keys_of(spec.search) if spec.search else set())
    clash = sorted(swept & set(overrides))
    if clash:
        raise ConfigError(f"--set {clash[0]}: this study sets {clash[0]} per trial (its grid or search space), "
                          "so a fixed value would be ignored; drop it (or use --losses / --seeds / --search)")


def dry_run_lines(spec: StudySpec, options: StudyOptions, args: argparse.Namespace,
                  local_problems: list[str]) -> list[str]:
    """What ``--dry-run`` prints: the trials (grouped by seed), their resources, totals, and the estimated cost
    with its assumptions (:mod:`dcl_core.study.cost`). Times a few training steps; starts nothing."""
    # The models, the trainer and FlopCounterMode: only a dry run needs them, a real run loads them in its trials.
    from dcl_core.study import cost

    res = options.resources
    plans = cost.plan_study(
        spec, res.num_workers,
        sizes_of=lambda c: cost.data_sizes(c.data.dataset, c.data.root, c.data.train_per_class,
                                           c.data.test_per_class),
        flops_of=cost.default_flops_of)
    rates: dict[tuple[Any, ...], cost.Rate] = {}
    for group in (g for plan in plans for g in plan.groups):
        if cost.model_key(group.cfg) not in rates:
            rates[cost.model_key(group.cfg)] = cost.default_rate_of(group.cfg, group.flops, res.num_workers,
                                                                    res.threads)
    cpus = options.num_cpus or os.cpu_count() or 1
    slots = cost.trial_slots(res, cpus, options.max_concurrent)
    est = cost.estimate(plans, {k: r.flops_per_second for k, r in rates.items()}, res.num_workers, slots)
    upto = "at most " if options.asha else ""

    mode = "Optuna search" if spec.search is not None else "grid"
    out = [f"dry run of study {spec.name} (preset {args.preset}, {mode}): nothing was started or written", ""]
    for plan in plans:
        out += _experiment_lines(plan, upto, cost.format_space)
    where = f"this machine's {cpus:g} CPUs" + (" (--num-cpus)" if options.num_cpus else "")
    at_once = f"{slots} trial(s) at a time on {where}" if slots else f"one trial does not fit {where}"
    out += ["", f"resources per trial: {res.num_workers} worker(s) x ({res.cpus_per_worker:g} CPU, "
                f"{res.gpus_per_worker:g} GPU), {res.threads} torch thread(s) per worker; {at_once}"]
    out.append(f"total: {est.trials:,} trials, {upto}{est.epochs:,} epochs, {upto}{est.train_images:,} training "
               f"images (2 views each), kNN evaluations over {upto}{est.eval_images:,} images")
    sources = sorted({g.sizes.source for plan in plans for g in plan.groups})
    out.append(f"images: {'; '.join(sources)}")

    total = est.train_flops + est.eval_flops
    out += ["", f"cost estimate ({'an upper bound, ASHA may stop trials early; ' if upto else ''}from FLOP "
                "counts and a rate measured now, not a measurement of the study; assumptions below):",
            f"  FLOPs: {_si(est.train_flops)}FLOP training + {_si(est.eval_flops)}FLOP kNN = {_si(total)}FLOP"]
    for key, rate in rates.items():
        group = next(g for plan in plans for g in plan.groups if cost.model_key(g.cfg) == key)
        out.append(f"    {cost.describe_model(group.cfg)}: {group.flops.train_view / 1e9:.3g} GFLOP per view "
                   f"forward+backward, {group.flops.backbone_forward / 1e9:.3g} GFLOP per kNN image; CPU rate "
                   f"measured now: {rate.flops_per_second / 1e9:.1f} GFLOP/s ({rate.steps} step(s) of "
                   f"{rate.views} views, {rate.threads} thread(s))")
    if est.wall_seconds is None:
        wall = "no wall-clock estimate: one trial does not fit this machine's CPUs"
    else:
        wall = (f"wall-clock ~ {_minutes(est.wall_seconds)} with {slots} trial(s) at a time, incl. "
                f"{cost.TRIAL_STARTUP_S:g} s start-up per trial")
    out.append(f"  CPU, this machine: {_minutes(est.cpu_seconds)} of compute (all trials, all workers); {wall}")
    out.append(f"  GPU: {est.gpu_hours:.3g} GPU-hours at {cost.GPU_UTILIZATION:.0%} of {cost.GPU_NAME}'s "
               f"{cost.GPU_PEAK_FLOPS / 1e12:g} TFLOP/s (GPU_PEAK_FLOPS x GPU_UTILIZATION in dcl_core/study/cost.py)")
    out += ["assumptions:", *(textwrap.fill(a, 116, initial_indent="  - ", subsequent_indent="    ")
                              for a in cost.assumption_lines())]
    if not slots:
        need = res.num_workers * res.cpus_per_worker + (DDP_TRIAL_CPU if res.num_workers > 1 else 0.0)
        local_problems = [*local_problems, f"one trial needs {need:g} CPUs and the local Ray has {cpus:g} "
                                           "(--num-cpus)"]
    notes = [f"a run on this machine would stop: {p}" for p in local_problems]
    if spec.search is not None:
        notes += [f"searched {k} changes a trial's cost; counted at its base value"
                  for k in cost.costly_search_keys(spec.search)]
    if any(g.cfg.eval.linear for plan in plans for g in plan.groups):
        notes.append("eval.linear: the linear probe after pretraining is not counted")
    if options.resume:
        notes.append("--resume: trials that already finished are counted, though a resume does not rerun them")
    notes.append("not checked by a dry run: the MLflow store (--tracking-uri), --storage, what --resume continues")
    out += ["notes:", *(f"  - {n}" for n in notes)]
    return out


def _experiment_lines(plan: ExperimentPlan, upto: str, format_space: Callable[[Any], str]) -> list[str]:
    """An experiment's trials: a search's samples in one line; a grid's cells one per line (seeds together), or
    a summary of its keys' values when there are more than :data:`MAX_TRIAL_LINES` cells."""
    if plan.search is not None:
        fixed = ", ".join(f"{k}={_value(v)}" for k, v in plan.fixed.items())
        group = plan.groups[0]
        return [f"experiment {plan.name}: Optuna TPE search, {plan.trials} trials sampling "
                f"{format_space(plan.search)}",
                f"  fixed: {fixed or 'nothing'}, {_seeds(group.seeds)}; each trial {_work(group.work, upto)}"]
    seeds = sorted({s for g in plan.groups for s in g.seeds})
    out = [f"experiment {plan.name}: grid, {plan.trials} trials "
           f"({len(plan.groups)} cell(s) x {_seeds(tuple(seeds))})"]
    if len(plan.groups) <= MAX_TRIAL_LINES:
        for g in plan.groups:
            cell = " ".join(f"{k}={_value(v)}" for k, v in g.point.items()) or "(one cell)"
            out.append(f"  {cell}, {_seeds(g.seeds)}: {_work(g.work, upto)}")
        return out
    for key in plan.varied:
        values = list(dict.fromkeys(_value(g.point[key]) for g in plan.groups))
        out.append(f"  {key} in {{{', '.join(values)}}}")
    works: dict[str, int] = {}
    for g in plan.groups:
        works[_work(g.work, upto)] = works.get(_work(g.work, upto), 0) + g.count
    out += [f"  {n} trials: {w}" for w, n in works.items()]
    return out


def _work(work: TrialWork, upto: str) -> str:
    """``8 epochs x 2,496 images, kNN 1x over 3,500 images``."""
    return (f"{upto}{work.epochs} epochs x {work.images_per_epoch:,} images, kNN {work.evaluations}x over "
            f"{work.eval_images:,} images")


def _value(v: Any) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _seeds(seeds: tuple[int, ...]) -> str:
    """``seed 0``, ``seeds 0-2``, ``seeds 0, 5``."""
    if len(seeds) == 1:
        return f"seed {seeds[0]}"
    if list(seeds) == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"seeds {seeds[0]}-{seeds[-1]}"
    return "seeds " + ", ".join(map(str, seeds))


def _si(x: float) -> str:
    """``5.1 T``: a count with an SI prefix (three significant digits)."""
    for exponent, prefix in ((21, "Z"), (18, "E"), (15, "P"), (12, "T"), (9, "G"), (6, "M"), (3, "k")):
        if x >= 10**exponent:
            return f"{x / 10**exponent:.3g} {prefix}"
    return f"{x:.3g} "


def _minutes(seconds: float) -> str:
    """``21.3 min``, and in days too when it is more than one."""
    days = seconds / 86400
    return f"{seconds / 60:,.1f} min" + (f" (~{days:,.1f} days)" if days >= 1 else "")
