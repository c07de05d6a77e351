"""Alignment + uniformity (dcl_core/losses/align_uniform.py): Wang & Isola 2020, the DCL paper's A.5."""

import itertools
import statistics

import pytest
import torch
from reference import (
    GRID_D,
    GRID_N,
    GRID_TAU,
    align_uniform,
    alignment,
    library_value_and_grads,
    npc_multiplier,
    random_pair,
    reference_value_and_grads,
    uniformity,
)

from dcl_core.losses import AlignUniformLoss


@pytest.mark.parametrize(("t", "weight"), [(2.0, 1.0), (1.0, 0.5)])
@pytest.mark.parametrize(("n", "d", "tau"), list(itertools.product(GRID_N, GRID_D, GRID_TAU)))
def test_matches_loop_reference_value_and_gradients(n, d, tau, t, weight):
    """E||z1−z2||² + λ·½Σ_k log E_{i≠j} exp(−t||z_i^(k) − z_j^(k)||²); τ plays no part in the loss."""
    z1, z2 = random_pair(n, d, seed=6000 * n + 10 * d + int(100 * tau))
    loss_fn = AlignUniformLoss(tau, uniformity_t=t, uniformity_weight=weight)
    out, g1, g2 = library_value_and_grads(loss_fn, z1, z2)
    ref, r1, r2 = reference_value_and_grads(lambda a, b: align_uniform(a, b, t, weight), z1, z2)
    # No 1/τ here: values are O(t), float32 rounding ~1e-6.
    torch.testing.assert_close(out.loss.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g1, r1, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(g2, r2, rtol=1e-4, atol=1e-5)
    assert out.diagnostics["align"].item() == pytest.approx(float(alignment(z1, z2)), abs=1e-5)
    uniform = 0.5 * (float(uniformity(z1, t)) + float(uniformity(z2, t)))
    assert out.diagnostics["uniform"].item() == pytest.approx(uniform, abs=1e-5)


def test_temperature_only_affects_diagnostics():
    z1, z2 = random_pair(6, 5, seed=51)
    a, b = AlignUniformLoss(0.05)(z1, z2), AlignUniformLoss(2.0)(z1, z2)
    assert a.loss.item() == b.loss.item()
    assert a.diagnostics["q_mean"].item() != pytest.approx(b.diagnostics["q_mean"].item())
    q = npc_multiplier(z1, z2, 0.05)
    assert a.diagnostics["q_mean"].item() == pytest.approx(statistics.fmean(q), rel=1e-5)
    assert a.diagnostics["q_std"].item() == pytest.approx(statistics.pstdev(q), rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("n", [2, 3, 8])
def test_closed_form_all_embeddings_equal(n):
    """All equal: alignment 0, every distance 0 so uniformity log(1) = 0: L = 0."""
    v = torch.randn(1, 5, generator=torch.Generator().manual_seed(n))
    out = AlignUniformLoss()(v.repeat(n, 1), v.repeat(n, 1))
    assert out.loss.item() == pytest.approx(0.0, abs=1e-6)


@pytest.mark.parametrize(("t", "weight"), [(2.0, 1.0), (0.5, 3.0)])
def test_closed_form_orthonormal_batch(t, weight):
    """z1 = z2 = (e_1..e_N): alignment 0, all ||z_i − z_j||² = 2, so L = λ·(−2t)."""
    z = torch.eye(4, 6)
    out = AlignUniformLoss(uniformity_t=t, uniformity_weight=weight)(z, z.clone())
    assert out.loss.item() == pytest.approx(-2 * t * weight, rel=1e-6)


def test_closed_form_antipodal_pairs():
    """N = 2, z1 = (e1, e2), z2 = −z1: alignment 4; each view's two points at distance² 2: L = 4 − 2t."""
    z = torch.eye(2, 3)
    out = AlignUniformLoss(uniformity_t=1.5)(z, -z)
    assert out.loss.item() == pytest.approx(4.0 - 2 * 1.5, rel=1e-6)
    assert out.diagnostics["align"].item() == pytest.approx(4.0, rel=1e-6)


def test_zero_weight_is_alignment_only():
    z1, z2 = random_pair(5, 4, seed=52)
    out = AlignUniformLoss(uniformity_weight=0.0)(z1, z2)
    assert out.loss.item() == pytest.approx(float(alignment(z1, z2)), abs=1e-6)


@pytest.mark.parametrize("t", [0.0, -1.0, float("nan")])
def test_rejects_bad_t(t):
    with pytest.raises(ValueError):
        AlignUniformLoss(uniformity_t=t)


def test_rejects_negative_weight():
    with pytest.raises(ValueError):
        AlignUniformLoss(uniformity_weight=-0.1)
