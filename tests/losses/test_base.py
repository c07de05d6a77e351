"""Shared machinery of dcl_core/losses/base.py and the contract every loss in LOSSES must honour.

SimCLR's two-view construction, the NPC diagnostics, dcl_core.distributed's gathers without a process group, input
validation, symmetries, and the numerical robustness of all six losses (tiny τ, adversarial inputs, bf16).
"""

import math

import pytest
import torch
from reference import anchor_logits, positive_of, random_pair, unit_views

from dcl_core.config import LOSS_NAMES
from dcl_core.distributed import distributed_world, gather_no_grad, gather_with_grad
from dcl_core.losses import (
    LOSSES,
    AlignUniformLoss,
    DCLLoss,
    DCLWExpLoss,
    DCLWLoss,
    EqCoLoss,
    InfoNCELoss,
    LossOutput,
    PairSimilarities,
    npc_diagnostics,
    two_view_similarities,
)
from dcl_core.losses.base import negative_columns, negative_logsumexp


def make(name: str, tau: float):
    return LOSSES[name](temperature=tau)


def test_registry_maps_names_to_the_six_classes():
    expected = {
        "infonce": InfoNCELoss,
        "dcl": DCLLoss,
        "dclw": DCLWLoss,
        "dclw_exp": DCLWExpLoss,
        "eqco": EqCoLoss,
        "align_uniform": AlignUniformLoss,
    }
    assert expected == LOSSES
    assert tuple(LOSSES) == LOSS_NAMES  # the config's list of loss.name choices, in the same order


# --- two views
@pytest.mark.parametrize(("n", "d"), [(2, 1), (3, 4), (8, 32)])
def test_two_view_similarities_matches_loop_construction(n, d):
    z1, z2 = random_pair(n, d, seed=11 * n + d)
    sims = two_view_similarities(z1, z2)
    assert isinstance(sims, PairSimilarities)
    assert sims.pos.shape == (2 * n,)
    assert sims.neg.shape == (2 * n, 2 * n)  # every view, not copied: each row excludes 2 columns
    assert sims.neg_exclude is not None and sims.neg_exclude.shape == (2 * n, 2)
    assert sims.num_negatives == 2 * n - 2
    assert sims.pos_batch.shape == (n,)
    assert sims.pos.dtype == sims.neg.dtype == torch.float64  # float64 inputs stay float64 (the loss checker's)
    compact = sims.compact()
    assert compact.neg.shape == (2 * n, 2 * n - 2) and compact.neg_exclude is None
    assert compact.num_negatives == 2 * n - 2

    views = unit_views(z1, z2)
    for a in range(2 * n):
        s_pos, s_neg, js = anchor_logits(views, a, tau=1.0)
        assert len(js) == 2 * n - 2 and a not in js and positive_of(a, n) not in js
        assert set(sims.neg_exclude[a].tolist()) == {a, positive_of(a, n)}  # exactly the anchor and its positive
        assert sims.pos[a].item() == pytest.approx(float(s_pos), abs=1e-6)
        torch.testing.assert_close(
            compact.neg[a].double(), torch.stack(s_neg).double(), rtol=0, atol=1e-6
        )  # same negatives, same (view) order
        row = torch.stack([torch.dot(views[a], views[j]) for j in range(2 * n)])  # every column, in view order
        torch.testing.assert_close(sims.neg[a].double(), row, rtol=0, atol=1e-6)
    pair = torch.tensor([float(torch.dot(views[i], views[i + n])) for i in range(n)], dtype=torch.float64)
    torch.testing.assert_close(sims.pos_batch.double(), pair, rtol=0, atol=1e-6)
    assert not sims.pos_batch.requires_grad



# --- masked negatives (PairSimilarities.neg_exclude) vs the compact copy
# name -> constructor kwargs: every loss, EqCo also with a margin and with K-subsampling.
MASKED_CASES = {
    "infonce": ("infonce", {}),
    "dcl": ("dcl", {}),
    "dclw": ("dclw", {"sigma": 0.5}),
    "dclw_exp": ("dclw_exp", {"sigma": 0.5, "delta": 3.0}),
    "eqco": ("eqco", {}),
    "eqco_alpha": ("eqco", {"alpha": 256.0}),
    "eqco_sampled": ("eqco", {"alpha": 8.0, "num_negatives": 5}),
    "align_uniform": ("align_uniform", {}),
}


