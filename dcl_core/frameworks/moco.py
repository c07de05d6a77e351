"""MoCo-v2 (He et al., 2020; Chen et al., 2020): a momentum key encoder and a FIFO queue of negative keys.

Its key encoder and queue are the building blocks in :mod:`dcl_core.frameworks.common`, shared with SiMo and NNCLR.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcl_core.distributed import gather_no_grad
from dcl_core.frameworks.common import Framework, enqueue, make_key_encoder, momentum_update, register_queue
from dcl_core.losses import ContrastiveLoss, LossOutput, PairSimilarities


class MoCo(Framework):
    r"""MoCo-v2: queries from the trained encoder, keys from its momentum copy, negatives from a key queue.

    For a query :math:`q` (view 1 through the query encoder θq), its positive key :math:`k_+` (view 2 of the
    same image through the key encoder θk) and the K queued keys :math:`k_1..k_K` (MoCo Eq. 1):

    .. math::
        \mathrm{pos} = \langle q, k_+\rangle,\qquad \mathrm{neg}_j = \langle q, k_j\rangle,\ j = 1..K

    (all L2-normalized, no gradient through keys), handed to the loss's ``from_similarities`` as
    ``PairSimilarities(pos=(A,), neg=(A, K), pos_batch=(P,))``. MoCo + InfoNCE is MoCo-v2's loss; MoCo + DCL
    drops the positive from the denominator (DCL Eq. 6, Table 5 / Fig. 3b); MoCo + EqCo adds the margin
    τ·log(α/K) with K = queue size (EqCo Eq. 5).

    Choices made here:

    - **Symmetric by default** (MoCo-v3 style, and like this library's SimCLR): view-1 queries use view-2 keys
      as positives *and* view-2 queries use view-1 keys; A = 2n anchors, the loss is their mean. Both views go
      through each encoder as one batch of 2n. ``symmetric=False`` is MoCo-v2's one-directional form (A = n,
      query encoder on view 1 only, key encoder on view 2 only).
    - **Queue**: a registered (K, D) buffer + a pointer buffer, so both are checkpointed. Initialised with
      random unit vectors, as MoCo does (not "only the filled part"): the first ⌈K/N⌉ steps see some random
      negatives. After each optimizer step (:meth:`after_step`) the N view-2 keys of the last forward pass
      (the positives of the view-1 queries, the keys MoCo-v2 enqueues; also when symmetric, so the queue
      holds one key per image of the last K images) replace the N oldest entries (FIFO, wrapping around).
    - **Momentum** update θk ← β·θk + (1 − β)·θq after every optimizer step, then the enqueue. This is the
      order of MoCo's reference code (update at the start of the next forward).
    - **DDP**: keys are gathered from all ranks (no gradient) before enqueuing, so every rank holds the same
      queue of global keys; ``pos_batch`` is gathered too.
    - **Shuffle-free**: no shuffling BN. MoCo shuffles the key batch across GPUs so BatchNorm statistics cannot
      leak which key is the positive; here keys are computed with the key encoder's own batch statistics on
      the unshuffled batch (single process: nothing to shuffle across). Under multi-GPU DDP the trainer's
      SyncBN (``model.sync_bn``) is copied into the key encoder too, which is SiMo's choice (EqCo Sec. 3).

    Args:
        model: query encoder mapping images (B, 3, H, W) to (features, projections (B, D)); may be DDP-wrapped.
        loss: any loss with ``from_similarities`` (not align_uniform).
        dim: projection dimension D (size of the queued keys).
        queue_size: K ≥ 1, the number of negatives per query (DCL Table 5 sweeps 32…65536).
        momentum: β in [0, 1); 0.999 in MoCo-v2.
        symmetric: also use view-2 queries against view-1 keys.

    Example:
        >>> fw = MoCo(model, DCLLoss(temperature=0.2), dim=128, queue_size=4096)
        >>> out = fw(view1, view2); out.loss.backward(); opt.step(); fw.after_step()
    """

    # Buffers made by register_queue (declared for the type checker: nn.Module's attributes are Tensor | Module).
    queue: Tensor
    queue_ptr: Tensor

    def __init__(
        self,
        model: nn.Module,
        loss: ContrastiveLoss,
        dim: int,
        queue_size: int = 4096,
        momentum: float = 0.999,
        symmetric: bool = True,
    ) -> None:
        super().__init__()
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.model = model
        self.loss = loss
        self.key_encoder = make_key_encoder(model)
        self.momentum = float(momentum)
        self.symmetric = symmetric
        register_queue(self, "queue", queue_size, dim, model)  # queue (K, D), queue_ptr: index of the oldest row
        self._pending_keys: Tensor | None = None  # keys of the last training forward, enqueued by after_step

    @property
    def queue_size(self) -> int:
        """K, the number of keys the queue holds."""
        return self.queue.shape[0]

    def forward(self, view1: Tensor, view2: Tensor) -> LossOutput:
        """The loss of the queries against their momentum keys (positives) and the queued keys (negatives)."""
        n = view1.shape[0]
        if self.symmetric:
            _, q = self.model(torch.cat([view1, view2], dim=0))  # (2n, D): view-1 queries, then view-2
            with torch.no_grad():
                _, k = self.key_encoder(torch.cat([view1, view2], dim=0))  # (2n, D)
            k1, k2 = k.chunk(2, dim=0)  # (n, D) each
            positives = torch.cat([k2, k1], dim=0)  # (2n, D): query of view v ↔ key of the other view
        else:
            _, q = self.model(view1)  # (n, D)
            with torch.no_grad():
                _, positives = self.key_encoder(view2)  # (n, D)
        # Similarities in fp32 even under autocast (logits reach 1/τ).
        with torch.autocast(device_type=q.device.type, enabled=False):
            q = F.normalize(q.float(), dim=1)  # (A, D)
            positives = F.normalize(positives.detach().float(), dim=1)  # (A, D), no gradient through keys
            pos = (q * positives).sum(dim=1)  # (A,)
            neg = torch.einsum("ad,kd->ak", q, self.queue)  # (A, K)
        if self.training:
            self._pending_keys = gather_no_grad(positives[:n])  # (N, D): the view-2 keys, all ranks
        pos_batch = gather_no_grad(pos.detach())  # (world * A,)
        return self.loss.from_similarities(PairSimilarities(pos=pos, neg=neg, pos_batch=pos_batch))

    @torch.no_grad()
    def after_step(self) -> None:
        """After each optimizer step: momentum-update the key encoder, then enqueue the last batch's keys."""
        momentum_update(self.key_encoder, self.model, self.momentum)
        if self._pending_keys is not None:
            enqueue(self.queue, self.queue_ptr, self._pending_keys)
            self._pending_keys = None

    def extra_repr(self) -> str:
        """Queue size, momentum and symmetry for ``repr(module)``."""
        return f"queue_size={self.queue_size}, momentum={self.momentum}, symmetric={self.symmetric}"
