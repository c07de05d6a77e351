"""The ``reference`` property: the loss's value and gradient against the user's plain-loop transcription of its
equation (``--reference module:function``), at every τ of the check and on spread, nearly saturated, aligned,
collapsed and antipodal float64 embeddings, so that a clamp or a max branch is checked for its value too."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dcl_core.losscheck.core import LossFactory, grad_of, relative, unit_batch
from dcl_core.losscheck.rows import REFERENCE_KINDS, Check, measured, worst

# float64 against float64, relative to the largest value compared plus REFERENCE_FLOOR/τ (logits and gradients of
# unit embeddings are O(1/τ), and so is their rounding): the sound losses of the tests meet it by ~1e-10, and a
# floor K·e^{−1/τ} written as e^{−1/τ} misses it by ~1e-6 (tests/losses/test_check.py)
TOL_REFERENCE = 1e-8
REFERENCE_FLOOR = 1e-6
Reference = Callable[..., Tensor]  # function(z1, z2, temperature, **params) -> 0-d tensor


def check_reference(make: LossFactory, reference: Reference, params: dict[str, Any], tau: float) -> Check:
    """At ``tau``, on each of :data:`REFERENCE_KINDS`: the loss's value and autograd gradient against
    ``reference``'s, both on float64 inputs."""
    loss = make(tau, False)
    errors, differs = [], []
    for kind in REFERENCE_KINDS:
        z1, z2 = unit_batch(kind)
        a, b = z1.clone().requires_grad_(True), z2.clone().requires_grad_(True)
        out = loss(a, b)
        if out.loss.dtype != torch.float64:
            return Check("reference", f"tau={tau:g}", False,
                         detail=f"on float64 embeddings the loss is {out.loss.dtype}: compute in the input's "
                                "precision (no .float())")
        out.loss.backward()
        ra, rb = z1.clone().requires_grad_(True), z2.clone().requires_grad_(True)
        value = reference(ra, rb, tau, **params)
        if not (isinstance(value, Tensor) and value.dim() == 0 and value.requires_grad):
            return Check("reference", f"tau={tau:g}", False,
                         detail="the reference must return a 0-d tensor with a gradient (computed from z1, z2)")
        torch.autograd.backward(value)
        floor = REFERENCE_FLOOR / tau
        error = worst([relative(out.loss, value, floor),
                       relative(torch.cat([grad_of(a), grad_of(b)]), torch.cat([grad_of(ra), grad_of(rb)]), floor)])
        errors.append(error)
        if not error <= TOL_REFERENCE:
            differs.append(kind)
    return measured("reference", f"value and gradient, tau={tau:g}", worst(errors), TOL_REFERENCE,
                    f"differs from the reference on {', '.join(differs)} embeddings")
