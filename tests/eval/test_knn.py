"""Tests for the weighted kNN monitor in dcl_core.eval.knn."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from dcl_core.eval import knn_predict, knn_top1


def _reference_predict(
    query: torch.Tensor,
    bank: torch.Tensor,
    bank_labels: torch.Tensor,
    num_classes: int,
    k: int,
    temperature: float,
) -> torch.Tensor:
    """Plain per-query loop in float64: sort similarities, take top k, sum exp(sim / t) per class."""
    q = F.normalize(query.double(), dim=1)
    b = F.normalize(bank.double(), dim=1)
    k = min(k, len(b))
    preds = []
    for i in range(len(q)):
        sims = [float(torch.dot(q[i], b[j])) for j in range(len(b))]
        order = sorted(range(len(b)), key=lambda j: -sims[j])[:k]
        votes = [0.0] * num_classes
        for j in order:
            votes[int(bank_labels[j])] += math.exp(sims[j] / temperature)
        preds.append(max(range(num_classes), key=lambda c: (votes[c], -c)))
    return torch.tensor(preds, dtype=torch.long)


def _random_data(m: int, n: int, f: int, c: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(m, f, generator=g),
        torch.randn(n, f, generator=g),
        torch.randint(0, c, (n,), generator=g),
    )


@pytest.mark.parametrize(
    ("k", "temperature", "chunk_size"),
    [(1, 0.1, 7), (5, 0.1, 1024), (10, 0.5, 3), (25, 0.07, 16), (60, 1.0, 64), (200, 0.1, 13)],
)
def test_matches_reference(k: int, temperature: float, chunk_size: int) -> None:
    num_classes = 5
    query, bank, bank_labels = _random_data(37, 60, 8, num_classes, seed=k)
    preds = knn_predict(
        query, bank, bank_labels, num_classes, k=k, temperature=temperature, chunk_size=chunk_size
    )
    expected = _reference_predict(query, bank, bank_labels, num_classes, k, temperature)
    assert preds.dtype == torch.int64
    assert preds.shape == (37,)
    assert torch.equal(preds, expected)


def test_chunking_is_invariant() -> None:
    query, bank, bank_labels = _random_data(101, 300, 16, 10, seed=0)
    full = knn_predict(query, bank, bank_labels, 10, k=20, chunk_size=101)
    for chunk_size in (1, 2, 7, 50, 100, 1024):
        assert torch.equal(knn_predict(query, bank, bank_labels, 10, k=20, chunk_size=chunk_size), full)
    # Chunking the bank (running top-k merge) too; chunks smaller than k included.
    for bank_chunk in (1, 7, 19, 20, 21, 150, 299, 300):
        got = knn_predict(query, bank, bank_labels, 10, k=20, chunk_size=33, bank_chunk_size=bank_chunk)
        assert torch.equal(got, full), bank_chunk


def test_separated_clusters_give_100_percent() -> None:
    num_classes, per_class, dim = 10, 50, 32
    g = torch.Generator().manual_seed(0)
    centers = torch.eye(dim)[:num_classes] * 10.0  # orthogonal class centres

    def sample(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        labels = torch.arange(num_classes).repeat_interleave(n)  # (C * n,)
        return centers[labels] + torch.randn(len(labels), dim, generator=g), labels

    bank, bank_labels = sample(per_class)
    query, query_labels = sample(20)
    # Default k=200 > 50 samples per class: 150 of the neighbours are of other classes, but the
    # exp(sim / 0.1) weighting lets the 50 same-class neighbours win.
    assert knn_top1(query, query_labels, bank, bank_labels, num_classes) == 100.0


def test_k1_is_nearest_neighbour() -> None:
    query, bank, bank_labels = _random_data(50, 80, 6, 4, seed=3)
    sims = F.normalize(query, dim=1) @ F.normalize(bank, dim=1).T  # (50, F) @ (F, 80) -> (50, 80)
    expected = bank_labels[sims.argmax(dim=1)]
    for temperature in (0.01, 0.1, 10.0):
        assert torch.equal(knn_predict(query, bank, bank_labels, 4, k=1, temperature=temperature), expected)


def test_temperature_changes_prediction() -> None:
    # One very close neighbour of class 0 (cos 0.99) vs two moderately close of class 1 (cos 0.7 each).
    s = math.sqrt(1 - 0.7**2)
    bank = torch.tensor([[0.99, math.sqrt(1 - 0.99**2)], [0.7, s], [0.7, -s]])
    bank_labels = torch.tensor([0, 1, 1])
    query = torch.tensor([[1.0, 0.0]])
    # t=0.1: e^9.9 > 2 e^7 -> class 0.  t=10: e^0.099 < 2 e^0.07 -> class 1.
    assert knn_predict(query, bank, bank_labels, 2, k=3, temperature=0.1).item() == 0
    assert knn_predict(query, bank, bank_labels, 2, k=3, temperature=10.0).item() == 1
    # Small t does not overflow: still a clean vote for the nearest neighbour's class.
    assert knn_predict(query, bank, bank_labels, 2, k=3, temperature=1e-3).item() == 0


def test_k_larger_than_bank_is_clamped() -> None:
    query, bank, bank_labels = _random_data(20, 6, 4, 3, seed=1)
    clamped = knn_predict(query, bank, bank_labels, 3, k=200)
    assert torch.equal(clamped, knn_predict(query, bank, bank_labels, 3, k=6))
    assert torch.equal(clamped, _reference_predict(query, bank, bank_labels, 3, 6, 0.1))


def test_num_classes_is_explicit() -> None:
    query, bank, _ = _random_data(10, 30, 4, 3, seed=2)
    bank_labels = torch.full((30,), 7)  # only class 7 present, out of 10
    preds = knn_predict(query, bank, bank_labels, num_classes=10, k=5)
    assert torch.equal(preds, torch.full((10,), 7))
    with pytest.raises(ValueError, match=r"bank_labels must lie in \[0, 5\)"):  # caught before indexing
        knn_predict(query, bank, bank_labels, num_classes=5, k=5)


def test_scale_invariance_and_top1_percent() -> None:
    query, bank, bank_labels = _random_data(40, 100, 8, 4, seed=4)
    preds = knn_predict(query, bank, bank_labels, 4, k=10)
    assert torch.equal(knn_predict(query * 3.0, bank * 0.2, bank_labels, 4, k=10), preds)
    query_labels = preds.clone()
    query_labels[:10] = (query_labels[:10] + 1) % 4  # 10 of 40 wrong
    assert knn_top1(query, query_labels, bank, bank_labels, 4, k=10) == pytest.approx(75.0)


def test_top1_is_the_exact_ratio_of_counts() -> None:
    """12 of 40 right is 30.0, not float32's 30.000001192...: two seeds with the same count must report the same
    value, or a t-interval over them has the width of rounding noise."""
    query, bank, bank_labels = _random_data(40, 100, 8, 4, seed=5)
    preds = knn_predict(query, bank, bank_labels, 4, k=10)
    query_labels = preds.clone()
    query_labels[12:] = (query_labels[12:] + 1) % 4  # 12 of 40 right
    assert knn_top1(query, query_labels, bank, bank_labels, 4, k=10) == 100 * 12 / 40 == 30.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"temperature": -0.1}, "temperature"),
        ({"k": 0}, "k must"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"bank_chunk_size": 0}, "bank_chunk_size must"),
    ],
)
def test_invalid_arguments(kwargs: dict[str, float], match: str) -> None:
    query, bank, bank_labels = _random_data(4, 8, 3, 2, seed=0)
    with pytest.raises(ValueError, match=match):
        knn_predict(query, bank, bank_labels, 2, **kwargs)
    with pytest.raises(ValueError, match=match):
        knn_top1(query, torch.zeros(4, dtype=torch.long), bank, bank_labels, 2, **kwargs)


def test_bank_labels_must_be_in_range() -> None:
    bank = F.normalize(torch.randn(6, 4), dim=1)
    for bad in (torch.tensor([0, 1, 2, 0, 1, -1]), torch.tensor([0, 1, 3, 0, 1, 2])):
        with pytest.raises(ValueError, match=r"must lie in \[0, 3\)"):
            knn_predict(bank[:2], bank, bad, num_classes=3, k=2)
