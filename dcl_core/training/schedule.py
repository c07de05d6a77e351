"""The schedule: optimizer steps per epoch, and the learning rate's linear warm-up then cosine decay (small pure
functions, no torch: the CLIs check a run's steps before torch loads)."""

from __future__ import annotations

import math

from dcl_core.config import ConfigError
from dcl_core.config.derive import per_rank_batch


def steps_per_epoch(n_images: int, batch_size: int, world_size: int = 1) -> int:
    """Optimizer steps per epoch: full per-rank batches in each rank's shard of the epoch permutation.

    Raises:
        ConfigError: if there is none (a batch larger than the pretraining set), or the ranks do not split the
            batch evenly.
    """
    # Each rank's DistributedSampler shard (drop_last) holds n_images // world_size indices.
    steps = (n_images // world_size) // per_rank_batch(batch_size, world_size)
    if steps == 0:
        raise ConfigError(
            f"{n_images} pretraining images give no full batch of {batch_size}; "
            "lower optim.batch_size or raise data.train_per_class"
        )
    return steps


def cosine_lr(
    step: int, total_steps: int, peak_lr: float, warmup_steps: int = 0, min_ratio: float = 0.0
) -> float:
    """Learning rate at optimizer step ``step`` (0-based).

    1) linear warm-up from peak/warmup_steps to peak over ``warmup_steps`` steps;
    2) cosine decay from peak to ``min_ratio * peak`` over the remaining steps.
    """
    if warmup_steps > 0 and step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps  # 1) warm-up
    decay_steps = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    floor = min_ratio * peak_lr
    return floor + (peak_lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))  # 2) cosine
