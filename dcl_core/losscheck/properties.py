"""The properties of a loss as ``loss(z1, z2)`` sees SimCLR's two views: what the trainer reads (the contract),
finiteness in fp32 and under bf16 autocast, invariance to the batch's order, and the gradient its value implies
(central differences on float64 inputs)."""

from __future__ import annotations

import torch
from torch import Tensor

from dcl_core.config import InputError
from dcl_core.losscheck.core import D, LossFactory, N, batch, relative, unit_batch, value_and_grads
from dcl_core.losscheck.rows import GRADIENT_KINDS, INPUT_KINDS, Check, first_line, measured, worst
from dcl_core.losses.base import ContrastiveLoss, LossOutput
from dcl_core.losses.user import build_user_loss

# Tolerances (relative, with an absolute floor of the same size): the built-in losses meet each by far
TOL_EXACT = 1e-5  # the same arithmetic in another order (permutation, layouts, DDP's split)
TOL_BF16 = 1e-3  # fp32 vs bf16 autocast on the same rounded embeddings (the built-ins: 0, similarities in fp32)
# float64 central differences (Richardson-extrapolated, step FD_STEP·τ) along random directions against autograd,
# relative to the gradient's norm + GRADIENT_FLOOR/τ (gradients of unit embeddings are O(1/τ), and so is the
# rounding of a loss's value, which a nearly saturated loss cancels to ~0): the built-in losses measure at most
# ~1e-10, a gradient off by a factor of 1.1 on one of its terms ~1e-3 (docs/own-loss.md#what-a-pass-means).
TOL_GRADIENT = 1e-6
GRADIENT_FLOOR = 1e-2
FD_STEP = 1e-3
FD_DIRECTIONS = 16


def check_contract(make: LossFactory) -> Check:
    """What the trainer reads: a LossOutput, a finite 0-d loss with a gradient, detached finite diagnostics."""
    z1, z2 = batch()
    a, b = z1.clone().requires_grad_(True), z2.clone().requires_grad_(True)
    out = make(0.2, False)(a, b)
    problems = []
    if not isinstance(out, LossOutput):
        return Check("contract", "LossOutput", False, detail=f"returned {type(out).__name__}, not LossOutput")
    if not (isinstance(out.loss, Tensor) and out.loss.dim() == 0 and out.loss.is_floating_point()):
        problems.append("loss is not a 0-d float tensor")
    elif not out.loss.requires_grad:
        problems.append("loss has no gradient")
    elif not torch.isfinite(out.loss):
        problems.append(f"loss is {out.loss.item()}")
    for key, value in out.diagnostics.items():
        if not (isinstance(value, Tensor) and value.dim() == 0) or value.requires_grad:
            problems.append(f"diagnostic {key!r} is not a detached 0-d tensor")
        elif not torch.isfinite(value):
            problems.append(f"diagnostic {key!r} is {value.item()}")
    if out.npc is not None and (not isinstance(out.npc, Tensor) or out.npc.dim() != 1 or out.npc.requires_grad):
        problems.append("npc is not a detached vector")
    return Check("contract", "LossOutput", not problems, detail="; ".join(problems))


def check_user_contract(name: str, params: str) -> None:
    """A study's pre-flight of the user's loss ``name`` (with its ``params`` JSON): InputError (one line) unless it
    imports, takes its arguments and meets the contract (:func:`check_contract`) on a batch of 8 pairs.
    :func:`dcl_core.losscheck.isolation.preflight_isolated` runs it in a process of its own."""
    def make(tau: float, gather: bool) -> ContrastiveLoss:
        return build_user_loss(name, params, tau, gather)

    try:
        contract = check_contract(make)
    except InputError:
        raise
    except (Exception, SystemExit) as err:  # the user's loss raising (or calling sys.exit) on a small batch
        raise InputError(f"loss.name={name}: on a batch of {N} pairs it raised {type(err).__name__}: "
                         f"{str(err).splitlines()[0] if str(err) else ''}"[:400]) from None
    if not contract.ok:
        raise InputError(f"loss.name={name}: {contract.detail} (python -m dcl_core.losses check {name} runs "
                         "every check)")


