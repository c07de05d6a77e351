"""SiMo (EqCo Sec. 3, Zhu et al., 2020): MoCo-v2 without the queue, negatives from the current batch's keys."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcl_core.distributed import distributed_world, gather_no_grad
from dcl_core.frameworks.common import Framework, make_key_encoder, momentum_update, split_positive
from dcl_core.losses import ContrastiveLoss, LossOutput, PairSimilarities, sample_negatives


class SiMo(Framework):
    r"""Simplified MoCo: a momentum key encoder, no memory bank; the other images' keys are the negatives.

    EqCo Sec. 3: "we use the momentum encoder to extract both positive and negative key embeddings from the
    current batch". For the query :math:`q_i` of image i (view 1, query encoder θq) and the keys
    :math:`k_j` of view 2 (key encoder θk, no gradient), all L2-normalized:

    .. math::
        \mathrm{pos}_i = \langle q_i, k_i\rangle,\qquad
        \mathrm{neg}_i = \{\langle q_i, k_j\rangle : j \in S_i\},\quad S_i \subseteq \{1..N\}\setminus\{i\},
        \ |S_i| = K

    where :math:`S_i` is all N − 1 other images (``num_negatives=0``) or K of them drawn uniformly without
    replacement, independently per query (EqCo Sec. 2.3, :func:`~dcl_core.losses.eqco.sample_negatives`).
    The loss then sees exactly K columns, so ``EqCoLoss(alpha=α, num_negatives=0)`` applies the margin
    τ·log(α/K) of EqCo Eq. 5/12 with this K (SiMo: K = 16…256, α = 256 or 65536, EqCo Table 2). With α = K
    (or α = None) EqCo is plain InfoNCE on the same similarities.

    Choices made here:

    - **Symmetric by default**: view-2 queries against view-1 keys as well (A = 2n anchors, loss = mean),
      both views through each encoder as one batch of 2n; ``symmetric=False`` uses view-1 queries only.
      Keys come from the *other* view only, as in MoCo (never the query view's own keys), so N − 1
      negatives are available per query.
    - **Momentum** θk ← β·θk + (1 − β)·θq after every optimizer step (:meth:`after_step`; EqCo App. B.1).
    - **DDP**: with ``gather_distributed`` the keys of all ranks are gathered (no gradient), so N is the global
      batch; otherwise each rank contrasts within its own n. No shuffling BN (EqCo uses SyncBN for SiMo: the
      positive and the negatives come from the same batch, so no BN statistic tells them apart).

    Args:
        model: query encoder mapping images (B, 3, H, W) to (features, projections); may be DDP-wrapped.
        loss: any loss with ``from_similarities`` (not align_uniform); for EqCo pass ``num_negatives=0``.
        momentum: β in [0, 1); 0.999 as in MoCo-v2 / EqCo App. B.1.
        num_negatives: K keys per query; 0 = all N − 1 other images.
        symmetric: also use view-2 queries against view-1 keys.
        gather_distributed: under DDP, keys from all ranks.
        generator: optional RNG for the per-query K-sampling.

    Example:
        >>> fw = SiMo(model, EqCoLoss(temperature=0.2, alpha=256.0), num_negatives=16)
    """

    def __init__(
        self,
        model: nn.Module,
        loss: ContrastiveLoss,
        momentum: float = 0.999,
        num_negatives: int = 0,
        symmetric: bool = True,
        gather_distributed: bool = False,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        if num_negatives < 0:
            raise ValueError(f"num_negatives must be >= 0, got {num_negatives}")
        self.model = model
        self.loss = loss
        self.key_encoder = make_key_encoder(model)
        self.momentum = float(momentum)
        self.num_negatives = int(num_negatives)
        self.symmetric = symmetric
        self.gather_distributed = gather_distributed
        self.generator = generator

    def forward(self, view1: Tensor, view2: Tensor) -> LossOutput:
        """The loss of the queries against their momentum keys, the batch's other keys as negatives."""
        n = view1.shape[0]
        rank, world = distributed_world() if self.gather_distributed else (0, 1)
        if self.symmetric:
            _, q = self.model(torch.cat([view1, view2], dim=0))  # (2n, D): view-1 queries, then view-2
            with torch.no_grad():
                _, k = self.key_encoder(torch.cat([view1, view2], dim=0))  # (2n, D)
        else:
            _, q = self.model(view1)  # (n, D)
            with torch.no_grad():
                _, k = self.key_encoder(view2)  # (n, D)
        with torch.autocast(device_type=q.device.type, enabled=False):
            q = F.normalize(q.float(), dim=1)  # (A, D)
            k = F.normalize(k.float(), dim=1)  # (A, D)
            if self.symmetric:
                q1, q2 = q.chunk(2, dim=0)  # (n, D) each
                k1, k2 = k.chunk(2, dim=0)  # (n, D) each
            else:
                q1, k2 = q, k  # (n, D) each
            k2_all = gather_no_grad(k2) if world > 1 else k2  # (N, D)
            if k2_all.shape[0] < 2:
                raise ValueError("SiMo needs at least 2 images in the batch (negatives are the other images)")
            sim = torch.einsum("ad,kd->ak", q1, k2_all)  # (n, N): view-1 queries vs view-2 keys
            if self.symmetric:
                k1_all = gather_no_grad(k1) if world > 1 else k1  # (N, D)
                sim21 = torch.einsum("ad,kd->ak", q2, k1_all)  # (n, N): view-2 queries vs view-1 keys
                sim = torch.cat([sim, sim21], dim=0)  # (2n, N)
        local = torch.arange(n, device=q.device) + rank * n  # (n,) global index of this rank's images
        pos_col = local.repeat(sim.shape[0] // n)  # (A,) the same image's key
        pos, neg = split_positive(sim, pos_col)  # (A,), (A, N − 1)
        if self.num_negatives and self.num_negatives < neg.shape[1]:
            neg = sample_negatives(neg, self.num_negatives, self.generator)  # (A, K)
        elif self.num_negatives > neg.shape[1]:
            raise ValueError(f"num_negatives={self.num_negatives} exceeds the {neg.shape[1]} other images' keys")
        pos_batch = gather_no_grad(pos.detach()) if world > 1 else pos.detach()  # (world * A,)
        return self.loss.from_similarities(PairSimilarities(pos=pos, neg=neg, pos_batch=pos_batch))

    @torch.no_grad()
    def after_step(self) -> None:
        """After each optimizer step: momentum-update the key encoder."""
        momentum_update(self.key_encoder, self.model, self.momentum)

    def extra_repr(self) -> str:
        """Momentum, negatives, symmetry and gathering for ``repr(module)``."""
        return (
            f"momentum={self.momentum}, num_negatives={self.num_negatives}, symmetric={self.symmetric}, "
            f"gather_distributed={self.gather_distributed}"
        )
