"""A prepared study run (:func:`run_plan`): its store checked, Ray's console quieted, its first round and, with
``--until-resolved``, rounds of seeds until every question is settled either way or a cap is hit
(:func:`until_resolved`), under the design the plan fixed (:mod:`dcl_core.study.plan.design`); Ray ended before the
answer is printed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from dcl_core.study.analysis.sequential import Design
from dcl_core.study.execution import ray_env
from dcl_core.study.plan.run_options import VERBOSE
from dcl_core.study.plan.spec import grid_seeds
from dcl_core.study.plan.study_plan import StudyPlan

if TYPE_CHECKING:
    from dcl_core.study.execution.results import StudyOutcome


def run_plan(plan: StudyPlan, say: Callable[[str], None]) -> StudyOutcome:
    """Run the study ``plan`` prepared (its rounds with ``--until-resolved``; ``say`` prints a look's lines and why
    the rounds stopped) and return its last outcome. ConfigError (one line) for an unusable MLflow store, before
    Ray starts."""
    study = plan.study
    assert study is not None, "a dry run or a re-analysis runs nothing"
    verbosity = study.options.verbosity
    # Ray's token mode and Tune's threshold are read when Ray is first imported: set them before
    if study.local:  # a local Ray: ask for its token mode
        ray_env.request_token_auth()
    else:  # a cluster: send the token at hand, which it may require
        ray_env.request_token_auth_to_attach()
    if verbosity < VERBOSE:
        ray_env.quiet_slow_loop_warnings()
    # Ray, Optuna and MLflow take seconds to import: bad input was refused before, and a --help never pays them
    from dcl_core.study.execution.trial_failures import quiet_ray_lines  # Ray: as above
    from dcl_core.study.execution.tuning import end_ray, run_study  # Ray, Optuna, MLflow: as above
    from dcl_core.study.tracking import check_store_in_folder, preflight  # MLflow: as above
    if plan.options.tracking_uri:  # a bad or unreachable MLflow store: one line now, not minutes after Ray starts
        preflight(plan.options.tracking_uri)
    # a copied or moved folder's store would write to the original's folders
    check_store_in_folder(study.tracking_uri, study.options.output_dir)
    # Ray's own lines stay off the console (not with -v) from the first round to the end of Ray, which comes before
    # the answer is printed: nothing Ray forwards can follow the verdict
    begun = time.monotonic()
    with quiet_ray_lines(verbosity < VERBOSE):
        outcome = run_study(study)
        if plan.args.until_resolved:
            assert plan.spec.design is not None
            outcome, why = until_resolved(outcome, plan.spec.design, len(grid_seeds(plan.spec) or ()),
                                          time.monotonic() - begun, plan.args.max_minutes,
                                          lambda n: run_study(plan.next_round(n)), say)
            say(why)
            say("")
        end_ray(verbosity)
    return outcome


def until_resolved(outcome: StudyOutcome, design: Design, seeds: int, first_seconds: float,
                   max_minutes: float | None,
        next_round: Callable[[int], StudyOutcome], say: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic) -> tuple[StudyOutcome, str]:
    """Run rounds after the first look (``outcome``, at ``seeds`` per cell, which took ``first_seconds``) until
    resolved or capped; returns the last outcome and why it stopped. ``next_round(n)`` runs the study with ``n``
    seeds per cell (a resume that adds the new seeds); ``say`` prints a look's lines. The time cap counts from
    the first round's start: a round is not started when, at the last round's pace per seed, it would end later."""
    started = clock() - first_seconds
    round_seconds, round_seeds = first_seconds, seeds
    looks = design.looks
    while True:
        spent = (clock() - started) / 60
        look = sum(n <= seeds for n in looks)
        say("")
        say(f"look {look} of {len(looks)}: {seeds} seeds per cell, {spent:.1f} min"
            + (f" of {max_minutes:g}" if max_minutes is not None else "") + " spent")
        for line in [*outcome.verdicts, *outcome.power]:
            say(f"  {line}")
        if outcome.resolved:
            return outcome, f"stopped: every question settled at {seeds} seeds per cell (look {look})"
        if seeds >= design.max_seeds:
            return outcome, f"stopped: not resolved at the last look ({design.max_seeds} seeds per cell, --max-seeds)"
        add = next((n for n in looks if n > seeds), design.max_seeds) - seeds  # to the next look
        pace = round_seconds / max(round_seeds, 1) * add
        if max_minutes is not None and spent * 60 + pace > max_minutes * 60:
            return outcome, (f"stopped: not resolved at {seeds} seeds per cell; the next round (~{pace / 60:.1f} min) "
                             f"would end after --max-minutes {max_minutes:g} ({spent:.1f} min spent)")
        begun = clock()
        outcome = next_round(seeds + add)
        round_seconds, round_seeds, seeds = clock() - begun, add, seeds + add

