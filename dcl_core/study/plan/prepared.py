"""A study prepared to run: its spec validated and set for ASHA, its options resolved (absolute output folder,
Ray storage, MLflow store), its Tune experiments and every check that needs no Ray made, once, before Ray starts.
:func:`dcl_core.study.execution.tuning.run_study` consumes it without calling back into planning."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path

from dcl_core.config import LossSource, loss_reference
from dcl_core.losscheck.isolation import preflight_isolated
from dcl_core.study.plan.run_options import StudyOptions
from dcl_core.study.plan.spec import StudySpec, TuneExperiment, grid_points, tune_experiments, validate_spec, with_asha
from dcl_core.study.plan.storage import check_output, check_output_dir, study_entries, summary_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PreparedStudy:
    """One study (or one round of ``--until-resolved``), checked and resolved."""

    spec: StudySpec  # validated, as it runs (ASHA: kNN every epoch)
    options: StudyOptions  # resolved: storage and tracking_uri are set
    experiments: tuple[TuneExperiment, ...]
    local: bool  # a local Ray (no --address, no $RAY_ADDRESS)

    @property
    def storage(self) -> str:
        """The Ray storage path or URI."""
        assert self.options.storage is not None
        return self.options.storage

    @property
    def tracking_uri(self) -> str:
        """The MLflow store."""
        assert self.options.tracking_uri is not None
        return self.options.tracking_uri

    @property
    def summary_dir(self) -> Path:
        """``OUTPUT_DIR/summary/<study>``."""
        return summary_dir(self.options.output_dir, self.spec.name)


def prepare(spec: StudySpec, options: StudyOptions) -> PreparedStudy:
    """The study ``spec`` and ``options`` ask for, checked before Ray starts: ConfigError (one line) for a bad spec
    (:func:`~dcl_core.study.plan.spec.validate_spec`), then as :func:`prepare_built`. The entry for a spec made by
    hand; a study script's plan, whose build has validated its spec, calls :func:`prepare_built`."""
    validate_spec(spec)
    return prepare_built(spec, options)


def prepare_built(spec: StudySpec, options: StudyOptions, *, dry_run: bool = False) -> PreparedStudy:
    """A validated ``spec`` prepared to run with ``options``, checked before Ray starts: ConfigError (one line)
    for ``--asha`` on a grid sweep, a trial no local Ray could fit, an unusable output folder or storage, a link
    where the study writes, or (last: it takes seconds) a user loss that fails its pre-flight. ``dry_run``: the
    study a dry run prints, prepared the same way but for what its printout reports rather than refuses (a trial
    the local Ray cannot fit) or leaves unchecked (the Ray storage, links in the folder): nothing is created either
    way."""
    knn_every = spec.base.eval.knn_every
    spec = with_asha(spec, options.asha)
    if spec.base.eval.knn_every != knn_every and not dry_run:
        log.info("ASHA: measuring kNN every epoch (eval.knn_every %d -> 1)", knn_every)
    local = options.cluster is None
    if local and not dry_run:
        options.resources.check_fits(options.num_cpus or os.cpu_count() or 1)
    options = options.resolved()
    assert options.storage is not None
    experiments = tuple(tune_experiments(spec))
    if dry_run:
        check_output_dir(options.output_dir)
    else:
        check_output(options.output_dir, options.storage, study_entries(spec.name, (e.name for e in experiments)))
    spec = replace(spec, loss_sources=check_user_losses(spec))  # last: a process of its own, seconds
    return PreparedStudy(spec, options, experiments, local)


def check_user_losses(spec: StudySpec) -> tuple[LossSource, ...]:
    """Each user loss the study names (``--losses my_losses:MyLoss``) and what it is made of (its sources and their
    hashes, :func:`~dcl_core.losses.user.loss_sources`); an
    InputError (one line) unless it imports, takes its arguments and gives a finite loss and gradient on a small
    batch (:func:`~dcl_core.losscheck.isolation.preflight_isolated`, in a process of its own, within a time bound):
    found before Ray starts, not in every trial. ``python -m dcl_core.losses check`` checks the rest of
    what the built-in losses are tested for."""
    names = {spec.base.loss.name} | {str(v) for grid in spec.grids for point in grid_points(grid)
                                      for k, v in point.items() if k == "loss.name"}
    users = sorted(n for n in names if loss_reference(n) is not None)
    if not users:
        return ()
    from dcl_core.losses.user import loss_sources  # torch: only for a study that names a user loss

    for name in users:  # in a process of its own: the user's code can neither end nor hang the study
        preflight_isolated(name, spec.base.loss.params)
    return tuple(loss_sources(name) for name in users)
