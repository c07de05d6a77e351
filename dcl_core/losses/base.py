"""What every contrastive loss shares: its input (:class:`PairSimilarities`), its output (:class:`LossOutput`),
the base class (:class:`ContrastiveLoss`), SimCLR's two-view construction and the NPC diagnostics.

A *framework* (``dcl_core/frameworks``: SimCLR, MoCo, SiMo, NNCLR) decides how anchors, positives and negatives
are formed and hands the loss a :class:`PairSimilarities`: one positive cosine similarity per anchor and a matrix
of negative similarities. A *loss* reduces that to a scalar with its paper's equation
(:meth:`ContrastiveLoss.from_similarities`). ``loss(z1, z2)`` first forms SimCLR's two-view similarities
(:func:`two_view_similarities`; with ``gather_distributed`` under DDP, the negatives of every rank, gathered by
:func:`~dcl_core.distributed.gather_with_grad`).

Notation (DCL Eq. 1-2): for anchor a with positive p and negatives n,
``s⁺ = <z_a, z_p>/τ``, ``U = Σ_n exp(<z_a, z_n>/τ)``, and the NPC multiplier (Eq. 4)
``q_B = U / (exp(s⁺) + U) = sigmoid(log U − s⁺)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcl_core.distributed import distributed_world, gather_with_grad


@dataclass
class PairSimilarities:
    """Cosine similarities (not yet divided by τ) of each anchor with its positive and its negatives.

    Attributes:
        pos: (A,) similarity of each anchor with its positive.
        neg: (A, M) similarity of each anchor with each of its M negatives.
        pos_batch: (P,) detached positive similarities of every pair in the (global) batch; batch statistics
            such as DCLW's E_i[·] are taken over these, so they are the same on every DDP rank.
    """

    pos: Tensor
    neg: Tensor
    pos_batch: Tensor


@dataclass
class LossOutput:
    """A scalar loss and per-batch diagnostics (detached 0-d tensors, computed from the same logits).

    ``npc`` holds the per-anchor NPC multipliers q_B (A,), detached, for distributions (DCL Fig. 1); ``None``
    for losses without one.
    """

    loss: Tensor
    diagnostics: dict[str, Tensor] = field(default_factory=dict)
    npc: Tensor | None = None


def two_view_similarities(z1: Tensor, z2: Tensor, gather_distributed: bool = False) -> PairSimilarities:
    """SimCLR's construction: 2n anchors (both views), positive = the other view, 2N−2 negatives each.

    Args:
        z1: (n, D) projections of view 1 on this rank (normalized here).
        z2: (n, D) projections of view 2.
        gather_distributed: under DDP, take negatives from all ranks (global batch N = world * n). Anchors
            stay local; the mean over ranks of the per-rank loss is then the full-batch loss.
    """
    if z1.shape != z2.shape or z1.dim() != 2:
        raise ValueError(f"z1 and z2 must both be (N, D); got {tuple(z1.shape)} and {tuple(z2.shape)}")
    n = z1.shape[0]
    rank, world = distributed_world() if gather_distributed else (0, 1)
    if n * world < 2:
        raise ValueError("a contrastive loss needs at least 2 samples in the batch")
    # Similarities in fp32 even under autocast: logits reach 1/τ = 200 at τ = 0.005.
    with torch.autocast(device_type=z1.device.type, enabled=False):
        z1 = F.normalize(z1.float(), dim=1)
        z2 = F.normalize(z2.float(), dim=1)
        z1_all = gather_with_grad(z1) if world > 1 else z1  # (N, D)
        z2_all = gather_with_grad(z2) if world > 1 else z2  # (N, D)
        big_n = z1_all.shape[0]
        anchors = torch.cat([z1, z2], dim=0)  # (2n, D): view-1 anchors, then view-2 anchors
        keys = torch.cat([z1_all, z2_all], dim=0)  # (2N, D): same layout over the global batch
        sim = torch.einsum("ad,kd->ak", anchors, keys)  # (2n, 2N)

    local = torch.arange(n, device=z1.device) + rank * n  # (n,) global index of this rank's samples
    self_col = torch.cat([local, local + big_n])  # (2n,) column of each anchor itself
    pos_col = torch.cat([local + big_n, local])  # (2n,) column of its positive (the other view)
    pos = sim.gather(1, pos_col[:, None]).squeeze(1)  # (2n,)
    cols = torch.arange(2 * big_n, device=z1.device)[None, :]  # (1, 2N)
    keep = (cols != self_col[:, None]) & (cols != pos_col[:, None])  # (2n, 2N), 2N−2 True per row
    neg = sim[keep].view(2 * n, 2 * big_n - 2)  # (2n, 2N−2), column order preserved
    pos_batch = (z1_all * z2_all).sum(dim=1).detach()  # (N,)
    return PairSimilarities(pos=pos, neg=neg, pos_batch=pos_batch)


def npc_multiplier(pos_logit: Tensor, log_u: Tensor) -> Tensor:
    """Per-anchor q_B = U / (e^{s⁺} + U) = sigmoid(log U − s⁺) (DCL Eq. 4), detached; stable for any τ."""
    with torch.no_grad():
        return torch.sigmoid(log_u - pos_logit)  # (A,)


def npc_diagnostics(pos_logit: Tensor, log_u: Tensor) -> dict[str, Tensor]:
    """NPC multiplier q_B (DCL Eq. 4) statistics from logits: mean, std and coefficient of variation.

    Args:
        pos_logit: (A,) s⁺ = <z_a, z_p>/τ.
        log_u: (A,) log U, the log-sum-exp of the negative logits (EqCo: including its log(α/K) shift).
    """
    with torch.no_grad():
        q = npc_multiplier(pos_logit, log_u)  # (A,)
        mean = q.mean()
        std = q.std(unbiased=False)
        return {"q_mean": mean, "q_std": std, "q_cv": std / mean.clamp_min(1e-12)}


def similarity_diagnostics(sims: PairSimilarities) -> dict[str, Tensor]:
    """Mean positive and negative cosine similarity (alignment and spread of the embedding)."""
    with torch.no_grad():
        return {"pos_sim": sims.pos.mean(), "neg_sim": sims.neg.mean()}


class ContrastiveLoss(nn.Module):
    """Base for losses of the form ``loss(z1, z2) -> LossOutput`` over SimCLR's two views.

    Subclasses implement :meth:`from_similarities`, which frameworks other than SimCLR call directly with
    their own anchors/positives/negatives.

    Args:
        temperature: τ > 0. It only divides similarities; no τ-dependent factor scales the loss, so a
            temperature sweep changes nothing but τ.
        gather_distributed: under DDP, use every rank's samples as negatives.
    """

    def __init__(self, temperature: float = 0.1, gather_distributed: bool = False) -> None:
        super().__init__()
        if not temperature > 0 or not math.isfinite(temperature):
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)
        self.gather_distributed = gather_distributed

    def forward(self, z1: Tensor, z2: Tensor) -> LossOutput:
        return self.from_similarities(two_view_similarities(z1, z2, self.gather_distributed))

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:  # pragma: no cover - abstract
        raise NotImplementedError

    def extra_repr(self) -> str:
        return f"temperature={self.temperature}, gather_distributed={self.gather_distributed}"
