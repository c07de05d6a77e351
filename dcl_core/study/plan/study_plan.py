"""A study request, prepared once: :func:`prepare_plan` turns a script and its parsed request into a :class:`StudyPlan`,
making every step that needs neither Ray nor the MLflow store, in order, once: the options checked, a resume's or
re-analysis's recorded seeds and design (a moved folder refused), ``--download``'s data, the spec (the script's
science, its question, its sequential design), the trials' data root, ``--until-resolved``'s design, and the
:class:`~dcl_core.study.plan.prepared.PreparedStudy` (user losses, fit, folder, storage, links), which runs or
which ``--dry-run`` prints, prepared the same way. Execution (:mod:`dcl_core.study.execution.rounds`) receives
the plan and nothing else; a round of ``--until-resolved`` is :meth:`StudyPlan.next_round`, not a call back into
the command line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dcl_core.study.plan import design as rounds
from dcl_core.study.plan.args import StudyArgs, StudyRequest
from dcl_core.study.plan.checks import trial_data_root
from dcl_core.study.plan.dry_run import dry_run_lines, estimate_study
from dcl_core.study.plan.prepared import PreparedStudy, prepare_built
from dcl_core.study.plan.run_options import StudyOptions
from dcl_core.study.plan.script import Script
from dcl_core.study.plan.spec import StudySpec, grid_seeds, tune_experiments, with_asha, with_base

if TYPE_CHECKING:
    from dcl_core.study.plan.flops import Rate  # torch: only a dry run's estimate measures a rate

QUESTION_OPTIONS = ("compare", "statistic", "at", "claim", "effect_of_interest")  # what asks a study's question


@dataclass(frozen=True)
class StudyPlan:
    """One study request, prepared: what runs, or what a dry run prints, or which question a re-analysis asks.

    Attributes:
        script: the study script.
        args: the options as the study runs them: a resume's recorded seeds and design, ``--download``'s data root,
            ``--until-resolved``'s planned design.
        spec: the study's spec, validated, with its question, its design and the trials' data root.
        options: how it runs, with the record of its command.
        data_root: the data root the trials read (None: a re-analysis, or data this machine lacks in a dry run).
        study: what runs (None for a dry run and a re-analysis).
        dry_run: the lines ``--dry-run`` prints (empty unless ``--dry-run``).
        recorded: a re-analysis's recorded command (empty otherwise).
    """

    script: Script
    args: StudyArgs
    spec: StudySpec
    options: StudyOptions
    data_root: str | None = None
    study: PreparedStudy | None = None
    dry_run: tuple[str, ...] = ()
    recorded: Mapping[str, Any] = field(default_factory=dict)

    @property
    def another_question(self) -> bool:
        """Whether a re-analysis asks another question than the one the study recorded."""
        return another_question(self.args, self.recorded)

    def next_round(self, seeds: int) -> PreparedStudy:
        """The study at ``seeds`` per cell, a look of its design: a resume of this study that adds the new seeds.
        Only the seeds change, so only the spec is built again (the script's own seed grid); every check made
        when the plan was prepared (folder, storage, user losses, fit) holds for it."""
        assert self.study is not None, "a dry run or a re-analysis has no rounds"
        args = replace(self.args, seeds=seeds)
        spec = replace(self.script.build(args, self.data_root), loss_sources=self.study.spec.loss_sources)
        options = replace(self.study.options, command=self.script.command(args), resume=True, overwrite=False)
        spec = with_asha(spec, options.asha)
        return PreparedStudy(spec, options, tuple(tune_experiments(spec)), self.study.local)


def prepare_plan(script: Script, request: StudyRequest) -> StudyPlan:
    """The plan of ``request``: every check that needs neither Ray nor the MLflow store, made once, in order;
    ConfigError or DataError (one line) for the first that fails, before anything runs or is written."""
    args, recorded = request.args_to_run(script.name, script.path)
    spec = script.build(args, fetch=True)
    if args.reanalyze:  # the stored results only: no data, no GPU, no Ray
        options = replace(request.options, command=script.command(args))
        return StudyPlan(script, args, spec, options, recorded=recorded.command)
    if args.download:  # the release fetched is the data root, as if given with --data-root (so that the same
        args = replace(args, data_root=spec.base.data.root)  # command line resumes the study)
    root, local_problems = trial_data_root(spec, request.options, args.dry_run)
    data_root = str(Path(root).expanduser().resolve()) if root is not None else None
    if data_root is not None:
        spec = with_base(spec, {"data.root": data_root})
    wall_seconds_at: Callable[[int], float | None] = lambda n: None  # noqa: E731
    rates: dict[tuple[Any, ...], Rate] = {}  # the CPU's rate of each model, measured once for every estimate
    if args.until_resolved:
        design, wall_seconds_at = _plan_design(script, args, spec, request.options, data_root, recorded.looks, rates)
        args = replace(args, design=rounds.to_record(design))
        spec = replace(spec, design=design)
    options = replace(request.options, command=script.command(args))  # recorded once its arguments are final
    study = prepare_built(spec, options, dry_run=args.dry_run)  # Script.build validated it
    if args.dry_run:  # what the study would run and cost: no Ray, nothing written
        lines = dry_run_lines(study, args.preset, local_problems, rates)
        if args.until_resolved:
            assert spec.design is not None
            lines += rounds.dry_run_lines(spec.design, args.max_minutes, wall_seconds_at)
        return StudyPlan(script, args, study.spec, options, data_root, dry_run=tuple(lines))
    return StudyPlan(script, args, study.spec, options, data_root, study)


def another_question(args: StudyArgs, recorded: Mapping[str, Any]) -> bool:
    """Whether ``args`` ask a question other than the one a study's ``recorded`` command asked (a record without
    a command, or from before questions were recorded, asks the study's own)."""
    if not recorded:
        return False
    given = args.record("")
    return any((given.get(k) or None) != (recorded.get(k) or None) for k in QUESTION_OPTIONS)


def _plan_design(script: Script, args: StudyArgs, spec: StudySpec, options: StudyOptions, data_root: str | None,
                 looks: tuple[int, ...], rates: dict[tuple[Any, ...], Rate]
                 ) -> tuple[Any, Callable[[int], float | None]]:
    """The ``--until-resolved`` design, fixed before the first look, and the estimated wall-clock seconds of the
    study at ``n`` seeds per cell (what --dry-run's worst case prints); ``looks``: the rounds a resumed study ran;
    ``rates``: the CPU's rates measured so far, shared by every estimate of the plan."""
    def wall_seconds_at(n: int) -> float | None:
        return estimate_study(script.build(replace(args, seeds=n), data_root), options, rates)[2].wall_seconds

    first = len(grid_seeds(spec) or ())
    design = rounds.plan(spec, args.design, args.max_seeds, args.max_minutes, args.seeds_per_round,
                         lambda: (w / first if (w := wall_seconds_at(first)) else None),
                         looks if options.resume else ())
    return design, wall_seconds_at
