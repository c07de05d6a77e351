"""MoCo-v2 (He et al., 2020; Chen et al., 2020): a momentum key encoder and a FIFO queue of negative keys.

This module also holds the building blocks SiMo and NNCLR reuse: the momentum key encoder and its update
(:func:`make_key_encoder`, :func:`momentum_update`), the ring-buffer queue (:func:`enqueue`), a gradient-free
all-gather (:func:`gather_no_grad`) and the split of a similarity matrix into positive and negatives
(:func:`split_positive`).
"""

from __future__ import annotations

import copy
import logging

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from dcl_core.losses import ContrastiveLoss, LossOutput, PairSimilarities
from dcl_core.losses.base import distributed_world

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------------------
# Shared building blocks (MoCo, SiMo, NNCLR)


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside a DDP wrapper (or the module itself)."""
    return model.module if isinstance(model, DistributedDataParallel) else model


def make_key_encoder(model: nn.Module) -> nn.Module:
    """A frozen deep copy of ``model`` (unwrapped from DDP): θk = θq at initialisation, as in MoCo.

    Its parameters never receive gradients; they only move by :func:`momentum_update`. Its BatchNorm layers
    keep their own running statistics (updated by its own forward passes, as MoCo's key encoder does).
    """
    key_encoder = copy.deepcopy(unwrap(model))
    for p in key_encoder.parameters():
        p.requires_grad_(False)
    return key_encoder


@torch.no_grad()
def momentum_update(key_encoder: nn.Module, model: nn.Module, momentum: float) -> None:
    r"""MoCo's momentum update of the key encoder, :math:`\theta_k \leftarrow \beta\theta_k + (1-\beta)\theta_q`.

    MoCo (He et al., 2020) Eq. 2; EqCo Appendix B.1 uses the same rule for SiMo. Parameters only: BatchNorm
    running statistics are buffers and are not averaged (MoCo's reference implementation does the same).
    β = 0 copies θq exactly.

    Args:
        key_encoder: the momentum encoder (θk), updated in place.
        model: the query encoder (θq), possibly DDP-wrapped.
        momentum: β in [0, 1).
    """
    q_params = list(unwrap(model).parameters())
    k_params = list(key_encoder.parameters())
    if len(q_params) != len(k_params):
        raise ValueError(f"key encoder has {len(k_params)} parameters, the query encoder {len(q_params)}")
    for pk, pq in zip(k_params, q_params, strict=True):
        if momentum == 0.0:
            pk.copy_(pq)
        else:
            pk.mul_(momentum).add_(pq.detach(), alpha=1.0 - momentum)


@torch.no_grad()
def gather_no_grad(x: Tensor) -> Tensor:
    """``x`` from every rank concatenated along dim 0 (rank order), without gradient; ``x`` itself if single."""
    _, world = distributed_world()
    if world == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world)]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=0)  # (world * n, ...)


@torch.no_grad()
def enqueue(queue: Tensor, ptr: Tensor, keys: Tensor) -> None:
    """FIFO update of a ring-buffer queue: overwrite the oldest ``len(keys)`` rows, wrapping around.

    Row ``ptr`` is the oldest entry. The keys are written to rows ``ptr, ptr+1, … (mod K)`` in order and
    ``ptr`` advances by ``len(keys)`` modulo K, so K need not be a multiple of the batch (MoCo's reference
    implementation requires it). If more than K keys arrive at once, only the last K are kept.

    Args:
        queue: (K, D) buffer, updated in place.
        ptr: 0-d long buffer, index of the oldest row; updated in place.
        keys: (n, D) new entries (already normalized, detached).
    """
    size = queue.shape[0]
    n = keys.shape[0]
    start = int(ptr)
    if n > size:
        keys = keys[n - size :]  # (K, D): the newest K keys
        start = (start + n - size) % size
    idx = (start + torch.arange(keys.shape[0], device=queue.device)) % size  # (m,) distinct rows
    queue[idx] = keys.to(device=queue.device, dtype=queue.dtype)
    ptr.fill_((int(ptr) + n) % size)


def split_positive(sim: Tensor, pos_col: Tensor) -> tuple[Tensor, Tensor]:
    """Split each row of a similarity matrix into its positive column and the remaining (negative) columns.

    Args:
        sim: (A, M) similarities of A anchors with M candidates.
        pos_col: (A,) column of each anchor's positive.

    Returns:
        pos (A,) and neg (A, M − 1) with the column order preserved.
    """
    a, m = sim.shape
    pos = sim.gather(1, pos_col[:, None]).squeeze(1)  # (A,)
    cols = torch.arange(m, device=sim.device)[None, :]  # (1, M)
    keep = cols != pos_col[:, None]  # (A, M), M − 1 True per row
    neg = sim[keep].view(a, m - 1)  # (A, M − 1)
    return pos, neg


def random_unit_rows(rows: int, dim: int, device: torch.device) -> Tensor:
    """(rows, dim) random unit vectors: MoCo's initial queue (drawn on the CPU RNG, so device-independent)."""
    return F.normalize(torch.randn(rows, dim), dim=1).to(device)  # (rows, dim)


def model_device(model: nn.Module) -> torch.device:
    """Device of the first parameter (CPU for a parameter-free module)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


# ----------------------------------------------------------------------------------------------------------
# MoCo-v2


class MoCo(nn.Module):
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
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.model = model
        self.loss = loss
        self.key_encoder = make_key_encoder(model)
        self.momentum = float(momentum)
        self.symmetric = symmetric
        device = model_device(model)
        self.register_buffer("queue", random_unit_rows(queue_size, dim, device))  # (K, D)
        self.register_buffer("queue_ptr", torch.zeros((), dtype=torch.long, device=device))  # index of oldest
        self._pending_keys: Tensor | None = None  # keys of the last training forward, enqueued by after_step

    @property
    def queue_size(self) -> int:
        return self.queue.shape[0]

    def forward(self, view1: Tensor, view2: Tensor) -> LossOutput:
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
        return f"queue_size={self.queue_size}, momentum={self.momentum}, symmetric={self.symmetric}"
