"""One pretraining run: SGD + warm-up/cosine, per-epoch kNN monitor, atomic checkpoints, resume, DDP.

Device-agnostic: CPU here, CUDA (AMP, NCCL, SyncBN) on a GPU machine, DDP when launched by torchrun or inside
a Ray Train worker (the process group then already exists). Reporting goes through :class:`EpochCallback`s so
this module never imports Ray or MLflow.

Read top to bottom: :func:`train` joins the process group; :func:`_train` builds the run
(:func:`~dcl_core.training.run_setup.build_run`), restores it (:func:`_restore`) and loops over epochs:
:func:`_train_one_epoch` fills an :class:`EpochStats`, which gives the epoch's metrics; then the kNN monitor when
due, the checkpoint, the log line and the callbacks.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist

from dcl_core import files
from dcl_core import metric_names as M
from dcl_core.config import Config, RunFailedError, loss_label, to_flat_dict
from dcl_core.training.checkpoint import (
    check_resumable,
    framework_state,
    load_checkpoint,
    load_framework_state,
    save_checkpoint,
)
from dcl_core.training.epoch import EpochStats, StepProgress, grad_norm
from dcl_core.training.probes import evaluate_knn, linear_eval
from dcl_core.training.run_setup import Run, build_run, unwrap
from dcl_core.training.runtime import Runtime, broadcast_from_rank0, setup_runtime
from dcl_core.training.schedule import cosine_lr

log = logging.getLogger(__name__)

METRICS_NAME = "metrics.jsonl"


class NonFiniteLossError(RunFailedError):
    """The training loss became NaN or inf; the run stops as failed."""


class RunOutputError(RunFailedError):
    """The run's output folder could not be written (disk full, quota, permissions); the run stops as failed.
    ``str(err)`` is one line naming the file."""


class EpochCallback(Protocol):
    """Called on every rank after each epoch with the (rank-averaged) metrics and the checkpoint path."""

    def __call__(self, epoch: int, metrics: dict[str, float], checkpoint: Path | None) -> None:
        """Handle one epoch's metrics and checkpoint."""


@dataclass
class TrainResult:
    """Every epoch's metrics, the final ones (the last epoch's, plus the linear probe's) and the output folder."""

    history: list[dict[str, float]] = field(default_factory=list)
    final: dict[str, float] = field(default_factory=dict)
    output_dir: Path | None = None


def _epoch_seed(seed: int, epoch: int, rank: int) -> int:
    return (seed * 1_000_003 + epoch * 101 + rank) % (2**63 - 1)


def train(cfg: Config, callbacks: Sequence[EpochCallback] = (), resume: bool = False,
          progress: bool = False) -> TrainResult:
    """Pretrain one configuration; returns the per-epoch history and the final metrics.

    Args:
        cfg: the validated run configuration.
        callbacks: called after every epoch on every rank (reporting seam for Ray Tune / MLflow).
        resume: continue from ``<output_dir>/checkpoint.pt`` if it exists.
        progress: show progress within each epoch on rank 0 (a bar on a terminal, a few log lines otherwise).

    Raises:
        NonFiniteLossError: if the loss becomes NaN/inf.
        RunOutputError: if the output folder cannot be written (e.g. the disk is full).
        DataError: if the dataset is missing or an image cannot be decoded (in-memory data: before any training).
        ConfigError: if the data gives no full batch, or ``resume`` finds a checkpoint of another config
            (before any training).
        CheckpointError: if ``resume`` finds a file that is not a readable checkpoint (before any training).
    """
    runtime = setup_runtime(cfg)
    try:
        return _train(cfg, runtime, callbacks, resume, progress)
    finally:
        if runtime.owns_process_group:
            dist.destroy_process_group()


def _method(cfg: Config) -> str:
    """The framework and its loss as the run's first line names them: ``simclr/dcl``, and a user loss by its class
    and where it comes from, ``simclr/PositiveWeighted (/abs/my_losses.py:PositiveWeighted)``."""
    label = loss_label(cfg.loss.name)
    loss = label if label == cfg.loss.name else f"{label} ({cfg.loss.name})"
    return f"{cfg.framework.name}/{loss}"


