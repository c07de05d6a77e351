"""Weighted k-nearest-neighbour monitor (InstDisc, Wu et al. 2018; the MoCo CIFAR-10 demo).

Each query is classified by its ``k`` most cosine-similar bank features: neighbour ``i`` votes for its class
with weight ``exp(sim_i / t)`` and the class with the largest total vote wins. The temperature ``t`` here is
the kNN monitor's **own** hyper-parameter (0.1 by default, as in InstDisc and the MoCo demo); it is never
the temperature of the contrastive training loss, so that kNN accuracies are comparable across training
temperatures.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, TypedDict

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; only type checkers read it here
    from typing_extensions import Unpack

logger = logging.getLogger(__name__)


def _validate(
    query: torch.Tensor,
    bank: torch.Tensor,
    bank_labels: torch.Tensor,
    num_classes: int,
    k: int,
    temperature: float,
    chunk_size: int,
) -> None:
    """Raise ``ValueError`` for inconsistent shapes or out-of-range hyper-parameters."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if query.ndim != 2 or bank.ndim != 2 or query.shape[1] != bank.shape[1]:
        raise ValueError(
            f"query (M, F) and bank (N, F) mismatch: {tuple(query.shape)} vs {tuple(bank.shape)}"
        )
    if bank.shape[0] == 0:
        raise ValueError("bank must not be empty")
    if bank_labels.shape != (bank.shape[0],):
        raise ValueError(f"bank_labels must have shape ({bank.shape[0]},), got {tuple(bank_labels.shape)}")
    if not 0 <= int(bank_labels.min()) <= int(bank_labels.max()) < num_classes:
        raise ValueError(
            f"bank_labels must lie in [0, {num_classes}) (unlabeled images cannot vote), got "
            f"[{int(bank_labels.min())}, {int(bank_labels.max())}]"
        )


@torch.no_grad()
def knn_predict(
    query: torch.Tensor,
    bank: torch.Tensor,
    bank_labels: torch.Tensor,
    num_classes: int,
    *,  # the vote's settings by name only: a training τ can never slip in positionally
    k: int = 200,
    temperature: float = 0.1,
    chunk_size: int = 1024,
    bank_chunk_size: int = 65536,
) -> torch.Tensor:
    """Predict query labels by a similarity-weighted vote of their ``k`` nearest bank neighbours.

    Features are L2-normalised here (a no-op for already normalised features), so the similarity is the
    cosine similarity. Queries are processed ``chunk_size`` at a time against ``bank_chunk_size`` bank rows
    at a time, keeping a running top-k, so at most a ``(chunk_size, bank_chunk_size)`` similarity matrix
    exists at once (ImageNet's 1.28M-image bank included).

    Args:
        query: Query features ``(M, F)``.
        bank: Bank (training-set) features ``(N, F)``; the computation runs on this tensor's device.
        bank_labels: Integer labels ``(N,)`` in ``[0, num_classes)``.
        num_classes: Number of classes (explicit; never inferred from the labels).
        k: Number of neighbours; clamped to ``N``.
        temperature: The kNN monitor's own temperature ``t`` in the vote weights ``exp(sim / t)``
            (0.1 as in InstDisc / MoCo). This is NOT the contrastive training temperature.
        chunk_size: Number of queries per chunk.
        bank_chunk_size: Number of bank rows compared at once.

    Returns:
        int64 predictions ``(M,)`` on the device of ``query``. Ties between classes go to the lowest index.

    Raises:
        ValueError: If ``temperature <= 0``, ``k < 1``, ``chunk_size < 1``, ``num_classes < 1`` or the shapes
            are inconsistent.
    """
    _validate(query, bank, bank_labels, num_classes, k, temperature, chunk_size)
    if bank_chunk_size < 1:
        raise ValueError(f"bank_chunk_size must be >= 1, got {bank_chunk_size}")
    k = min(k, bank.shape[0])
    device = bank.device
    bank_n = F.normalize(bank.float(), dim=1)  # (N, F)
    bank_labels = bank_labels.to(device=device, dtype=torch.long)  # (N,)
    preds = torch.empty(query.shape[0], dtype=torch.long, device=device)  # (M,)
    for start in range(0, query.shape[0], chunk_size):
        q = F.normalize(query[start : start + chunk_size].to(device).float(), dim=1)  # (C, F)
        top_sims, top_idx = _top_k(q, bank_n, k, bank_chunk_size)  # (C, k), (C, k); top_sims[:, 0] is the max
        top_labels = bank_labels[top_idx]  # (C, k)
        # exp((s - s_max) / t) rescales each row's weights by one positive constant: the vote argmax is
        # unchanged but exp cannot overflow for small t.
        weights = ((top_sims - top_sims[:, :1]) / temperature).exp()  # (C, k)
        votes = torch.zeros(q.shape[0], num_classes, device=device)  # (C, num_classes)
        votes.scatter_add_(1, top_labels, weights)  # (C, num_classes): summed weights per class
        preds[start : start + q.shape[0]] = votes.argmax(dim=1)
    return preds.to(query.device)


