"""Weighted DCL with the negative von Mises-Fisher weight (DCL paper Eq. 7)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dcl_core import metric_names as M
from dcl_core.config.bounds import Range
from dcl_core.config.loss_registry import LossParam, LossSpec
from dcl_core.losses.base import ContrastiveLoss, LossOutput, PairSimilarities


def vmf_weights(pos: Tensor, pos_batch: Tensor, sigma: float) -> Tensor:
    r"""The vMF weight w = 2 − exp(<z1,z2>/σ) / E_i[exp(<z1,z2>/σ)], detached; E_i over the (global) batch of pairs.

    Computed in log space: exp(pos/σ − (logsumexp(pos_batch/σ) − log P)), so σ → 0 cannot overflow.

    Args:
        pos: (A,) positive similarities of the anchors being weighted.
        pos_batch: (P,) positive similarities of every pair in the batch.
        sigma: σ > 0.
    """
    with torch.no_grad():
        top = pos_batch.max()  # shift before dividing by σ: keeps E[w] = 1 in fp32 even for tiny σ
        log_mean = torch.logsumexp((pos_batch - top) / sigma, dim=0) - math.log(pos_batch.numel())  # ()
        return 2.0 - torch.exp((pos.detach() - top) / sigma - log_mean)  # (A,)


class DCLWLoss(ContrastiveLoss):
    r"""DCL with a per-pair weight on the positive term that favours hard positives.

    DCL Eq. 7:

    .. math::
        L_{DCW,i}^{(k)} = -w(z_i^{(1)}, z_i^{(2)})\,\langle z_i^{(1)}, z_i^{(2)}\rangle/\tau + \log U_{i,k},
        \qquad w = 2 - \frac{\exp(\langle z_i^{(1)}, z_i^{(2)}\rangle/\sigma)}
                            {E_i[\exp(\langle z_i^{(1)}, z_i^{(2)}\rangle/\sigma)]}

    so E[w] = 1; the weights are computed from detached similarities (a reweighting, not a new gradient path),
    and E_i is over the global batch under DDP. σ → ∞ gives w → 1, i.e. DCL. The paper uses σ = 0.5.

    Args:
        temperature: τ > 0.
        sigma: σ > 0.
        gather_distributed: under DDP, negatives (and E_i) from all ranks.

    Examples:
        >>> out = DCLWLoss(temperature=0.1, sigma=0.5)(torch.randn(8, 16), torch.randn(8, 16))
    """

    spec = LossSpec(
        name="dclw",
        colour="#2ca02c",  # green
        # dclw_sigma_sweep runs sigma = 1000 as the DCL limit.
        params=(LossParam("sigma", float, 0.5, "DCLW: vMF weight scale sigma (Eq. 7)", paper=0.5,
                          bounds=Range(gt=0, cap=1e6)),),
    )

    detached = "the vMF weights w (computed from detached similarities)"

    def __init__(
        self, temperature: float = 0.1, sigma: float = 0.5, gather_distributed: bool = False
    ) -> None:
        super().__init__(temperature, gather_distributed)
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0, got {sigma}")
        self.sigma = float(sigma)

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        """DCL Eq. 7 averaged over the anchors, with the std of the weights as a diagnostic."""
        pos = sims.pos / self.temperature  # (A,)
        log_u = sims.negative_logsumexp(self.temperature)  # (A,) negatives only, as in DCL
        w = vmf_weights(sims.pos, sims.pos_batch, self.sigma)  # (A,)
        # Departs from DCL (and InfoNCE) here: the positive logit is reweighted per pair.
        loss = (log_u - w * pos).mean()
        return LossOutput.with_npc(loss, sims, pos, log_u, {M.Diagnostic.WEIGHT_STD: w.std(unbiased=False)})

    def extra_repr(self) -> str:
        """τ, σ and distributed gathering for ``repr(module)``."""
        return f"{super().extra_repr()}, sigma={self.sigma}"
