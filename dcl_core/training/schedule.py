"""Learning-rate schedule: linear warm-up, then cosine decay (a small pure function)."""

from __future__ import annotations

import math


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