def run_with_similarities(monkeypatch, loss_fn, z1, z2, compact: bool):
    """(LossOutput, ∂L/∂z1, ∂L/∂z2) with SimCLR's similarities as built, or copied to the compact layout."""
    import dcl_core.losses.align_uniform as align_module
    import dcl_core.losses.base as base_module

    built = base_module.two_view_similarities
    make = (lambda *args: built(*args).compact()) if compact else built
    for module in (base_module, align_module):
        monkeypatch.setattr(module, "two_view_similarities", make)
    a, b = z1.clone().requires_grad_(True), z2.clone().requires_grad_(True)
    torch.manual_seed(7)  # EqCo's K-subsample: the same draw on both layouts
    out = loss_fn(a, b)
    out.loss.backward()
    return out, a.grad, b.grad


@pytest.mark.parametrize("case", list(MASKED_CASES))
@pytest.mark.parametrize("tau", [0.005, 0.05, 0.5, 5.0])
def test_masked_negatives_equal_the_compact_copy(monkeypatch, case, tau):
    """Excluding the anchor and its positive by −inf in the full matrix gives the loss, gradients and
    diagnostics of the explicit (2N, 2N − 2) copy of the negatives (the previous implementation)."""
    key, kwargs = MASKED_CASES[case]
    z1, z2 = random_pair(6, 8, seed=int(1000 * tau), dtype=torch.float32)
    loss_fn = LOSSES[key](temperature=tau, **kwargs)
    masked, g1, g2 = run_with_similarities(monkeypatch, loss_fn, z1, z2, compact=False)
    copied, c1, c2 = run_with_similarities(monkeypatch, loss_fn, z1, z2, compact=True)
    torch.testing.assert_close(masked.loss, copied.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g1, c1, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(g2, c2, rtol=1e-6, atol=1e-6)
    assert masked.diagnostics.keys() == copied.diagnostics.keys()
    for name, value in masked.diagnostics.items():
        torch.testing.assert_close(value, copied.diagnostics[name], rtol=1e-6, atol=1e-6, msg=name)
    torch.testing.assert_close(masked.npc, copied.npc, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("tau", [0.005, 0.1, 2.0])
@pytest.mark.parametrize("excluded", [0, 1, 3])
def test_negative_logsumexp_equals_torch_logsumexp_of_masked_logits(tau, excluded):
    g = torch.Generator().manual_seed(excluded)
    neg = (2 * torch.rand(7, 9, generator=g) - 1).requires_grad_(True)  # similarities in [−1, 1]
    exclude = torch.rand(7, 9, generator=g).argsort(dim=1)[:, :excluded] if excluded else None  # distinct
    got = negative_logsumexp(neg, exclude, tau)
    (grad,) = torch.autograd.grad(got.sum(), neg)
    logits = neg.detach() / tau
    if exclude is not None:
        logits = logits.scatter(1, exclude, float("-inf"))
    torch.testing.assert_close(got, torch.logsumexp(logits, dim=1), rtol=0, atol=0)  # same shift and sum: bit for bit
    # ∂ log U / ∂s = softmax(logits) / τ, here in float64 from the same float32 logits (at τ = 0.005 the
    # float32 rounding of s/τ ≈ 200 alone moves e^{s/τ} by ~1e-5 relative, so both sides start from it).
    ref_grad = torch.softmax(logits.double(), dim=1) / tau
    torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-6, atol=1e-6)
    if exclude is not None:
        assert (grad.gather(1, exclude) == 0).all()  # excluded columns receive no gradient
    # float64 gradcheck of the hand-written backward, with a random incoming gradient per row
    x = neg.detach().double().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda t: negative_logsumexp(t, exclude, tau) * torch.arange(1.0, 8.0), (x,))


