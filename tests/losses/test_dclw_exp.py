"""DCLW with exponential weighting (dcl_core/losses/dclw_exp.py): DCL Appendix A.8, Eq. 9-10."""

import itertools
import math

import pytest
import torch
from reference import (
    GRID_D,
    GRID_N,
    GRID_TAU,
    dclw_exp,
    exp_weights,
    grad_tol,
    library_value_and_grads,
    loss_tol,
    pair_cosines,
    random_pair,
    reference_value_and_grads,
    unit_views,
    weighted_dcl,
)

from dcl_core.losses import DCLLoss, DCLWExpLoss


@pytest.mark.parametrize(("sigma", "delta"), [(0.5, 3.0), (1.0, 1.5)])
@pytest.mark.parametrize(("n", "d", "tau"), list(itertools.product(GRID_N, GRID_D, GRID_TAU)))
def test_matches_loop_reference_value_and_gradients(n, d, tau, sigma, delta):
    """Eq. 10, w = δ·exp(−σ<z1, z2>) treated as a constant in the gradient."""
    z1, z2 = random_pair(n, d, seed=4000 * n + 10 * d + int(100 * tau))
    out, g1, g2 = library_value_and_grads(DCLWExpLoss(tau, sigma=sigma, delta=delta), z1, z2)
    ref, r1, r2 = reference_value_and_grads(lambda a, b: dclw_exp(a, b, tau, sigma, delta), z1, z2)
    torch.testing.assert_close(out.loss.double(), ref, **loss_tol(tau))
    torch.testing.assert_close(g1, r1, **grad_tol(tau))
    torch.testing.assert_close(g2, r2, **grad_tol(tau))


def test_weight_is_not_differentiated():
    """With w differentiated the gradient would differ; the library's equals the detached reference."""
    z1, z2 = random_pair(5, 6, seed=31)
    tau, sigma, delta = 0.2, 0.5, 3.0

    def undetached(a, b):  # tensor weights keep their graph
        views = unit_views(a, b)
        n = a.shape[0]
        cos = [torch.dot(views[i], views[i + n]) for i in range(n)]
        return weighted_dcl(a, b, tau, [delta * torch.exp(-sigma * c) for c in cos])

    _, g1, _ = library_value_and_grads(DCLWExpLoss(tau, sigma=sigma, delta=delta), z1, z2)
    _, r1, _ = reference_value_and_grads(lambda a, b: dclw_exp(a, b, tau, sigma, delta), z1, z2)
    _, u1, _ = reference_value_and_grads(undetached, z1, z2)
    torch.testing.assert_close(g1, r1, **grad_tol(tau))
    assert not torch.allclose(g1, u1, **grad_tol(tau))


@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_sigma_to_zero_and_delta_one_is_dcl(tau):
    z1, z2 = random_pair(6, 5, seed=32)
    out, g1, g2 = library_value_and_grads(DCLWExpLoss(tau, sigma=1e-12, delta=1.0), z1, z2)
    ref, r1, r2 = library_value_and_grads(DCLLoss(tau), z1, z2)
    torch.testing.assert_close(out.loss, ref.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g1, r1, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g2, r2, rtol=1e-5, atol=1e-6)
    assert out.diagnostics["weight_mean"].item() == pytest.approx(1.0, abs=1e-9)


@pytest.mark.parametrize("delta", [0.5, 2.0, 3.0])
def test_constant_weight_is_linear_in_delta(delta):
    """σ → 0: w = δ everywhere, so L = DCL + (1 − δ)·mean_a(s⁺_a)."""
    tau = 0.1
    z1, z2 = random_pair(5, 4, seed=33)
    cos = pair_cosines(z1, z2)
    expected = DCLLoss(tau)(z1, z2).loss.item() + (1 - delta) * sum(cos) / len(cos) / tau
    got = DCLWExpLoss(tau, sigma=1e-12, delta=delta)(z1, z2).loss.item()
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("n", [2, 3, 8])
@pytest.mark.parametrize("tau", [0.05, 0.1, 1.0])
@pytest.mark.parametrize(("sigma", "delta"), [(0.5, 3.0), (2.0, 1.0)])
def test_closed_form_all_embeddings_equal(n, tau, sigma, delta):
    """All similarities 1: w = δe^{−σ}, L = log((2N−2)e^{1/τ}) − w/τ = log(2N−2) + (1 − δe^{−σ})/τ."""
    v = torch.randn(1, 5, generator=torch.Generator().manual_seed(n))
    out = DCLWExpLoss(tau, sigma=sigma, delta=delta)(v.repeat(n, 1), v.repeat(n, 1))
    expected = math.log(2 * n - 2) + (1 - delta * math.exp(-sigma)) / tau
    assert out.loss.item() == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_weight_mean_diagnostic_and_hard_positives_weigh_more():
    z1, z2 = random_pair(7, 4, seed=34)
    w = exp_weights(z1, z2, 0.5, 3.0)
    out = DCLWExpLoss(0.2, sigma=0.5, delta=3.0)(z1, z2)
    assert out.diagnostics["weight_mean"].item() == pytest.approx(sum(w) / len(w), rel=1e-5)
    cos = pair_cosines(z1, z2)
    assert max(range(7), key=lambda i: w[i]) == min(range(7), key=lambda i: cos[i])


def test_defaults_are_paper_values():
    loss = DCLWExpLoss(0.1)
    assert (loss.sigma, loss.delta) == (0.5, 3.0)


@pytest.mark.parametrize("sigma", [0.0, -1.0, float("nan")])
def test_rejects_bad_sigma(sigma):
    with pytest.raises(ValueError):
        DCLWExpLoss(0.1, sigma=sigma)


@pytest.mark.parametrize("delta", [0.0, -3.0, float("nan")])
def test_rejects_bad_delta(delta):
    with pytest.raises(ValueError):
        DCLWExpLoss(0.1, delta=delta)
