"""Decoupled Contrastive Learning loss (DCL paper Prop. 2, Eq. 5-6)."""

from __future__ import annotations

from dcl_core.config.loss_registry import LossSpec
from dcl_core.losses.base import ContrastiveLoss, LossOutput, PairSimilarities


class DCLLoss(ContrastiveLoss):
    r"""InfoNCE with the positive removed from the denominator, averaged over all 2N anchors.

    DCL Eq. 6:

    .. math::
        L_{DC,i}^{(k)} = -\langle z_i^{(1)}, z_i^{(2)}\rangle/\tau + \log U_{i,k},\qquad
        U_{i,k} = \sum_{l\in\{1,2\},\, j\neq i} \exp(\langle z_i^{(k)}, z_j^{(l)}\rangle/\tau)

    Removing the positive removes the NPC multiplier q_B from every gradient (Prop. 1). The loss can be
    negative. Per anchor, InfoNCE − DCL = softplus(s⁺ − log U) ≥ 0.

    Diagnostics: q_B (Eq. 4) computed from the same logits, i.e. the coupling InfoNCE *would* apply here.

    Args:
        temperature: τ > 0.
        gather_distributed: under DDP, negatives from all ranks.

    Examples:
        >>> out = DCLLoss(temperature=0.1)(torch.randn(8, 16), torch.randn(8, 16))
    """

    spec = LossSpec(name="dcl", colour="#1f77b4")  # blue (matplotlib's first cycle colour)

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        """DCL Eq. 6 averaged over the anchors: log U − s⁺, the positive left out of the denominator."""
        pos = sims.pos / self.temperature  # (A,)
        # Key difference from InfoNCE: the denominator sums over negatives only (no positive term).
        log_u = sims.negative_logsumexp(self.temperature)  # (A,) log U_{i,k}
        loss = (log_u - pos).mean()
        return LossOutput.with_npc(loss, sims, pos, log_u)
