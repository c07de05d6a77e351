"""Properties of a loss's equation as ``from_similarities`` holds it, which need no reference: it depends on the
negatives it is handed and on nothing else of the matrix that holds them.

- *layout*: the same negatives as SimCLR's masked matrix (``neg_exclude``), as ``sims.compact()`` (the negatives
  alone) and compact with each row's negatives shuffled give the same loss and the same gradient with respect to
  the embeddings. A loss that reads an excluded column, takes the number of negatives from the matrix's width or
  depends on the negatives' order fails it.
- *excluded inert*: other values in the excluded columns change neither the loss nor any gradient, and the
  excluded columns receive no gradient.
- *frameworks*: on the similarities MoCo (a queue), NNCLR and SiMo form with their own code (no excluded columns,
  A anchors against K ≠ 2N − 2 negatives), the loss and its gradient are finite, and the same negatives embedded
  in a wider matrix with excluded columns of other values give the same loss and gradient.

A loss that computes from ``(z1, z2)`` in ``forward`` alone (Wang & Isola's, another library's) has no
``from_similarities``: the rows say n/a, and the frameworks other than SimCLR cannot use it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from dcl_core.frameworks import NNCLR, MoCo, SiMo
from dcl_core.frameworks.common import Framework
from dcl_core.losscheck.core import D, LossFactory, N, batch, grad_of, relative, unit_batch
from dcl_core.losscheck.properties import TOL_EXACT
from dcl_core.losscheck.rows import GRADIENT_KINDS, Check, measured, not_applicable, worst
from dcl_core.losses.base import ContrastiveLoss, LossOutput, PairSimilarities, two_view_similarities


def has_similarities(loss: ContrastiveLoss) -> bool:
    """Whether ``loss`` holds its equation in ``from_similarities`` (what the frameworks call)."""
    return type(loss).from_similarities is not ContrastiveLoss.from_similarities


def without_similarities(name: str) -> Check:
    """The row of a similarity property for a loss without ``from_similarities``."""
    return not_applicable(name, "every tau", "computes from (z1, z2) in forward, not from_similarities: MoCo, "
                                             "NNCLR and SiMo cannot use it")


def shuffled(sims: PairSimilarities, seed: int = 0) -> PairSimilarities:
    """``sims`` (compact) with each row's negatives in another order (one random permutation a row)."""
    g = torch.Generator().manual_seed(seed)
    order = torch.rand(sims.neg.shape, generator=g).argsort(dim=1).to(sims.neg.device)  # (A, K)
    return PairSimilarities(pos=sims.pos, neg=sims.neg.gather(1, order), pos_batch=sims.pos_batch)


Presentation = Callable[[PairSimilarities], PairSimilarities]


def _embedding_grads(loss: ContrastiveLoss, z1: Tensor, z2: Tensor,
                     present: list[tuple[str, Presentation]]) -> list[tuple[str, Tensor, Tensor]]:
    """For each way of presenting the similarities, the loss and its gradient with respect to (z1, z2)."""
    results = []
    for label, transform in present:
        a, b = z1.clone().requires_grad_(True), z2.clone().requires_grad_(True)
        sims = transform(two_view_similarities(a, b))
        out = loss.from_similarities(sims)
        torch.autograd.backward(out.loss)
        results.append((label, out.loss.detach(), torch.cat([grad_of(a), grad_of(b)])))
    return results


def check_layout(make: LossFactory, tau: float) -> Check:
    """At ``tau``, on spread and nearly saturated float64 embeddings: SimCLR's masked matrix, ``compact()`` and
    compact with shuffled rows give one loss and one gradient with respect to the embeddings."""
    setting = f"masked = compact = shuffled, tau={tau:g}"
    loss = make(tau, False)
    present: list[tuple[str, Presentation]] = [
        ("masked", lambda s: s), ("compact", lambda s: s.compact()), ("shuffled", lambda s: shuffled(s.compact()))]
    errors, differs = [], []
    for kind in GRADIENT_KINDS:
        (_, value, grad), *others = _embedding_grads(loss, *unit_batch(kind), present)
        for label, other_value, other_grad in others:
            error = worst([relative(other_value, value, TOL_EXACT), relative(other_grad, grad, TOL_EXACT)])
            errors.append(error)
            if not error <= TOL_EXACT:
                differs.append(f"{label} ({kind})")
    return measured("layout", setting, worst(errors), TOL_EXACT,
                    f"{', '.join(differs)} differ from the masked matrix: the loss reads a column that is not a "
                    "negative (neg_exclude), counts the negatives from the matrix's width (use sims.num_negatives) "
                    "or depends on their order")