def _train(cfg: Config, runtime: Runtime, callbacks: Sequence[EpochCallback], resume: bool,
           progress: bool = False) -> TrainResult:
    """Build the run, restore it, train the remaining epochs, then the linear probe if configured."""
    run = build_run(cfg, runtime)
    start_epoch, history = _restore(run, resume)
    log.info(
        "training %s on %s x%d: %d epochs x %d steps, batch %d, peak lr %.4g, K=%d",
        _method(cfg), runtime.device, runtime.world_size, cfg.optim.epochs,
        run.steps_per_epoch, cfg.optim.batch_size, run.derived.lr, run.derived.num_negatives,
    )
    for epoch in range(start_epoch, cfg.optim.epochs):
        with StepProgress(epoch + 1, cfg.optim.epochs, run.steps_per_epoch,
                          enabled=progress and runtime.rank == 0) as bar:
            stats = _train_one_epoch(run, epoch, bar)
        metrics = stats.metrics(runtime) | {M.EPOCH: epoch + 1}
        if (epoch + 1) % cfg.eval.knn_every == 0 or epoch + 1 == cfg.optim.epochs:  # always after the last
            metrics |= _knn_metrics(run)
        metrics[M.EPOCH_SECONDS] = time.perf_counter() - stats.started
        # K and α as derived for this run (its world size): results tables read them instead of re-deriving.
        metrics |= {M.NUM_NEGATIVES: run.derived.num_negatives, M.EQCO_ALPHA: run.derived.eqco_alpha}
        history.append(metrics)
        _save(run, epoch + 1, history)
        _log_epoch(epoch + 1, cfg.optim.epochs, metrics)
        for callback in callbacks:
            callback(epoch + 1, metrics, run.checkpoint_path if runtime.rank == 0 else None)

    final = dict(history[-1]) if history else {}
    if cfg.eval.linear:
        final |= _linear_metrics(run)
    return TrainResult(history=history, final=final, output_dir=run.out_dir)


# ------------------------------------------------------------------------------------------------------------
# Restoring a run


def _restore(run: Run, resume: bool) -> tuple[int, list[dict[str, float]]]:
    """The epoch to start from and the history of the epochs before it.

    With ``resume`` and an existing checkpoint: its model, framework, optimizer and scaler states are loaded
    into ``run`` (its config must match, :data:`RESUME_FREE_KEYS` aside) and rank 0 rewrites the metrics file
    to match it. Otherwise rank 0 starts the output folder afresh: ``config.json``, no metrics file.

    Raises:
        CheckpointError: if the checkpoint is not a readable checkpoint.
        ConfigError: if the checkpoint's config differs from the run's.
        ValueError: if its framework state does not match the run's.
    """
    cfg, path = run.cfg, run.checkpoint_path
    if not (resume and path.exists()):
        if run.runtime.rank == 0:
            with _writing(run.out_dir / "config.json"):  # never through a link planted at either name
                files.write_text(run.out_dir / "config.json", json.dumps(to_flat_dict(cfg), indent=1))
                (run.out_dir / METRICS_NAME).unlink(missing_ok=True)
        return 0, []
    state = load_checkpoint(path, map_location=run.runtime.device)
    check_resumable(cfg, state, path)
    unwrap(run.model).load_state_dict(state["model"])
    load_framework_state(run.framework, state.get("framework", {}))  # momentum encoder, queues (none: SimCLR)
    run.optimizer.load_state_dict(state["optimizer"])
    run.scaler.load_state_dict(state["scaler"])
    history = list(state["history"])
    if run.runtime.rank == 0:  # the metrics file matches the checkpoint (drops epochs trained after it, if any)
        with _writing(run.out_dir / METRICS_NAME):
            files.write_text(run.out_dir / METRICS_NAME, "".join(json.dumps(m) + "\n" for m in history))
    log.info("resumed from %s at epoch %d", path, state["epoch"])
    return state["epoch"], history


