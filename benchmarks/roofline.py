"""Roofline: how much of this machine's matrix-multiply rate a training step achieves.

The FLOPs of one training step (forward + backward of ``SSLModel`` on both views, plus the DCL loss) are counted
with ``torch.utils.flop_counter.FlopCounterMode`` (matmuls and convolutions, 2 FLOPs per multiply-add; batch
norm, activations and the optimizer are not counted) and divided by the measured step time (fp32, channels_last,
SGD step included, as the trainer runs it; see ``benchmarks/levers.py``). The machine's reference rate for a
dtype is the faster of a 2048×2048 matmul (512×512 under ``--quick``) and a large 3×3 convolution (batch 32,
128 → 128 channels, 32×32, channels_last) in that dtype, measured in the same run with the same thread count:
on some CPUs torch's convolution kernels outrun its matmul (an AMD EPYC ran the fp32 step at 1.18× its fp32
matmul rate), and a reference below the step's own rate is no roofline.

Presets: ResNet-18 ×0.125 batch 32 (CPU study) and ×0.25 batch 128 (single CPU run), CIFAR stem, 32×32.

Reading a row: ``ours`` is the step's achieved GFLOP/s, ``baseline`` the machine's best measured rate (fp32 or
bf16, whichever ran faster: a machine without native bf16 runs it far below fp32, and a roofline below the step's
own rate is no roofline), ``ratio`` the fraction of it (0.5 = 50%). Goal: ≥ 50% of that rate. A ratio above 1
is a measurement error (the reference ran slow, e.g. under load, or the step's FLOPs are over-counted): the row
says so and does not count as met (:func:`judge`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from benchmarks.common import Row, median_time
from benchmarks.levers import PRESETS, TrainStep, preset_name

SECTION = "roofline"
GEMM = 2048
# --quick (CI: checks that every row is measured) multiplies 512x512: a CPU without native bf16 runs the 2048x2048
# bf16 product at ~0.3 GFLOP/s, about a minute a repetition.
GEMM_QUICK = 512


def gemm_rate(dtype: torch.dtype, reps: int, size: int = GEMM) -> float:
    """FLOP/s of a ``size``×``size`` matmul in ``dtype`` at the current thread count."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(dtype)
    b = torch.randn(size, size, generator=gen).to(dtype)
    out = torch.empty(size, size, dtype=dtype)
    seconds = median_time(lambda: torch.mm(a, b, out=out), reps=reps, warmup=2)
    return 2 * size**3 / seconds


CONV = (32, 128, 32)  # batch, channels in = out, side: a 3x3 convolution as large as the CPU presets' largest


def conv_rate(dtype: torch.dtype, reps: int) -> float:
    """FLOP/s of a 3×3 same-padding convolution of :data:`CONV`'s size in ``dtype`` (channels_last, as the trainer
    runs), at the current thread count."""
    batch, channels, side = CONV
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, channels, side, side, generator=gen).to(dtype=dtype, memory_format=torch.channels_last)
    w = torch.randn(channels, channels, 3, 3, generator=gen).to(dtype=dtype, memory_format=torch.channels_last)
    seconds = median_time(lambda: F.conv2d(x, w, padding=1), reps=reps, warmup=2)
    return 2 * batch * channels * channels * 9 * side * side / seconds


def step_flops(step: TrainStep) -> int:
    """Counted FLOPs of one forward + backward of ``step`` (the optimizer's element-wise update is not counted)."""
    counter = FlopCounterMode(display=False)
    with counter:
        out = step.framework(step.view1, step.view2)
        out.loss.backward()
    step.optimizer.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def judge(ratio: float) -> tuple[bool, str]:
    """Whether a step's fraction of the best measured rate meets the goal, and a note: above 1 it cannot be true."""
    if ratio > 1:
        return False, f"; ratio {ratio:.2f} > 1 is a measurement error, not a result: rerun on an idle machine"
    return ratio >= 0.5, ""


def run(quick: bool) -> list[Row]:
    """Per preset: achieved GFLOP/s vs the best rate measured (goal ≥ 50%, never above 100%) and vs the
    other one (informs)."""
    threads = torch.get_num_threads()
    gemm_reps = 3 if quick else 7
    size = GEMM_QUICK if quick else GEMM
    rows: list[Row] = []
    rates: dict[str, float] = {}
    for label, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        gemm, conv = gemm_rate(dtype, gemm_reps, size), conv_rate(dtype, gemm_reps)
        rates[label] = max(gemm, conv)
        rows.append(Row(SECTION, f"{label} GEMM {size}x{size} rate", gemm / 1e9, unit="GFLOP/s",
                        note=f"{threads} threads, torch.mm"))
        rows.append(Row(SECTION, f"{label} conv 3x3 {CONV[1]}ch {CONV[2]}px b{CONV[0]} rate", conv / 1e9,
                        unit="GFLOP/s", note=f"{threads} threads, F.conv2d, channels_last; the {label} reference is "
                                              f"the faster of the two ({'conv' if conv > gemm else 'GEMM'})"))
    for width, batch in PRESETS:
        step = TrainStep(width, batch)
        flops = step_flops(step)
        reps = (3 if quick else 9) if width < 0.2 else (2 if quick else 5)
        seconds = median_time(step, reps=reps)
        achieved = flops / seconds
        where = f"{flops / 1e9:.3g} GFLOP/step, {seconds * 1e3:.3g} ms/step, fp32 channels_last, {threads} threads"
        best = max(rates, key=rates.__getitem__)
        ratio = achieved / rates[best]
        met, note = judge(ratio)
        rows.append(Row(SECTION, f"{preset_name(width, batch)} step vs best rate ({best})", achieved / 1e9,
                        rates[best] / 1e9, ratio, ">= 50% of the best measured rate (0.5 <= ratio <= 1)", met,
                        "GFLOP/s", where + note))
        other = "bf16" if best == "fp32" else "fp32"
        rows.append(Row(SECTION, f"{preset_name(width, batch)} step vs {other} rate", achieved / 1e9,
                        rates[other] / 1e9, achieved / rates[other], "", None, "GFLOP/s",
                        where + judge(achieved / rates[other])[1]))
    if rates["bf16"] < rates["fp32"]:
        rows[2].note += "; bf16 slower than fp32 on this machine"
    return rows
