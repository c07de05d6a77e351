"""What one run builds from its config before the first epoch (:class:`Run`, :func:`build_run`): the output
folder, the data, the model (the same initial weights on every rank), the framework and its loss, the optimizer,
the AMP scaler and this rank's sampler, and the step counts the lr schedule follows.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DistributedSampler

from dcl_core.config import Config, Derived, derive
from dcl_core.files import real_path
from dcl_core.frameworks.common import Framework
from dcl_core.models import last_block_convs
from dcl_core.training.builders import (
    TrainingData,
    build_data,
    build_framework,
    build_loss,
    build_model,
    build_optimizer,
)
from dcl_core.training.checkpoint import CHECKPOINT_NAME
from dcl_core.training.runtime import Runtime, free_cpu_threads
from dcl_core.training.schedule import steps_per_epoch


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DDP wrapper (itself when not wrapped)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def backbone_of(model: nn.Module) -> nn.Module:
    """The encoder of an SSLModel, DDP-wrapped or not (without its projection head)."""
    backbone = unwrap(model).backbone
    assert isinstance(backbone, nn.Module)  # an attribute of an nn.Module is typed Tensor | Module
    return backbone


@dataclass
class Run:
    """Everything one run builds from its config before the first epoch."""

    cfg: Config
    derived: Derived
    runtime: Runtime
    out_dir: Path  # absolute: checkpoint.pt, config.json, metrics.jsonl
    data: TrainingData
    model: nn.Module  # the SSLModel, DDP-wrapped on several ranks
    framework: Framework  # model + loss (+ momentum encoder, queues)
    probes: list[torch.Tensor]  # weights whose gradient norm is recorded every step (DCL Fig. 5)
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    sampler: DistributedSampler[int]  # this rank's shard of each epoch's permutation
    steps_per_epoch: int
    amp_dtype: torch.dtype | None = None  # the autocast dtype (``amp`` on CUDA: :func:`amp_dtype`), None: fp32

    @property
    def total_steps(self) -> int:
        """Optimizer steps over the whole run."""
        return self.steps_per_epoch * self.cfg.optim.epochs

    @property
    def warmup_steps(self) -> int:
        """Optimizer steps of linear learning-rate warm-up."""
        return round(self.cfg.optim.warmup_epochs * self.steps_per_epoch)

    @property
    def use_amp(self) -> bool:
        """Whether the forward pass runs under autocast (``amp`` on a CUDA device)."""
        return self.amp_dtype is not None

    @property
    def checkpoint_path(self) -> Path:
        """Where the run writes its checkpoint."""
        return self.out_dir / CHECKPOINT_NAME

    @property
    def backbone(self) -> nn.Module:
        """The encoder without its projection head (what kNN and the linear probe evaluate)."""
        return backbone_of(self.model)


def build_run(cfg: Config, runtime: Runtime) -> Run:
    """Output folder, data, model (seeded: the same initial weights on every rank), framework, optimizer.

    Raises:
        ConfigError: if the pretraining set gives no full batch.
    """
    rank, world, device = runtime.rank, runtime.world_size, runtime.device
    derived = derive(cfg, world)
    if device.type == "cpu" or cfg.threads > 0:
        torch.set_num_threads(cfg.threads or free_cpu_threads(world))
    out_dir = real_path(cfg.output_dir)  # made once the data and the model are: a refusal leaves nothing behind

    # A download happens once: rank 0 fetches, the other ranks read what it wrote.
    fetch_first = cfg.data.download and world > 1
    if fetch_first and rank != 0:
        dist.barrier()
    data = build_data(cfg)
    if fetch_first and rank == 0:
        dist.barrier()
    n_images = len(data)
    steps = steps_per_epoch(n_images, cfg.optim.batch_size, world)  # before building anything else
    torch.manual_seed(cfg.seed)  # same initial weights on every rank (DDP also broadcasts rank 0's)
    # channels_last: oneDNN (CPU) and cuDNN (tensor cores under AMP) both run convolutions faster in NHWC.
    # torch's Module.to overloads take device and memory_format only apart; the call accepts both (stub gap).
    model: nn.Module = build_model(cfg).to(device, memory_format=torch.channels_last)  # type: ignore[call-overload]
    if world > 1:
        if device.type == "cuda" and cfg.model.sync_bn:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    framework = build_framework(cfg, model, build_loss(cfg, derived))
    # DCL Fig. 5: gradient norm of the last convolution of the last two residual blocks, every step.
    probes = [conv.weight for conv in last_block_convs(backbone_of(model))]
    optimizer = build_optimizer(cfg, derived, model)
    dtype = amp_dtype(device) if cfg.amp else None
    scaler = grad_scaler(device, dtype)

    # The sampler reads only len(dataset): the indices stand in for the data (torch types it as a Dataset).
    sampler: DistributedSampler[int] = DistributedSampler(
        range(n_images),  # type: ignore[arg-type]
        num_replicas=world, rank=rank, shuffle=True, seed=cfg.seed, drop_last=True,
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    return Run(cfg, derived, runtime, out_dir, data, model, framework, probes, optimizer, scaler, sampler, steps,
               dtype)


def grad_scaler(device: torch.device, dtype: torch.dtype | None) -> torch.amp.GradScaler:
    """The trainer's loss scaling under autocast ``dtype``: on for fp16, off otherwise (a no-op scaler).

    fp16's smallest normal number is 6.1e-5. A contrastive loss near saturation (the positive far above the
    negatives, e.g. InfoNCE ~0.002 at τ 0.07) has gradients of ~1e-5 per embedding entry and below, which an fp16
    activation's gradient holds only as subnormals with fewer significant bits, or as zeros: unscaled, the
    gradient at the projection head differs from fp32 by 1-20% there (``tests/training/test_mixed_precision.py``).
    GradScaler's loss scale (2^16 to start) lifts them into fp16's normal range, leaving fp16's own rounding
    (~2e-4 relative). bf16 has fp32's exponent range: no scaling, and no step skipped for an overflow."""
    return torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)


def amp_dtype(device: torch.device) -> torch.dtype | None:
    """The autocast dtype of mixed precision on ``device``: bf16 where the GPU has it (fp32's range: no loss
    scaling, no step skipped for an overflow; ``benchmarks/gpu.py`` times it against fp16), else fp16 (with a
    GradScaler); None off CUDA (the CPU trains in fp32)."""
    if device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