def _train_one_epoch(run: Run, epoch: int, progress: StepProgress | None = None) -> EpochStats:
    """One pass over this rank's shard of the epoch's permutation, one optimizer step per batch."""
    cfg, device = run.cfg, run.runtime.device
    run.sampler.set_epoch(epoch)
    order = torch.tensor(list(run.sampler), dtype=torch.long)  # this rank's shard of the epoch permutation
    # Per-epoch seeding: views, EqCo's negative sampling etc. are identical after a resume.
    torch.manual_seed(_epoch_seed(cfg.seed, epoch, run.runtime.rank))
    gen = torch.Generator(device="cpu").manual_seed(_epoch_seed(cfg.seed, epoch, run.runtime.rank))
    run.framework.train()
    stats = EpochStats(device)
    n = run.derived.per_rank_batch
    batches = [order[s * n : (s + 1) * n] for s in range(run.steps_per_epoch)]  # (n,) image indices each
    watch = LossWatch(device, run.steps_per_epoch)
    for step, (view1, view2) in enumerate(run.data.epoch_views(batches, gen, device)):  # (n, 3, S, S) each
        lr = cosine_lr(
            epoch * run.steps_per_epoch + step, run.total_steps, run.derived.lr, run.warmup_steps,
            cfg.optim.min_lr_ratio,
        )
        for group in run.optimizer.param_groups:
            group["lr"] = lr
        view1 = view1.contiguous(memory_format=torch.channels_last)
        view2 = view2.contiguous(memory_format=torch.channels_last)
        with torch.autocast(device_type=device.type, dtype=run.amp_dtype, enabled=run.use_amp):
            out = run.framework(view1, view2)
        watch.add(out.loss, step, lr)
        if watch.due(step):
            watch.stop_if_not_finite(run, epoch)
        run.optimizer.zero_grad(set_to_none=True)
        run.scaler.scale(out.loss).backward()
        run.scaler.unscale_(run.optimizer)  # true gradients for the probe below (no-op without AMP)
        stats.add_gradients(grad_norm(run.probes), out.npc)
        run.scaler.step(run.optimizer)
        run.scaler.update()
        run.framework.after_step()
        stats.add_losses({M.Diagnostic.LOSS: out.loss.detach(), **out.diagnostics}, images=n, lr=lr)
        if progress is not None:
            progress.step(n * run.runtime.world_size)
    stats.seconds = time.perf_counter() - stats.started
    return stats


class LossWatch:
    """A NaN/inf training loss found without reading the loss back every step on a GPU: each step's check stays on
    the device (the first non-finite step and its loss kept there), and :meth:`stop_if_not_finite` reads it back
    when :meth:`due`: after every step on the CPU (where reading is free: a diverged run stops at once), every
    :data:`GPU_CHECK_EVERY` steps and at the epoch's last step on a GPU, where a read per step would stall the
    host until the device caught up (the few steps trained after a NaN are lost with the run, which fails
    before anything is saved)."""

    GPU_CHECK_EVERY = 50

    def __init__(self, device: torch.device, steps: int) -> None:
        self.every = 1 if device.type == "cpu" else self.GPU_CHECK_EVERY
        self.steps = steps
        self.first = torch.full((), -1, dtype=torch.long, device=device)  # the first non-finite step, -1: none
        self.value = torch.zeros((), device=device)  # its loss
        self.lrs: list[float] = []

    def add(self, loss: torch.Tensor, step: int, lr: float) -> None:
        """Note the step's loss (()) and learning rate; no host sync."""
        new = ~torch.isfinite(loss.detach()) & (self.first < 0)
        self.first = torch.where(new, torch.full_like(self.first, step), self.first)
        self.value = torch.where(new, loss.detach().float(), self.value)
        self.lrs.append(lr)

    def due(self, step: int) -> bool:
        """Whether the check is read back after ``step`` (the same steps on every rank)."""
        return (step + 1) % self.every == 0 or step + 1 == self.steps

    def stop_if_not_finite(self, run: Run, epoch: int) -> None:
        """Raise :class:`NonFiniteLossError` on every rank if any rank's loss was NaN/inf."""
        bad = (self.first >= 0).float()  # ()
        if run.runtime.world_size > 1:
            # Every rank stops together: a rank raising alone would leave the others waiting in backward's
            # gradient all-reduce (their own loss may still be finite).
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if bad:
            step = int(self.first)
            at = f"step {step + 1} (this rank's: {float(self.value)}; " if step >= 0 else "a step (on another rank; "
            lr = self.lrs[step] if step >= 0 else self.lrs[-1]
            raise NonFiniteLossError(
                f"the training loss became non-finite at epoch {epoch + 1}, {at}loss={run.cfg.loss.name}, "
                f"tau={run.cfg.loss.temperature}, lr={lr:.4g})"
            )