def check_finite_fp32(make: LossFactory, tau: float) -> Check:
    """Loss, gradients and diagnostics finite at ``tau`` on each of :data:`INPUT_KINDS`, and the value under
    ``torch.no_grad()`` (as an evaluation computes it) finite too."""
    failed = []
    for kind in INPUT_KINDS:
        try:
            out, g1, g2 = value_and_grads(make(tau, False), *batch(kind))
            with torch.no_grad():
                plain = make(tau, False)(*batch(kind)).loss
        except Exception as err:  # the loss raising on a legitimate batch is a failure of this property
            failed.append(f"{kind}: {first_line(err)}"[:120])
            continue
        bad = [what for what, t in (("loss", out.loss), ("grad", torch.cat([g1, g2])), ("loss under no_grad", plain))
               if not torch.isfinite(t).all()]
        bad += [key for key, v in out.diagnostics.items() if not torch.isfinite(v)]
        if bad:
            failed.append(f"{kind}: {', '.join(bad)}")
    return Check("finite fp32", f"tau={tau:g}", not failed, detail=("not finite: " + "; ".join(failed))[:300]
                 if failed else "")


def check_finite_bf16(make: LossFactory, tau: float) -> Check:
    """Finite under CPU bf16 autocast at ``tau``, and within :data:`TOL_BF16` of fp32 on the same embeddings."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(D, 32)
    x1, x2 = batch()
    loss = make(tau, False)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z1, z2 = layer(x1), layer(x2)
        out = loss(z1, z2)
    out.loss.backward()
    assert layer.weight.grad is not None
    if not (torch.isfinite(out.loss) and torch.isfinite(layer.weight.grad).all()):
        return Check("finite bf16", f"tau={tau:g}", False, detail="loss or gradient not finite under autocast")
    ref = loss(z1.detach().float(), z2.detach().float()).loss.detach()
    error = relative(out.loss, ref, TOL_BF16)
    return measured("finite bf16", f"tau={tau:g}", error, TOL_BF16,
                    "the loss under autocast differs from fp32 on the same embeddings")


def check_permutation(make: LossFactory) -> Check:
    """The batch permuted alike in both views: the same loss, the permuted gradients."""
    z1, z2 = batch()
    perm = torch.randperm(N, generator=torch.Generator().manual_seed(0))
    out, g1, g2 = value_and_grads(make(0.2, False), z1, z2)
    out_p, p1, p2 = value_and_grads(make(0.2, False), z1[perm], z2[perm])
    error = worst([relative(out_p.loss, out.loss, TOL_EXACT),
                   relative(torch.cat([p1, p2]), torch.cat([g1[perm], g2[perm]]), TOL_EXACT)])
    return measured("permutation", "both views alike", error, TOL_EXACT)


def directional_errors(loss: ContrastiveLoss, z1: Tensor, z2: Tensor, gradient: Tensor, tau: float,
                       directions: int = FD_DIRECTIONS) -> list[float]:
    """|∂loss/∂v by central differences − <gradient, v>| along random unit directions v of (z1, z2), over the
    gradient's norm + :data:`GRADIENT_FLOOR`/τ, at step h = :data:`FD_STEP`·τ. The differences at h and h/2 are
    combined (Richardson: (4·D(h/2) − D(h))/3), which cancels their h² error, so a step large enough to keep
    rounding small stays exact.
    """
    z = torch.cat([z1, z2]).detach()  # (2N, D)
    n = z1.shape[0]
    g = torch.Generator().manual_seed(7)
    scale = float(gradient.norm()) + GRADIENT_FLOOR / tau
    step = FD_STEP * tau
    errors = []
    with torch.no_grad():
        def slope(v: Tensor, h: float) -> float:
            up, down = z + h * v, z - h * v
            return float(loss(up[:n], up[n:]).loss - loss(down[:n], down[n:]).loss) / (2 * h)

        for _ in range(directions):
            v = torch.randn(z.shape, generator=g, dtype=z.dtype)
            v = v / v.norm()
            numeric = (4 * slope(v, step / 2) - slope(v, step)) / 3
            errors.append(abs(numeric - float((gradient * v).sum())) / scale)
    return errors


def check_gradient(make: LossFactory, tau: float) -> Check:
    """At ``tau``, on spread and nearly saturated float64 embeddings (:data:`GRADIENT_KINDS`): autograd's gradient
    against central differences along random directions (for a loss without a stop-gradient: see ``detached``)."""
    setting = f"float64 central differences, tau={tau:g}"
    loss = make(tau, False)
    errors = []
    for kind in GRADIENT_KINDS:
        z1, z2 = unit_batch(kind)
        out, g1, g2 = value_and_grads(loss, z1, z2)
        if out.loss.dtype != torch.float64:
            return Check("gradient", setting, False,
                         detail=f"on float64 embeddings the loss is {out.loss.dtype}: compute in the input's "
                                "precision (no .float()) so that its gradient can be checked")
        errors += directional_errors(loss, z1, z2, torch.cat([g1, g2]), tau)
    return measured("gradient", setting, worst(errors), TOL_GRADIENT,
                    "autograd's gradient is not the one the loss's value implies")
