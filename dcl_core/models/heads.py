"""Projection head and the backbone + head wrapper used for contrastive pre-training."""

from __future__ import annotations

import torch
from torch import nn


class ProjectionHead(nn.Sequential):
    """SimCLR / DCL 2-layer MLP projection head: ``Linear -> BatchNorm1d -> ReLU -> Linear``.

    The first ``Linear`` has no bias because the following BatchNorm would cancel it. The output is
    **not** L2-normalised; the contrastive losses normalise their inputs themselves.

    Args:
        in_dim: Input (backbone feature) dimension.
        hidden_dim: Hidden dimension of the MLP.
        out_dim: Output (projection) dimension; 128 in SimCLR and the DCL paper.
    """

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int = 128) -> None:
        for name, value in (("in_dim", in_dim), ("hidden_dim", hidden_dim), ("out_dim", out_dim)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        super().__init__(
            nn.Linear(in_dim, hidden_dim, bias=False),
            nn.BatchNorm1d(hidden_dim),
            nn.ReLU(inplace=True),
            nn.Linear(hidden_dim, out_dim),
        )
        self.in_dim = in_dim
        self.hidden_dim = hidden_dim
        self.out_dim = out_dim


class SSLModel(nn.Module):
    """Backbone followed by a projection head.

    Args:
        backbone: Maps images ``(B, 3, H, W)`` to features ``(B, F)``.
        head: Maps features ``(B, F)`` to projections ``(B, P)``.
    """

    def __init__(self, backbone: nn.Module, head: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Compute backbone features and projections.

        Args:
            x: Images of shape ``(B, 3, H, W)``.

        Returns:
            ``(features, projections)`` of shapes ``(B, F)`` and ``(B, P)``.
        """
        features = self.backbone(x)  # (B, F)
        projections = self.head(features)  # (B, P)
        return features, projections
