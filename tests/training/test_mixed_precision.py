"""Mixed precision on the GPU, checked on the CPU: why the trainer scales the loss under fp16 autocast and not
under bf16 (:func:`dcl_core.training.run_setup.grad_scaler`).

The losses compute in fp32 whatever the autocast (``tests/losses/test_base.py``), so what low precision changes is
the gradient handed back to the fp16 or bf16 embeddings a projection head gives under autocast: it is rounded to
that dtype. An H100 showed fp16 gradients 9.5% (InfoNCE) and 38% (EqCo) from fp32 at τ 0.07 on nearly saturated
embeddings. That is underflow, reproduced here with CPU fp16 arithmetic (IEEE, as on the GPU): every entry lies
below fp16's smallest normal (6.1e-5), some round to zero. GradScaler's loss scale removes it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dcl_core.config import apply_overrides, derive, preset
from dcl_core.training.builders import build_loss
from dcl_core.training.run_setup import grad_scaler

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/: the GPU check measures the same way
from benchmarks.gpu import trainer_gradient

CPU = torch.device("cpu")
FP16_SMALLEST_NORMAL = 2.0**-14  # 6.1e-5
UNIT_ROUNDOFF = {torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def nearly_saturated_pair(n: int = 256, dim: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """Unit embeddings whose positives have cosine ~0.96 and negatives ~0: InfoNCE ~0.002 at τ 0.07."""
    gen = torch.Generator().manual_seed(0)
    z1 = F.normalize(torch.randn(n, dim, generator=gen), dim=1)
    z2 = F.normalize(z1 + 0.025 * torch.randn(n, dim, generator=gen), dim=1)
    return z1, z2


def gradient(loss_fn: torch.nn.Module, z1: torch.Tensor, z2: torch.Tensor, dtype: torch.dtype | None,
             scaler: torch.amp.GradScaler | None = None) -> tuple[float, torch.Tensor]:
    """The loss and the gradient in ``z1`` the trainer's step hands its optimizer (``benchmarks/gpu.py``'s
    measurement): ``z1`` a head's output in its dtype, the backward through ``scaler``'s scaled loss (None: none)."""
    loss, grad, skipped = trainer_gradient(z1, z2, loss_fn, CPU, dtype, scaler)
    assert skipped == 0  # no overflow at these sizes: the gradient of the first step
    return loss.item(), grad


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


@pytest.mark.parametrize("name", ["infonce", "eqco"])
def test_fp16_gradients_of_a_nearly_saturated_loss_underflow_unless_the_trainer_scales_the_loss(name: str) -> None:
    cfg = apply_overrides(preset("smoke"), {"loss.name": name, "loss.temperature": 0.07})
    loss_fn = build_loss(cfg, derive(cfg, 1))
    z1, z2 = (z.half() for z in nearly_saturated_pair())  # what a head under fp16 autocast hands the loss
    loss, exact = gradient(loss_fn, z1.float(), z2.float(), None)  # fp32 on the same embeddings
    assert loss < 0.01 and exact.abs().max() < FP16_SMALLEST_NORMAL  # saturated: every entry an fp16 subnormal
    _, unscaled = gradient(loss_fn, z1, z2, torch.float16)
    assert relative(unscaled, exact) > 5e-3  # the H100's observation: fp16 underflow, not a defect of the loss
    scaler = grad_scaler(CPU, torch.float16)
    _, scaled = gradient(loss_fn, z1, z2, torch.float16, scaler)
    assert relative(scaled, exact) <= UNIT_ROUNDOFF[torch.float16]  # fp16's own rounding, nothing more
    assert scaler.get_scale() >= 2.0**16


@pytest.mark.parametrize("name", ["infonce", "dcl", "dclw", "eqco"])
def test_bf16_gradients_need_no_loss_scaling(name: str) -> None:
    cfg = apply_overrides(preset("smoke"), {"loss.name": name, "loss.temperature": 0.07})
    loss_fn = build_loss(cfg, derive(cfg, 1))
    z1, z2 = (z.bfloat16() for z in nearly_saturated_pair())
    _, exact = gradient(loss_fn, z1.float(), z2.float(), None)
    scaler = grad_scaler(CPU, torch.bfloat16)
    assert not scaler.is_enabled() and grad_scaler(CPU, None).is_enabled() is False
    _, low = gradient(loss_fn, z1, z2, torch.bfloat16, scaler)
    assert relative(low, exact) <= UNIT_ROUNDOFF[torch.bfloat16]  # fp32's exponent range: only bf16's rounding
