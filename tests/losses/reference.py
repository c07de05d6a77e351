"""Plain-Python reference transcriptions of the loss equations, shared by the tests in this folder.

Everything here is float64 and loops explicitly over anchors and candidates, with an explicit ``if`` for
the anchor itself and its positive. No ``dcl_core`` helper is used. The arithmetic is done on 0-d float64
torch tensors (``torch.exp``/``torch.log``/``torch.dot``) so the same functions give values and, through
autograd, reference gradients.

Layout (the same as the library's, so per-anchor values can be compared): the 2N views are
``V[0..N-1] = z^(1)_0..N-1`` and ``V[N..2N-1] = z^(2)_0..N-1``; the positive of view ``a`` is the other view
of the same sample, ``a ± N``; the candidates of an anchor are scanned in view order ``j = 0..2N-1``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def unit_views(z1: Tensor, z2: Tensor) -> list[Tensor]:
    """The 2N L2-normalized rows (1-d float64 tensors, still connected to z1/z2 for autograd)."""
    views = []
    for z in (z1, z2):
        for row in z.to(torch.float64).unbind(0):
            views.append(row / torch.sqrt(torch.dot(row, row)))
    return views


def positive_of(a: int, n: int) -> int:
    """Index of the other view of the same sample."""
    return a + n if a < n else a - n


def anchor_logits(views: list[Tensor], a: int, tau: float) -> tuple[Tensor, list[Tensor], list[int]]:
    """s⁺ = <z_a, z_p>/τ, the negative logits <z_a, z_j>/τ and their view indices j (view order)."""
    n = len(views) // 2
    p = positive_of(a, n)
    s_pos = torch.dot(views[a], views[p]) / tau
    s_neg, js = [], []
    for j in range(2 * n):
        if j == a:  # the anchor itself
            continue
        if j == p:  # its positive
            continue
        s_neg.append(torch.dot(views[a], views[j]) / tau)
        js.append(j)
    return s_pos, s_neg, js


def _sum(terms: list[Tensor]) -> Tensor:
    total = terms[0]
    for t in terms[1:]:
        total = total + t
    return total


def mean(values: list[Tensor]) -> Tensor:
    return _sum(values) / len(values)


# --- InfoNCE
def infonce_per_anchor(z1: Tensor, z2: Tensor, tau: float) -> list[Tensor]:
    """DCL Eq. 1-2: L = −log(e^{s⁺} / (e^{s⁺} + U)), U = Σ_{negatives} e^{s}."""
    views = unit_views(z1, z2)
    return [infonce_anchor(views, a, tau) for a in range(len(views))]


def infonce_anchor(views: list[Tensor], a: int, tau: float) -> Tensor:
    """L_a^{InfoNCE} from already-normalized views (no normalization inside: for Prop. 1)."""
    s_pos, s_neg, _ = anchor_logits(views, a, tau)
    u = _sum([torch.exp(s) for s in s_neg])
    return -torch.log(torch.exp(s_pos) / (torch.exp(s_pos) + u))


def infonce(z1: Tensor, z2: Tensor, tau: float) -> Tensor:
    return mean(infonce_per_anchor(z1, z2, tau))


def npc_multiplier(z1: Tensor, z2: Tensor, tau: float, neg_scale: float = 1.0) -> list[float]:
    """DCL Eq. 4 per anchor: q = U / (e^{s⁺} + U); for EqCo U is scaled by α/K (``neg_scale``)."""
    views = unit_views(z1.detach(), z2.detach())
    out = []
    for a in range(len(views)):
        s_pos, s_neg, _ = anchor_logits(views, a, tau)
        u = neg_scale * sum(math.exp(float(s)) for s in s_neg)
        out.append(u / (math.exp(float(s_pos)) + u))
    return out


# --- DCL
def dcl_per_anchor(z1: Tensor, z2: Tensor, tau: float) -> list[Tensor]:
    """DCL Eq. 6: L = −s⁺ + log U (no positive in the denominator)."""
    views = unit_views(z1, z2)
    return [dcl_anchor(views, a, tau) for a in range(len(views))]


def dcl_anchor(views: list[Tensor], a: int, tau: float) -> Tensor:
    """L_a^{DCL} from already-normalized views (no normalization inside: for Prop. 1)."""
    s_pos, s_neg, _ = anchor_logits(views, a, tau)
    return -s_pos + torch.log(_sum([torch.exp(s) for s in s_neg]))


def dcl(z1: Tensor, z2: Tensor, tau: float) -> Tensor:
    return mean(dcl_per_anchor(z1, z2, tau))


# --- DCLW
def pair_cosines(z1: Tensor, z2: Tensor) -> list[float]:
    """<z_i^(1), z_i^(2)> of each of the N pairs, as Python floats (i.e. detached)."""
    views = unit_views(z1.detach(), z2.detach())
    n = len(views) // 2
    return [float(torch.dot(views[i], views[i + n])) for i in range(n)]


def vmf_weights(z1: Tensor, z2: Tensor, sigma: float) -> list[float]:
    """DCL Eq. 7 weight per pair: w_i = 2 − exp(c_i/σ) / E_i[exp(c_i/σ)] (constants, no gradient)."""
    cos = pair_cosines(z1, z2)
    expectation = sum(math.exp(c / sigma) for c in cos) / len(cos)
    return [2.0 - math.exp(c / sigma) / expectation for c in cos]


def exp_weights(z1: Tensor, z2: Tensor, sigma: float, delta: float) -> list[float]:
    """DCL A.8 weight per pair: w_i = δ·exp(−σ c_i) (constants, no gradient)."""
    return [delta * math.exp(-sigma * c) for c in pair_cosines(z1, z2)]


def weighted_dcl(z1: Tensor, z2: Tensor, tau: float, weights: list[float]) -> Tensor:
    """DCL Eq. 7 / Eq. 10: L = −w_i s⁺ + log U, one weight per pair shared by both of its anchors.

    ``weights`` are floats (constants, as in the library) or 0-d tensors (then differentiated through).
    """
    views = unit_views(z1, z2)
    n = len(views) // 2
    out = []
    for a in range(2 * n):
        s_pos, s_neg, _ = anchor_logits(views, a, tau)
        w = weights[a % n]
        out.append(-w * s_pos + torch.log(_sum([torch.exp(s) for s in s_neg])))
    return mean(out)


def dclw(z1: Tensor, z2: Tensor, tau: float, sigma: float) -> Tensor:
    return weighted_dcl(z1, z2, tau, vmf_weights(z1, z2, sigma))


def dclw_exp(z1: Tensor, z2: Tensor, tau: float, sigma: float, delta: float) -> Tensor:
    return weighted_dcl(z1, z2, tau, exp_weights(z1, z2, sigma, delta))


# --- EqCo
def eqco_per_anchor(
    z1: Tensor, z2: Tensor, tau: float, alpha: float | None = None, subsets: list[list[int]] | None = None
) -> list[Tensor]:
    """EqCo Eq. 12: L = −log(s_0 / (s_0 + (α/K) Σ_{i=1..K} s_i)), s_i = e^{<q,k_i>/τ}.

    ``subsets[a]`` lists the positions (0..2N−3, in the anchor's candidate order) of the K negatives kept for
    anchor a; None keeps all 2N−2. ``alpha`` None means α = K.
    """
    views = unit_views(z1, z2)
    out = []
    for a in range(len(views)):
        s_pos, s_neg, _ = anchor_logits(views, a, tau)
        if subsets is not None:
            s_neg = [s_neg[m] for m in subsets[a]]
        k = len(s_neg)
        al = float(k) if alpha is None else alpha
        s0 = torch.exp(s_pos)
        out.append(-torch.log(s0 / (s0 + (al / k) * _sum([torch.exp(s) for s in s_neg]))))
    return out


def eqco(z1: Tensor, z2: Tensor, tau: float, alpha: float | None = None, subsets=None) -> Tensor:
    return mean(eqco_per_anchor(z1, z2, tau, alpha, subsets))


def eqco_margin(z1: Tensor, z2: Tensor, tau: float, alpha: float) -> Tensor:
    """EqCo Eq. 1 with the equivalent condition Eq. 5: margin m = τ log(α/K) subtracted from the positive."""
    views = unit_views(z1, z2)
    out = []
    for a in range(len(views)):
        s_pos, s_neg, _ = anchor_logits(views, a, tau)
        m = tau * math.log(alpha / len(s_neg))
        num = torch.exp(s_pos - m / tau)
        out.append(-torch.log(num / (num + _sum([torch.exp(s) for s in s_neg]))))
    return mean(out)


# --- align/uniform
def _unit_rows(z: Tensor) -> list[Tensor]:
    return [row / torch.sqrt(torch.dot(row, row)) for row in z.to(torch.float64).unbind(0)]


def alignment(z1: Tensor, z2: Tensor) -> Tensor:
    """Wang & Isola: E_i ||z_i^(1) − z_i^(2)||²."""
    a, b = _unit_rows(z1), _unit_rows(z2)
    return mean([torch.dot(x - y, x - y) for x, y in zip(a, b, strict=True)])


def uniformity(z: Tensor, t: float) -> Tensor:
    """Wang & Isola: log E_{i≠j} exp(−t ||z_i − z_j||²)."""
    rows = _unit_rows(z)
    terms = []
    for i in range(len(rows)):
        for j in range(len(rows)):
            if i == j:
                continue
            d = rows[i] - rows[j]
            terms.append(torch.exp(-t * torch.dot(d, d)))
    return torch.log(mean(terms))


def align_uniform(z1: Tensor, z2: Tensor, t: float = 2.0, weight: float = 1.0) -> Tensor:
    """Alignment + weight × the mean of the two views' uniformities."""
    return alignment(z1, z2) + weight * 0.5 * (uniformity(z1, t) + uniformity(z2, t))


# --- Prop. 1
def prop1_anchor_gradients(views: list[Tensor], a: int, tau: float, coupled: bool) -> list[Tensor]:
    """∇ of the single-anchor loss L_a wrt every normalized view, transcribed from DCL Eq. 3 (closed form).

    With positive p, negatives j, p_j = e^{s_j}/U and q = U/(e^{s⁺}+U) (Eq. 4; q = 1 when not coupled, DCL):
    ∇_{z_a} = −(q/τ)(z_p − Σ_j p_j z_j), ∇_{z_p} = −(q/τ) z_a, ∇_{z_j} = (q/τ) p_j z_a.
    """
    views = [v.detach().to(torch.float64) for v in views]
    n2 = len(views)
    p = positive_of(a, n2 // 2)
    s_pos, s_neg, js = anchor_logits(views, a, tau)
    u = sum(math.exp(float(s)) for s in s_neg)
    q = u / (math.exp(float(s_pos)) + u) if coupled else 1.0
    probs = [math.exp(float(s)) / u for s in s_neg]
    grads = [torch.zeros_like(v) for v in views]
    grads[a] = -(q / tau) * (views[p] - _sum([pj * views[j] for pj, j in zip(probs, js, strict=True)]))
    grads[p] = -(q / tau) * views[a]
    for pj, j in zip(probs, js, strict=True):
        grads[j] = (q / tau) * pj * views[a]
    return grads


def prop1_view_gradients(views: list[Tensor], tau: float, coupled: bool) -> list[Tensor]:
    """∇ of the mean over the 2N anchors wrt each normalized view: the mean of the Eq. 3 gradients."""
    total = [torch.zeros_like(v, dtype=torch.float64) for v in views]
    for a in range(len(views)):
        for k, g in enumerate(prop1_anchor_gradients(views, a, tau, coupled)):
            total[k] = total[k] + g
    return [g / len(views) for g in total]


def project_to_tangent(grad: Tensor, z: Tensor) -> Tensor:
    """Chain rule through z ↦ z/||z|| at a unit-norm z: (I − z zᵀ) g, row by row."""
    return grad - (grad * z).sum(dim=1, keepdim=True) * z


# --- test helpers
GRID_N = (2, 3, 8)
GRID_D = (1, 4, 32)
GRID_TAU = (0.05, 0.1, 0.5, 1.0)


def random_pair(n: int, d: int, seed: int, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """Two (n, d) views with rows of random norm in [0.5, 3] (the losses must normalize them)."""
    g = torch.Generator().manual_seed(seed)
    z1 = torch.randn(n, d, generator=g, dtype=torch.float64)
    z2 = torch.randn(n, d, generator=g, dtype=torch.float64)
    # Exact row norms (a near-zero row would amplify float32 rounding in the normalize backward by 1/|z|).
    z1 = z1 / z1.norm(dim=1, keepdim=True) * (0.5 + 2.5 * torch.rand(n, 1, generator=g, dtype=torch.float64))
    z2 = z2 / z2.norm(dim=1, keepdim=True) * (0.5 + 2.5 * torch.rand(n, 1, generator=g, dtype=torch.float64))
    return z1.to(dtype), z2.to(dtype)


def library_value_and_grads(loss_fn, z1: Tensor, z2: Tensor):
    """(LossOutput, ∂L/∂z1, ∂L/∂z2) of a library loss on fresh leaf copies."""
    a = z1.detach().clone().requires_grad_(True)
    b = z2.detach().clone().requires_grad_(True)
    out = loss_fn(a, b)
    out.loss.backward()
    return out, a.grad, b.grad


def reference_value_and_grads(ref_fn, z1: Tensor, z2: Tensor):
    """(loss, ∂L/∂z1, ∂L/∂z2) of a reference function (autograd through its loops)."""
    a = z1.detach().clone().to(torch.float64).requires_grad_(True)
    b = z2.detach().clone().to(torch.float64).requires_grad_(True)
    loss = ref_fn(a, b)
    loss.backward()
    return loss.detach(), a.grad, b.grad


def loss_tol(tau: float) -> dict[str, float]:
    """The library computes in float32: similarities carry ~1e-7 absolute error, logits ~1e-7/τ."""
    return {"rtol": 1e-5, "atol": 1e-6 / tau}


def grad_tol(tau: float) -> dict[str, float]:
    """Gradients scale like 1/τ; float32 rounding (incl. through normalize) stays below ~1e-5/τ."""
    return {"rtol": 1e-4, "atol": 1e-5 / tau}
