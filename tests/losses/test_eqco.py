"""EqCo (dcl_core/losses/eqco.py): EqCo Eq. 1/5/12, the MI bound of Sec. 2.1, K-subsampling of Sec. 2.3."""

import itertools
import math
import statistics

import pytest
import torch
from reference import (
    GRID_D,
    GRID_N,
    GRID_TAU,
    eqco,
    eqco_margin,
    grad_tol,
    library_value_and_grads,
    loss_tol,
    npc_multiplier,
    random_pair,
    reference_value_and_grads,
)

from dcl_core.losses import EqCoLoss, InfoNCELoss, PairSimilarities, sample_negatives


@pytest.mark.parametrize("alpha", [None, 0.25, 3.0, 256.0])
@pytest.mark.parametrize(("n", "d", "tau"), list(itertools.product(GRID_N, GRID_D, GRID_TAU)))
def test_matches_loop_reference_value_and_gradients(n, d, tau, alpha):
    """Eq. 12 with K = 2N − 2: negatives' sum scaled by α/K, positive kept in the denominator."""
    z1, z2 = random_pair(n, d, seed=5000 * n + 10 * d + int(100 * tau))
    out, g1, g2 = library_value_and_grads(EqCoLoss(tau, alpha=alpha), z1, z2)
    ref, r1, r2 = reference_value_and_grads(lambda a, b: eqco(a, b, tau, alpha), z1, z2)
    torch.testing.assert_close(out.loss.double(), ref, **loss_tol(tau))
    torch.testing.assert_close(g1, r1, **grad_tol(tau))
    torch.testing.assert_close(g2, r2, **grad_tol(tau))


@pytest.mark.parametrize("alpha", [0.5, 7.0, 65536.0])
@pytest.mark.parametrize("tau", [0.1, 0.5])
def test_equals_margin_form(alpha, tau):
    """Eq. 1 with the margin of Eq. 5, m = τ log(α/K), is the same loss as Eq. 12."""
    z1, z2 = random_pair(5, 6, seed=41)
    got = EqCoLoss(tau, alpha=alpha)(z1, z2).loss.item()
    assert got == pytest.approx(float(eqco_margin(z1, z2, tau, alpha)), rel=1e-5, abs=1e-6 / tau)


@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize("tau", [0.05, 1.0, 10.0])
@pytest.mark.parametrize("alpha", [0.5, 1.0, 16.0, 4096.0])
def test_closed_form_all_embeddings_equal(n, tau, alpha):
    """All s equal: L = −log(s / (s + (α/K)·K·s)) = log(1 + α), whatever N, K and τ."""
    v = torch.randn(1, 6, generator=torch.Generator().manual_seed(n))
    out = EqCoLoss(tau, alpha=alpha)(v.repeat(n, 1), v.repeat(n, 1))
    assert out.loss.item() == pytest.approx(math.log1p(alpha), rel=1e-5, abs=1e-5)
    assert out.diagnostics["mi_bound"].item() == pytest.approx(0.0, abs=1e-5)
    assert out.diagnostics["q_mean"].item() == pytest.approx(alpha / (1 + alpha), rel=1e-5)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_closed_form_all_equal_default_alpha(n):
    v = torch.ones(n, 3)
    assert EqCoLoss(0.1)(v, v.clone()).loss.item() == pytest.approx(math.log(2 * n - 1), rel=1e-5)


@pytest.mark.parametrize(("n", "tau"), [(2, 0.05), (5, 0.1), (8, 0.5)])
def test_alpha_equal_k_is_exactly_infonce(n, tau):
    """α = K means m = 0: EqCo is InfoNCE, bit for bit (log(α/K) = 0), with α explicit or None."""
    z1, z2 = random_pair(n, 7, seed=n)
    ref, r1, r2 = library_value_and_grads(InfoNCELoss(tau), z1, z2)
    for alpha in (float(2 * n - 2), None):
        out, g1, g2 = library_value_and_grads(EqCoLoss(tau, alpha=alpha), z1, z2)
        torch.testing.assert_close(out.loss, ref.loss, rtol=0, atol=0)
        torch.testing.assert_close(g1, r1, rtol=0, atol=0)
        torch.testing.assert_close(g2, r2, rtol=0, atol=0)
        for key, value in ref.diagnostics.items():
            torch.testing.assert_close(out.diagnostics[key], value, rtol=0, atol=0)


