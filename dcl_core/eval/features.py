"""Feature extraction from a frozen backbone, for the kNN monitor and the linear probe."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

logger = logging.getLogger(__name__)


def _module_device(module: nn.Module) -> torch.device:
    """Return the device of the first parameter (or buffer) of ``module``; CPU if it has neither."""
    for tensor in (*module.parameters(), *module.buffers()):
        return tensor.device
    return torch.device("cpu")


def _autocast_context(device: torch.device, amp: bool) -> contextlib.AbstractContextManager:
    """Mixed-precision autocast on CUDA (bf16 when supported, else fp16); a no-op on any other device."""
    if amp and device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.autocast(device_type="cuda", dtype=dtype)
    return contextlib.nullcontext()


@torch.no_grad()
def extract_features(
    backbone: nn.Module,
    images: torch.Tensor,
    transform: Callable[[torch.Tensor], torch.Tensor],
    batch_size: int = 512,
    device: torch.device | str | None = None,
    normalize: bool = True,
    amp: bool = True,
) -> torch.Tensor:
    """Run a backbone over a (possibly large) uint8 image tensor in batches and collect its features.

    The backbone runs in ``eval()`` mode (BatchNorm uses its running statistics, which are not updated);
    the train/eval mode of every submodule is restored afterwards, even if an exception is raised.
    The backbone is not moved: it must already live on ``device``.

    Args:
        backbone: Maps a float image batch ``(B, 3, H, W)`` to features ``(B, F)``.
        images: ``uint8`` images ``(N, 3, H, W)``, typically on CPU; batches are copied to ``device``.
        transform: Maps a ``uint8`` batch on ``device`` to the float, normalised backbone input.
        batch_size: Number of images per forward pass.
        device: Device the batches are sent to; defaults to the device of the backbone's parameters.
        normalize: L2-normalise each feature row.
        amp: Use ``torch.autocast`` (bf16, or fp16 without bf16 support) when ``device`` is CUDA.
            Ignored on other devices, where the backbone always runs in float32.

    Returns:
        float32 features ``(N, F)`` on CPU; rows have unit L2 norm when ``normalize`` is True.

    Raises:
        ValueError: If ``images`` is not a non-empty 4-D tensor or ``batch_size < 1``.
    """
    if images.ndim != 4 or images.shape[0] == 0:
        raise ValueError(f"images must be a non-empty (N, C, H, W) tensor, got shape {tuple(images.shape)}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    device = _module_device(backbone) if device is None else torch.device(device)
    batches = (transform(images[s : s + batch_size].to(device, non_blocking=True))  # (b, 3, H, W) float
               for s in range(0, images.shape[0], batch_size))
    return _collect(backbone, batches, device, normalize, amp, total=images.shape[0])


@torch.no_grad()
def extract_features_from_batches(
    backbone: nn.Module,
    batches: Iterable[torch.Tensor],
    total: int,
    device: torch.device | str | None = None,
    normalize: bool = True,
    amp: bool = True,
) -> torch.Tensor:
    """As :func:`extract_features`, for ``total`` images whose batches were transformed elsewhere (e.g. by
    ``DataLoader`` workers streaming an ImageFolder): float ``(b, 3, H, W)`` backbone inputs, in order."""
    device = _module_device(backbone) if device is None else torch.device(device)
    batches = (b.to(device, non_blocking=True) for b in batches)
    return _collect(backbone, batches, device, normalize, amp, total)


def _collect(
    backbone: nn.Module, batches: Iterable[torch.Tensor], device: torch.device, normalize: bool, amp: bool,
    total: int,
) -> torch.Tensor:
    """Backbone features (total, F) of every batch on CPU, in eval mode (each module's mode restored
    afterwards); the output is allocated once and filled (one copy of ImageNet's features, not two)."""
    previous_modes = {module: module.training for module in backbone.modules()}
    backbone.eval()
    out: torch.Tensor | None = None
    filled = 0
    try:
        for batch in batches:
            with _autocast_context(device, amp):
                feats = backbone(batch)  # (b, F)
            feats = feats.float()
            if normalize:
                feats = F.normalize(feats, dim=1)  # (b, F), unit rows
            if out is None:
                out = torch.empty(total, feats.shape[1], dtype=torch.float32)  # (N, F) on CPU
            out[filled : filled + feats.shape[0]] = feats.cpu()
            filled += feats.shape[0]
    finally:
        for module, mode in previous_modes.items():
            module.training = mode
    if out is None or filled != total:
        raise ValueError(f"expected features of {total} images, got {filled}")
    logger.debug("extracted features %s on %s", tuple(out.shape), device)
    return out
