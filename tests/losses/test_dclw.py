"""Weighted DCL (dcl_core/losses/dclw.py): DCL Eq. 7 with the negative von Mises-Fisher weight."""

import itertools
import math
import statistics

import pytest
import torch
from reference import (
    GRID_D,
    GRID_N,
    GRID_TAU,
    dcl,
    dclw,
    grad_tol,
    library_value_and_grads,
    loss_tol,
    pair_cosines,
    random_pair,
    reference_value_and_grads,
    unit_views,
    weighted_dcl,
)
from reference import vmf_weights as ref_vmf_weights

from dcl_core.losses import DCLLoss, DCLWLoss, two_view_similarities, vmf_weights


@pytest.mark.parametrize("sigma", [0.5, 2.0])
@pytest.mark.parametrize(("n", "d", "tau"), list(itertools.product(GRID_N, GRID_D, GRID_TAU)))
def test_matches_loop_reference_value_and_gradients(n, d, tau, sigma):
    """Eq. 7, with w treated as a constant in the gradient."""
    z1, z2 = random_pair(n, d, seed=3000 * n + 10 * d + int(100 * tau))
    out, g1, g2 = library_value_and_grads(DCLWLoss(tau, sigma=sigma), z1, z2)
    ref, r1, r2 = reference_value_and_grads(lambda a, b: dclw(a, b, tau, sigma), z1, z2)
    torch.testing.assert_close(out.loss.double(), ref, **loss_tol(tau))
    torch.testing.assert_close(g1, r1, **grad_tol(tau))
    torch.testing.assert_close(g2, r2, **grad_tol(tau))


def dclw_weight_with_gradient(z1, z2, tau, sigma):
    """Eq. 7 with w NOT detached (tensor weights keep their graph): what the library must not compute."""
    views = unit_views(z1, z2)
    n = len(views) // 2
    cos = [torch.dot(views[i], views[i + n]) for i in range(n)]
    expectation = sum(torch.exp(c / sigma) for c in cos) / n
    return weighted_dcl(z1, z2, tau, [2 - torch.exp(c / sigma) / expectation for c in cos])


def test_weight_is_not_differentiated():
    z1, z2 = random_pair(5, 6, seed=17)
    tau, sigma = 0.2, 0.5
    _, g1, _ = library_value_and_grads(DCLWLoss(tau, sigma=sigma), z1, z2)
    _, r1, _ = reference_value_and_grads(lambda a, b: dclw(a, b, tau, sigma), z1, z2)
    l_w, w1, _ = reference_value_and_grads(lambda a, b: dclw_weight_with_gradient(a, b, tau, sigma), z1, z2)
    torch.testing.assert_close(g1, r1, **grad_tol(tau))
    assert l_w.item() == pytest.approx(float(dclw(z1, z2, tau, sigma)), rel=1e-10)  # same value ...
    assert not torch.allclose(g1, w1, **grad_tol(tau))  # ... different gradient


@pytest.mark.parametrize(("n", "sigma"), [(2, 0.5), (8, 0.5), (8, 0.05), (32, 3.0)])
def test_vmf_weights_match_reference_and_average_to_one(n, sigma):
    z1, z2 = random_pair(n, 8, seed=n)
    sims = two_view_similarities(z1, z2)
    pos = sims.pos.clone().requires_grad_(True)
    w = vmf_weights(pos, sims.pos_batch, sigma)
    assert w.shape == (2 * n,)
    assert not w.requires_grad
    ref = ref_vmf_weights(z1, z2, sigma)
    expected = torch.tensor(ref + ref, dtype=torch.float64)  # each pair's weight on both of its anchors
    torch.testing.assert_close(w.double(), expected, rtol=1e-5, atol=1e-5)
    assert w.double().mean().item() == pytest.approx(1.0, abs=1e-5)  # E[w] = 1
    hardest = min(range(n), key=lambda i: pair_cosines(z1, z2)[i])
    assert w[hardest].item() == pytest.approx(max(w.tolist()))  # the hard positive gets the largest weight


@pytest.mark.parametrize("sigma", [1e-3, 1e-6, 1e-12])
def test_vmf_weights_finite_for_tiny_sigma(sigma):
    """Computed in log space: exp(1/σ) would overflow; the largest similarity takes all the mass."""
    pos = torch.tensor([1.0, 0.9, -0.5, 0.99])
    w = vmf_weights(pos, pos, sigma=sigma)
    assert torch.isfinite(w).all()
    assert (w <= 2.0).all()
    if sigma >= 1e-3:  # float32 logits pos/σ of size 1e6+ lose the log(P) term: only check moderate 1/σ
        expected = torch.tensor([2.0 - 4.0, 2.0, 2.0, 2.0], dtype=torch.float64)
        torch.testing.assert_close(w.double(), expected, rtol=0, atol=1e-3)


@pytest.mark.parametrize("sigma", [1e6, float("inf")])
@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_large_sigma_is_dcl(sigma, tau):
    """lim_{σ→∞} L_DCW = L_DC: all weights 1 (loss and gradients)."""
    z1, z2 = random_pair(6, 5, seed=21)
    out, g1, g2 = library_value_and_grads(DCLWLoss(tau, sigma=sigma), z1, z2)
    ref, r1, r2 = library_value_and_grads(DCLLoss(tau), z1, z2)
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g1, r1, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g2, r2, rtol=1e-5, atol=1e-6)
    assert out.diagnostics["weight_std"].item() == pytest.approx(0.0, abs=1e-5)


@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize("tau", [0.05, 0.1, 1.0])
def test_closed_form_all_embeddings_equal(n, tau):
    """All pairs equally similar: every w = 1, so DCLW = DCL = log(2N−2)."""
    v = torch.randn(1, 5, generator=torch.Generator().manual_seed(n))
    out = DCLWLoss(tau, sigma=0.5)(v.repeat(n, 1), v.repeat(n, 1))
    assert out.loss.item() == pytest.approx(math.log(2 * n - 2), rel=1e-5, abs=1e-5)
    assert out.diagnostics["weight_std"].item() == pytest.approx(0.0, abs=1e-6)


def test_dclw_differs_from_dcl_at_paper_sigma():
    z1, z2 = random_pair(6, 5, seed=22)
    assert DCLWLoss(0.1, sigma=0.5)(z1, z2).loss.item() != pytest.approx(float(dcl(z1, z2, 0.1)), rel=1e-3)


def test_weight_std_diagnostic():
    z1, z2 = random_pair(7, 4, seed=23)
    out = DCLWLoss(0.2, sigma=0.5)(z1, z2)
    ref = statistics.pstdev(ref_vmf_weights(z1, z2, 0.5))  # both anchors of a pair share w: same std
    assert out.diagnostics["weight_std"].item() == pytest.approx(ref, rel=1e-4)


@pytest.mark.parametrize("sigma", [0.0, -0.5, float("nan")])
def test_rejects_bad_sigma(sigma):
    with pytest.raises(ValueError):
        DCLWLoss(0.1, sigma=sigma)


def test_default_sigma_is_paper_value():
    assert DCLWLoss(0.1).sigma == 0.5