def test_negative_logsumexp_without_grad_and_finite_at_extremes():
    neg = torch.tensor([[1.0, -1.0, 1.0], [-1.0, -1.0, 1.0]])
    exclude = torch.tensor([[0], [2]])
    with torch.no_grad():
        out = negative_logsumexp(neg, exclude, 0.005)  # logits ±200
    assert not out.requires_grad and torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.tensor([200.0, math.log(2.0) - 200.0]))


def test_pair_similarities_helpers():
    neg = torch.arange(12.0).view(3, 4)
    exclude = torch.tensor([[0, 3], [2, 1], [1, 3]])
    sims = PairSimilarities(pos=torch.zeros(3), neg=neg, pos_batch=torch.zeros(3), neg_exclude=exclude)
    assert sims.num_negatives == 2
    kept = [[1.0, 2.0], [4.0, 7.0], [8.0, 10.0]]  # each row's non-excluded columns, in column order
    assert sims.compact().neg.tolist() == kept
    assert negative_columns(torch.tensor([[1, 0], [1, 0], [0, 1]]), exclude).tolist() == [[2, 1], [3, 0], [0, 2]]
    assert sims.negative_mean().item() == pytest.approx(sum(map(sum, kept)) / 6)
    dense = PairSimilarities(pos=torch.zeros(3), neg=neg, pos_batch=torch.zeros(3))
    assert dense.num_negatives == 4 and dense.compact() is dense
    assert dense.negative_mean().item() == pytest.approx(neg.mean().item())


@pytest.mark.parametrize("shape", [(3, 4), (2, 1), (3,), (3, 1, 1)])
def test_pair_similarities_rejects_bad_exclusions(shape):
    """(A, E) with E < M: the row count of neg (A = 3) and at least one negative left (M = 4)."""
    with pytest.raises(ValueError):
        PairSimilarities(
            pos=torch.zeros(3), neg=torch.zeros(3, 4), pos_batch=torch.zeros(3), neg_exclude=torch.zeros(shape).long()
        )

def test_two_view_similarities_normalizes_inputs():
    z1, z2 = random_pair(5, 7, seed=3)
    ref = two_view_similarities(z1, z2)
    scaled = two_view_similarities(1e3 * z1, 1e-3 * z2)
    torch.testing.assert_close(scaled.pos, ref.pos, rtol=0, atol=1e-6)
    torch.testing.assert_close(scaled.neg, ref.neg, rtol=0, atol=1e-6)
    assert ref.pos.abs().max() <= 1 + 1e-6 and ref.neg.abs().max() <= 1 + 1e-6


