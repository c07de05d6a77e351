"""The building blocks the frameworks share: their base class (:class:`Framework`); for MoCo, SiMo and NNCLR
the momentum key encoder and its update, the ring-buffer queue (random unit rows at first, then a FIFO of keys)
and the split of a similarity matrix into each anchor's positive and negatives.

The all-gathers they use (with and without gradient) are in :mod:`dcl_core.distributed`.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dcl_core.distributed import unwrap


class Framework(nn.Module):
    """Base of the frameworks: ``forward(view1, view2) -> LossOutput``, and :meth:`after_step` after every
    optimizer step, which the trainer calls on whichever framework the config names."""

    def after_step(self) -> None:
        """Per-step state update (momentum encoder, queue); none unless the framework keeps such state."""


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


def register_queue(module: nn.Module, name: str, rows: int, dim: int, model: nn.Module) -> None:
    """Give ``module`` a ring-buffer queue for :func:`enqueue`: buffer ``name``, ``(rows, dim)`` random unit vectors
    (MoCo's initial queue, drawn on the CPU RNG so it is device-independent), and ``{name}_ptr``, the index of its
    oldest row, both on ``model``'s device."""
    if rows < 1:
        raise ValueError(f"queue_size must be >= 1, got {rows}")
    device = model_device(model)
    module.register_buffer(name, F.normalize(torch.randn(rows, dim), dim=1).to(device))  # (rows, dim)
    module.register_buffer(f"{name}_ptr", torch.zeros((), dtype=torch.long, device=device))


def model_device(model: nn.Module) -> torch.device:
    """Device of the first parameter (CPU for a parameter-free module)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")
