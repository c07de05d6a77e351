"""Losses vs lightly: our InfoNCE / DCL / DCLW against lightly's NTXentLoss / DCLLoss / DCLWLoss.

Each row times one forward + backward of ``loss(z1, z2)`` on random projections ``z1, z2`` of shape (N, 128)
(N = 128, 512, 2048; ``--quick``: 128 and 512), same temperature (0.1) and, for DCLW, the same σ = 0.5. The two
sides are interleaved (A B A B …) and each side's median is kept.

Reading a row: ``ours`` and ``baseline`` are milliseconds per forward + backward; ``ratio`` = ours / lightly
time, so below 1 means ours is faster. Goal: ratio ≤ 1.0 at every size. Ours also returns its diagnostics (q_B,
similarity statistics) computed from the same logits; lightly returns only the loss. The note says whether both
sides computed the same loss value (a check that the comparison is like for like).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch

from benchmarks.common import Row, bench_extra, interleaved

SECTION = "losses"
DIM = 128
TEMPERATURE = 0.1
SIGMA = 0.5
MIN_SAMPLE_S = 0.01  # small sizes repeat the call inside one timed sample so that a sample lasts about this long


def _pairs() -> list[tuple[str, Callable[[], torch.nn.Module], Callable[[], torch.nn.Module]]]:
    """(name, ours factory, lightly factory) for the three losses."""
    lightly_loss = bench_extra("lightly.loss", "losses", "lightly>=1.5.21,<2")
    from dcl_core.losses import DCLLoss, DCLWLoss, InfoNCELoss

    return [
        ("InfoNCE vs lightly NTXentLoss", lambda: InfoNCELoss(TEMPERATURE),
         lambda: lightly_loss.NTXentLoss(temperature=TEMPERATURE)),
        ("DCL vs lightly DCLLoss", lambda: DCLLoss(TEMPERATURE), lambda: lightly_loss.DCLLoss(temperature=TEMPERATURE)),
        ("DCLW vs lightly DCLWLoss", lambda: DCLWLoss(TEMPERATURE, sigma=SIGMA),
         lambda: lightly_loss.DCLWLoss(temperature=TEMPERATURE, sigma=SIGMA)),
    ]


def _step(loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], z1: torch.Tensor, z2: torch.Tensor,
          inner: int) -> Callable[[], None]:
    """``inner`` forward + backward passes of ``loss_fn(z1, z2)`` (a scalar tensor)."""

    def run() -> None:
        for _ in range(inner):
            z1.grad = z2.grad = None
            loss_fn(z1, z2).backward()

    return run


def _compare(name: str, ours: torch.nn.Module, theirs: torch.nn.Module, n: int, reps: int) -> Row:
    gen = torch.Generator().manual_seed(n)
    z1 = torch.randn(n, DIM, generator=gen).requires_grad_()
    z2 = torch.randn(n, DIM, generator=gen).requires_grad_()

    def ours_loss(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return ours(a, b).loss

    with torch.no_grad():
        ours_value, their_value = float(ours_loss(z1, z2)), float(theirs(z1, z2))
    # Time one pass to choose how many passes make one sample (tiny N is otherwise timer noise).
    probe_a, probe_b = interleaved(_step(ours_loss, z1, z2, 1), _step(theirs, z1, z2, 1), reps=1, warmup=1)
    inner = max(1, round(MIN_SAMPLE_S / max(min(probe_a, probe_b), 1e-6)))
    t_ours, t_theirs = interleaved(_step(ours_loss, z1, z2, inner), _step(theirs, z1, z2, inner), reps=reps)
    t_ours, t_theirs = t_ours / inner, t_theirs / inner
    ratio = t_ours / t_theirs
    same = abs(ours_value - their_value) <= 1e-4 * max(1.0, abs(their_value))
    value_note = "same loss value" if same else f"loss values differ: ours {ours_value:.6g}, lightly {their_value:.6g}"
    return Row(
        section=SECTION,
        name=f"{name}, fwd+bwd, N={n}, D={DIM}",
        ours=t_ours * 1e3,
        baseline=t_theirs * 1e3,
        ratio=ratio,
        goal="<= 1.0x lightly (ours/lightly time)",
        met=ratio <= 1.0,
        unit="ms",
        note=f"tau={TEMPERATURE}, {torch.get_num_threads()} threads, {value_note}",
    )


def run(quick: bool) -> list[Row]:
    """One row per (loss, N): ours vs lightly forward + backward time."""
    sizes = (128, 512) if quick else (128, 512, 2048)
    pairs = _pairs()
    rows = []
    warnings.filterwarnings("ignore", message="To copy construct from a tensor", module="lightly")  # its DCLW
    for n in sizes:
        reps = (5 if n >= 2048 else 9) if not quick else 5
        for name, make_ours, make_theirs in pairs:
            rows.append(_compare(name, make_ours(), make_theirs(), n, reps))
    return rows