def test_two_view_similarities_stay_fp32_under_bf16_autocast():
    z1, z2 = random_pair(4, 8, seed=5, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        sims = two_view_similarities(z1, z2)
    assert sims.pos.dtype == sims.neg.dtype == torch.float32


BAD_SHAPES = [
    ((3, 4), (4, 4)),  # different N
    ((3, 4), (3, 5)),  # different D
    ((4,), (4,)),  # not 2-d
    ((2, 3, 4), (2, 3, 4)),  # not 2-d
    ((1, 4), (1, 4)),  # a single sample has no negatives
]


@pytest.mark.parametrize(("s1", "s2"), BAD_SHAPES)
def test_two_view_similarities_rejects_bad_shapes(s1, s2):
    with pytest.raises(ValueError):
        two_view_similarities(torch.randn(*s1), torch.randn(*s2))


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize(("s1", "s2"), BAD_SHAPES)
def test_every_loss_rejects_bad_shapes(name, s1, s2):
    with pytest.raises(ValueError):
        make(name, 0.1)(torch.randn(*s1), torch.randn(*s2))


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("tau", [0.0, -0.1, -1.0, float("nan"), float("inf")])
def test_every_loss_rejects_bad_temperature(name, tau):
    with pytest.raises(ValueError):
        make(name, tau)


# --- helpers
def test_npc_diagnostics_formula():
    pos = torch.tensor([2.0, -1.0, 0.5, 30.0])
    log_u = torch.tensor([1.0, 3.0, 0.5, -30.0])
    pairs = zip(pos.tolist(), log_u.tolist(), strict=True)
    q = [math.exp(lu) / (math.exp(p) + math.exp(lu)) for p, lu in pairs]
    mean = sum(q) / len(q)
    std = math.sqrt(sum((x - mean) ** 2 for x in q) / len(q))  # population std
    d = npc_diagnostics(pos, log_u)
    assert d["q_mean"].item() == pytest.approx(mean, rel=1e-6)
    assert d["q_std"].item() == pytest.approx(std, rel=1e-5)
    assert d["q_cv"].item() == pytest.approx(std / mean, rel=1e-5)


def test_npc_diagnostics_finite_for_extreme_logits():
    pos = torch.tensor([1e4, -1e4, 0.0], requires_grad=True)
    log_u = torch.tensor([-1e4, 1e4, 0.0])
    d = npc_diagnostics(pos, log_u)
    assert all(torch.isfinite(v) and not v.requires_grad for v in d.values())
    assert d["q_mean"].item() == pytest.approx((0.0 + 1.0 + 0.5) / 3, abs=1e-6)


def test_gathers_are_the_identity_without_process_group():
    x = torch.randn(3, 4, requires_grad=True)
    assert distributed_world() == (0, 1)
    assert gather_with_grad(x) is x
    assert gather_no_grad(x) is x


def test_loss_output_defaults():
    out = LossOutput(loss=torch.tensor(1.0))
    assert out.diagnostics == {}


# --- contract
EXPECTED_KEYS = {
    "infonce": {"mi_bound"},
    "dcl": set(),
    "dclw": {"weight_std"},
    "dclw_exp": {"weight_mean"},
    "eqco": {"mi_bound"},
    "align_uniform": {"align", "uniform"},
}


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_output_contract(name):
    z1, z2 = random_pair(6, 8, seed=1, dtype=torch.float32)
    z1.requires_grad_(True)
    out = make(name, 0.2)(z1, z2)
    assert isinstance(out, LossOutput)
    assert out.loss.dim() == 0 and out.loss.requires_grad and torch.isfinite(out.loss)
    assert set(out.diagnostics) == {"q_mean", "q_std", "q_cv", "pos_sim", "neg_sim"} | EXPECTED_KEYS[name]
    for key, value in out.diagnostics.items():
        assert value.dim() == 0, key
        assert not value.requires_grad, key
        assert torch.isfinite(value), key
    # Per-anchor q_B for the histogram (Fig. 1): one per anchor, detached, in (0, 1), mean = q_mean.
    assert out.npc is not None and out.npc.shape == (12,) and not out.npc.requires_grad
    assert ((out.npc > 0) & (out.npc < 1)).all()
    assert out.npc.mean().item() == pytest.approx(out.diagnostics["q_mean"].item(), rel=1e-6)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_similarity_diagnostics_match_reference(name):
    n = 5
    z1, z2 = random_pair(n, 6, seed=2)
    out = make(name, 0.3)(z1, z2)
    views = unit_views(z1, z2)
    pos, neg = [], []
    for a in range(2 * n):
        s_pos, s_neg, _ = anchor_logits(views, a, tau=1.0)
        pos.append(float(s_pos))
        neg.extend(float(s) for s in s_neg)
    assert out.diagnostics["pos_sim"].item() == pytest.approx(sum(pos) / len(pos), abs=1e-6)
    assert out.diagnostics["neg_sim"].item() == pytest.approx(sum(neg) / len(neg), abs=1e-6)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_symmetries(name):
    """Invariant to input scale (normalized inside), to swapping the views and to permuting the batch."""
    z1, z2 = random_pair(7, 5, seed=4)
    loss_fn = make(name, 0.25)
    ref = loss_fn(z1, z2).loss.item()
    perm = torch.randperm(7, generator=torch.Generator().manual_seed(0))
    assert loss_fn(3.0 * z1, 0.1 * z2).loss.item() == pytest.approx(ref, rel=1e-5)
    assert loss_fn(z2, z1).loss.item() == pytest.approx(ref, rel=1e-5)
    assert loss_fn(z1[perm], z2[perm]).loss.item() == pytest.approx(ref, rel=1e-5)


@pytest.mark.parametrize("name", LOSS_NAMES)
def test_gradient_is_tangent_to_each_input_row(name):
    """The loss sees only z/||z||, so ∂L/∂z_i ⟂ z_i."""
    z1, z2 = random_pair(6, 5, seed=8)
    a, b = z1.clone().requires_grad_(True), z2.clone().requires_grad_(True)
    make(name, 0.2)(a, b).loss.backward()
    for z, g in ((z1, a.grad), (z2, b.grad)):
        radial = (g * z).sum(dim=1) / z.norm(dim=1)
        assert radial.abs().max() < 1e-5 * g.abs().max() + 1e-7
        assert g.abs().max() > 0


@pytest.mark.parametrize(("dtype", "computed"), [(torch.float64, torch.float64), (torch.float32, torch.float32),
                                                  (torch.bfloat16, torch.float32), (torch.float16, torch.float32)])
def test_similarities_are_computed_in_fp32_or_in_the_input_s_higher_precision(dtype, computed):
    z1, z2 = random_pair(4, 3, seed=9)
    a = z1.to(dtype).requires_grad_(True)
    out = InfoNCELoss(0.1)(a, z2.to(dtype))
    out.loss.backward()
    assert out.loss.dtype == computed
    assert a.grad.dtype == dtype


# --- numerics
NUMERIC_TAUS = (0.005, 0.01, 0.1, 1.0, 10.0)


def adversarial_inputs(kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    n, d = 8, 16
    g = torch.Generator().manual_seed(123)
    base = torch.randn(n, d, generator=g)
    if kind == "identical":  # every view of every sample is the same vector
        v = torch.randn(1, d, generator=g)
        return v.repeat(n, 1), v.repeat(n, 1)
    if kind == "antipodal":  # z2 = −z1: the positive is the farthest point
        return base, -base
    if kind == "aligned":  # perfect positives, random negatives: the largest logits
        return base, base.clone()
    if kind == "collapsed_pairs":  # two clusters: many negatives identical to the positive
        v = torch.randn(2, d, generator=g)
        z = v[torch.arange(n) % 2]
        return z, z.clone()
    if kind == "huge":
        return 1e15 * base, 1e15 * torch.randn(n, d, generator=g)
    if kind == "tiny":
        return 1e-15 * base, 1e-15 * torch.randn(n, d, generator=g)
    return base, torch.randn(n, d, generator=g)


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("tau", NUMERIC_TAUS)
@pytest.mark.parametrize(
    "kind", ["random", "identical", "antipodal", "aligned", "collapsed_pairs", "huge", "tiny"]
)
def test_finite_loss_and_gradients_fp32(name, tau, kind):
    z1, z2 = adversarial_inputs(kind)
    a, b = z1.clone().requires_grad_(True), z2.clone().requires_grad_(True)
    out = make(name, tau)(a, b)
    out.loss.backward()
    assert torch.isfinite(out.loss), out.loss
    assert torch.isfinite(a.grad).all() and torch.isfinite(b.grad).all()
    assert all(torch.isfinite(v) for v in out.diagnostics.values()), out.diagnostics


@pytest.mark.parametrize("name", LOSS_NAMES)
@pytest.mark.parametrize("tau", [0.005, 0.1, 1.0])
def test_bf16_autocast_finite_and_close_to_fp32(name, tau):
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 32)
    x1, x2 = torch.randn(8, 16), torch.randn(8, 16)
    loss_fn = make(name, tau)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z1, z2 = layer(x1), layer(x2)
        assert z1.dtype == torch.bfloat16  # the projector output really is low precision
        out = loss_fn(z1, z2)
    out.loss.backward()
    assert torch.isfinite(out.loss)
    assert out.loss.dtype == torch.float32
    assert torch.isfinite(layer.weight.grad).all() and layer.weight.grad.abs().max() > 0
    # Same (bf16-rounded) inputs, cast to fp32, outside autocast: the loss must be computed identically.
    ref = loss_fn(z1.detach().float(), z2.detach().float()).loss
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-5)