def _loss_on(loss: ContrastiveLoss, pos: Tensor, neg: Tensor, pos_batch: Tensor,
             exclude: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """The loss of similarity leaves (detached copies of ``pos`` and ``neg``) and its gradients with respect to both."""
    p, m = pos.detach().clone().requires_grad_(True), neg.detach().clone().requires_grad_(True)
    out = loss.from_similarities(PairSimilarities(pos=p, neg=m, pos_batch=pos_batch, neg_exclude=exclude))
    torch.autograd.backward(out.loss)
    return out.loss.detach(), grad_of(p), grad_of(m)


def check_excluded_inert(make: LossFactory, tau: float) -> Check:
    """At ``tau``, SimCLR's matrix with its excluded columns (each anchor's own and its positive's) set to −1, to
    1 and to random values: the same loss and gradients, and no gradient reaching an excluded column."""
    loss = make(tau, False)
    with torch.no_grad():
        sims = two_view_similarities(*unit_batch("random"))
    assert sims.neg_exclude is not None
    exclude = sims.neg_exclude
    value, g_pos, g_neg = _loss_on(loss, sims.pos, sims.neg, sims.pos_batch, exclude)
    kept = torch.ones_like(sims.neg, dtype=torch.bool).scatter_(1, exclude, False)  # (A, M) the negatives
    errors = [float(g_neg[~kept].abs().max()) / (float(g_neg[kept].abs().max()) + TOL_EXACT)]  # gradient into them
    rand = torch.rand(exclude.shape, generator=torch.Generator().manual_seed(3), dtype=sims.neg.dtype) * 2 - 1
    for values in (torch.full_like(rand, -1.0), torch.ones_like(rand), rand):
        other, o_pos, o_neg = _loss_on(loss, sims.pos, sims.neg.scatter(1, exclude, values), sims.pos_batch, exclude)
        errors += [relative(other, value, TOL_EXACT), relative(o_pos, g_pos, TOL_EXACT),
                   relative(o_neg[kept], g_neg[kept], TOL_EXACT)]
    return measured("excluded", f"other values in neg_exclude, tau={tau:g}", worst(errors), TOL_EXACT,
                    "the loss reads the columns neg_exclude lists (each anchor's own and its positive's): "
                    "use sims.negative_logsumexp / negative_mean / compact()")


class _Projector(nn.Module):
    """A linear model returning (features, projections), as the frameworks' models do."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(D, D)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        z = self.layer(x)
        return z, z


class _Recording(ContrastiveLoss):
    """Hands the framework's similarities to ``loss`` and keeps them."""

    def __init__(self, loss: ContrastiveLoss) -> None:
        super().__init__(loss.temperature, False)
        self.inner = loss
        self.seen: PairSimilarities | None = None

    def from_similarities(self, sims: PairSimilarities) -> LossOutput:
        self.seen = sims
        return self.inner.from_similarities(sims)


FRAMEWORK_SHAPES: dict[str, Callable[[nn.Module, ContrastiveLoss], Framework]] = {  # name -> around a model, a loss
    "moco": lambda model, loss: MoCo(model, loss, dim=D, queue_size=3 * N + 5),  # A = 2N anchors, K = 29
    "nnclr": lambda model, loss: NNCLR(model, loss, dim=D, queue_size=2 * N),  # K = N − 1
    "simo": lambda model, loss: SiMo(model, loss, num_negatives=N // 2,
                                     generator=torch.Generator().manual_seed(5)),  # K = N/2 of N − 1, sampled
}


def _widened(pos: Tensor, neg: Tensor, extra: int = 3, seed: int = 11) -> tuple[Tensor, Tensor]:
    """``neg`` (A, K) inside an (A, K + extra) matrix, ``extra`` excluded columns per row at random places holding
    random values: (the wider matrix, its ``neg_exclude``)."""
    a, k = neg.shape
    g = torch.Generator().manual_seed(seed)
    exclude = torch.rand(a, k + extra, generator=g).argsort(dim=1)[:, :extra].sort(dim=1).values  # (A, extra)
    kept = torch.ones(a, k + extra, dtype=torch.bool).scatter_(1, exclude, False)
    wide = (torch.rand(a, k + extra, generator=g, dtype=neg.dtype) * 2 - 1).masked_scatter(kept, neg.detach())
    return wide, exclude


def check_framework(make: LossFactory, framework: str, tau: float = 0.2) -> Check:
    """The loss on the similarities ``framework`` forms (its own forward on a small model): finite, and the same
    in a wider matrix whose extra columns are excluded."""
    loss = make(tau, False)
    torch.manual_seed(0)  # the model, the queues and NNCLR's support set
    recording = _Recording(loss)
    fw: Framework = FRAMEWORK_SHAPES[framework](_Projector(), recording)
    x1, x2 = batch("random")
    out = fw(x1, x2)
    out.loss.backward()
    sims = recording.seen
    assert sims is not None
    setting = f"{framework}: A={sims.neg.shape[0]}, K={sims.num_negatives}, tau={tau:g}"
    grads = [p.grad for p in fw.parameters() if p.grad is not None]
    if not (torch.isfinite(out.loss) and all(torch.isfinite(g).all() for g in grads)):
        return Check("frameworks", setting, False, detail="loss or gradient not finite")
    value, g_pos, g_neg = _loss_on(loss, sims.pos, sims.neg, sims.pos_batch, None)
    wide, exclude = _widened(sims.pos, sims.neg)
    kept = torch.ones_like(wide, dtype=torch.bool).scatter_(1, exclude, False)
    other, o_pos, o_neg = _loss_on(loss, sims.pos, wide, sims.pos_batch, exclude)
    error = worst([relative(other, value, TOL_EXACT), relative(o_pos, g_pos, TOL_EXACT),
                   relative(o_neg[kept].view_as(g_neg), g_neg, TOL_EXACT)])
    return measured("frameworks", setting, error, TOL_EXACT,
                    "the same negatives with excluded columns beside them give another loss or gradient")


def framework_names() -> tuple[str, ...]:
    """The frameworks whose shapes the check tries."""
    return tuple(FRAMEWORK_SHAPES)

