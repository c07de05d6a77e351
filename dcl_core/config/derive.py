"""Values derived from a config, computed in one place: the scaled learning rate, the per-rank batch, EqCo's K and
the α it uses."""

from __future__ import annotations

from dataclasses import dataclass

from dcl_core.config.schema import Config, ConfigError


@dataclass(frozen=True)
class Derived:
    """Values computed from a config, in one place (nothing else re-derives them)."""

    lr: float  # peak lr = base_lr * global batch / 256 (linear scaling rule; DCL Sec. 4.1, EqCo Sec. 2.2)
    per_rank_batch: int  # global batch / world size
    num_negatives: int  # K: negatives per anchor seen by the loss, per framework (see derive)
    eqco_alpha: float  # alpha actually used (alpha = K when unset: zero margin)


def derive(cfg: Config, world_size: int = 1) -> Derived:
    """Compute derived values; ``world_size`` is the number of DDP ranks sharing the global batch.

    K, the number of negatives per anchor (the K of EqCo's margin τ·log(α/K); α = None means α = K), with N the
    batch the negatives come from (global with ``loss.gather_distributed``, else per rank):

    - simclr: ``loss.num_negatives`` or all 2N−2 other views;
    - moco: ``framework.queue_size`` (every query is scored against the whole queue);
    - simo: ``framework.num_negatives`` or all N−1 other images' keys;
    - nnclr: ``loss.num_negatives`` or all N−1 other images (NNCLR contrasts against the other view only).
    """
    if cfg.optim.batch_size % world_size:
        raise ConfigError(
            f"optim.batch_size={cfg.optim.batch_size} is not divisible by the {world_size} DDP workers"
        )
    big_n = cfg.optim.batch_size if cfg.loss.gather_distributed else cfg.optim.batch_size // world_size
    name = cfg.framework.name
    if name == "moco":
        k, available = cfg.framework.queue_size, cfg.framework.queue_size
    elif name == "simo":
        available = big_n - 1
        k = cfg.framework.num_negatives or available
    elif name == "nnclr":
        available = big_n - 1
        k = cfg.loss.num_negatives or available
    else:
        available = 2 * big_n - 2
        k = cfg.loss.num_negatives or available
    if available < 1 or k > available:
        raise ConfigError(
            f"{name} with a per-rank batch of {cfg.optim.batch_size // world_size} (gather_distributed="
            f"{cfg.loss.gather_distributed}) offers {available} negatives per anchor, fewer than K={k}"
        )
    alpha = float(k) if cfg.loss.alpha is None else cfg.loss.alpha
    return Derived(
        lr=cfg.optim.base_lr * cfg.optim.batch_size / 256,
        per_rank_batch=cfg.optim.batch_size // world_size,
        num_negatives=k,
        eqco_alpha=alpha,
    )
