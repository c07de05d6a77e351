"""Losses that each break one property ``python -m dcl_core.losses check`` runs (tests/losses/test_check.py), and
one that keeps them all: the checker must fail each broken one on its property and pass the sound one."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from dcl_core.losses import ContrastiveLoss, DCLLoss, LossOutput, PairSimilarities, two_view_similarities


class PositiveWeighted(ContrastiveLoss):
    """Sound: InfoNCE with the positive's term in the denominator weighted by ``positive_weight`` (1: InfoNCE)."""

    def __init__(self, temperature: float = 0.1, gather_distributed: bool = False, positive_weight: float = 1.0):
        super().__init__(temperature, gather_distributed)
        self.positive_weight = positive_weight

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        pos = sims.pos / self.temperature
        log_u = sims.negative_logsumexp(self.temperature)
        loss = (torch.logaddexp(pos + math.log(self.positive_weight), log_u) - pos).mean()
        return LossOutput.with_npc(loss, sims, pos, log_u)


def positive_weighted_reference(z1: Tensor, z2: Tensor, temperature: float, positive_weight: float = 1.0) -> Tensor:
    """PositiveWeighted as a plain loop over the 2N anchors."""
    views = [F.normalize(z, dim=1) for z in (z1, z2)]
    n, terms = z1.shape[0], []
    for v in range(2):
        for i in range(n):
            anchor, positive = views[v][i], views[1 - v][i]
            s_pos = anchor @ positive / temperature
            negatives = [views[w][j] for w in range(2) for j in range(n) if j != i]
            u = sum(torch.exp(anchor @ neg / temperature) for neg in negatives)
            terms.append(torch.log(positive_weight * torch.exp(s_pos) + u) - s_pos)
    return torch.stack(terms).mean()


class ReturnsTensor(DCLLoss):
    """Breaks the contract: a bare tensor, not a LossOutput."""

    def forward(self, z1: Tensor, z2: Tensor):  # type: ignore[override]
        return super().forward(z1, z2).loss


class NaiveExp(ContrastiveLoss):
    """Breaks finiteness: exp(s/τ) summed without a shift overflows at small τ."""

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        pos = sims.pos / self.temperature
        u = torch.exp(sims.neg / self.temperature).sum(dim=1)
        loss = (torch.log(u) - pos).mean()
        return LossOutput(loss=loss)


class HalfPrecision(ContrastiveLoss):
    """Breaks autocast: the whole loss in the input's precision (bf16 under autocast), not fp32."""

    def forward(self, z1: Tensor, z2: Tensor) -> LossOutput:
        a, b = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
        logits = a @ b.T / self.temperature  # bf16 under autocast
        return LossOutput(loss=(torch.logsumexp(logits, dim=1) - logits.diagonal()).mean().float())


class OrderDependent(DCLLoss):
    """Breaks permutation invariance: the anchors weighted by their position in the batch."""

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        pos = sims.pos / self.temperature
        log_u = sims.negative_logsumexp(self.temperature)
        weights = torch.linspace(0.5, 1.5, pos.shape[0])
        return LossOutput(loss=((log_u - pos) * weights).mean())


class _HalfGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return 0.5 * grad


class WrongGradient(DCLLoss):
    """Breaks the gradient: a hand-written backward that halves it."""

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        out = super().from_similarities(sims)
        return LossOutput(loss=_HalfGradient.apply(out.loss), diagnostics=out.diagnostics, npc=out.npc)


class LocalNegatives(DCLLoss):
    """Breaks DDP: never gathers the other ranks' negatives, whatever gather_distributed says."""

    def forward(self, z1: Tensor, z2: Tensor) -> LossOutput:
        return self.from_similarities(two_view_similarities(z1, z2, gather_distributed=False))
