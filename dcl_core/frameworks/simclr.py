"""SimCLR (Chen et al., 2020): two views through one encoder, negatives from the batch."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from dcl_core.frameworks.common import Framework
from dcl_core.losses import ContrastiveLoss, LossOutput


class SimCLR(Framework):
    """Both views through the same encoder + projection head; the loss sees (z1, z2).

    The two views go through the encoder as one batch of 2n images (one forward pass, BatchNorm statistics
    over both views), then split back.

    Args:
        model: maps images (B, 3, H, W) to (features (B, F), projections (B, P)); may be DDP-wrapped.
        loss: any contrastive loss with the ``loss(z1, z2)`` signature.
    """

    def __init__(self, model: nn.Module, loss: ContrastiveLoss) -> None:
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, view1: Tensor, view2: Tensor) -> LossOutput:
        """The loss of the two views' projections, both through the one encoder."""
        _, z = self.model(torch.cat([view1, view2], dim=0))  # z: (2n, P)
        z1, z2 = z.chunk(2, dim=0)  # (n, P) each
        return self.loss(z1, z2)

    def after_step(self) -> None:
        """Per-step state update (momentum encoders, queues); SimCLR has none."""
