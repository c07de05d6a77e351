"""Losses that each break one property ``python -m dcl_core.losses check`` runs (tests/losses/test_check.py), and
one that keeps them all: the checker must fail each broken one on its property and pass the sound one."""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable

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
    """Breaks finiteness: exp(s/τ) summed, then the log taken (no max shift), overflows at small τ."""

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        pos = sims.pos / self.temperature
        u = torch.exp(sims.compact().neg / self.temperature).sum(dim=1)
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


# The mistakes docs/own-loss.md's contract invites, each written as a researcher would write a debiased contrastive
# loss (Chuang et al., 2020) from the docs: the checker must fail each without a reference, on the property meant to
# catch it (tests/losses/test_check.py).

def _debiased(pos: Tensor, log_u: Tensor, k: int, temperature: float, tau_plus: float,
              scale: Callable[[Tensor], Tensor] | None = None, floor_count: int | None = None) -> Tensor:
    """Chuang et al. Eq. 4 in log space: log(e^{s⁺} + max((U − K τ⁺ e^{s⁺}) / (1 − τ⁺), K e^{−1/τ})) − s⁺, with
    U = Σ_n e^{s_n/τ} given as ``log_u`` and K negatives; ``scale`` maps the corrected sum's log (the mistake of
    :class:`DebiasedDroppedFactor`) and ``floor_count`` replaces K in the floor (:class:`DebiasedWrongFloor`)."""
    log_r = math.log(k * tau_plus) + pos - log_u  # (A,) log(K τ⁺ e^{s⁺} / U)
    corrected = torch.where(log_r < 0, log_u + torch.log(-torch.expm1(log_r.clamp(max=-1e-12))),
                            torch.full_like(log_r, -math.inf))  # log(U − K τ⁺ e^{s⁺}), −∞ where it is ≤ 0
    corrected = corrected - math.log(1 - tau_plus) if scale is None else scale(corrected)
    floor = torch.full_like(corrected, math.log(k if floor_count is None else floor_count) - 1 / temperature)
    return (torch.logaddexp(pos, torch.maximum(corrected, floor)) - pos).mean()


class Debiased(ContrastiveLoss):
    """Sound: the debiased contrastive loss (Chuang et al., 2020), with the class prior ``tau_plus``."""

    def __init__(self, temperature: float = 0.1, gather_distributed: bool = False, tau_plus: float = 0.1):
        super().__init__(temperature, gather_distributed)
        self.tau_plus = tau_plus

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        pos = sims.pos / self.temperature
        log_u = sims.negative_logsumexp(self.temperature)
        return LossOutput(loss=_debiased(pos, log_u, sims.num_negatives, self.temperature, self.tau_plus))


def debiased_reference(z1: Tensor, z2: Tensor, temperature: float, tau_plus: float = 0.1) -> Tensor:
    """Debiased as a plain loop over the 2N anchors, with Python's max for the floor."""
    views = [F.normalize(z, dim=1) for z in (z1, z2)]
    n, terms = z1.shape[0], []
    for v in range(2):
        for i in range(n):
            anchor, positive = views[v][i], views[1 - v][i]
            e_pos = torch.exp(anchor @ positive / temperature)
            negatives = [views[w][j] for w in range(2) for j in range(n) if j != i]
            k = len(negatives)
            u = sum(torch.exp(anchor @ neg / temperature) for neg in negatives)
            ng = torch.maximum((u - k * tau_plus * e_pos) / (1 - tau_plus),
                               torch.tensor(k * math.exp(-1 / temperature), dtype=u.dtype))
            terms.append(-torch.log(e_pos / (e_pos + ng)))
    return torch.stack(terms).mean()


class DebiasedSelfAndPositive(Debiased):
    """Mistake 1: ``sims.neg`` read as the negatives alone: the anchor's own and its positive's columns counted."""

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        pos = sims.pos / self.temperature
        log_u = torch.logsumexp(sims.neg / self.temperature, dim=1)
        return LossOutput(loss=_debiased(pos, log_u, sims.num_negatives, self.temperature, self.tau_plus))


class DCLSelfAndPositive(ContrastiveLoss):
    """Mistake 1 in DCL: ``-s⁺/τ + logsumexp(sims.neg/τ)``, self and positive in the denominator (not DCL)."""

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        return LossOutput(loss=(torch.logsumexp(sims.neg / self.temperature, dim=1) - sims.pos / self.temperature)
                          .mean())


class DebiasedCountFromWidth(Debiased):
    """Mistake 2: the number of negatives read from the matrix's width (2N where there are 2N − 2)."""

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        pos = sims.pos / self.temperature
        log_u = sims.negative_logsumexp(self.temperature)
        return LossOutput(loss=_debiased(pos, log_u, sims.neg.shape[1], self.temperature, self.tau_plus))


class DebiasedDroppedFactor(Debiased):
    """Mistake 3: the value right, the gradient without 1/(1 − τ⁺) (the factor applied to a detached copy)."""

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        pos = sims.pos / self.temperature
        log_u = sims.negative_logsumexp(self.temperature)
        keep = 1 - self.tau_plus

        def scale(log_corrected: Tensor) -> Tensor:  # its value log(·/(1 − τ⁺)), its gradient (1 − τ⁺)× the true one
            return log_corrected * keep + (log_corrected * self.tau_plus).detach() - math.log(keep)

        return LossOutput(loss=_debiased(pos, log_u, sims.num_negatives, self.temperature, self.tau_plus, scale))


class DebiasedWrongFloor(Debiased):
    """A wrong equation the properties cannot see: the floor e^{−1/τ} where Chuang et al. have K·e^{−1/τ}. Only a
    reference compared where the floor is active (aligned, collapsed, nearly saturated embeddings) catches it."""

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        pos = sims.pos / self.temperature
        log_u = sims.negative_logsumexp(self.temperature)
        return LossOutput(loss=_debiased(pos, log_u, sims.num_negatives, self.temperature, self.tau_plus,
                                         floor_count=1))


class NaNWithoutGrad(DCLLoss):
    """NaN whenever autograd is off (as under an evaluation's ``torch.no_grad()``), DCL otherwise."""

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        out = super().from_similarities(sims)
        if torch.is_grad_enabled():
            return out
        return LossOutput(loss=out.loss * math.nan, diagnostics=out.diagnostics, npc=out.npc)


class ExitsInInit(DCLLoss):
    """Ends the process (status 0) while it is built."""

    def __init__(self, temperature: float = 0.1, gather_distributed: bool = False):
        os._exit(0)


class ExitsInLoss(DCLLoss):
    """Raises SystemExit(0) in its loss: a checker run in-process would end with status 0 and no table."""

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        sys.exit(0)


class Hangs(DCLLoss):
    """Never returns from its loss."""

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        time.sleep(3600)
        return super().from_similarities(sims)


def _in_gloo_rank() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


class AbortsAtTeardown(DCLLoss):
    """Sound DCL whose DDP ranks end by SIGABRT once their main thread is done, as gloo's transport thread ends a
    rank whose peer hung up during the process group's teardown (std::terminate on "Connection closed by peer")."""

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        if _in_gloo_rank():
            main = threading.main_thread()
            threading.Thread(target=lambda: (main.join(), os.abort()), daemon=False).start()
        return super().from_similarities(sims)


class AbortsInDDP(DCLLoss):
    """Ends its DDP ranks by SIGABRT in the loss itself, before they have a result (one process: sound DCL)."""

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        if _in_gloo_rank():
            os.abort()
        return super().from_similarities(sims)