def _top_k(q: torch.Tensor, bank: torch.Tensor, k: int, bank_chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest similarities of each query row with the bank and their bank indices, sorted descending,
    merging per-chunk top-k's so only a (C, bank_chunk_size) similarity block exists at once."""
    best_sims: torch.Tensor | None = None
    best_idx: torch.Tensor | None = None
    for b0 in range(0, bank.shape[0], bank_chunk_size):
        sims = q @ bank[b0 : b0 + bank_chunk_size].T  # (C, F) @ (F, B) -> (C, B)
        sims, idx = sims.topk(min(k, sims.shape[1]), dim=1)  # (C, <=k) each
        idx += b0
        if best_sims is not None and best_idx is not None:
            sims = torch.cat([best_sims, sims], dim=1)  # (C, <=2k): running best, then this chunk's
            idx = torch.cat([best_idx, idx], dim=1)
            sims, pick = sims.topk(min(k, sims.shape[1]), dim=1)  # (C, <=k)
            idx = idx.gather(1, pick)
        best_sims, best_idx = sims, idx
    assert best_sims is not None and best_idx is not None  # the bank is non-empty (validated)
    return best_sims, best_idx


class KnnVote(TypedDict, total=False):
    """The vote's settings :func:`knn_top1` passes on to :func:`knn_predict` (which holds their defaults)."""

    k: int
    temperature: float
    chunk_size: int
    bank_chunk_size: int


@torch.no_grad()
def knn_top1(
    query: torch.Tensor,
    query_labels: torch.Tensor,
    bank: torch.Tensor,
    bank_labels: torch.Tensor,
    num_classes: int,
    **vote: Unpack[KnnVote],
) -> float:
    """Top-1 accuracy (percent, 0-100) of the weighted kNN classifier :func:`knn_predict`.

    Args:
        query: Query features ``(M, F)``.
        query_labels: True query labels ``(M,)``.
        bank: Bank features ``(N, F)``.
        bank_labels: Bank labels ``(N,)``.
        num_classes: Number of classes.
        **vote: ``k``, ``temperature`` (the kNN monitor's own, never the training τ), ``chunk_size``,
            ``bank_chunk_size``, by name, as :func:`knn_predict` takes them.

    Returns:
        Percentage of queries whose predicted label equals ``query_labels``.

    Raises:
        ValueError: As :func:`knn_predict`, or if ``query_labels`` does not have shape ``(M,)`` or ``M == 0``.
    """
    if query.shape[0] == 0 or query_labels.shape != (query.shape[0],):
        raise ValueError(
            f"query_labels must have shape ({query.shape[0]},) with M > 0, got {tuple(query_labels.shape)}"
        )
    preds = knn_predict(query, bank, bank_labels, num_classes, **vote)  # (M,)
    # From the integer count, in float64: a float32 mean (0.3 -> 30.000001192...) made two seeds with the same
    # count differ in the 7th digit, and a t-interval over such "different" values has a width of rounding noise.
    correct = int((preds == query_labels.to(preds.device)).sum())
    top1 = 100.0 * correct / len(preds)
    logger.debug("kNN top-1 %.2f%% (%s, M=%d, N=%d)", top1, vote or "default vote", len(preds), len(bank))
    return top1
