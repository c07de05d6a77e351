"""InfoNCE / NT-Xent (dcl_core/losses/infonce.py): DCL Eq. 1-2, the NPC multiplier (Eq. 3-4), the MI bound."""

import itertools
import math
import statistics

import pytest
import torch
import torch.nn.functional as F
from reference import (
    GRID_D,
    GRID_N,
    GRID_TAU,
    anchor_logits,
    grad_tol,
    infonce,
    infonce_anchor,
    library_value_and_grads,
    loss_tol,
    npc_multiplier,
    positive_of,
    project_to_tangent,
    prop1_anchor_gradients,
    prop1_view_gradients,
    random_pair,
    reference_value_and_grads,
)

from dcl_core.losses import InfoNCELoss, PairSimilarities


@pytest.mark.parametrize(("n", "d", "tau"), list(itertools.product(GRID_N, GRID_D, GRID_TAU)))
def test_matches_loop_reference_value_and_gradients(n, d, tau):
    z1, z2 = random_pair(n, d, seed=1000 * n + 10 * d + int(100 * tau))
    out, g1, g2 = library_value_and_grads(InfoNCELoss(tau), z1, z2)
    ref, r1, r2 = reference_value_and_grads(lambda a, b: infonce(a, b, tau), z1, z2)
    torch.testing.assert_close(out.loss.double(), ref, **loss_tol(tau))
    torch.testing.assert_close(g1, r1, **grad_tol(tau))
    torch.testing.assert_close(g2, r2, **grad_tol(tau))


@pytest.mark.parametrize(("n", "d", "tau"), [(2, 3, 0.1), (5, 8, 0.5), (16, 4, 0.07)])
def test_matches_cross_entropy_formulation(n, d, tau):
    """The usual NT-Xent code: cross-entropy over the 2N−1 other views, target = the other view."""
    z1, z2 = random_pair(n, d, seed=n)
    z = F.normalize(torch.cat([z1, z2]), dim=1)
    logits = z @ z.T / tau
    logits.fill_diagonal_(float("-inf"))
    target = (torch.arange(2 * n) + n) % (2 * n)
    expected = F.cross_entropy(logits, target)
    assert InfoNCELoss(tau)(z1, z2).loss.item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("n", [2, 3, 8, 32])
@pytest.mark.parametrize("tau", [0.05, 0.1, 1.0, 10.0])
def test_closed_form_all_embeddings_equal(n, tau):
    """All logits equal 1/τ: L = −log(e^{1/τ} / ((2N−1) e^{1/τ})) = log(2N−1), for any τ."""
    v = torch.randn(1, 6, generator=torch.Generator().manual_seed(n))
    out = InfoNCELoss(tau)(v.repeat(n, 1), v.repeat(n, 1))
    assert out.loss.item() == pytest.approx(math.log(2 * n - 1), rel=1e-5, abs=1e-5)
    assert out.diagnostics["q_mean"].item() == pytest.approx((2 * n - 2) / (2 * n - 1), rel=1e-5)
    assert out.diagnostics["q_std"].item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize("tau", [0.05, 0.1, 0.5, 1.0, 2.0])
def test_closed_form_orthogonal_samples(tau):
    """N = 2, z1 = z2 = (e1, e2): s⁺ = 1/τ, two negatives at 0: L = log(1 + 2 e^{−1/τ}) (no τ factor)."""
    z = torch.eye(2, 3)
    expected = math.log1p(2.0 * math.exp(-1.0 / tau))
    # abs: float32 logsumexp(s⁺, 0, 0) − s⁺ has ~1e-7·s⁺ absolute rounding error.
    assert InfoNCELoss(tau)(z, z.clone()).loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-6 / tau)


@pytest.mark.parametrize(("n", "tau"), [(2, 0.1), (5, 0.2), (8, 1.0)])
def test_npc_diagnostics_and_mi_bound(n, tau):
    z1, z2 = random_pair(n, 6, seed=7 * n)
    out = InfoNCELoss(tau)(z1, z2)
    q = npc_multiplier(z1, z2, tau)
    assert len(q) == 2 * n
    mean, std = statistics.fmean(q), statistics.pstdev(q)
    assert out.diagnostics["q_mean"].item() == pytest.approx(mean, rel=1e-5)
    assert out.diagnostics["q_std"].item() == pytest.approx(std, rel=1e-4, abs=1e-7)
    assert out.diagnostics["q_cv"].item() == pytest.approx(std / mean, rel=1e-4, abs=1e-7)
    k = 2 * n - 2
    ref = float(infonce(z1, z2, tau))
    assert out.diagnostics["mi_bound"].item() == pytest.approx(math.log(1 + k) - ref, abs=1e-5)
    assert out.diagnostics["mi_bound"].item() == pytest.approx(math.log(1 + k) - out.loss.item(), abs=1e-6)


