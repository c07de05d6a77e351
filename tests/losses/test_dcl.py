"""Decoupled contrastive loss (dcl_core/losses/dcl.py): DCL Eq. 6, its relation to InfoNCE, Prop. 1-2."""

import dataclasses
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
    dcl,
    dcl_anchor,
    dcl_per_anchor,
    grad_tol,
    infonce_anchor,
    infonce_per_anchor,
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

from dcl_core.losses import DCLLoss, InfoNCELoss, PairSimilarities, two_view_similarities


@pytest.mark.parametrize(("n", "d", "tau"), list(itertools.product(GRID_N, GRID_D, GRID_TAU)))
def test_matches_loop_reference_value_and_gradients(n, d, tau):
    z1, z2 = random_pair(n, d, seed=2000 * n + 10 * d + int(100 * tau))
    out, g1, g2 = library_value_and_grads(DCLLoss(tau), z1, z2)
    ref, r1, r2 = reference_value_and_grads(lambda a, b: dcl(a, b, tau), z1, z2)
    torch.testing.assert_close(out.loss.double(), ref, **loss_tol(tau))
    torch.testing.assert_close(g1, r1, **grad_tol(tau))
    torch.testing.assert_close(g2, r2, **grad_tol(tau))


@pytest.mark.parametrize("n", [2, 3, 8, 32])
@pytest.mark.parametrize("tau", [0.05, 0.1, 1.0, 10.0])
def test_closed_form_all_embeddings_equal(n, tau):
    """All logits equal 1/τ: L = −1/τ + log((2N−2) e^{1/τ}) = log(2N−2), for any τ."""
    v = torch.randn(1, 6, generator=torch.Generator().manual_seed(n))
    out = DCLLoss(tau)(v.repeat(n, 1), v.repeat(n, 1))
    assert out.loss.item() == pytest.approx(math.log(2 * n - 2), rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("tau", [0.05, 0.1, 0.5, 1.0, 2.0])
def test_no_hidden_temperature_scaling(tau):
    """N = 2, z1 = z2 = (e1, e2): s⁺ = 1/τ, two negatives at 0, so L = log 2 − 1/τ exactly (negative for
    small τ). A loss multiplied by τ or 2τ (as in some SimCLR code) would give τ log 2 − 1."""
    z = torch.eye(2, 3)
    assert DCLLoss(tau)(z, z.clone()).loss.item() == pytest.approx(math.log(2) - 1 / tau, rel=1e-6)


@pytest.mark.parametrize("tau", GRID_TAU)
def test_value_at_each_temperature_equals_reference(tau):
    z1, z2 = random_pair(6, 8, seed=99)
    assert DCLLoss(tau)(z1, z2).loss.item() == pytest.approx(float(dcl(z1, z2, tau)), rel=1e-5, abs=1e-6)


# --- vs InfoNCE
@pytest.mark.parametrize(("n", "d", "tau"), [(2, 3, 0.1), (5, 8, 0.05), (8, 32, 0.5), (4, 1, 1.0)])
def test_infonce_minus_dcl_is_softplus_per_anchor(n, d, tau):
    """Per anchor: L_InfoNCE − L_DCL = log(1 + e^{s⁺}/U) = softplus(s⁺ − log U) ≥ 0."""
    z1, z2 = random_pair(n, d, seed=4 * n + d)
    sims = two_view_similarities(z1, z2)
    compact = sims.compact()  # (2N, 2N − 2) negatives only, copied
    gap = F.softplus(compact.pos / tau - torch.logsumexp(compact.neg / tau, dim=1))  # (2N,)
    info, dec = InfoNCELoss(tau)(z1, z2).loss, DCLLoss(tau)(z1, z2).loss
    assert (info - dec).item() == pytest.approx(gap.mean().item(), rel=1e-4, abs=1e-6 / tau)
    assert info.item() >= dec.item()
    # Per anchor, from the reference transcriptions, and from the library on one-anchor slices.
    pairs = zip(infonce_per_anchor(z1, z2, tau), dcl_per_anchor(z1, z2, tau), strict=True)
    ref_gap = [float(i - d_) for i, d_ in pairs]
    torch.testing.assert_close(gap.double(), torch.tensor(ref_gap, dtype=torch.float64), **loss_tol(tau))
    for a in range(2 * n):
        one = PairSimilarities(
            pos=sims.pos[a : a + 1],
            neg=sims.neg[a : a + 1],
            pos_batch=sims.pos_batch,
            neg_exclude=sims.neg_exclude[a : a + 1],
        )
        per = InfoNCELoss(tau).from_similarities(one).loss - DCLLoss(tau).from_similarities(one).loss
        assert per.item() == pytest.approx(ref_gap[a], rel=1e-4, abs=1e-6 / tau)
        assert per.item() >= 0


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("tau", [0.05, 0.5, 5.0])
def test_infonce_is_at_least_dcl(seed, tau):
    z1, z2 = random_pair(6, 4, seed=seed)
    assert InfoNCELoss(tau)(z1, z2).loss.item() >= DCLLoss(tau)(z1, z2).loss.item()


def test_npc_diagnostics_are_the_infonce_coupling():
    z1, z2 = random_pair(6, 5, seed=13)
    tau = 0.2
    out = DCLLoss(tau)(z1, z2)
    q = npc_multiplier(z1, z2, tau)
    assert out.diagnostics["q_mean"].item() == pytest.approx(statistics.fmean(q), rel=1e-5)
    assert out.diagnostics["q_std"].item() == pytest.approx(statistics.pstdev(q), rel=1e-4, abs=1e-7)
    info = InfoNCELoss(tau)(z1, z2).diagnostics
    for key in ("q_mean", "q_std", "q_cv", "pos_sim", "neg_sim"):
        assert out.diagnostics[key].item() == pytest.approx(info[key].item(), rel=1e-6, abs=1e-8)


# --- Prop. 1-2
def unit_leaves(n: int, d: int, seed: int, dtype=torch.float64) -> list[torch.Tensor]:
    z1, z2 = random_pair(n, d, seed=seed)
    z = F.normalize(torch.cat([z1, z2]), dim=1).to(dtype)
    return [row.clone().requires_grad_(True) for row in z]


@pytest.mark.parametrize(("n", "d", "tau"), [(2, 3, 0.1), (4, 6, 0.2), (6, 5, 0.5)])
def test_prop2_decoupled_gradients_have_no_npc_multiplier(n, d, tau):
    """DCL gradients are Eq. 3 with q = 1, and InfoNCE's are exactly q_{B,a} times DCL's for the positive
    and each negative (−∇_{z_p} L = (q/τ) z_a vs (1/τ) z_a; −∇_{z_j} L = −(q/τ)(e^{s_j}/U) z_a vs no q)."""
    views = unit_leaves(n, d, seed=n * d)
    flat = [v.detach() for v in views]
    q = npc_multiplier(torch.stack(flat[:n]), torch.stack(flat[n:]), tau)
    for a in range(2 * n):
        g_dcl = torch.autograd.grad(dcl_anchor(views, a, tau), views)
        g_info = torch.autograd.grad(infonce_anchor(views, a, tau), views)
        closed = prop1_anchor_gradients(views, a, tau, coupled=False)
        for gd, c in zip(g_dcl, closed, strict=True):
            torch.testing.assert_close(gd, c, rtol=1e-9, atol=1e-12)
        p = positive_of(a, n)
        torch.testing.assert_close(-g_dcl[p], flat[a] / tau, rtol=1e-9, atol=1e-12)
        for gi, gd in zip(g_info, g_dcl, strict=True):  # anchor, positive and every negative alike
            torch.testing.assert_close(gi, q[a] * gd, rtol=1e-9, atol=1e-12)
        assert 0 < q[a] < 1


@pytest.mark.parametrize(("n", "d", "tau"), [(2, 3, 0.1), (4, 6, 0.2)])
def test_prop2_holds_for_library_single_anchor(n, d, tau):
    views = unit_leaves(n, d, seed=7 * n + d, dtype=torch.float32)
    for a in range(2 * n):
        p = positive_of(a, n)
        negs = [torch.dot(views[a], views[j]) for j in range(2 * n) if j not in (a, p)]
        sims = PairSimilarities(
            pos=torch.dot(views[a], views[p])[None], neg=torch.stack(negs)[None], pos_batch=torch.zeros(n)
        )
        grads = torch.autograd.grad(DCLLoss(tau).from_similarities(sims).loss, views)
        closed = prop1_anchor_gradients(views, a, tau, coupled=False)
        for g, c in zip(grads, closed, strict=True):
            torch.testing.assert_close(g.double(), c, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("n", "d", "tau"), [(3, 4, 0.1), (8, 16, 0.3)])
def test_library_gradient_is_mean_of_decoupled_gradients(n, d, tau):
    z1, z2 = random_pair(n, d, seed=6 * n)
    z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)
    _, g1, g2 = library_value_and_grads(DCLLoss(tau), z1, z2)
    views = list(torch.cat([z1, z2]).unbind(0))
    expected = torch.stack(prop1_view_gradients(views, tau, coupled=False))
    torch.testing.assert_close(g1, project_to_tangent(expected[:n], z1), **grad_tol(tau))
    torch.testing.assert_close(g2, project_to_tangent(expected[n:], z2), **grad_tol(tau))
    # ... and it is not the coupled (InfoNCE) gradient.
    coupled = torch.stack(prop1_view_gradients(views, tau, coupled=True))
    assert not torch.allclose(g1, project_to_tangent(coupled[:n], z1), **grad_tol(tau))


