"""ResNet backbones for contrastive pre-training, built on ``torchvision.models.resnet``.

The network reuses torchvision's ``BasicBlock``/``Bottleneck`` blocks, its ``ResNet._make_layer`` stage
builder and its ``ResNet._forward_impl`` forward pass. Two things differ from the stock torchvision model:

* a **width multiplier**: the four stages have ``round(64 * width * m)`` channels for ``m`` in 1, 2, 4, 8
  (at least 8 channels each), so CPU presets can train a narrow network (e.g. ``width=0.125``);
* a **CIFAR stem** (SimCLR / DCL on 32x32 images): ``conv1`` is a 3x3 stride-1 convolution and the max-pool
  is removed. The ``"imagenet"`` stem keeps torchvision's 7x7 stride-2 convolution followed by the max-pool.

The classification layer ``fc`` is an ``nn.Identity``, so the backbone returns the globally average-pooled
features of shape ``(B, feature_dim)``.
"""

from __future__ import annotations

import logging

from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

from dcl_core.config import ARCH_NAMES, STEM_NAMES

logger = logging.getLogger(__name__)

# The config's model.arch / model.stem choices: the lists live in the torch-free dcl_core.config (the CLIs check
# names without importing torch), and the specs below are checked against them on import.
ARCHS: tuple[str, ...] = ARCH_NAMES
STEMS: tuple[str, ...] = STEM_NAMES

# arch -> (residual block type, number of blocks per stage), as in torchvision.models.resnet18/resnet50.
_ARCH_SPECS: dict[str, tuple[type[BasicBlock | Bottleneck], list[int]]] = {
    "resnet18": (BasicBlock, [2, 2, 2, 2]),
    "resnet50": (Bottleneck, [3, 4, 6, 3]),
}
if tuple(_ARCH_SPECS) != ARCHS:
    raise ImportError(f"_ARCH_SPECS {tuple(_ARCH_SPECS)} must match dcl_core.config.ARCH_NAMES {ARCHS}")

_BASE_WIDTH = 64
_STAGE_MULTIPLIERS = (1, 2, 4, 8)
_MIN_CHANNELS = 8


def stage_widths(width: float) -> tuple[int, int, int, int]:
    """Return the number of channels (``planes``) of the four ResNet stages for a width multiplier.

    Args:
        width: Width multiplier; 1.0 gives the standard 64, 128, 256, 512.

    Returns:
        ``round(64 * width * m)`` for ``m`` in (1, 2, 4, 8), each clamped to at least 8.

    Raises:
        ValueError: If ``width`` is not positive.
    """
    if not width > 0:
        raise ValueError(f"width must be > 0, got {width}")
    w1, w2, w3, w4 = (max(_MIN_CHANNELS, round(_BASE_WIDTH * width * m)) for m in _STAGE_MULTIPLIERS)
    return w1, w2, w3, w4


