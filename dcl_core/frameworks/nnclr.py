"""NNCLR (Dwibedi et al., 2021): the positive is the nearest neighbour of a view in a support set of projections."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcl_core.distributed import distributed_world, gather_no_grad, gather_with_grad
from dcl_core.frameworks.common import Framework, enqueue, register_queue, split_positive
from dcl_core.losses import ContrastiveLoss, LossOutput, PairSimilarities


@torch.no_grad()
def nearest_neighbours(z: Tensor, support: Tensor) -> Tensor:
    """For each row of ``z``, the support row with the largest cosine similarity (detached).

    Both inputs are L2-normalized, so the largest dot product is the largest cosine similarity. Ties go to
    the first such row (``argmax``).

    Args:
        z: (n, D) normalized queries.
        support: (Q, D) normalized support set.

    Returns:
        (n, D) the nearest support rows.
    """
    sim = torch.einsum("nd,qd->nq", z, support.to(z.dtype))  # (n, Q)
    return support[sim.argmax(dim=1)].to(z.dtype)  # (n, D)


class NNCLR(Framework):
    r"""Nearest-Neighbour Contrastive Learning: NN(z₁ᵢ) from a support queue replaces z₁ᵢ as the anchor.

    NNCLR's loss (Dwibedi et al., 2021, Eq. 2) for image i, with normalized projections z and the support set Q:

    .. math::
        L_i = -\log \frac{\exp(\langle NN(z^{(1)}_i, Q), z^{(2)}_i\rangle/\tau)}
                         {\sum_{k=1}^{N} \exp(\langle NN(z^{(1)}_i, Q), z^{(2)}_k\rangle/\tau)},\qquad
        NN(z, Q) = \arg\max_{q \in Q} \langle z, q\rangle

    This class builds the similarities and lets the loss decide the form:
    ``pos_i = <NN(z1_i), z2_i>`` and ``neg_i = {<NN(z1_i), z2_j> : j ≠ i}`` (N − 1 in-batch negatives, the
    other view's projections), handed to ``from_similarities``. With InfoNCE this is exactly Eq. 2 (the
    positive is in the denominator); with DCL the positive leaves the denominator (NNCLR + DCL, DCL Table 7
    and Table 10). The symmetric term (default, as in NNCLR) adds ``<NN(z2_i), z1_i>`` against
    ``<NN(z2_i), z1_j>``; the loss is the mean over the 2n anchors.

    Differences from NNCLR as published, on purpose:

    - No prediction head: NNCLR contrasts NN(z1) with a predictor's output p2 = g(z2); this library's models
      have a projection head only, so the other view's projection z2 plays p2's role.
    - Gradients flow only through the other view's projection (z2 for the NN(z1) anchors): the support set
      and therefore NN(·) are detached, as in NNCLR.
    - Support set: a FIFO queue of Q (``queue_size``) normalized view-1 projections, registered buffers
      (checkpointed), updated after each optimizer step (:meth:`after_step`) with the last batch's view-1
      projections (from all ranks under DDP, so the support set is identical on every rank). Initialised
      with random unit vectors, as MoCo's queue (and solo-learn's NNCLR); they are all replaced after ⌈Q/N⌉
      steps, and real projections, usually closer to a query than a random direction, win the lookup sooner.
      NNCLR uses Q = 98,304.

    Args:
        model: maps images (B, 3, H, W) to (features, projections (B, D)); may be DDP-wrapped.
        loss: any loss with ``from_similarities`` (not align_uniform).
        dim: projection dimension D.
        queue_size: support-set size Q ≥ 1.
        symmetric: add the NN(z2)-anchored term.
        gather_distributed: under DDP, the in-batch negatives come from all ranks (with gradient).

    Example:
        >>> fw = NNCLR(model, DCLLoss(temperature=0.1), dim=128, queue_size=4096)
    """

    # Buffers made by register_queue (declared for the type checker: nn.Module's attributes are Tensor | Module).
    support: Tensor
    support_ptr: Tensor

    def __init__(
        self,
        model: nn.Module,
        loss: ContrastiveLoss,
        dim: int,
        queue_size: int = 4096,
        symmetric: bool = True,
        gather_distributed: bool = False,
    ) -> None:
        super().__init__()
        self.model = model
        self.loss = loss
        self.symmetric = symmetric
        self.gather_distributed = gather_distributed
        register_queue(self, "support", queue_size, dim, model)  # support (Q, D), support_ptr: its oldest row
        self._pending: Tensor | None = None  # view-1 projections of the last training forward

    @property
    def queue_size(self) -> int:
        """The number of embeddings the support queue holds."""
        return self.support.shape[0]

    def forward(self, view1: Tensor, view2: Tensor) -> LossOutput:
        """The loss with each anchor replaced by its nearest neighbour in the support queue."""
        n = view1.shape[0]
        _, z = self.model(torch.cat([view1, view2], dim=0))  # (2n, D)
        rank, world = distributed_world() if self.gather_distributed else (0, 1)
        with torch.autocast(device_type=z.device.type, enabled=False):
            z = F.normalize(z.float(), dim=1)  # (2n, D)
            z1, z2 = z.chunk(2, dim=0)  # (n, D) each
            nn1 = nearest_neighbours(z1.detach(), self.support)  # (n, D), no gradient
            z2_all = gather_with_grad(z2) if world > 1 else z2  # (N, D)
            big_n = z2_all.shape[0]
            if big_n < 2:
                raise ValueError("NNCLR needs at least 2 images in the batch (negatives are the other images)")
            sim = torch.einsum("ad,kd->ak", nn1, z2_all)  # (n, N): NN(z1_i) vs view-2 projections
            if self.symmetric:
                nn2 = nearest_neighbours(z2.detach(), self.support)  # (n, D)
                z1_all = gather_with_grad(z1) if world > 1 else z1  # (N, D)
                sim21 = torch.einsum("ad,kd->ak", nn2, z1_all)  # (n, N): NN(z2_i) vs view-1 projections
                sim = torch.cat([sim, sim21], dim=0)  # (2n, N)
        local = torch.arange(n, device=z.device) + rank * n  # (n,) global index of this rank's images
        pos_col = local.repeat(sim.shape[0] // n)  # (A,) column of the same image
        pos, neg = split_positive(sim, pos_col)  # (A,), (A, N − 1)
        if self.training:
            self._pending = gather_no_grad(z1.detach())  # (world * n, D): support update, all ranks
        pos_batch = gather_no_grad(pos.detach()) if world > 1 else pos.detach()  # (world * A,)
        return self.loss.from_similarities(PairSimilarities(pos=pos, neg=neg, pos_batch=pos_batch))

    @torch.no_grad()
    def after_step(self) -> None:
        """After each optimizer step: push the last batch's view-1 projections into the support set (FIFO)."""
        if self._pending is not None:
            enqueue(self.support, self.support_ptr, self._pending)
            self._pending = None

    def extra_repr(self) -> str:
        """Queue size, symmetry and gathering for ``repr(module)``."""
        return f"queue_size={self.queue_size}, symmetric={self.symmetric}, gather_distributed={self.gather_distributed}"