@pytest.mark.parametrize("alpha", [None, 0.5, 10.0, 4096.0])
def test_mi_bound_is_log_one_plus_alpha_minus_loss(alpha):
    """EqCo Sec. 2.1: f̂ = log(1 + K e^{m/τ}) − L = log(1 + α) − L."""
    n, tau = 6, 0.2
    z1, z2 = random_pair(n, 5, seed=42)
    out = EqCoLoss(tau, alpha=alpha)(z1, z2)
    a = float(2 * n - 2) if alpha is None else alpha
    ref = float(eqco(z1, z2, tau, alpha))
    assert out.diagnostics["mi_bound"].item() == pytest.approx(math.log1p(a) - ref, abs=1e-5)
    assert out.diagnostics["mi_bound"].item() == pytest.approx(math.log1p(a) - out.loss.item(), abs=1e-6)


@pytest.mark.parametrize("alpha", [None, 0.5, 100.0])
def test_npc_diagnostics_use_scaled_negatives(alpha):
    """The NPC multiplier q = (α/K)U / (e^{s⁺} + (α/K)U), the one in EqCo's gradient (Eq. 13)."""
    n, tau = 5, 0.3
    z1, z2 = random_pair(n, 4, seed=43)
    k = 2 * n - 2
    q = npc_multiplier(z1, z2, tau, neg_scale=(k if alpha is None else alpha) / k)
    out = EqCoLoss(tau, alpha=alpha)(z1, z2)
    assert out.diagnostics["q_mean"].item() == pytest.approx(statistics.fmean(q), rel=1e-5)
    assert out.diagnostics["q_std"].item() == pytest.approx(statistics.pstdev(q), rel=1e-4, abs=1e-7)


# --- K-subsampling
def sampled_positions(seed: int, a: int, m: int, k: int) -> list[list[int]]:
    """Re-draw the subset the loss drew: same seed, same (A, M) shape, same sample_negatives call."""
    torch.manual_seed(seed)
    positions = torch.arange(m, dtype=torch.float64).expand(a, m).contiguous()
    return sample_negatives(positions, k).long().tolist()


@pytest.mark.parametrize("alpha", [None, 8.0])
@pytest.mark.parametrize(("n", "k"), [(3, 1), (4, 3), (8, 5), (8, 13)])
def test_subsampled_matches_reference_on_same_subset(n, k, alpha):
    tau, seed = 0.2, 1234 + k
    z1, z2 = random_pair(n, 6, seed=n + k)
    torch.manual_seed(seed)
    out, g1, g2 = library_value_and_grads(EqCoLoss(tau, alpha=alpha, num_negatives=k), z1, z2)
    subsets = sampled_positions(seed, 2 * n, 2 * n - 2, k)
    ref, r1, r2 = reference_value_and_grads(lambda a, b: eqco(a, b, tau, alpha, subsets), z1, z2)
    torch.testing.assert_close(out.loss.double(), ref, **loss_tol(tau))
    torch.testing.assert_close(g1, r1, **grad_tol(tau))
    torch.testing.assert_close(g2, r2, **grad_tol(tau))
    a = float(k) if alpha is None else alpha  # α = K (the sampled K) by default
    assert out.diagnostics["mi_bound"].item() == pytest.approx(math.log1p(a) - float(ref), abs=1e-5)
    # A different draw gives a different loss (the subset really is random).
    torch.manual_seed(seed + 1)
    assert EqCoLoss(tau, alpha=alpha, num_negatives=k)(z1, z2).loss.item() != pytest.approx(out.loss.item())


@pytest.mark.parametrize("alpha", [None, 3.0])
def test_subsampling_all_negatives_is_the_full_loss(alpha):
    n, tau = 5, 0.1
    z1, z2 = random_pair(n, 4, seed=44)
    out, g1, g2 = library_value_and_grads(EqCoLoss(tau, alpha=alpha, num_negatives=2 * n - 2), z1, z2)
    ref, r1, r2 = library_value_and_grads(EqCoLoss(tau, alpha=alpha), z1, z2)
    torch.testing.assert_close(out.loss, ref.loss, rtol=0, atol=0)
    torch.testing.assert_close(g1, r1, rtol=0, atol=0)
    torch.testing.assert_close(g2, r2, rtol=0, atol=0)


@pytest.mark.parametrize("k", [1, 2, 5])
def test_subsampled_closed_form_all_equal(k):
    """All s equal: log(1 + α) for any sampled K (the equivalence EqCo is built on)."""
    v = torch.ones(4, 3)
    for alpha in (None, 32.0):
        a = float(k) if alpha is None else alpha
        loss = EqCoLoss(0.1, alpha=alpha, num_negatives=k)(v, v.clone()).loss.item()
        assert loss == pytest.approx(math.log1p(a), rel=1e-5)


