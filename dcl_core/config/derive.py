"""Values derived from a config, computed in one place: the scaled learning rate, the per-rank batch, EqCo's K and
the α it uses."""

from __future__ import annotations

from dataclasses import dataclass

from dcl_core.config.negatives import NEGATIVES
from dcl_core.config.schema import Config, ConfigError, value_at


@dataclass(frozen=True)
class Derived:
    """Values computed from a config, in one place (nothing else re-derives them)."""

    lr: float  # peak lr = base_lr * global batch / 256 (linear scaling rule; DCL Sec. 4.1, EqCo Sec. 2.2)
    per_rank_batch: int  # global batch / world size
    num_negatives: int  # K: negatives per anchor seen by the loss, per framework (see derive)
    eqco_alpha: float  # alpha actually used (alpha = K when unset: zero margin)


def derive(cfg: Config, world_size: int = 1) -> Derived:
    """Compute derived values; ``world_size`` is the number of DDP ranks sharing the global batch.

    K, the number of negatives per anchor (the K of EqCo's margin τ·log(α/K); α = None means α = K), is what
    the framework's row of :data:`~dcl_core.config.negatives.NEGATIVES` says: the value of its K key, or every
    negative it offers for N images, N being the batch the negatives come from (global with
    ``loss.gather_distributed``, else per rank).
    """
    per_rank = per_rank_batch(cfg.optim.batch_size, world_size)
    big_n = cfg.optim.batch_size if cfg.loss.gather_distributed else per_rank
    name = cfg.framework.name
    negatives = NEGATIVES[name]  # the framework's row: what it offers, which key sets K
    available = negatives.offered(big_n, cfg.framework.queue_size)
    k = value_at(cfg, negatives.k_key) or available
    if available < 1 or k > available:
        raise ConfigError(
            f"{name} with a per-rank batch of {per_rank} (gather_distributed="
            f"{cfg.loss.gather_distributed}) offers {available} negatives per anchor, fewer than K={k}"
        )
    given = value_at(cfg, "loss.alpha")  # EqCo's option (dcl_core/losses/eqco.py)
    alpha = float(k) if given is None else given
    return Derived(
        lr=cfg.optim.base_lr * cfg.optim.batch_size / 256,
        per_rank_batch=per_rank,
        num_negatives=k,
        eqco_alpha=alpha,
    )


def per_rank_batch(batch_size: int, world_size: int) -> int:
    """Each DDP rank's share of the global batch; ConfigError unless ``world_size`` ranks split it evenly (fewer
    images than ranks included)."""
    if batch_size % world_size:
        raise ConfigError(f"optim.batch_size={batch_size} is not divisible by the {world_size} DDP workers")
    return batch_size // world_size
