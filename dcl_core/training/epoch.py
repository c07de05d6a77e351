"""What one epoch of training accumulates and reports: :class:`EpochStats` (running sums of the loss, its
diagnostics, the probe's gradient norms and the q_B histogram, turned into the epoch's ``train/*`` metrics), the
gradient-norm probe, and the within-epoch progress bar."""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from dcl_core import metric_names as M
from dcl_core.training.runtime import Runtime, average_over_ranks

log = logging.getLogger(__name__)

Q_HIST_BINS = 40  # bins of the per-epoch NPC multiplier histogram over [0, 1] (DCL Fig. 1)


@dataclass
class EpochStats:
    """This rank's running sums over one epoch's steps, and the epoch's metrics from them."""

    device: torch.device
    steps: int = 0
    images: int = 0
    lr: float = math.nan  # the learning rate of the last step
    sums: dict[str, torch.Tensor] = field(default_factory=dict)  # loss and diagnostics, float32 ()
    grad_sum: torch.Tensor = field(init=False)  # float64 (): sum of the probe's gradient norms
    grad_sq: torch.Tensor = field(init=False)  # float64 (): sum of their squares
    q_hist: torch.Tensor = field(init=False)  # float64 (Q_HIST_BINS,): anchors per bin of q_B over [0, 1]
    started: float = field(init=False)  # time.perf_counter() when the epoch's steps began
    seconds: float = 0.0  # duration of the epoch's steps

    def __post_init__(self) -> None:
        self.grad_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.grad_sq = torch.zeros((), dtype=torch.float64, device=self.device)
        self.q_hist = torch.zeros(Q_HIST_BINS, dtype=torch.float64, device=self.device)
        self.started = time.perf_counter()

    def add_gradients(self, grad_norm: torch.Tensor, npc: torch.Tensor | None) -> None:
        """The step's probe gradient norm (float64 ()) and NPC multipliers q_B (A,), if the loss has them."""
        self.grad_sum += grad_norm
        self.grad_sq += grad_norm**2
        if npc is not None:
            self.q_hist += torch.histc(npc.float(), bins=Q_HIST_BINS, min=0.0, max=1.0).double()

    def add_losses(self, values: dict[str, torch.Tensor], images: int, lr: float) -> None:
        """The step's loss and diagnostics (detached ()), its batch size and learning rate."""
        for key, value in values.items():
            self.sums[key] = self.sums.get(key, 0.0) + value.float()
        self.steps += 1
        self.images += images
        self.lr = lr

    def metrics(self, runtime: Runtime) -> dict[str, float]:
        """``train/*``: step means and gradient-norm statistics averaged over ranks, images/s over all ranks,
        the q_B histogram over every rank's anchors (fractions; absent without q_B) and the last lr."""
        metrics = {M.train_metric(k): float(v) / self.steps for k, v in self.sums.items()}
        metrics[M.IMAGES_PER_S] = self.images / self.seconds
        grad_mean = float(self.grad_sum) / self.steps
        grad_std = math.sqrt(max(float(self.grad_sq) / self.steps - grad_mean**2, 0.0))
        metrics |= {M.GRAD_NORM_MEAN: grad_mean, M.GRAD_NORM_STD: grad_std,
                    M.GRAD_NORM_CV: grad_std / grad_mean if grad_mean > 0 else math.nan}
        metrics = average_over_ranks(metrics, runtime)
        metrics[M.IMAGES_PER_S] *= runtime.world_size
        if runtime.world_size > 1:
            dist.all_reduce(self.q_hist)  # counts over every rank's anchors
        if self.q_hist.sum() > 0:  # fraction of anchors per bin of q_B over [0, 1]
            metrics[M.Q_HIST] = (self.q_hist / self.q_hist.sum()).tolist()  # type: ignore[assignment]
        metrics[M.LR] = self.lr
        return metrics


class StepProgress:
    """Progress within an epoch: a tqdm bar (steps, images/s, ETA) on a terminal, else a log line at each quarter
    of the epoch; nothing when disabled (Ray trials report per epoch)."""

    def __init__(self, epoch: int, epochs: int, steps: int, enabled: bool) -> None:
        self.epoch, self.epochs, self.steps, self.enabled = epoch, epochs, steps, enabled
        self.bar: Any = None
        self.done = 0
        self.images = 0
        self.started = time.perf_counter()

    def __enter__(self) -> StepProgress:
        if self.enabled and sys.stderr.isatty():
            from tqdm import tqdm  # only on a terminal

            self.bar = tqdm(total=self.steps, desc=f"epoch {self.epoch}/{self.epochs}", unit="step", leave=False,
                            dynamic_ncols=True)
        return self

    def step(self, images: int) -> None:
        """Count one step of ``images`` images; update the bar, or log at each quarter of the epoch."""
        if not self.enabled:
            return
        self.done += 1
        self.images += images
        rate = self.images / max(time.perf_counter() - self.started, 1e-9)
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"{rate:.0f} img/s", refresh=False)
        elif self.done in {math.ceil(self.steps * q / 4) for q in (1, 2, 3)}:
            eta = (self.steps - self.done) * (time.perf_counter() - self.started) / self.done
            log.info("epoch %d/%d: step %d/%d, %.0f img/s, %.0f s left in the epoch", self.epoch, self.epochs,
                     self.done, self.steps, rate, eta)

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.close()


def grad_norm(params: Sequence[torch.Tensor]) -> torch.Tensor:
    """L2 norm of the gradients of ``params`` taken together, float64 ()."""
    norms = []
    for p in params:
        if p.grad is None:
            raise ValueError("grad_norm: a parameter has no gradient (called before backward?)")
        norms.append(p.grad.norm())
    return torch.linalg.vector_norm(torch.stack(norms)).double()