class WideResNetBackbone(ResNet):
    """A torchvision ``ResNet`` with a width multiplier, a selectable stem and no classification layer.

    ``ResNet.__init__`` hard-codes the 64/128/256/512 stage widths, so this class initialises ``nn.Module``
    directly, sets the attributes ``ResNet._make_layer`` relies on (``inplanes``, ``dilation``, ``groups``,
    ``base_width``, ``_norm_layer``) and then builds the stages with the inherited ``_make_layer``. The
    inherited ``forward`` (``_forward_impl``) is used unchanged; ``maxpool`` and ``fc`` are ``nn.Identity``
    where they are not wanted.

    Args:
        block: Residual block type (``BasicBlock`` or ``Bottleneck``).
        layers: Number of blocks in each of the four stages.
        width: Width multiplier of the stage widths (see :func:`stage_widths`).
        stem: ``"cifar"`` (3x3 stride-1 conv, no max-pool) or ``"imagenet"`` (7x7 stride-2 conv + max-pool).
        zero_init_residual: Zero-initialise the last BatchNorm gamma of each residual branch.

    Attributes:
        feature_dim: Dimension of the pooled output features.
    """

    def __init__(
        self,
        block: type[BasicBlock | Bottleneck],
        layers: list[int],
        width: float = 1.0,
        stem: str = "cifar",
        zero_init_residual: bool = False,
    ) -> None:
        # Deliberately skip ResNet.__init__ (fixed widths); everything it sets up is recreated below.
        nn.Module.__init__(self)
        if stem not in STEMS:
            raise ValueError(f"unknown stem {stem!r}; expected one of {STEMS}")
        widths = stage_widths(width)
        self._norm_layer = nn.BatchNorm2d
        self.inplanes = widths[0]
        self.dilation = 1
        self.groups = 1
        self.base_width = _BASE_WIDTH  # keeps Bottleneck's inner width equal to `planes`
        self.stem = stem

        if stem == "cifar":
            self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=3, stride=1, padding=1, bias=False)
            self.maxpool: nn.Module = nn.Identity()
        else:
            self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.bn1 = self._norm_layer(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self._make_layer(block, widths[0], layers[0])
        self.layer2 = self._make_layer(block, widths[1], layers[1], stride=2)
        self.layer3 = self._make_layer(block, widths[2], layers[2], stride=2)
        self.layer4 = self._make_layer(block, widths[3], layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc: nn.Module = nn.Identity()
        self.feature_dim = widths[3] * block.expansion

        # Same initialisation as torchvision's ResNet.
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.zeros_(m.bn3.weight)
                elif isinstance(m, BasicBlock):
                    nn.init.zeros_(m.bn2.weight)


def build_backbone(
    arch: str, width: float = 1.0, stem: str = "cifar", zero_init_residual: bool = False
) -> tuple[nn.Module, int]:
    """Build a ResNet backbone that maps images ``(B, 3, H, W)`` to pooled features ``(B, feature_dim)``.

    Args:
        arch: ``"resnet18"`` or ``"resnet50"``.
        width: Width multiplier; stage widths are ``round(64 * width * [1, 2, 4, 8])`` (min 8 channels).
        stem: ``"cifar"`` (3x3 stride-1 ``conv1``, no max-pool, as in SimCLR/DCL on CIFAR) or
            ``"imagenet"`` (torchvision's 7x7 stride-2 ``conv1`` followed by a 3x3 stride-2 max-pool).
        zero_init_residual: Zero-initialise the last BatchNorm gamma of each residual branch (off by default).

    Returns:
        ``(backbone, feature_dim)`` where ``feature_dim`` is ``max(8, round(512 * width))`` for resnet18 and
        four times that for resnet50 (i.e. 512 / 2048 at ``width=1``).

    Raises:
        ValueError: For an unknown ``arch`` or ``stem``, or a non-positive ``width``.
    """
    if arch not in _ARCH_SPECS:
        raise ValueError(f"unknown arch {arch!r}; expected one of {ARCHS}")
    block, layers = _ARCH_SPECS[arch]
    backbone = WideResNetBackbone(
        block, layers, width=width, stem=stem, zero_init_residual=zero_init_residual
    )
    logger.debug(
        "built %s (width=%s, stem=%s): feature_dim=%d, %d parameters",
        arch,
        width,
        stem,
        backbone.feature_dim,
        sum(p.numel() for p in backbone.parameters()),
    )
    return backbone, backbone.feature_dim


def last_block_convs(backbone: nn.Module, blocks: int = 2) -> list[nn.Conv2d]:
    """The last convolution of each of the final ``blocks`` residual blocks (DCL Fig. 5's gradient probes).

    For ResNet-18 these are ``layer4[0].conv2`` and ``layer4[1].conv2``; for ResNet-50 the ``conv3`` of the
    last two bottlenecks.
    """
    found = [m for m in backbone.modules() if isinstance(m, BasicBlock | Bottleneck)]
    if not found:
        raise ValueError("backbone has no residual blocks")
    return [b.conv3 if isinstance(b, Bottleneck) else b.conv2 for b in found[-blocks:]]
