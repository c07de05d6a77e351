"""Alignment + uniformity on the hypersphere (Wang & Isola, 2020): the DCL paper's A.5 comparison."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from dcl_core import metric_names as M
from dcl_core.config.bounds import Range
from dcl_core.config.loss_registry import LossParam, LossSpec
from dcl_core.distributed import distributed_world, gather_with_grad
from dcl_core.losses.base import ContrastiveLoss, LossOutput, at_least_fp32, two_view_similarities


def uniformity(z: Tensor, t: float) -> Tensor:
    r""":math:`\log \frac{1}{N(N-1)} \sum_{i \neq j} e^{-t \lVert z_i - z_j \rVert^2}` for normalized z (N, D)."""
    n = z.shape[0]
    sq_dist = (2.0 - 2.0 * z @ z.T).clamp_min(0.0)  # (N, N), ||zi − zj||² for unit vectors
    off_diag = ~torch.eye(n, dtype=torch.bool, device=z.device)  # (N, N)
    return torch.logsumexp(-t * sq_dist[off_diag], dim=0) - math.log(n * (n - 1))


class AlignUniformLoss(ContrastiveLoss):
    r"""Wang & Isola's loss: alignment of positives plus uniformity of each view's embedding.

    .. math::
        L = \mathbb{E}_i \lVert z_i^{(1)} - z_i^{(2)} \rVert^2
            + \frac{\lambda}{2}\sum_{k=1}^{2} \log \mathbb{E}_{i\neq j} e^{-t\lVert z_i^{(k)} - z_j^{(k)}\rVert^2}

    (alignment exponent 2, t = 2, λ = 1 by default). DCL A.5 contrasts its per-anchor log-sum (no
    negative-negative coupling) with this single log over all pairs. Under DDP the loss is computed over the
    gathered global batch on every rank, so the mean over ranks equals the full-batch loss and gradients match.

    τ is not part of this loss; it is used only for the q_B diagnostic, computed from the same two-view
    logits as for the other losses.

    Args:
        temperature: τ for the q_B diagnostic only.
        uniformity_t: t > 0.
        uniformity_weight: λ >= 0.
        gather_distributed: under DDP, compute over the global batch.

    Examples:
        >>> out = AlignUniformLoss()(torch.randn(8, 16), torch.randn(8, 16))
    """

    spec = LossSpec(
        name="align_uniform",
        colour="#e377c2",  # pink
        params=(
            LossParam("uniformity_t", float, 2.0, "align_uniform: uniformity kernel scale t (Wang & Isola)", paper=2.0,
                      bounds=Range(gt=0, cap=100)),
            LossParam("uniformity_weight", float, 1.0, "align_uniform: weight of the uniformity term", paper=1.0,
                      bounds=Range(ge=0, cap=1e6)),
        ),
        frameworks=("simclr",),
        frameworks_why="it scores whole embeddings, not the anchor/positive/negative similarities the framework builds",
    )

    def __init__(
        self,
        temperature: float = 0.1,
        uniformity_t: float = 2.0,
        uniformity_weight: float = 1.0,
        gather_distributed: bool = False,
    ) -> None:
        super().__init__(temperature, gather_distributed)
        if not uniformity_t > 0:
            raise ValueError(f"uniformity_t must be > 0, got {uniformity_t}")
        if uniformity_weight < 0:
            raise ValueError(f"uniformity_weight must be >= 0, got {uniformity_weight}")
        self.uniformity_t = float(uniformity_t)
        self.uniformity_weight = float(uniformity_weight)

    def forward(self, z1: Tensor, z2: Tensor) -> LossOutput:
        """Alignment plus weighted uniformity of the normalized views; the logits feed the NPC diagnostics only."""
        sims = two_view_similarities(z1, z2, self.gather_distributed)  # validates shapes first
        _, world = distributed_world() if self.gather_distributed else (0, 1)
        with torch.autocast(device_type=z1.device.type, enabled=False):
            a = F.normalize(at_least_fp32(z1), dim=1)
            b = F.normalize(at_least_fp32(z2), dim=1)
            if world > 1:
                a, b = gather_with_grad(a), gather_with_grad(b)  # (N, D) each, global batch
            align = (a - b).pow(2).sum(dim=1).mean()
            uniform = 0.5 * (uniformity(a, self.uniformity_t) + uniformity(b, self.uniformity_t))
            loss = align + self.uniformity_weight * uniform
        with torch.no_grad():  # the logits serve the diagnostics only
            pos = sims.pos / self.temperature  # (A,)
            log_u = sims.negative_logsumexp(self.temperature)  # (A,)
        extra = {M.Diagnostic.ALIGN: align.detach(), M.Diagnostic.UNIFORM: uniform.detach()}
        return LossOutput.with_npc(loss, sims, pos, log_u, extra)

    def extra_repr(self) -> str:
        """τ, t and the uniformity weight for ``repr(module)``."""
        return f"{super().extra_repr()}, t={self.uniformity_t}, weight={self.uniformity_weight}"