@pytest.mark.parametrize("ratio", [1 / 64, 4.0, 256.0])
def test_eqco_scaling_of_negatives_is_a_constant_for_dcl_but_not_for_infonce(ratio):
    """Why the config rejects loss.alpha outside EqCo: with the positive out of the denominator, scaling the
    negatives' sum by α/K (EqCo Eq. 12) adds log(α/K) to every anchor's loss and leaves the gradient alone."""
    tau = 0.2
    z1, z2 = random_pair(6, 8, seed=11)  # the library's similarities are fp32: compare at fp32 tolerance

    def value_and_grads(loss_fn, shift):
        a = z1.clone().requires_grad_(True)
        b = z2.clone().requires_grad_(True)
        sims = two_view_similarities(a, b)
        # + τ·log(α/K) on each negative similarity = the negatives' exp-sum scaled by α/K.
        scaled = dataclasses.replace(sims, neg=sims.neg + tau * shift)
        loss = loss_fn.from_similarities(scaled).loss
        loss.backward()
        return loss.detach(), a.grad, b.grad

    shift = math.log(ratio)
    dcl_plain, *dcl_grads = value_and_grads(DCLLoss(tau), 0.0)
    dcl_scaled, *dcl_scaled_grads = value_and_grads(DCLLoss(tau), shift)
    torch.testing.assert_close(dcl_scaled, dcl_plain + shift)
    for g, h in zip(dcl_grads, dcl_scaled_grads, strict=True):
        torch.testing.assert_close(g, h, atol=1e-6, rtol=1e-5)
    # InfoNCE's positive competes with the scaled sum, so the same scaling moves its gradient substantially.
    _, *nce_grads = value_and_grads(InfoNCELoss(tau), 0.0)
    _, *nce_scaled_grads = value_and_grads(InfoNCELoss(tau), shift)
    for g, h in zip(nce_grads, nce_scaled_grads, strict=True):
        assert (g - h).abs().max() > 0.1 * g.abs().max()
