"""Backbones and projection heads for contrastive pre-training."""

from dcl_core.models.heads import ProjectionHead, SSLModel
from dcl_core.models.resnet import ARCHS, STEMS, build_backbone, last_block_convs

__all__ = ["ARCHS", "STEMS", "ProjectionHead", "SSLModel", "build_backbone", "last_block_convs"]
