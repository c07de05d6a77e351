"""What every property of the loss check shares: the loss it builds (:func:`loss_factory`), the batches it feeds
and how it measures a difference (NaN and ∞ never pass: :func:`relative`)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from dcl_core.config import Config, apply_overrides
from dcl_core.losses import LOSSES
from dcl_core.losses.base import ContrastiveLoss, LossOutput
from dcl_core.losses.user import build_user_loss

N, D = 8, 16  # the batch every property uses; the DDP check splits it over 2 ranks

LossFactory = Callable[[float, bool], ContrastiveLoss]  # (temperature, gather_distributed) -> a loss


def loss_factory(name: str, params: str = "{}") -> LossFactory:
    """A function building loss ``name`` (built-in, or the user's with its ``params`` JSON) at τ, gathering.

    Raises:
        InputError: the name or params as a config refuses them, or a user loss that cannot be loaded or built
            (one line, before any property runs).
    """
    apply_overrides(Config(), {"loss.name": name, "loss.params": params})  # the config's own checks and messages
    if name in LOSSES:
        cls = LOSSES[name]
        return lambda tau, gather: cls(temperature=tau, gather_distributed=gather)
    build_user_loss(name, params, 0.1, False)
    return lambda tau, gather: build_user_loss(name, params, tau, gather)


def batch(kind: str = "random", seed: int = 123, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """Two views (N, D) of one of :data:`INPUT_KINDS` or ``saturated`` (unit rows, the positive 0.02 away)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(N, D, generator=g, dtype=torch.float64)
    other = torch.randn(N, D, generator=g, dtype=torch.float64)
    if kind == "identical":
        v = base[:1]
        z1, z2 = v.repeat(N, 1), v.repeat(N, 1)
    elif kind == "antipodal":
        z1, z2 = base, -base
    elif kind == "aligned":
        z1, z2 = base, base.clone()
    elif kind == "collapsed":
        z = base[torch.arange(N) % 2]
        z1, z2 = z, z.clone()
    elif kind == "saturated":
        z1 = F.normalize(base, dim=1)
        z2 = F.normalize(z1 + 0.02 * F.normalize(other, dim=1), dim=1)
    elif kind == "huge":
        z1, z2 = 1e15 * base, 1e15 * other
    elif kind == "tiny":
        z1, z2 = 1e-15 * base, 1e-15 * other
    else:
        z1, z2 = base, other
    return z1.to(dtype), z2.to(dtype)


def unit_batch(kind: str, dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor]:
    """:func:`batch` with unit rows: the scale finite differences and layouts are measured at."""
    z1, z2 = batch(kind, dtype=torch.float64)
    return F.normalize(z1, dim=1).to(dtype), F.normalize(z2, dim=1).to(dtype)


def value_and_grads(loss: ContrastiveLoss, z1: Tensor, z2: Tensor) -> tuple[LossOutput, Tensor, Tensor]:
    """The loss of ``(z1, z2)`` and its gradients with respect to both (fresh leaves)."""
    a, b = z1.detach().clone().requires_grad_(True), z2.detach().clone().requires_grad_(True)
    out = loss(a, b)
    out.loss.backward()
    return out, grad_of(a), grad_of(b)


def grad_of(leaf: Tensor) -> Tensor:
    """A leaf's gradient after ``backward``, zeros where the loss does not depend on it."""
    return leaf.grad if leaf.grad is not None else torch.zeros_like(leaf)


def relative(x: Tensor, y: Tensor, floor: float) -> float:
    """The largest |x − y| over (the largest |y| + floor): one number for a whole tensor (0 when they are equal);
    NaN when either holds a NaN, ∞ when either holds an ∞ where the other does not."""
    x, y = x.detach().double(), y.detach().double()
    if torch.isnan(x).any() or torch.isnan(y).any():
        return math.nan
    if not (torch.isfinite(x).all() and torch.isfinite(y).all()):
        return 0.0 if torch.equal(x, y) else math.inf
    return float((x - y).abs().max() / (y.abs().max() + floor))
