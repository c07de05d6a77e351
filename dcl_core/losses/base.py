"""What every contrastive loss shares: its input (:class:`PairSimilarities`), its output (:class:`LossOutput`),
the base class (:class:`ContrastiveLoss`), SimCLR's two-view construction and the NPC diagnostics.

A *framework* (``dcl_core/frameworks``: SimCLR, MoCo, SiMo, NNCLR) decides how anchors, positives and negatives
are formed and hands the loss a :class:`PairSimilarities`: one positive cosine similarity per anchor and a matrix
of negative similarities, possibly with a few columns per row that are not negatives of that row (SimCLR's
matrix holds every view, the anchor itself and its positive included). A *loss* reduces that to a scalar with
its paper's equation (:meth:`ContrastiveLoss.from_similarities`). ``loss(z1, z2)`` first forms SimCLR's two-view
similarities (:func:`two_view_similarities`; with ``gather_distributed`` under DDP, the negatives of every rank,
gathered by :func:`~dcl_core.distributed.gather_with_grad`).

Speed: on a CPU the cost of a loss over a large batch is mostly the (A, M) buffers it allocates (a fresh
64 MB tensor costs more than the arithmetic done on it), so the similarity matrix is never copied to drop the
excluded columns; they are set to −inf in the one logits buffer of :func:`negative_logsumexp`, whose backward
allocates the one gradient buffer.

Notation (DCL Eq. 1-2): for anchor a with positive p and negatives n,
``s⁺ = <z_a, z_p>/τ``, ``U = Σ_n exp(<z_a, z_n>/τ)``, and the NPC multiplier (Eq. 4)
``q_B = U / (exp(s⁺) + U) = sigmoid(log U − s⁺)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from dcl_core import metric_names as M
from dcl_core.config.loss_registry import LossSpec
from dcl_core.distributed import distributed_world, gather_with_grad


@dataclass
class PairSimilarities:
    """Cosine similarities (not yet divided by τ) of each anchor with its positive and its negatives.

    Attributes:
        pos: (A,) similarity of each anchor with its positive.
        neg: (A, M) similarity of each anchor with M candidates: its negatives, except the columns listed in
            ``neg_exclude``.
        pos_batch: (P,) detached positive similarities of every pair in the (global) batch; batch statistics
            such as DCLW's E_i[·] are taken over these, so they are the same on every DDP rank.
        neg_exclude: (A, E) long, the E columns of ``neg`` that are not negatives of that row (distinct within
            a row; SimCLR: the anchor itself and its positive), or None when every column is a negative.
            Every use of the negatives (:meth:`negative_logsumexp`, :meth:`negative_mean`, EqCo's sampling)
            skips them, so the matrix is never copied to drop them.
    """

    pos: Tensor
    neg: Tensor
    pos_batch: Tensor
    neg_exclude: Tensor | None = None

    def __post_init__(self) -> None:
        if self.neg_exclude is not None and (
            self.neg_exclude.dim() != 2
            or self.neg_exclude.shape[0] != self.neg.shape[0]
            or self.neg_exclude.shape[1] >= self.neg.shape[1]
        ):
            raise ValueError(
                f"neg_exclude must be (A, E) with E < M for neg (A, M) = {tuple(self.neg.shape)}; "
                f"got {tuple(self.neg_exclude.shape)}"
            )

    @property
    def num_negatives(self) -> int:
        """K, the number of negatives of each anchor: M − E (2N − 2 in SimCLR)."""
        excluded = 0 if self.neg_exclude is None else self.neg_exclude.shape[1]
        return self.neg.shape[1] - excluded

    def negative_logsumexp(self, temperature: float) -> Tensor:
        """(A,) log U = log Σ_n exp(s_n/τ) over each anchor's negatives (see :func:`negative_logsumexp`)."""
        return negative_logsumexp(self.neg, self.neg_exclude, temperature)

    def negative_mean(self) -> Tensor:
        """Detached 0-d mean similarity of the anchors with their negatives (all A·K of them)."""
        with torch.no_grad():
            if self.neg_exclude is None:
                return self.neg.mean()
            total = self.neg.sum() - self.neg.gather(1, self.neg_exclude).sum()  # excluded entries taken out
            return total / (self.neg.shape[0] * self.num_negatives)

    def compact(self) -> PairSimilarities:
        """The same similarities with ``neg`` copied to (A, K), the negatives only in column order, no exclusions.

        A slow reference layout (tests, inspection); the losses use the masked matrix directly.
        """
        if self.neg_exclude is None:
            return self
        positions = torch.arange(self.num_negatives, device=self.neg.device).expand(self.neg.shape[0], -1)  # (A, K)
        neg = self.neg.gather(1, negative_columns(positions, self.neg_exclude))  # (A, K)
        return PairSimilarities(pos=self.pos, neg=neg, pos_batch=self.pos_batch)


def negative_columns(positions: Tensor, exclude: Tensor) -> Tensor:
    """Column of ``neg`` holding each anchor's p-th negative (p = 0..K−1, in column order).

    Args:
        positions: (A, J) positions p among each row's negatives.
        exclude: (A, E) excluded columns of each row (distinct), as in :attr:`PairSimilarities.neg_exclude`.

    Returns:
        (A, J) columns of ``neg``.
    """
    cols = positions
    for skipped in exclude.sort(dim=1).values.unbind(dim=1):  # (A,) each, in ascending column order
        cols = cols + (cols >= skipped[:, None])  # (A, J): step over an excluded column at or before it
    return cols


class _NegativeLogSumExp(torch.autograd.Function):
    """log Σ_n exp(s_n/τ) per row over the non-excluded columns; backward is softmax · g / τ in one buffer.

    The value is torch.logsumexp of the masked logits (same max shift, same sum). Autograd through
    ``div``, ``scatter_`` and ``torch.logsumexp`` allocates seven (A, M) buffers across forward and backward;
    this allocates two: the logits, turned in place into e^{s/τ − max} and saved, and the gradient. Not
    twice differentiable (``once_differentiable``): no loss here needs a gradient of a gradient.
    """

    @staticmethod
    def forward(ctx: Any, neg: Tensor, exclude: Tensor | None, temperature: float) -> Tensor:
        shifted = neg / temperature  # (A, M) logits s/τ, the one (A, M) buffer
        if exclude is not None:
            shifted.scatter_(1, exclude, float("-inf"))  # (A, M): excluded columns drop out of the sum
        top = shifted.amax(dim=1, keepdim=True)  # (A, 1)
        top.masked_fill_(top.isinf(), 0.0)  # a row without a finite logit: no shift, as torch.logsumexp
        shifted.sub_(top).exp_()  # (A, M) e^{s/τ − max} in (0, 1], 0 at excluded columns
        total = shifted.sum(dim=1)  # (A,)
        ctx.save_for_backward(shifted, total)
        ctx.temperature = temperature
        return total.log() + top.squeeze(1)  # (A,)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        shifted, total = ctx.saved_tensors
        scale = grad / (total * ctx.temperature)  # (A,) ∂L/∂logU_a / (Σ e^{s/τ − max} · τ)
        return shifted * scale[:, None], None, None  # (A, M) softmax over the negatives · g / τ


def negative_logsumexp(neg: Tensor, exclude: Tensor | None, temperature: float) -> Tensor:
    """(A,) log U = log Σ_n exp(s_n/τ) over each row's negatives, finite for any τ > 0 (max-shifted).

    Args:
        neg: (A, M) similarities.
        exclude: (A, E) columns of each row left out of the sum (distinct), or None.
        temperature: τ > 0.
    """
    out: Tensor = _NegativeLogSumExp.apply(neg, exclude, temperature)  # torch types Function.apply as Any
    return out


@dataclass
class LossOutput:
    """A scalar loss and per-batch diagnostics (detached 0-d tensors, computed from the same logits).

    ``npc`` holds the per-anchor NPC multipliers q_B (A,), detached, for distributions (DCL Fig. 1); ``None``
    for losses without one.
    """

    loss: Tensor
    diagnostics: dict[str, Tensor] = field(default_factory=dict)
    npc: Tensor | None = None

    @classmethod
    def with_npc(cls, loss: Tensor, sims: PairSimilarities, pos_logit: Tensor, log_u: Tensor,
                 extra: dict[str, Tensor] | None = None) -> LossOutput:
        """``loss`` with what every loss of the InfoNCE family reports: q_B's statistics and per-anchor values
        (DCL Eq. 4, from the positive logits ``pos_logit`` (A,) and ``log_u`` (A,), the log-sum-exp of the
        negatives' logits), the similarity means, then the loss's own ``extra`` diagnostics."""
        diagnostics = npc_diagnostics(pos_logit, log_u) | similarity_diagnostics(sims) | (extra or {})
        return cls(loss=loss, diagnostics=diagnostics, npc=npc_multiplier(pos_logit, log_u))


def at_least_fp32(z: Tensor) -> Tensor:
    """``z`` in fp32, or kept in fp64 if it is fp64: the precision similarities are computed in (bf16 and fp16 are
    raised to fp32; fp64 inputs, as the loss checker's, stay fp64)."""
    return z.to(torch.promote_types(z.dtype, torch.float32))


def two_view_similarities(z1: Tensor, z2: Tensor, gather_distributed: bool = False) -> PairSimilarities:
    """SimCLR's construction: 2n anchors (both views), positive = the other view, 2N−2 negatives each.

    ``neg`` is the full (2n, 2N) matrix of every anchor against every view, with each row's own column and its
    positive's column in ``neg_exclude``; ``pos`` is computed row by row (not read from the matrix), so the
    matrix receives gradient from the negatives' log-sum-exp alone.

    Args:
        z1: (n, D) projections of view 1 on this rank (normalized here).
        z2: (n, D) projections of view 2.
        gather_distributed: under DDP, take negatives from all ranks (global batch N = world * n). Anchors
            stay local; the mean over ranks of the per-rank loss is then the full-batch loss.
    """
    if z1.shape != z2.shape or z1.dim() != 2:
        raise ValueError(f"z1 and z2 must both be (N, D); got {tuple(z1.shape)} and {tuple(z2.shape)}")
    n = z1.shape[0]
    rank, world = distributed_world() if gather_distributed else (0, 1)
    if n * world < 2:
        raise ValueError("a contrastive loss needs at least 2 samples in the batch")
    # Similarities in fp32 even under autocast: logits reach 1/τ = 200 at τ = 0.005.
    with torch.autocast(device_type=z1.device.type, enabled=False):
        z1 = F.normalize(at_least_fp32(z1), dim=1)
        z2 = F.normalize(at_least_fp32(z2), dim=1)
        z1_all = gather_with_grad(z1) if world > 1 else z1  # (N, D)
        z2_all = gather_with_grad(z2) if world > 1 else z2  # (N, D)
        big_n = z1_all.shape[0]
        anchors = torch.cat([z1, z2], dim=0)  # (2n, D): view-1 anchors, then view-2 anchors
        keys = torch.cat([z1_all, z2_all], dim=0) if world > 1 else anchors  # (2N, D): same layout, global batch
        sim = torch.einsum("ad,kd->ak", anchors, keys)  # (2n, 2N), anchor itself and positive included
        pair = torch.einsum("nd,nd->n", z1, z2)  # (n,) <z1_i, z2_i>: the positive of both anchors of sample i
        pos_batch = torch.einsum("nd,nd->n", z1_all, z2_all).detach()  # (N,)

    local = torch.arange(n, device=z1.device) + rank * n  # (n,) global index of this rank's samples
    self_col = torch.cat([local, local + big_n])  # (2n,) column of each anchor itself
    pos_col = torch.cat([local + big_n, local])  # (2n,) column of its positive (the other view)
    exclude = torch.stack([self_col, pos_col], dim=1)  # (2n, 2): the 2 columns of each row that are not negatives
    pos = torch.cat([pair, pair])  # (2n,) the anchors' order: view 1, then view 2
    return PairSimilarities(pos=pos, neg=sim, pos_batch=pos_batch, neg_exclude=exclude)


def npc_multiplier(pos_logit: Tensor, log_u: Tensor) -> Tensor:
    """Per-anchor q_B = U / (e^{s⁺} + U) = sigmoid(log U − s⁺) (DCL Eq. 4), detached; stable for any τ."""
    with torch.no_grad():
        return torch.sigmoid(log_u - pos_logit)  # (A,)


def npc_diagnostics(pos_logit: Tensor, log_u: Tensor) -> dict[str, Tensor]:
    """NPC multiplier q_B (DCL Eq. 4) statistics from logits: mean, std and coefficient of variation.

    Args:
        pos_logit: (A,) s⁺ = <z_a, z_p>/τ.
        log_u: (A,) log U, the log-sum-exp of the negative logits (EqCo: including its log(α/K) shift).
    """
    with torch.no_grad():
        q = npc_multiplier(pos_logit, log_u)  # (A,)
        mean = q.mean()
        std = q.std(unbiased=False)
        return {M.Diagnostic.Q_MEAN: mean, M.Diagnostic.Q_STD: std, M.Diagnostic.Q_CV: std / mean.clamp_min(1e-12)}


def similarity_diagnostics(sims: PairSimilarities) -> dict[str, Tensor]:
    """Mean positive and negative cosine similarity (alignment and spread of the embedding)."""
    with torch.no_grad():
        return {M.Diagnostic.POS_SIM: sims.pos.mean(), M.Diagnostic.NEG_SIM: sims.negative_mean()}


class ContrastiveLoss(nn.Module):
    """Base for losses of the form ``loss(z1, z2) -> LossOutput`` over SimCLR's two views.

    Subclasses implement :meth:`from_similarities`, which frameworks other than SimCLR call directly with
    their own anchors/positives/negatives.

    Args:
        temperature: τ > 0. It only divides similarities; no τ-dependent factor scales the loss, so a
            temperature sweep changes nothing but τ.
        gather_distributed: under DDP, use every rank's samples as negatives.

    Attributes:
        spec: a built-in loss's :class:`~dcl_core.config.LossSpec` (its ``loss.name``, colour and own parameters,
            read from its source by :mod:`dcl_core.config.loss_registry`); None for the user's own.
        detached: what the loss holds constant in its gradient (a stop-gradient, such as DCLW's weights), or
            ``""``; its gradient is then not the loss's derivative, and ``python -m dcl_core.losses check``
            checks it against a ``--reference`` instead of finite differences.
    """

    detached: str = ""
    spec: ClassVar[LossSpec | None] = None  # a built-in loss's declaration; None for the user's own

    def __init__(self, temperature: float = 0.1, gather_distributed: bool = False) -> None:
        super().__init__()
        if not temperature > 0 or not math.isfinite(temperature):
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)
        self.gather_distributed = gather_distributed

    def forward(self, z1: Tensor, z2: Tensor) -> LossOutput:
        """The loss of SimCLR's two views ``z1``, ``z2`` (each (N, D)), through :meth:`from_similarities`."""
        return self.from_similarities(two_view_similarities(z1, z2, self.gather_distributed))

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        """The loss's equation on precomputed similarities; each subclass implements it, or computes from
        ``(z1, z2)`` in :meth:`forward` instead (then only SimCLR can use it)."""
        raise NotImplementedError(f"{type(self).__name__} computes from (z1, z2) in forward and has no "
                                  "from_similarities: it runs with framework.name=simclr only")

    def extra_repr(self) -> str:
        """τ and distributed gathering for ``repr(module)``."""
        return f"temperature={self.temperature}, gather_distributed={self.gather_distributed}"