# --- Prop. 1
def unit_leaves(n: int, d: int, seed: int, dtype=torch.float64) -> list[torch.Tensor]:
    """2N already-normalized leaf vectors (view order), so gradients are wrt the normalized z (Prop. 1)."""
    z1, z2 = random_pair(n, d, seed=seed)
    z = F.normalize(torch.cat([z1, z2]), dim=1).to(dtype)
    return [row.clone().requires_grad_(True) for row in z]


@pytest.mark.parametrize(("n", "d", "tau"), [(2, 3, 0.1), (4, 6, 0.2), (6, 5, 0.5)])
def test_prop1_npc_multiplier_in_single_anchor_gradients(n, d, tau):
    """DCL Eq. 3: every partial gradient of L_a^{InfoNCE} carries the factor q_{B,a} of Eq. 4."""
    views = unit_leaves(n, d, seed=n + d)
    for a in range(2 * n):
        grads = torch.autograd.grad(infonce_anchor(views, a, tau), views)
        closed = prop1_anchor_gradients(views, a, tau, coupled=True)
        for g, c in zip(grads, closed, strict=True):
            torch.testing.assert_close(g, c, rtol=1e-9, atol=1e-12)
        # The positive's gradient is exactly (q/τ) z_a, with q from Eq. 4:
        s_pos, s_neg, js = anchor_logits([v.detach() for v in views], a, tau)
        u = sum(math.exp(float(s)) for s in s_neg)
        q = 1.0 - math.exp(float(s_pos)) / (math.exp(float(s_pos)) + u)
        p = positive_of(a, n)
        torch.testing.assert_close(-grads[p], (q / tau) * views[a].detach(), rtol=1e-9, atol=1e-12)
        for j, s in zip(js, s_neg, strict=True):
            expected = -(q / tau) * (math.exp(float(s)) / u) * views[a].detach()
            torch.testing.assert_close(-grads[j], expected, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(("n", "d", "tau"), [(2, 3, 0.1), (4, 6, 0.2)])
def test_prop1_holds_for_library_single_anchor(n, d, tau):
    """The library's from_similarities on one anchor (similarities of normalized leaves) obeys Eq. 3."""
    views = unit_leaves(n, d, seed=3 * n + d, dtype=torch.float32)
    for a in range(2 * n):
        p = positive_of(a, n)
        negs = [torch.dot(views[a], views[j]) for j in range(2 * n) if j not in (a, p)]
        sims = PairSimilarities(
            pos=torch.dot(views[a], views[p])[None],
            neg=torch.stack(negs)[None],
            pos_batch=torch.zeros(n),
        )
        grads = torch.autograd.grad(InfoNCELoss(tau).from_similarities(sims).loss, views)
        closed = prop1_anchor_gradients(views, a, tau, coupled=True)
        for g, c in zip(grads, closed, strict=True):
            torch.testing.assert_close(g.double(), c, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("n", "d", "tau"), [(3, 4, 0.1), (8, 16, 0.3)])
def test_library_gradient_is_mean_of_prop1_gradients(n, d, tau):
    """Full loss: ∂L/∂z (inputs already unit) = tangent projection of the mean of the Eq. 3 gradients."""
    z1, z2 = random_pair(n, d, seed=5 * n)
    z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    _, g1, g2 = library_value_and_grads(InfoNCELoss(tau), z1, z2)
    views = list(torch.cat([z1, z2]).unbind(0))
    expected = torch.stack(prop1_view_gradients(views, tau, coupled=True))
    torch.testing.assert_close(g1, project_to_tangent(expected[:n], z1), **grad_tol(tau))
    torch.testing.assert_close(g2, project_to_tangent(expected[n:], z2), **grad_tol(tau))
