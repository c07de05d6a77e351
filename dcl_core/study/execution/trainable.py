"""The Tune trainable: one study trial is one configuration of :func:`dcl_core.training.train`, run
in-process (one worker) or as a Ray Train ``TorchTrainer`` with N DDP workers (gloo on CPU, NCCL on GPU),
reached from the Tune trial through ``TuneReportCallback``, as Ray's Train V2 expects. Reporting goes through
the epoch callbacks of :mod:`dcl_core.study.tracking`."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from ray.train import CheckpointConfig, LoggingConfig, RunConfig, ScalingConfig
from ray.tune.integration.ray_train import TuneReportCallback

from dcl_core.config import CONFIG_KEYS, Config, from_flat_dict
from dcl_core.files import no_space, open_append
from dcl_core.study import tracking
from dcl_core.study.analysis.rows import error_text
from dcl_core.study.execution import memory_loss, trial_failures
from dcl_core.study.execution.ray_env import setup_worker
from dcl_core.study.plan.run_options import Resources

# Fault injection for tests: every trial crashes once at this epoch / every attempt fails before training.
CRASH_ENV = "DCL_CRASH_ONCE_AT_EPOCH"
# ... every attempt holds this much memory after each epoch from this one on ("EPOCH:MiB"), until Ray's memory
# monitor kills it
HOLD_ENV = "DCL_HOLD_MEMORY_FROM_EPOCH"
HOLD_S = 60.0  # the most an attempt holds it (a test whose monitor never fires then sees the trial go on)
FAIL_ENV = "DCL_FAIL_EVERY_ATTEMPT"
FAILURES_FILE = ".failures"  # in the trial directory: the cause of each failed attempt, one per line

log = logging.getLogger(__name__)

# torch, the trainer and Ray Train's torch backend are imported inside the functions below, in the trial's own
# process: the study's driver imports this module only to hand Tune the function, and never trains.


def _run_config(config: dict[str, Any], output_dir: Path, threads: int) -> Config:
    flat = {k: v for k, v in config.items() if k in CONFIG_KEYS}
    flat["output_dir"] = str(output_dir)
    flat["threads"] = threads
    return from_flat_dict(flat)


def trainable(config: dict[str, Any], resources: Resources | None = None, train_storage: str | None = None,
              max_failures: int = 0, memory_losses: dict[str, int] | None = None, verbose: bool = False) -> None:
    """One study trial: one configuration of the core trainer, reporting every epoch to Tune.

    ``train_storage`` (a path or URI every node reaches, e.g. under the study's Ray storage) holds a DDP
    trial's Ray Train run; Train V2 needs shared storage once workers sit on several nodes. ``memory_losses``:
    the times each trial was lost to Ray's memory monitor in this run of the study; a trial lost more often than
    ``max_failures`` (``--max-failures``) reports itself failed instead of training again (:mod:`.memory_loss`).
    ``verbose`` (``-v``): a DDP trial's Ray Train controller and workers log at INFO, as Ray Train does by default;
    otherwise their warnings only, as a one-worker trial's (its trainer's INFO lines reach no console).
    """
    # torch and the trainer (seconds): in the trial's process only, never in the driver that hands Tune this function
    from dcl_core.training import NonFiniteLossError
    from dcl_core.training.checkpoint import CHECKPOINT_NAME  # torch, as the line above

    resources = resources or Resources()
    setup_worker()
    trial_id, trial_dir, work_dir = tracking.trial_context()
    if memory_loss.over_budget(trial_id, memory_losses, max_failures):
        tracking.report_failed({}, memory_loss.CAUSE)
        return
    if resources.num_workers > 1:
        try:
            _fit_ddp(config, resources, trial_id, work_dir, train_storage or str(trial_dir.parent / "_train"), verbose)
        except Exception as err:
            _fail_or_retry(trial_dir, err, {})
        return
    died = trial_failures.previous_death(trial_dir)  # the last attempt's process died of a fatal signal
    if died is not None and _seen_before(trial_dir, died):
        log.info("trial died twice with %s: not retried", died)  # the study's line for the trial names the cause
        tracking.report_failed({}, died)
        return
    cfg = _run_config(config, work_dir / "run", resources.threads)
    resume = tracking.restore_latest_checkpoint(Path(cfg.output_dir) / CHECKPOINT_NAME)
    last = _LastMetrics(crash_marker=trial_dir)
    try:
        with trial_failures.noting_fatal_signals(trial_dir):
            if os.environ.get(FAIL_ENV):
                raise RuntimeError(f"injected failure at every attempt ({FAIL_ENV})")
            _train_or_restart(cfg, [tracking.TuneReporter(), last], resume)
    except NonFiniteLossError as err:
        tracking.report_diverged(last.metrics, str(err))
    except SystemExit as err:  # the trial's code called sys.exit: a failure like any other, named as such
        _fail_or_retry(trial_dir, trial_failures.exit_error(err), last.metrics)
    except Exception as err:
        _fail_or_retry(trial_dir, err, last.metrics)


def _train_or_restart(cfg: Config, callbacks: list[Any], resume: bool) -> None:
    """Train, resuming from the restored checkpoint; if that checkpoint is unreadable (a damaged file on shared
    storage), restart the trial from scratch instead of failing every retry on the same file."""
    from dcl_core.training import train  # torch and the trainer: in the trial's process only (see trainable)
    from dcl_core.training.checkpoint import CHECKPOINT_NAME, CheckpointError  # torch, as the line above

    try:
        train(cfg, callbacks=callbacks, resume=resume)
    except CheckpointError as err:
        if not resume:
            raise
        log.warning("restarting the trial from scratch: its latest checkpoint is unreadable (%s)", err)
        (Path(cfg.output_dir) / CHECKPOINT_NAME).unlink(missing_ok=True)
        train(cfg, callbacks=callbacks, resume=False)


def _fail_or_retry(trial_dir: Path, err: Exception, metrics: dict[str, float]) -> None:
    """Re-raise (Tune retries the trial from its checkpoint, up to --max-failures), unless this trial already
    failed the same way once, or the disk is full: then a retry would only repeat it (bad data, bad config, no
    space), so the trial ends as failed, with the cause in plain text."""
    cause = error_text(err)
    if no_space(err):  # a retry would fail the same way; the driver stops the study (tune_state.DiskFullStop)
        log.error("trial failed: %s", cause)
        tracking.report_failed(metrics, cause)
        return
    if not _seen_before(trial_dir, cause):
        raise err
    log.info("trial failed twice with %s: not retried", cause)  # the study's line for the trial names the cause
    tracking.report_failed(metrics, cause)


def _seen_before(trial_dir: Path, cause: str) -> bool:
    """Record a failed attempt's cause in the trial's :data:`FAILURES_FILE`; whether an earlier attempt had the
    same one."""
    log_file = trial_dir / FAILURES_FILE
    seen = log_file.read_text().splitlines() if log_file.exists() else []
    with open_append(log_file) as f:
        f.write(cause.replace("\n", " ") + "\n")
    return cause.replace("\n", " ") in seen


def _fit_ddp(config: dict[str, Any], resources: Resources, trial_id: str, work_dir: Path, storage: str,
             verbose: bool) -> None:
    from ray.train.torch import TorchTrainer  # imports torch: in the trial's process only (see trainable)

    per_worker: dict[str, float] = {"CPU": resources.cpus_per_worker}
    if resources.gpus_per_worker:
        per_worker["GPU"] = resources.gpus_per_worker
    trainer = TorchTrainer(
        _worker_loop,
        train_loop_config={"config": config, "work_dir": str(work_dir), "threads": resources.threads,
                           "verbose": verbose},
        scaling_config=ScalingConfig(
            num_workers=resources.num_workers,
            use_gpu=resources.gpus_per_worker > 0,
            resources_per_worker=per_worker,
        ),
        # Named per trial so a restarted trial's TorchTrainer resumes from its own checkpoints (Train V2). Its
        # logging_config is Train V2's only (the type checker sees V1's RunConfig, as for the callbacks below).
        run_config=RunConfig(  # type: ignore[call-arg]
            name=f"train-{trial_id}", storage_path=storage,
            # ray.train.RunConfig is Train V2's at run time but Train V1's to a type checker (ray's own gap).
            callbacks=[TuneReportCallback()],  # type: ignore[list-item]
            # Train V2 keeps every checkpoint by default (Tune's num_to_keep does not reach it); resuming needs
            # only the latest.
            checkpoint_config=CheckpointConfig(num_to_keep=1),
            # Ray Train's own INFO lines (resources requested, the worker group, every report) on a quiet console
            logging_config=LoggingConfig(log_level="INFO" if verbose else "WARNING"),
        ),
    )
    trainer.fit()


def _worker_loop(loop_config: dict[str, Any]) -> None:
    """Runs on every Ray Train worker; the process group (gloo/NCCL) is already initialized."""
    # torch and the trainer: in the Train worker's process only (see trainable)
    import torch.distributed as dist

    from dcl_core.training import NonFiniteLossError, train  # torch, as the line above
    from dcl_core.training.checkpoint import CHECKPOINT_NAME  # torch, as the line above

    setup_worker()
    if not loop_config.get("verbose"):
        # Ray Train sets its workers' root logger to INFO, so the trainer's INFO lines and Ray Train's "Reporting
        # training result" (logged under its file's path, not under ray.train) would reach the console: WARNING, as
        # in a one-worker trial (Ray Train's own loggers keep their handlers and the LoggingConfig's level)
        logging.getLogger().setLevel(logging.WARNING)
    rank = dist.get_rank() if dist.is_initialized() else 0
    # Scratch space (the trial's working directory, created on whichever node the worker runs): rank 0 writes
    # checkpoints, which reach the Train run's storage through the report; other ranks only need a place to
    # receive one when resuming.
    work_dir = Path(loop_config["work_dir"])
    out = work_dir / "run" if rank == 0 else work_dir / "run" / f"rank{rank}"
    cfg = _run_config(loop_config["config"], out, loop_config["threads"])
    resume = tracking.restore_latest_checkpoint(out / CHECKPOINT_NAME, in_train_worker=True)
    last = _LastMetrics()
    try:
        train(cfg, callbacks=[tracking.TrainReporter(), last], resume=resume)
    except NonFiniteLossError as err:  # raised on every rank at once (the trainer agrees on it first)
        tracking.report_diverged(last.metrics, str(err), in_train_worker=True)


class _LastMetrics:
    """Epoch callback keeping the last metrics (a diverged trial's final report carries them), and the hook
    of the crash-injection test (:data:`CRASH_ENV`) when given the trial directory to mark."""

    def __init__(self, crash_marker: Path | None = None) -> None:
        self.metrics: dict[str, float] = {}
        self.crash_marker = crash_marker

    def __call__(self, epoch: int, metrics: dict[str, float], checkpoint: Path | None) -> None:
        self.metrics = dict(metrics)
        if self.crash_marker is not None:
            _maybe_crash(self.crash_marker, epoch)
            _maybe_hold_memory(epoch)


def _maybe_crash(trial_dir: Path, epoch: int) -> None:
    at = os.environ.get(CRASH_ENV)
    marker = trial_dir / ".crashed_once"
    if at and epoch == int(at) and not marker.exists():
        marker.write_text("injected")
        raise RuntimeError(f"injected crash at epoch {epoch} ({CRASH_ENV})")


def _maybe_hold_memory(epoch: int) -> None:
    at, _, mib = os.environ.get(HOLD_ENV, "").partition(":")
    if at and epoch >= int(at):
        held = b"\x01" * (int(mib) << 20)  # written, so resident (a zeroed buffer would not be)
        time.sleep(HOLD_S)
        del held
