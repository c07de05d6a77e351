"""One pretraining run: SGD + warm-up/cosine, per-epoch kNN monitor, atomic checkpoints, resume, DDP.

Device-agnostic: CPU here, CUDA (AMP, NCCL, SyncBN) on a GPU machine, DDP when launched by torchrun or inside
a Ray Train worker (the process group then already exists). Reporting goes through :class:`EpochCallback`s so
this module never imports Ray or MLflow.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from dcl_core.config import Config, derive, to_flat_dict
from dcl_core.eval import knn_top1, linear_probe
from dcl_core.eval.linear import LINEAR_PRESETS
from dcl_core.models import last_block_convs
from dcl_core.training.builders import (
    TrainingData,
    build_data,
    build_framework,
    build_loss,
    build_model,
    build_optimizer,
)
from dcl_core.training.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from dcl_core.training.schedule import cosine_lr

log = logging.getLogger(__name__)

METRICS_NAME = "metrics.jsonl"
Q_HIST_BINS = 40  # bins of the per-epoch NPC multiplier histogram over [0, 1] (DCL Fig. 1)
# Where a run writes and how many threads it uses may change between the interrupted and the resumed process
# (Ray gives a restored trial a new directory); everything else must match the checkpoint.
RESUME_FREE_KEYS = frozenset({"output_dir", "threads"})


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or inf; the run stops as failed."""


class EpochCallback(Protocol):
    """Called on every rank after each epoch with the (rank-averaged) metrics and the checkpoint path."""

    def __call__(self, epoch: int, metrics: dict[str, float], checkpoint: Path | None) -> None: ...


@dataclass
class TrainResult:
    history: list[dict[str, float]] = field(default_factory=list)
    final: dict[str, float] = field(default_factory=dict)
    output_dir: Path | None = None


@dataclass
class Runtime:
    rank: int
    world_size: int
    device: torch.device
    owns_process_group: bool


def _setup_runtime(cfg: Config) -> Runtime:
    """Join (or start, under torchrun) the process group and pick the device."""
    owns = False
    if not (dist.is_available() and dist.is_initialized()) and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        use_cuda = cfg.device != "cpu" and torch.cuda.is_available()
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        owns = True
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device=cuda requested but CUDA is not available")
    if cfg.device in ("auto", "cuda") and torch.cuda.is_available():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    return Runtime(rank, world, device, owns)


def _average(values: dict[str, float], runtime: Runtime) -> dict[str, float]:
    """Mean of each metric over ranks (identical on every rank afterwards)."""
    if runtime.world_size == 1 or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([values[k] for k in keys], dtype=torch.float64, device=runtime.device)
    dist.all_reduce(t)
    return dict(zip(keys, (t / runtime.world_size).tolist(), strict=True))


def _broadcast(values: dict[str, float], keys: Sequence[str], runtime: Runtime) -> dict[str, float]:
    """Rank 0's values of ``keys`` on every rank."""
    if runtime.world_size == 1 or not keys:
        return values
    t = torch.tensor([values.get(k, float("nan")) for k in keys], dtype=torch.float64, device=runtime.device)
    dist.broadcast(t, src=0)
    return dict(zip(keys, t.tolist(), strict=True))


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


def framework_state(framework: nn.Module) -> dict[str, torch.Tensor]:
    """The framework's own state: its ``state_dict()`` minus the trained model (momentum encoder, queues).

    Frameworks hold the trained encoder as ``framework.model`` (saved separately as the checkpoint's
    ``model``); SimCLR has no other state, so this is empty for it.
    """
    return {k: v for k, v in framework.state_dict().items() if not k.startswith("model.")}


