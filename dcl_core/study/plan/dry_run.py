"""``--dry-run``: what a study would run, with its resources, totals and estimated cost (:mod:`.cost`), as lines;
nothing started or written."""

from __future__ import annotations

import os
import textwrap
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dcl_core.study.analysis.columns import fmt_x
from dcl_core.study.plan.run_options import DDP_TRIAL_CPU, StudyOptions
from dcl_core.study.plan.spec import StudySpec
from dcl_core.study.plan.storage import storage_exists, storage_join

if TYPE_CHECKING:
    from dcl_core.study.plan.cost import Estimate, ExperimentPlan, TrialWork
    from dcl_core.study.plan.flops import Rate
    from dcl_core.study.plan.prepared import PreparedStudy

MAX_TRIAL_LINES = 16  # a dry run lists an experiment's cells one per line up to this many, else summarizes them


def dry_run_lines(study: PreparedStudy, preset: str, local_problems: list[str],
                  rates: dict[tuple[Any, ...], Rate] | None = None) -> list[str]:
    """What ``--dry-run`` prints of the ``study`` its plan prepared: the trials (grouped by seed), their resources,
    totals, the estimated cost with its assumptions (:mod:`dcl_core.study.plan.cost`), and a note when the study
    already has output where it would write. Times a few training steps (each model's once, kept in ``rates`` when
    given); starts nothing."""
    from dcl_core.study.plan import cost  # its FLOP counts import torch: only for a dry run

    spec, options = study.spec, study.options
    plans, rates, est, slots = estimate_study(spec, options, rates)
    res, cpus = options.resources, options.num_cpus or os.cpu_count() or 1
    upto = "at most " if options.asha else ""

    mode = "Optuna search" if spec.search is not None else "grid"
    out = [f"dry run of study {spec.name} (preset {preset}, {mode}): nothing was started or written", ""]
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
    out.append(f"writes: {options.output_dir} (--output-dir)")
    for q in spec.questions:  # what the answer will say something of (the user's own claim, or the paper's)
        whose = "your claim" if q.own else "the paper's claim"
        out.append(f"asks: {q.claim} ({q.statistic.name}, {q.better} vs {q.base or q.better}; {whose})")

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
               f"{cost.GPU_PEAK_FLOPS / 1e12:g} TFLOP/s (GPU_PEAK_FLOPS x GPU_UTILIZATION in study/plan/cost.py)")
    out += ["assumptions:", *(textwrap.fill(a, 116, initial_indent="  - ", subsequent_indent="    ")
                              for a in cost.assumption_lines())]
    if not slots:
        need = res.num_workers * res.cpus_per_worker + (DDP_TRIAL_CPU if res.num_workers > 1 else 0.0)
        local_problems = [*local_problems, f"one trial needs {need:g} CPUs and the local Ray has {cpus:g} "
                                           "(--num-cpus)"]
    return [*out, "notes:", *(f"  - {n}" for n in _notes(spec, options, plans, local_problems)),
            *_existing_study_lines(study)]


def _existing_study_lines(study: PreparedStudy) -> list[str]:
    """A dry run's note that the study already has output where the real run would write (which refuses it
    without --resume or --overwrite)."""
    existing = [u for u in (storage_join(study.storage, e.name) for e in study.experiments) if storage_exists(u)]
    if not existing or study.options.resume or study.options.overwrite:
        return []
    return ["", f"note: study output exists at {existing[0]}: this command would be refused; add --resume to "
                "continue it (with a larger --seeds: only its new seeds run) or --overwrite to replace it"]


def _notes(spec: StudySpec, options: StudyOptions, plans: list[ExperimentPlan], local_problems: list[str]
           ) -> list[str]:
    """A dry run's notes: what would stop a run here, what the estimate leaves out, what a verdict will lack."""
    from dcl_core.study.plan import cost  # its FLOP counts import torch: only for a dry run

    notes = [f"a run on this machine would stop: {p}" for p in local_problems]
    if spec.search is not None:
        notes += [f"searched {k} changes a trial's cost; counted at its base value"
                  for k in cost.costly_search_keys(spec.search)]
    if any(g.cfg.eval.linear for plan in plans for g in plan.groups):
        notes.append("eval.linear: the linear probe after pretraining is not counted")
    fewest = min((len(g.seeds) for plan in plans for g in plan.groups), default=0)
    if fewest == 1 and spec.questions:
        notes.append("1 seed per cell: the verdict will have no interval, and so cannot resolve (--seeds 2 or more "
                     "gives one)")
    if options.resume:
        notes.append("--resume: trials that already finished are counted, though a resume does not rerun them")
    notes.append("not checked by a dry run: the MLflow store (--tracking-uri), --storage, what --resume continues")
    return notes


def estimate_study(spec: StudySpec, options: StudyOptions, rates: dict[tuple[Any, ...], Rate] | None = None
                   ) -> tuple[list[ExperimentPlan], dict[tuple[Any, ...], Rate], Estimate, int]:
    """(the plans, each model's CPU rate measured now, the cost estimate, trials at a time) of ``spec`` run with
    ``options`` on this machine (:mod:`dcl_core.study.plan.cost`). Times a few training steps of each model whose
    rate ``rates`` does not hold yet, and adds it there (one plan's estimates share one measurement); starts
    nothing."""
    # The models, the trainer and FlopCounterMode: only an estimate needs them, a real run loads them in its trials.
    from dcl_core.study.plan import cost, flops

    res = options.resources
    plans = cost.plan_study(
        spec, res.num_workers,
        sizes_of=lambda c: cost.data_sizes(c.data.dataset, c.data.root, c.data.train_per_class,
                                           c.data.test_per_class),
        flops_of=flops.default_flops_of)
    rates = {} if rates is None else rates
    for group in (g for plan in plans for g in plan.groups):
        if cost.model_key(group.cfg) not in rates:
            rates[cost.model_key(group.cfg)] = flops.default_rate_of(group.cfg, group.flops, res.num_workers,
                                                                     res.threads)
    slots = cost.trial_slots(res, options.num_cpus or os.cpu_count() or 1, options.max_concurrent)
    est = cost.estimate(plans, {k: r.flops_per_second for k, r in rates.items()}, res.num_workers, slots)
    return plans, rates, est, slots


def _experiment_lines(plan: ExperimentPlan, upto: str, format_space: Callable[[Any], str]) -> list[str]:
    """An experiment's trials: a search's samples in one line; a grid's cells one per line (seeds together), or
    a summary of its keys' values when there are more than :data:`MAX_TRIAL_LINES` cells."""
    if plan.search is not None:
        fixed = ", ".join(f"{k}={fmt_x(v)}" for k, v in plan.fixed.items())
        group = plan.groups[0]
        return [f"experiment {plan.name}: Optuna TPE search, {plan.trials} trials sampling "
                f"{format_space(plan.search)}",
                f"  fixed: {fixed or 'nothing'}, {_seeds(group.seeds)}; each trial {_work(group.work, upto)}"]
    seeds = sorted({s for g in plan.groups for s in g.seeds})
    out = [f"experiment {plan.name}: grid, {plan.trials} trials "
           f"({len(plan.groups)} cell(s) x {_seeds(tuple(seeds))})"]
    if len(plan.groups) <= MAX_TRIAL_LINES:
        for g in plan.groups:
            cell = " ".join(f"{k}={fmt_x(v)}" for k, v in g.point.items()) or "(one cell)"
            out.append(f"  {cell}, {_seeds(g.seeds)}: {_work(g.work, upto)}")
        return out
    for key in plan.varied:
        values = list(dict.fromkeys(fmt_x(g.point[key]) for g in plan.groups))
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