def test_too_many_negatives_rejected_at_call():
    loss_fn = EqCoLoss(0.1, num_negatives=7)  # 2N − 2 = 6 for N = 4
    with pytest.raises(ValueError):
        loss_fn(torch.randn(4, 3), torch.randn(4, 3))


def test_sample_negatives_draws_distinct_columns_per_row():
    a, m, k = 64, 14, 5
    neg = torch.arange(m, dtype=torch.float32).expand(a, m) + 100 * torch.arange(a)[:, None]  # unique entries
    torch.manual_seed(0)
    picked = sample_negatives(neg, k)
    assert picked.shape == (a, k)
    subsets = set()
    for row in range(a):
        values = picked[row].tolist()
        assert len(set(values)) == k  # without replacement
        assert all(100 * row <= v < 100 * row + m for v in values)  # taken from its own row
        subsets.add(frozenset(v - 100 * row for v in values))
    assert len(subsets) > a // 2  # rows draw independently


def test_sample_negatives_is_uniform_over_columns():
    a, m, k = 4000, 10, 3
    torch.manual_seed(1)
    picked = sample_negatives(torch.arange(m, dtype=torch.float32).expand(a, m), k).long()
    counts = torch.bincount(picked.flatten(), minlength=m).double()
    expected = a * k / m  # 1200, binomial std ≈ 29
    assert (counts - expected).abs().max().item() < 150


def test_sample_negatives_rng_handling():
    neg = torch.randn(6, 9)
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    state = torch.get_rng_state()
    assert torch.equal(sample_negatives(neg, 4, generator=g1), sample_negatives(neg, 4, generator=g2))
    assert torch.equal(torch.get_rng_state(), state)  # an explicit generator leaves the global RNG alone
    torch.manual_seed(3)
    first = sample_negatives(neg, 4)
    torch.manual_seed(3)
    assert torch.equal(sample_negatives(neg, 4), first)  # the global RNG by default
    assert sample_negatives(neg, 9) is neg  # K = M: everything, in order


@pytest.mark.parametrize("k", [1, 4, 7])
def test_sample_negatives_skips_excluded_columns_and_draws_as_on_the_compact_copy(k):
    """On a masked matrix only real negatives are drawn, and the same ones as on its compact copy."""
    a, m = 64, 9
    neg = torch.arange(m, dtype=torch.float32).expand(a, m) + 100 * torch.arange(a)[:, None]  # unique entries
    g = torch.Generator().manual_seed(4)
    exclude = torch.rand(a, m, generator=g).argsort(dim=1)[:, :2]  # (A, 2) distinct, in any order
    sims = PairSimilarities(pos=torch.zeros(a), neg=neg, pos_batch=torch.zeros(a), neg_exclude=exclude)
    torch.manual_seed(2)
    picked = sample_negatives(neg, k, exclude=exclude)
    torch.manual_seed(2)
    assert torch.equal(picked, sample_negatives(sims.compact().neg, k))
    assert picked.shape == (a, k)
    for row in range(a):
        columns = [int(v) - 100 * row for v in picked[row].tolist()]
        assert len(set(columns)) == k and not set(columns) & set(exclude[row].tolist())


def test_sample_negatives_all_of_a_masked_matrix_is_the_compact_copy_without_a_draw():
    neg = torch.randn(6, 9)
    exclude = torch.tensor([[0, 5]] * 3 + [[8, 1]] * 3)
    compact = PairSimilarities(torch.zeros(6), neg, torch.zeros(6), neg_exclude=exclude).compact().neg
    state = torch.get_rng_state()
    assert torch.equal(sample_negatives(neg, 7, exclude=exclude), compact)
    assert torch.equal(torch.get_rng_state(), state)
    with pytest.raises(ValueError):
        sample_negatives(neg, 8, exclude=exclude)  # 9 columns, 7 negatives

@pytest.mark.parametrize("k", [0, -1, 10])
def test_sample_negatives_rejects_bad_k(k):
    with pytest.raises(ValueError):
        sample_negatives(torch.randn(6, 9), k)


# --- validation
@pytest.mark.parametrize("alpha", [0.0, -1.0, float("nan")])
def test_rejects_bad_alpha(alpha):
    with pytest.raises(ValueError):
        EqCoLoss(0.1, alpha=alpha)


def test_rejects_negative_num_negatives():
    with pytest.raises(ValueError):
        EqCoLoss(0.1, num_negatives=-1)