def load_framework_state(framework: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Restore :func:`framework_state`; every non-model entry must be present and known (exact resume)."""
    result = framework.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not k.startswith("model.")]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"checkpoint framework state does not match: missing {missing}, unexpected {result.unexpected_keys}"
        )


def _epoch_seed(seed: int, epoch: int, rank: int) -> int:
    return (seed * 1_000_003 + epoch * 101 + rank) % (2**63 - 1)


def evaluate_knn(
    backbone: nn.Module, data: TrainingData, k: int, temperature: float, batch_size: int, device: torch.device
) -> float:
    """kNN top-1 (%) of the test set against the labeled train bank, test-time transforms for both."""
    bank = data.features(backbone, "bank", batch_size, device)
    test = data.features(backbone, "test", batch_size, device)
    return knn_top1(
        test, data.labels("test"), bank, data.labels("bank"), data.num_classes, k=k, temperature=temperature
    )


def train(cfg: Config, callbacks: Sequence[EpochCallback] = (), resume: bool = False) -> TrainResult:
    """Pretrain one configuration; returns the per-epoch history and the final metrics.

    Args:
        cfg: the validated run configuration.
        callbacks: called after every epoch on every rank (reporting seam for Ray Tune / MLflow).
        resume: continue from ``<output_dir>/checkpoint.pt`` if it exists.

    Raises:
        NonFiniteLossError: if the loss becomes NaN/inf.
        DataError: if the dataset is missing (before any training).
    """
    runtime = _setup_runtime(cfg)
    try:
        return _train(cfg, runtime, callbacks, resume)
    finally:
        if runtime.owns_process_group:
            dist.destroy_process_group()


def _train(cfg: Config, runtime: Runtime, callbacks: Sequence[EpochCallback], resume: bool) -> TrainResult:
    rank, world, device = runtime.rank, runtime.world_size, runtime.device
    derived = derive(cfg, world)
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    out_dir = Path(cfg.output_dir).expanduser().resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = out_dir / CHECKPOINT_NAME
    use_amp = cfg.amp and device.type == "cuda"

    # A download happens once: rank 0 fetches, the other ranks read what it wrote.
    fetch_first = cfg.data.download and world > 1
    if fetch_first and rank != 0:
        dist.barrier()
    data = build_data(cfg)
    if fetch_first and rank == 0:
        dist.barrier()
    torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    # channels_last: oneDNN (CPU) and cuDNN (tensor cores under AMP) both run convolutions faster in NHWC.
    model: nn.Module = build_model(cfg).to(device, memory_format=torch.channels_last)
    if world > 1:
        if device.type == "cuda" and cfg.model.sync_bn:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    loss_fn = build_loss(cfg, derived)
    framework = build_framework(cfg, model, loss_fn)
    # DCL Fig. 5: gradient norm of the last convolution of the last two residual blocks, every step.
    probes = [conv.weight for conv in last_block_convs(_unwrap(model).backbone)]
    optimizer = build_optimizer(cfg, derived, model)
    scaler = torch.amp.GradScaler(device.type, enabled=use_amp)

    n_images = len(data)
    sampler = DistributedSampler(
        range(n_images), num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed, drop_last=True
    )
    steps_per_epoch = len(sampler) // derived.per_rank_batch
    if steps_per_epoch == 0:
        raise ValueError(
            f"{n_images} pretraining images give no full batch of {cfg.optim.batch_size}; "
            "lower optim.batch_size or raise data.train_per_class"
        )
    total_steps = steps_per_epoch * cfg.optim.epochs
    warmup_steps = round(cfg.optim.warmup_epochs * steps_per_epoch)

    result = TrainResult(output_dir=out_dir)
    start_epoch = 0
    if resume and ckpt_path.exists():
        state = load_checkpoint(ckpt_path, map_location=device)
        # A key the checkpoint predates (e.g. framework.queue_size) had its default value then.
        saved = to_flat_dict(Config()) | state["config"]
        changed = sorted(k for k, v in to_flat_dict(cfg).items() if k not in RESUME_FREE_KEYS and saved.get(k) != v)
        if changed:
            raise ValueError(f"cannot resume {ckpt_path}: config differs in {', '.join(changed)}")
        _unwrap(model).load_state_dict(state["model"])
        load_framework_state(framework, state.get("framework", {}))  # momentum encoder, queues (none: SimCLR)
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        start_epoch = state["epoch"]
        result.history = list(state["history"])
        if rank == 0:  # the metrics file matches the checkpoint (drops epochs trained after it, if any)
            lines = "".join(json.dumps(m) + "\n" for m in result.history)
            (out_dir / METRICS_NAME).write_text(lines)
        log.info("resumed from %s at epoch %d", ckpt_path, start_epoch)
    elif rank == 0:
        (out_dir / "config.json").write_text(json.dumps(to_flat_dict(cfg), indent=1))
        (out_dir / METRICS_NAME).unlink(missing_ok=True)

    log.info(
        "training %s/%s on %s x%d: %d epochs x %d steps, batch %d, peak lr %.4g, K=%d",
        cfg.framework.name,
        cfg.loss.name,
        device,
        world,
        cfg.optim.epochs,
        steps_per_epoch,
        cfg.optim.batch_size,
        derived.lr,
        derived.num_negatives,
    )
    for epoch in range(start_epoch, cfg.optim.epochs):
        sampler.set_epoch(epoch)
        order = torch.tensor(list(sampler), dtype=torch.long)  # this rank's shard of the epoch permutation
        # Per-epoch seeding: views, EqCo's negative sampling etc. are identical after a resume.
        torch.manual_seed(_epoch_seed(cfg.seed, epoch, rank))
        gen = torch.Generator(device="cpu").manual_seed(_epoch_seed(cfg.seed, epoch, rank))
        framework.train()
        sums: dict[str, torch.Tensor] = {}
        grad_sum = torch.zeros((), dtype=torch.float64, device=device)
        grad_sq = torch.zeros((), dtype=torch.float64, device=device)
        q_hist = torch.zeros(Q_HIST_BINS, dtype=torch.float64, device=device)
        t0 = time.perf_counter()
        n = derived.per_rank_batch
        batches = [order[s * n : (s + 1) * n] for s in range(steps_per_epoch)]  # (n,) image indices each
        for step, (view1, view2) in enumerate(data.epoch_views(batches, gen, device)):  # (n, 3, S, S) each
            lr = cosine_lr(
                epoch * steps_per_epoch + step, total_steps, derived.lr, warmup_steps, cfg.optim.min_lr_ratio
            )
            for group in optimizer.param_groups:
                group["lr"] = lr
            view1 = view1.contiguous(memory_format=torch.channels_last)
            view2 = view2.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device_type=device.type, enabled=use_amp):
                out = framework(view1, view2)
            finite = torch.isfinite(out.loss.detach()).float()  # ()
            if world > 1:
                # Every rank stops together: a rank raising alone would leave the others waiting in backward's
                # gradient all-reduce (their own loss may still be finite).
                dist.all_reduce(finite, op=dist.ReduceOp.MIN)
            if not finite:
                raise NonFiniteLossError(
                    f"the training loss became non-finite at epoch {epoch + 1}, step {step + 1} (this rank's: "
                    f"{out.loss.item()}; loss={cfg.loss.name}, tau={cfg.loss.temperature}, lr={lr:.4g})"
                )
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(out.loss).backward()
            scaler.unscale_(optimizer)  # true gradients for the probe below (no-op without AMP)
            grad_norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in probes])).double()
            grad_sum += grad_norm
            grad_sq += grad_norm**2
            if out.npc is not None:
                q_hist += torch.histc(out.npc.float(), bins=Q_HIST_BINS, min=0.0, max=1.0).double()
            scaler.step(optimizer)
            scaler.update()
            framework.after_step()
            for key, value in {"loss": out.loss.detach(), **out.diagnostics}.items():
                sums[key] = sums.get(key, 0.0) + value.float()
        train_time = time.perf_counter() - t0

        metrics = {f"train/{k}": float(v) / steps_per_epoch for k, v in sums.items()}
        metrics["train/images_per_s"] = steps_per_epoch * derived.per_rank_batch / train_time
        grad_mean = float(grad_sum) / steps_per_epoch
        grad_std = math.sqrt(max(float(grad_sq) / steps_per_epoch - grad_mean**2, 0.0))
        metrics |= {"train/grad_norm_mean": grad_mean, "train/grad_norm_std": grad_std,
                    "train/grad_norm_cv": grad_std / grad_mean if grad_mean > 0 else math.nan}
        metrics = _average(metrics, runtime)
        metrics["train/images_per_s"] *= world
        if world > 1:
            dist.all_reduce(q_hist)  # counts over every rank's anchors
        if q_hist.sum() > 0:  # fraction of anchors per bin of q_B over [0, 1]
            metrics["train/q_hist"] = (q_hist / q_hist.sum()).tolist()  # type: ignore[assignment]
        metrics["train/lr"] = lr
        metrics["epoch"] = epoch + 1
        last = epoch + 1 == cfg.optim.epochs
        if (epoch + 1) % cfg.eval.knn_every == 0 or last:
            knn = {}
            if rank == 0:
                t1 = time.perf_counter()
                knn["eval/knn_top1"] = evaluate_knn(
                    _unwrap(model).backbone,
                    data,
                    cfg.eval.knn_k,
                    cfg.eval.knn_temperature,
                    cfg.eval.batch_size,
                    device,
                )
                knn["eval/knn_seconds"] = time.perf_counter() - t1
            metrics |= _broadcast(knn, ["eval/knn_top1", "eval/knn_seconds"], runtime)
        metrics["time/epoch_seconds"] = time.perf_counter() - t0
        result.history.append(metrics)

        if rank == 0:
            save_checkpoint(
                {
                    "epoch": epoch + 1,
                    "model": _unwrap(model).state_dict(),
                    "framework": framework_state(framework),
                    "optimizer": optimizer.state_dict(),
                    "scaler": scaler.state_dict(),
                    "config": to_flat_dict(cfg),
                    "history": result.history,
                },
                ckpt_path,
            )
            with (out_dir / METRICS_NAME).open("a") as f:
                f.write(json.dumps(metrics) + "\n")
        if world > 1:
            dist.barrier()
        log.info(
            "epoch %d/%d  loss %.4f  knn %s  q_B %.3f (Cv %.3f)  lr %.4g  %.0f img/s",
            epoch + 1,
            cfg.optim.epochs,
            metrics["train/loss"],
            f"{metrics['eval/knn_top1']:.2f}%" if "eval/knn_top1" in metrics else "-",
            metrics.get("train/q_mean", math.nan),
            metrics.get("train/q_cv", math.nan),
            lr,
            metrics["train/images_per_s"],
        )
        for callback in callbacks:
            callback(epoch + 1, metrics, ckpt_path if rank == 0 else None)

    final = dict(result.history[-1]) if result.history else {}
    if cfg.eval.linear:
        final |= _broadcast(
            _linear_eval(cfg, model, data, device) if rank == 0 else {},
            ["eval/linear_top1", "eval/linear_train_top1"],
            runtime,
        )
    result.final = final
    return result


def _linear_eval(cfg: Config, model: nn.Module, data: TrainingData, device: torch.device) -> dict[str, float]:
    backbone = _unwrap(model).backbone
    train_f = data.features(backbone, "bank", cfg.eval.batch_size, device, normalize=False)
    test_f = data.features(backbone, "test", cfg.eval.batch_size, device, normalize=False)
    res = linear_probe(
        train_f,
        data.labels("bank"),
        test_f,
        data.labels("test"),
        data.num_classes,
        seed=cfg.seed,
        device=device,
        **LINEAR_PRESETS[cfg.eval.linear_preset],
    )
    log.info("linear probe (%s): top-1 %.2f%%", cfg.eval.linear_preset, res["linear_top1"])
    return {f"eval/{k}": v for k, v in res.items()}