# ------------------------------------------------------------------------------------------------------------
# After an epoch, and after training


def _knn_metrics(run: Run) -> dict[str, float]:
    """The kNN monitor, run by rank 0 and broadcast to every rank, with its duration."""
    knn = {}
    if run.runtime.rank == 0:
        t0 = time.perf_counter()
        ev = run.cfg.eval
        knn[M.KNN_TOP1] = evaluate_knn(
            run.backbone,
            run.data,
            k=ev.knn_k,
            temperature=ev.knn_temperature,
            batch_size=ev.batch_size,
            device=run.runtime.device,
        )
        knn[M.KNN_SECONDS] = time.perf_counter() - t0
    return broadcast_from_rank0(knn, [M.KNN_TOP1, M.KNN_SECONDS], run.runtime)


def _save(run: Run, epoch: int, history: list[dict[str, float]]) -> None:
    """Rank 0 checkpoints the run after ``epoch`` and appends its metrics (``history[-1]``) to the metrics
    file; every rank waits until it has.

    Raises:
        RunOutputError: if either cannot be written (e.g. the disk is full).
    """
    if run.runtime.rank == 0:
        state = {
            "epoch": epoch,
            "model": unwrap(run.model).state_dict(),
            "framework": framework_state(run.framework),
            "optimizer": run.optimizer.state_dict(),
            "scaler": run.scaler.state_dict(),
            "config": to_flat_dict(run.cfg),
            "history": history,
        }
        with _writing(run.checkpoint_path):
            save_checkpoint(state, run.checkpoint_path)
        with _writing(run.out_dir / METRICS_NAME), files.open_append(run.out_dir / METRICS_NAME) as f:
            f.write(json.dumps(history[-1]) + "\n")
    if run.runtime.world_size > 1:
        dist.barrier()


@contextlib.contextmanager
def _writing(path: Path) -> Iterator[None]:
    """Turn an OSError while writing ``path`` into a one-line :class:`RunOutputError`."""
    try:
        yield
    except OSError as err:
        raise RunOutputError(f"cannot write {err.filename or path}: {err.strerror or err}") from err


def _log_epoch(epoch: int, epochs: int, metrics: dict[str, float]) -> None:
    q_mean, q_cv = metrics.get(M.Q_MEAN, math.nan), metrics.get(M.Q_CV, math.nan)
    log.info(
        "epoch %d/%d  loss %.4f  knn %s  q_B %s  lr %.4g  %.0f img/s",
        epoch,
        epochs,
        metrics[M.TRAIN_LOSS],
        f"{metrics[M.KNN_TOP1]:.2f}%" if M.KNN_TOP1 in metrics else "-",
        "- (the loss reports none)" if math.isnan(q_mean) else f"{q_mean:.3f} (Cv {q_cv:.3f})",
        metrics[M.LR],
        metrics[M.IMAGES_PER_S],
    )


def _linear_metrics(run: Run) -> dict[str, float]:
    """The linear probe after training, run by rank 0 and broadcast to every rank."""
    ev = run.cfg.eval
    result = {}
    if run.runtime.rank == 0:
        result = linear_eval(
            run.backbone,
            run.data,
            preset=ev.linear_preset,
            seed=run.cfg.seed,
            batch_size=ev.batch_size,
            device=run.runtime.device,
        )
    return broadcast_from_rank0(result, [M.LINEAR_TOP1, M.LINEAR_TRAIN_TOP1], run.runtime)
