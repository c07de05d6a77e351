"""How one invocation of a study runs: :class:`StudyOptions`, where its results go, the resources of a trial, resume
or overwrite. Each field that is a study option is declared here once, with its flag and help
(:func:`~dcl_core.study.plan.option_fields.option`): the command line's parser reads them beside
:class:`~dcl_core.study.plan.args.StudyArgs`'s, which holds them as its ``run``.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from dcl_core.config import ConfigError
from dcl_core.files import real_path
from dcl_core.study.plan.option_fields import RESOURCES, WHAT, WHERE, option
from dcl_core.study.plan.storage import absolute_storage, default_tracking_uri, redact_uri

DDP_TRIAL_CPU = 0.01  # what a DDP trial reserves itself: it only drives a TorchTrainer, whose workers hold CPUs
MAX_FAILURES = 20  # retries of a crashed trial; more is a loop, not resilience
QUIET, PROGRESS, VERBOSE = 0, 1, 2  # a study's console (-q, default, -v): dcl_core.study.execution.console
# the flags that set StudyOptions.verbosity, and their help
VERBOSITY_FLAGS = (
    ("-v", "--verbose", VERBOSE, "Ray Tune's status tables and the trials' own logs (default: a progress line and "
                                 "one line per finished trial)"),
    ("-q", "--quiet", QUIET, "print only the answer (table and verdicts)"),
)


@dataclass(frozen=True)
class Resources:
    """What one trial uses: ``num_workers`` DDP workers, each with these CPUs/GPUs."""

    num_workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0

    @property
    def threads(self) -> int:
        """Torch intra-op threads of each worker: its whole CPUs (at least one)."""
        return max(1, math.floor(self.cpus_per_worker))

    def check_fits(self, cpus: float) -> None:
        """ConfigError unless one trial fits a local Ray of ``cpus`` CPUs (else it would wait forever)."""
        own = DDP_TRIAL_CPU if self.num_workers > 1 else 0.0
        need = self.num_workers * self.cpus_per_worker + own
        if need > cpus + 1e-9:
            fit = math.floor((cpus - own) / self.num_workers * 100) / 100
            hint = f"--cpus-per-worker {fit:g}" if fit >= 0.01 else "fewer --workers"
            raise ConfigError(
                f"one trial needs {need:g} CPUs ({self.num_workers} worker(s) x {self.cpus_per_worker:g}"
                f"{f' + {own:g} for the trial itself' if own else ''}) but the local Ray has {cpus:g} (--num-cpus); "
                f"use {hint}")

    def trial_resources(self) -> dict[str, float]:
        """Tune's resource request for one trial (a DDP trial's driver takes a fixed CPU share)."""
        if self.num_workers <= 1:
            return {"cpu": self.cpus_per_worker, "gpu": self.gpus_per_worker}
        return {"cpu": DDP_TRIAL_CPU}


@dataclass(frozen=True)
class StudyOptions:
    """How one invocation of a study runs: where results go, resources, resume. Each field but ``search_seed``,
    ``verbosity`` (``-v``/``-q``) and ``command`` is the study option of the same name (``--max-failures`` ->
    ``max_failures``), declared here once: its default, flag and help. :meth:`resolved` fills in the defaults that
    depend on ``output_dir``. :meth:`to_json_dict` is recorded next to the summary (the record's options: how the
    study ran, each option once; its ``command`` records the rest), and a ``--resume`` must match it in every field
    declared ``fixed_on_resume``."""

    output_dir: Path = option(Path("outputs"), "--output-dir", WHERE)  # its flag: dcl_core.cli_common's store options
    tracking_uri: str | None = option(None, None, WHERE, fixed_on_resume=True)  # with --output-dir's
    storage: str | None = option(None, "--storage", WHERE, "Ray storage path or URI (default: OUTPUT_DIR/ray_results)",
                                 fixed_on_resume=True)
    resume: bool = option(False, "--resume", WHERE, "continue an interrupted study from its storage; with a larger "
                          "--seeds, extend a finished study by the new seeds only")
    overwrite: bool = option(False, "--overwrite", WHERE, "delete an existing study of the same name first")
    save_checkpoints: bool = option(False, "--save-checkpoints", WHERE, "log each trial's final checkpoint to MLflow",
                                    fixed_on_resume=True)
    workers: int = option(1, "--workers", RESOURCES, "DDP workers per trial (TorchTrainer when > 1)",
                          fixed_on_resume=True)
    cpus_per_worker: float = option(1.0, "--cpus-per-worker", RESOURCES, "CPUs per worker; also its torch threads")
    # the command line's None: the preset's (dcl_core.study.plan.args.GPU_PRESET)
    gpus_per_worker: float = option(0.0, "--gpus-per-worker", RESOURCES, "GPUs per worker (default: 1 with --preset "
                                    "paper, the papers' GPU protocol; else 0)")
    max_concurrent: int | None = option(None, "--max-concurrent", RESOURCES, "cap on concurrent trials")
    asha: bool = option(False, "--asha", WHAT, "early-stop poor Optuna trials with ASHA", fixed_on_resume=True)
    max_failures: int = option(2, "--max-failures", RESOURCES, "retries of a crashed trial")
    search_seed: int = option(0, None, None)  # an Optuna search's sampler's (TPE) seed: a trial's own is its config's
    address: str | None = option(None, "--address", RESOURCES, "Ray cluster address (default: local, or $RAY_ADDRESS)")
    num_cpus: int | None = option(None, "--num-cpus", RESOURCES, "CPUs for a local Ray (default: all)")
    # QUIET: only the answer (-q); PROGRESS: a progress line and a line per trial; VERBOSE: Ray Tune's tables and
    # Ray's own messages (-v): VERBOSITY_FLAGS
    verbosity: int = option(PROGRESS, None, None)
    command: dict[str, Any] | None = option(None, None, None)  # the study script and the options that built its spec

    def __post_init__(self) -> None:
        if self.workers < 1 or not 0 < self.cpus_per_worker < math.inf or not 0 <= self.gpus_per_worker < math.inf:
            raise ConfigError("--workers must be >= 1, --cpus-per-worker > 0 and --gpus-per-worker >= 0")
        if self.resume and self.overwrite:
            raise ConfigError("--resume and --overwrite exclude each other")
        if not 0 <= self.max_failures <= MAX_FAILURES:
            raise ConfigError(f"--max-failures must be in [0, {MAX_FAILURES}], got {self.max_failures}")
        if self.num_cpus is not None and self.num_cpus < 1:
            raise ConfigError(f"--num-cpus must be >= 1, got {self.num_cpus}")
        if self.max_concurrent is not None and self.max_concurrent < 1:
            raise ConfigError(f"--max-concurrent must be >= 1, got {self.max_concurrent}")

    @property
    def cluster(self) -> str | None:
        """The Ray cluster the study attaches to (``--address``, else ``$RAY_ADDRESS``), or None: a local Ray."""
        return self.address or os.environ.get("RAY_ADDRESS") or None

    @property
    def resources(self) -> Resources:
        """The per-trial resources these options ask for."""
        return Resources(self.workers, self.cpus_per_worker, self.gpus_per_worker)

    def resolved(self) -> StudyOptions:
        """Absolute output folder; Ray storage and MLflow store defaulting to folders inside it."""
        out = real_path(self.output_dir)
        return replace(
            self, output_dir=out,
            storage=absolute_storage(self.storage) if self.storage else str(out / "ray_results"),
            tracking_uri=self.tracking_uri or default_tracking_uri(out),
        )

    def to_json_dict(self) -> dict[str, Any]:
        """The options as stored next to the summary; credentials in a tracking URI are redacted."""
        out = {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}
        if out["tracking_uri"]:
            out["tracking_uri"] = redact_uri(out["tracking_uri"])
        return out

    def check_resume(self, before: dict[str, Any]) -> None:
        """ConfigError naming the first ``fixed_on_resume`` option that differs from ``before`` (the
        :meth:`to_json_dict` the study started with)."""
        now = self.to_json_dict()
        for f in fields(self):
            if f.metadata.get("fixed_on_resume") and f.name in before and before[f.name] != now[f.name]:
                raise ConfigError(f"--resume must use the options the study started with: {f.name} was "
                                  f"{before[f.name]!r}, now {now[f.name]!r}")
