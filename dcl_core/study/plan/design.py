"""``--until-resolved``'s design, planned before the first round (no Ray): its caps checked, its looks fixed, what
``--dry-run`` prints of it. :mod:`dcl_core.study.execution.rounds` runs the rounds.

A question is settled when its verdict is anything but "not resolved": its interval excludes 0 (supports or
contradicts the paper) or its futility bound excludes the effect of interest δ, a paper's δ with its table's
rounding (rules out the paper's size). The verdicts are looked at after every round under a group-sequential design
(:class:`~dcl_core.study.analysis.sequential.GroupSequential`: 6 looks equally spaced from the study's seeds to the
last look, or one every ``--seeds-per-round``): all looks together end at most 5% of null studies supporting or
contradicting the paper, and at most 5% of studies whose truth is δ ruling δ out. The design (first look, last
look, looks, boundary) is fixed before the first look and recorded with the study, so a resume continues it and a
re-analysis reproduces its intervals; a study recorded under an earlier design keeps it (the first group-sequential
boundary, Pocock's with 4% on the paper's side; or Pocock's design with a look every round,
:class:`~dcl_core.study.analysis.sequential.Sequential`). ``--max-minutes`` only stops early, which removes
looks and can only lower the error rates; without ``--max-seeds`` the last look is planned from the cost estimate
(what ``--dry-run`` prints).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

from dcl_core.config import ConfigError
from dcl_core.study.analysis.sequential import GROUP_LOOKS, MAX_SEEDS_PROJECTED, Design, GroupSequential
from dcl_core.study.plan.record import (  # the design as a study records it, kept with the record: re-exported
    RECORDED_BOUNDARY,
    from_record,
    to_record,
)
from dcl_core.study.plan.spec import StudySpec, grid_seeds

__all__ = ["RECORDED_BOUNDARY", "ROUND_OVERHEAD_S", "check_caps", "check_within", "dry_run_lines", "from_record",
           "plan", "to_record"]

log = logging.getLogger(__name__)

MAX_MINUTES = 60 * 24 * 365  # a year: more is a typo
# looks of a design: the boundary is simulated once per design, over this many seeds; also the most seeds per cell a
# power line projects, so it never advises more than this can run
MAX_SEEDS_PLANNED = MAX_SEEDS_PROJECTED
# What a round costs beyond its trials: a new Tune experiment, the summary, the MLflow summary run (measured:
# 5-6 s per round of the smoke study on 2 cores).
ROUND_OVERHEAD_S = 8.0


def check_caps(until_resolved: bool, max_seeds: int | None, max_minutes: float | None,
               seeds_per_round: int | None, reanalyze: bool, search: str) -> None:
    """One-line errors for the round options, before anything runs."""
    caps = {"--max-seeds": max_seeds, "--max-minutes": max_minutes, "--seeds-per-round": seeds_per_round}
    if not until_resolved:
        given = [k for k, v in caps.items() if v is not None]
        if given:
            raise ConfigError(f"{given[0]} caps --until-resolved; add --until-resolved (or drop {given[0]})")
        return
    if reanalyze or search != "grid":
        raise ConfigError("--until-resolved adds seeds to a grid study's cells: "
                          + ("--reanalyze trains nothing (it re-uses a study's recorded design by itself)"
                             if reanalyze else "an Optuna search has no seed grid"))
    if max_seeds is None and max_minutes is None:
        raise ConfigError("--until-resolved needs a cap: --max-seeds N and/or --max-minutes M")
    if max_minutes is not None and not 0 < max_minutes <= MAX_MINUTES:
        raise ConfigError(f"--max-minutes must be in (0, {MAX_MINUTES}], got {max_minutes:g}")
    if seeds_per_round is not None and seeds_per_round < 1:
        raise ConfigError(f"--seeds-per-round must be >= 1, got {seeds_per_round}")


def check_within(design: Design | None, seeds: int | None) -> None:
    """A study run under a sequential design cannot be extended past its last look (that look's boundary was set
    for no more looks), nor to seeds between its looks: every round's summary is a look, and one the design did
    not plan spends error it did not count (and the record could no longer tell the design from a forged one)."""
    if design is None or seeds is None:
        return
    if seeds > design.max_seeds:
        raise ConfigError(f"this study adds seeds under a sequential design that ends at {design.max_seeds} seeds "
                          f"per cell; --seeds {seeds} would look beyond it and void its 5% guarantee (--overwrite "
                          "to start a new design)")
    if seeds not in design.looks:
        raise ConfigError(f"this study adds seeds under a sequential design with looks at "
                          f"{', '.join(map(str, design.looks))} seeds per cell; --seeds {seeds} would look between "
                          "them and void its 5% guarantee (--until-resolved continues it look by look; --overwrite "
                          "starts a new design)")


def plan(spec: StudySpec, recorded_design: Any, max_seeds: int | None, max_minutes: float | None,
         seeds_per_round: int | None, seconds_per_seed: Callable[[], float | None],
         looks_ran: Sequence[int] = ()) -> Design:
    """The design of this ``--until-resolved`` run: the recorded one when it continues one (a changed
    ``--max-seeds`` or ``--seeds-per-round`` refused), else a :class:`GroupSequential` design with its first look
    at the study's seeds, 6 looks (or one every ``--seeds-per-round``), the last at ``--max-seeds`` or at the seeds
    the cost estimate fits in ``--max-minutes``. ``looks_ran``: the seeds per cell after each round a resumed study
    already ran (:class:`~dcl_core.study.plan.record.RecordedStudy`'s ``looks``); a new design must count each of
    them as one of its looks (they printed verdicts), so it can begin only at the study's first look."""
    seeds = grid_seeds(spec)
    if not seeds:
        raise ConfigError("--until-resolved adds seeds to a grid study's cells, and this study has no seed grid")
    recorded = from_record(recorded_design)
    if recorded is not None:
        for flag, mine, theirs in (("--max-seeds", max_seeds, recorded.max_seeds),
                                   ("--seeds-per-round", seeds_per_round, recorded.step)):
            if mine is not None and mine != theirs:
                raise ConfigError(f"--resume continues the study's sequential design ({flag} {theirs}); its looks "
                                  f"were fixed before the first one, so {flag} {mine} is refused")
        return recorded
    first = len(seeds)
    if first < 2:
        raise ConfigError("--until-resolved needs an interval at its first look: start with --seeds 2 or more")
    last = max_seeds
    if last is None:
        per_seed = seconds_per_seed()
        if per_seed is None:
            raise ConfigError("--max-minutes alone needs a cost estimate, and one trial does not fit this machine; "
                              "give --max-seeds")
        budget = (max_minutes or 0) * 60
        if seeds_per_round is None:  # GROUP_LOOKS - 1 rounds after the first look
            budget -= ROUND_OVERHEAD_S * (GROUP_LOOKS - 1)
        else:
            per_seed += ROUND_OVERHEAD_S / seeds_per_round
        last = max(first, min(MAX_SEEDS_PLANNED, math.floor(budget / per_seed)))
        log.info("sequential design: last look at %d seeds per cell, what ~%.1f min per seed (estimated) fits in "
                 "--max-minutes %g; --max-seeds fixes it", last, per_seed / 60, max_minutes)
    if last < first:
        raise ConfigError(f"--max-seeds {last} is below the first look's {first} seeds per cell")
    if last > MAX_SEEDS_PLANNED:
        raise ConfigError(f"--max-seeds must be at most {MAX_SEEDS_PLANNED}, got {last}")
    design = GroupSequential(first, last, step=seeds_per_round)
    earlier = [n for n in looks_ran if n != first]
    if earlier:
        raise ConfigError(f"--until-resolved fixes its design before the study's first look, and this study has "
                          f"already looked at {', '.join(map(str, earlier))} seeds per cell without one (its "
                          f"seed_rounds): a design begun now at {first} would not count those looks. Resume it "
                          "without --until-resolved, or start afresh with --overwrite")
    return design


def dry_run_lines(design: Design, max_minutes: float | None, wall_seconds_at: Callable[[int], float | None]
                  ) -> list[str]:
    """What ``--dry-run --until-resolved`` adds: the looks, the nominal level, and the worst case (every look
    unresolved) in seeds per cell and estimated minutes, and where ``--max-minutes`` cuts it."""
    looks = design.looks
    worst = wall_seconds_at(design.max_seeds)
    worst = None if worst is None else worst + ROUND_OVERHEAD_S * (len(looks) - 1)
    cost = "no wall-clock estimate" if worst is None else f"~{worst / 60:,.1f} min on this machine (estimated)"
    out = ["", f"until resolved: {design.describe()}",
           f"  worst case (no look resolves): {design.max_seeds} seeds per cell, {cost}"]
    if max_minutes is not None:
        out.append(f"  --max-minutes {max_minutes:g} stops it before any round that would end later")
    return out
