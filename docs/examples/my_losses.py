"""An example of your own loss (docs/own-loss.md): InfoNCE with the positive's term in the denominator weighted.

    L_i = -s⁺/τ + log(w·exp(s⁺/τ) + Σ_n exp(s_n/τ))

w = 1 is InfoNCE; w → 0 approaches DCL, whose denominator leaves the positive out (DCL Eq. 6).
"""

from __future__ import annotations

import math

import torch

from dcl_core.losses import ContrastiveLoss, LossOutput, PairSimilarities


class PositiveWeighted(ContrastiveLoss):
    """InfoNCE with weight ``positive_weight`` on the positive's term of the denominator."""

    def __init__(self, temperature: float = 0.1, gather_distributed: bool = False,
                 positive_weight: float = 1.0) -> None:
        super().__init__(temperature, gather_distributed)
        if not positive_weight > 0:
            raise ValueError(f"positive_weight must be > 0, got {positive_weight}")
        self.positive_weight = float(positive_weight)

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        """The loss of every anchor, from its positive's and its negatives' similarities."""
        pos = sims.pos / self.temperature  # (A,) s⁺/τ
        log_u = sims.negative_logsumexp(self.temperature)  # (A,) log Σ_n exp(s_n/τ), max-shifted
        loss = (torch.logaddexp(pos + math.log(self.positive_weight), log_u) - pos).mean()
        return LossOutput.with_npc(loss, sims, pos, log_u)  # q_B and the similarity diagnostics, as the built-ins
