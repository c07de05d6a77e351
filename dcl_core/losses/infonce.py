"""InfoNCE / NT-Xent, the SimCLR objective (DCL paper Eq. 1-2; Chen et al. 2020)."""

from __future__ import annotations

import math

import torch

from dcl_core import metric_names as M
from dcl_core.config.loss_registry import LossSpec
from dcl_core.losses.base import ContrastiveLoss, LossOutput, PairSimilarities


class InfoNCELoss(ContrastiveLoss):
    r"""NT-Xent with the positive in the denominator, averaged over all 2N anchors (both views).

    DCL Eq. 1-2, for view k of sample i:

    .. math::
        L_i^{(k)} = -\log \frac{\exp(\langle z_i^{(1)}, z_i^{(2)}\rangle/\tau)}
                              {\exp(\langle z_i^{(1)}, z_i^{(2)}\rangle/\tau) + U_{i,k}},\qquad
        U_{i,k} = \sum_{l\in\{1,2\},\, j\neq i} \exp(\langle z_i^{(k)}, z_j^{(l)}\rangle/\tau)

    The reported loss is the mean over the 2N anchors. Computed as ``logaddexp(s⁺, log U) − s⁺`` with log U a
    max-shifted log-sum-exp, so it stays finite for τ down to 0.005 in fp32.

    Diagnostics: NPC multiplier q_B (Eq. 4) mean/std/Cv and the empirical mutual-information lower bound
    ``log(1 + K) − L`` (EqCo Sec. 2.1 with m = 0; K = negatives per anchor).

    Args:
        temperature: τ > 0.
        gather_distributed: under DDP, negatives from all ranks.

    Examples:
        >>> loss_fn = InfoNCELoss(temperature=0.1)
        >>> out = loss_fn(torch.randn(8, 16), torch.randn(8, 16))
        >>> out.loss.shape
        torch.Size([])
    """

    spec = LossSpec(name="infonce", colour="#ff7f0e")  # orange (matplotlib's second cycle colour)

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        """InfoNCE averaged over the anchors, with its MI bound log(1 + K) − L as a diagnostic."""
        pos = sims.pos / self.temperature  # (A,)
        log_u = sims.negative_logsumexp(self.temperature)  # (A,) log U_{i,k}
        # The positive stays in the denominator: this is what couples positives and negatives (NPC).
        log_denominator = torch.logaddexp(pos, log_u)  # (A,) log(e^{s⁺} + U)
        per_anchor = log_denominator - pos  # (A,)
        loss = per_anchor.mean()
        k = sims.num_negatives
        return LossOutput.with_npc(loss, sims, pos, log_u, {M.Diagnostic.MI_BOUND: (math.log1p(k) - loss).detach()})
