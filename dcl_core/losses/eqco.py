"""EqCo: InfoNCE with the margin that makes it equivalent across numbers of negatives (Zhu et al., 2020)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from dcl_core import metric_names as M
from dcl_core.config.bounds import Range
from dcl_core.config.loss_registry import LossParam, LossSpec
from dcl_core.losses.base import ContrastiveLoss, LossOutput, PairSimilarities, negative_columns


def sample_negatives(
    neg: Tensor, k: int, generator: torch.Generator | None = None, exclude: Tensor | None = None
) -> Tensor:
    """K negatives drawn without replacement, independently for each anchor (EqCo Sec. 2.3).

    Args:
        neg: (A, M) similarities.
        k: 1 <= k <= K_all, the number of negatives per row (M − E).
        generator: optional RNG for reproducible draws.
        exclude: (A, E) columns of each row that are not negatives (:attr:`PairSimilarities.neg_exclude`);
            never drawn. The draw is the one made on the (A, M − E) matrix of the negatives alone, so a masked
            matrix and its compact copy give the same K negatives for the same RNG state.

    Returns:
        (A, K) the drawn similarities; for K = K_all every negative in column order, without a draw.
    """
    a, m = neg.shape
    available = m if exclude is None else m - exclude.shape[1]
    if not 1 <= k <= available:
        raise ValueError(f"cannot sample K={k} negatives from {available}")
    if k == available and exclude is None:
        return neg
    if k == available:
        positions = torch.arange(k, device=neg.device).expand(a, k)  # (A, K) all of them, in order
    else:
        scores = torch.rand(a, available, device=neg.device, generator=generator)  # (A, K_all)
        positions = scores.topk(k, dim=1).indices  # (A, K), a uniform random K-subset per row
    if exclude is not None:
        positions = negative_columns(positions, exclude)  # (A, K) columns of neg
    return neg.gather(1, positions)  # (A, K)


class EqCoLoss(ContrastiveLoss):
    r"""InfoNCE with margin m = τ·log(α/K) on the positive, written as negatives scaled by α/K.

    EqCo Eq. 1 with the equivalent condition Eq. 5, in the form of Eq. 12:

    .. math::
        L = -\log \frac{e^{(q^\top k_0 - m)/\tau}}{e^{(q^\top k_0 - m)/\tau} + \sum_{i=1}^{K} e^{q^\top k_i/\tau}}
          = -\log \frac{s_0}{s_0 + \frac{\alpha}{K}\sum_{i=1}^{K} s_i},\qquad m = \tau\log\frac{\alpha}{K}

    with :math:`s_i = e^{q^\top k_i/\tau}`. K is the number of negatives per anchor: every negative the framework
    hands over (2N−2 in SimCLR, the queue size in MoCo, N−1 or its own K-sample in SiMo, N−1 in NNCLR), or
    ``num_negatives`` of them sampled per anchor (EqCo Sec. 2.3) so K can be studied apart from the batch.
    α = K is exactly InfoNCE. In SimCLR form every one of the 2N views is an anchor (symmetric, as in DCL Eq. 1).

    Diagnostics: q_B (with the α/K-scaled denominator, the multiplier in EqCo's gradient, Eq. 13) and EqCo's
    empirical mutual-information lower bound f̂ = log(1 + K·e^{m/τ}) − L = log(1 + α) − L.

    Args:
        temperature: τ > 0.
        alpha: α > 0; None means α = K (zero margin).
        num_negatives: K negatives sampled per anchor; 0 uses all in-batch negatives.
        gather_distributed: under DDP, negatives from all ranks.

    Examples:
        >>> out = EqCoLoss(temperature=0.2, alpha=256.0)(torch.randn(8, 16), torch.randn(8, 16))
    """

    spec = LossSpec(
        name="eqco",
        colour="#8c564b",  # brown: EqCo with a fixed α (eqco(α=256))
        params=(
            # None means alpha = K, i.e. zero margin (plain InfoNCE). SiMo uses 256; EqCo MoCo runs 65536.
            LossParam("alpha", float, None, "EqCo alpha: margin m = tau*log(alpha/K) (EqCo Eq. 5); none = K",
                      paper=256.0, bounds=Range(gt=0), derived="eqco_alpha",
                      elsewhere="loss.alpha is EqCo's and has no effect with loss.name={name}: scaling the negatives "
                      "by alpha/K only changes gradients while the positive is in the denominator; use "
                      "loss.name=eqco"),
            LossParam("num_negatives", int, 0,
                      "EqCo: K negatives sampled per anchor (0 = all: 2N-2 for simclr, N-1 for nnclr); not moco/simo",
                      paper=0, bounds=Range(ge=0),
                      elsewhere="loss.num_negatives (K sub-sampling) is only defined for loss.name=eqco"),
        ),
    )

    def __init__(
        self,
        temperature: float = 0.1,
        alpha: float | None = None,
        num_negatives: int = 0,
        gather_distributed: bool = False,
    ) -> None:
        super().__init__(temperature, gather_distributed)
        if alpha is not None and not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        if num_negatives < 0:
            raise ValueError(f"num_negatives must be >= 0, got {num_negatives}")
        self.alpha = None if alpha is None else float(alpha)
        self.num_negatives = int(num_negatives)

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        """EqCo's loss over K sampled negatives (all when ``num_negatives`` is 0), with its MI bound log(1 + α) − L."""
        negatives = sims
        if self.num_negatives and self.num_negatives != sims.num_negatives:  # K < all (K > all raises)
            sampled = sample_negatives(sims.neg, self.num_negatives, exclude=sims.neg_exclude)  # (A, K)
            negatives = PairSimilarities(pos=sims.pos, neg=sampled, pos_batch=sims.pos_batch)
        k = negatives.num_negatives
        alpha = float(k) if self.alpha is None else self.alpha
        pos = sims.pos / self.temperature  # (A,)
        # Departs from InfoNCE here: each negative is scaled by α/K, i.e. the positive gets margin τ·log(α/K).
        log_u = negatives.negative_logsumexp(self.temperature) + math.log(alpha / k)  # (A,) log((α/K) Σ s_i)
        log_denominator = torch.logaddexp(pos, log_u)  # (A,) log(s_0 + (α/K) Σ s_i)
        loss = (log_denominator - pos).mean()
        return LossOutput.with_npc(loss, sims, pos, log_u, {M.Diagnostic.MI_BOUND: (math.log1p(alpha) - loss).detach()})

    def extra_repr(self) -> str:
        """τ, α, K and distributed gathering for ``repr(module)``."""
        return f"{super().extra_repr()}, alpha={self.alpha}, num_negatives={self.num_negatives}"
