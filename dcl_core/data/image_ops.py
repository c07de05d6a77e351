"""Batched image kernels the view augmentation (:mod:`dcl_core.data.augment`) is built from.

Every function works on a whole batch of float images in ``[0, 1]`` with per-sample parameters, on the
batch's device, and draws nothing itself: colour (RGB <-> HSV, hue rotation, Gaussian blur with a
per-sample sigma) and geometry (torchvision's ``RandomResizedCrop`` boxes from given uniforms, and the
crop + flip + bilinear resize of every sample in one ``grid_sample``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------------
# Batched color helpers (float images in [0, 1], channel dimension -3)
# ----------------------------------------------------------------------------------------------------


def to_device(draws: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A CPU tensor of the augmentation's (its random draws, masks, indices) on ``device``, as ``dtype``. To a GPU
    it goes through pinned memory without waiting: a copy from pageable memory makes the host wait until the device
    has run every kernel queued before it, and the two views make ten such copies each a step (docs/performance.md,
    "Where the trainer's time goes"). The values are the same either way."""
    draws = draws if dtype is None else draws.to(dtype)
    if device.type != "cuda" or draws.device.type != "cpu":
        return draws.to(device)
    return draws.pin_memory().to(device, non_blocking=True)


def rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """Converts RGB to HSV (all channels in ``[0, 1]``), batched.

    Args:
        x: Float images ``(..., 3, H, W)`` in ``[0, 1]``.

    Returns:
        ``(..., 3, H, W)`` with channels hue, saturation, value.
    """
    r, g, b = x.unbind(dim=-3)
    maxc = x.amax(dim=-3)
    minc = x.amin(dim=-3)
    delta = maxc - minc
    # Clamped divisors avoid 0/0: where maxc == 0 so is delta; where delta == 0, r == g == b == maxc.
    sat = delta / maxc.clamp(min=1e-12)
    safe_delta = delta.clamp(min=1e-12)
    rc = (maxc - r) / safe_delta
    gc = (maxc - g) / safe_delta
    bc = (maxc - b) / safe_delta
    hue = torch.where(maxc == r, bc - gc, torch.where(maxc == g, 2.0 + rc - bc, 4.0 + gc - rc))
    hue = hue / 6.0  # in [-1/6, 1)
    hue = hue + (hue < 0).to(hue.dtype)  # wrap to [0, 1) (cheaper than torch.remainder on CPU)
    return torch.stack((hue, sat, maxc), dim=-3)  # 3 x (..., H, W) -> (..., 3, H, W)


def hsv_to_rgb(x: torch.Tensor) -> torch.Tensor:
    """Converts HSV to RGB, batched (inverse of :func:`rgb_to_hsv`).

    Uses ``c_n = V - V S clamp(min(k, 4 - k), 0, 1)`` with ``k = (n + 6 H) mod 6`` and ``n = 5, 3, 1`` for
    the red, green and blue channel.

    Args:
        x: Float images ``(..., 3, H, W)`` with channels hue, saturation, value in ``[0, 1]`` (hue must
            lie in ``[0, 1]``; 1 is the same as 0).

    Returns:
        ``(..., 3, H, W)`` RGB images.
    """
    hue, sat, val = x.split(1, dim=-3)  # each (..., 1, H, W)
    offsets = torch.tensor((5.0, 3.0, 1.0), dtype=x.dtype, device=x.device).view(3, 1, 1)  # (3,) -> (3, 1, 1)
    k = offsets + hue * 6.0  # (..., 3, H, W), in [1, 11]
    k = k - 6.0 * (k >= 6.0).to(k.dtype)  # mod 6 for values in [0, 12)
    return val - val * sat * torch.clamp(torch.minimum(k, 4.0 - k), 0.0, 1.0)


def adjust_hue(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Rotates the hue of each image by its own amount.

    Args:
        x: Float images ``(B, 3, H, W)`` in ``[0, 1]``.
        shift: ``(B,)`` hue shifts in turns (``0.5`` is 180 degrees), any sign.

    Returns:
        ``(B, 3, H, W)`` images.
    """
    hsv = rgb_to_hsv(x)
    hue = hsv[:, :1] + shift.view(-1, 1, 1, 1)  # shift (B,) -> (B, 1, 1, 1); hue (B, 1, H, W)
    hue = hue - torch.floor(hue)  # wrap to [0, 1)
    return hsv_to_rgb(torch.cat((hue, hsv[:, 1:]), dim=1))  # (B, 1, H, W) + (B, 2, H, W) -> (B, 3, H, W)


def gaussian_blur(x: torch.Tensor, sigma: torch.Tensor, kernel_size: int) -> torch.Tensor:
    """Blurs each image with its own Gaussian (separable, reflect padding like torchvision).

    Args:
        x: Float images ``(B, C, H, W)``.
        sigma: ``(B,)`` standard deviations in pixels; a non-positive sigma leaves that image unchanged.
        kernel_size: Odd kernel side length.

    Returns:
        ``(B, C, H, W)`` blurred images.
    """
    batch, channels, height, width = x.shape
    half = kernel_size // 2
    taps = torch.arange(-half, half + 1, dtype=x.dtype, device=x.device)  # (k,)
    safe_sigma = torch.where(sigma > 0, sigma, torch.ones_like(sigma)).to(x.dtype)
    safe_sigma = safe_sigma.view(-1, 1)  # (B,) -> (B, 1)
    kernel = torch.exp(-0.5 * (taps / safe_sigma) ** 2)  # (B, k)
    kernel = kernel / kernel.sum(dim=1, keepdim=True)
    delta = (taps == 0).to(x.dtype).expand(batch, -1)  # (k,) -> (B, k)
    kernel = torch.where((sigma > 0).view(-1, 1), kernel, delta)  # (B, k)
    kernel = kernel.repeat_interleave(channels, dim=0)  # (B, k) -> (B * C, k)
    flat = x.reshape(1, batch * channels, height, width)  # (B, C, H, W) -> (1, B * C, H, W)
    flat = F.pad(flat, (half, half, half, half), mode="reflect")
    flat = F.conv2d(flat, kernel.view(batch * channels, 1, 1, kernel_size), groups=batch * channels)
    flat = F.conv2d(flat, kernel.view(batch * channels, 1, kernel_size, 1), groups=batch * channels)
    return flat.view(batch, channels, height, width)  # (1, B * C, H, W) -> (B, C, H, W)


# ----------------------------------------------------------------------------------------------------
# Geometry
# ----------------------------------------------------------------------------------------------------


def sample_crop_boxes(
    uniforms_scale: torch.Tensor,
    uniforms_ratio: torch.Tensor,
    uniforms_pos: torch.Tensor,
    height: int,
    width: int,
    scale: tuple[float, float],
    ratio: tuple[float, float],
) -> torch.Tensor:
    """Random-resized-crop boxes from pre-drawn uniforms, following torchvision's ``get_params``.

    For each sample, up to ``A`` attempts draw an area fraction uniformly from ``scale`` and an aspect
    ratio log-uniformly from ``ratio``; the first attempt whose integer box fits is used, at a uniformly
    random integer position. If none fits, the image is center-cropped to the nearest allowed ratio.

    Args:
        uniforms_scale: ``(B, A)`` uniforms in ``[0, 1)`` for the area fraction.
        uniforms_ratio: ``(B, A)`` uniforms for the log aspect ratio.
        uniforms_pos: ``(B, 2)`` uniforms for the top / left position.
        height: Image height.
        width: Image width.
        scale: Area fraction range.
        ratio: Aspect ratio (width / height) range.

    Returns:
        ``(B, 4)`` float64 boxes ``(top, left, box_height, box_width)`` in pixels (integer valued).
    """
    area = float(height * width)
    u_scale = uniforms_scale.to(torch.float64)
    u_ratio = uniforms_ratio.to(torch.float64)
    target_area = area * (scale[0] + (scale[1] - scale[0]) * u_scale)
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(log_lo + (log_hi - log_lo) * u_ratio)
    box_w = torch.round(torch.sqrt(target_area * aspect))
    box_h = torch.round(torch.sqrt(target_area / aspect))
    fits = (box_w > 0) & (box_h > 0) & (box_w <= width) & (box_h <= height)
    first = torch.argmax(fits.to(torch.int64), dim=1, keepdim=True)  # first fitting attempt, (B, 1)
    any_fit = fits.any(dim=1)
    box_w = box_w.gather(1, first).squeeze(1)  # (B, 1) -> (B,)
    box_h = box_h.gather(1, first).squeeze(1)  # (B, 1) -> (B,)

    # Fallback: whole image, center-cropped to the closest allowed aspect ratio.
    in_ratio = width / height
    if in_ratio < min(ratio):
        fb_w, fb_h = width, round(width / min(ratio))
    elif in_ratio > max(ratio):
        fb_w, fb_h = round(height * max(ratio)), height
    else:
        fb_w, fb_h = width, height
    box_w = torch.where(any_fit, box_w, torch.full_like(box_w, fb_w))
    box_h = torch.where(any_fit, box_h, torch.full_like(box_h, fb_h))

    u_pos = uniforms_pos.to(torch.float64)
    top = torch.minimum(torch.floor(u_pos[:, 0] * (height - box_h + 1)), height - box_h)
    left = torch.minimum(torch.floor(u_pos[:, 1] * (width - box_w + 1)), width - box_w)
    top = torch.where(any_fit, top, torch.floor((height - box_h) / 2))
    left = torch.where(any_fit, left, torch.floor((width - box_w) / 2))
    return torch.stack((top, left, box_h, box_w), dim=1)  # 4 x (B,) -> (B, 4)


def crop_flip_resize(x: torch.Tensor, boxes: torch.Tensor, flip: torch.Tensor, size: int) -> torch.Tensor:
    """Crops each image to its box, optionally mirrors it, and resizes to ``size`` in one resampling.

    The crop box (in pixel-edge coordinates) is mapped onto the output grid with an affine transform
    (``align_corners=False`` convention, so a full-image box at the native size is the identity);
    the flip negates the horizontal scale. Sampling positions are clamped to the box's pixel centers,
    so pixels outside the box never bleed in: the result equals cropping first and then resizing with
    ``F.interpolate(mode="bilinear", align_corners=False)`` (torchvision's order), up to float rounding.

    Args:
        x: Float images ``(B, C, H, W)``.
        boxes: ``(B, 4)`` boxes ``(top, left, box_height, box_width)`` in pixels.
        flip: ``(B,)`` bool, mirror horizontally.
        size: Output side length.

    Returns:
        ``(B, C, size, size)`` images.
    """
    batch, _, height, width = x.shape
    boxes = boxes.to(torch.float64)
    top, left, box_h, box_w = boxes.unbind(dim=1)
    scale_x = box_w / width
    scale_y = box_h / height
    center_x = (2.0 * left + box_w) / width - 1.0
    center_y = (2.0 * top + box_h) / height - 1.0
    scale_x = torch.where(flip.to(torch.bool).cpu(), -scale_x, scale_x)
    # Normalized coordinates of the first and last pixel center inside the box.
    low_x = (2.0 * left + 1.0) / width - 1.0
    high_x = (2.0 * (left + box_w) - 1.0) / width - 1.0
    low_y = (2.0 * top + 1.0) / height - 1.0
    high_y = (2.0 * (top + box_h) - 1.0) / height - 1.0
    # Equivalent to F.affine_grid with theta = [[scale_x, 0, center_x], [0, scale_y, center_y]], but
    # built separably (affine_grid's batched matmul dominated the CPU time).
    params = torch.stack(
        (scale_x, center_x, scale_y, center_y, low_x, high_x, low_y, high_y), dim=1
    )  # 8 x (B,) -> (B, 8)
    params = to_device(params, x.device, x.dtype).view(batch, 8, 1)  # (B, 8) -> (B, 8, 1)
    steps = (torch.arange(size, device=x.device, dtype=x.dtype) * 2.0 + 1.0) / size - 1.0  # pixel centers
    grid_x = params[:, 1] + params[:, 0] * steps  # (B, 1) * (size,) -> (B, size)
    grid_y = params[:, 3] + params[:, 2] * steps  # (B, 1) * (size,) -> (B, size)
    grid_x = torch.clamp(grid_x, min=params[:, 4], max=params[:, 5])  # bounds (B, 1)
    grid_y = torch.clamp(grid_y, min=params[:, 6], max=params[:, 7])  # bounds (B, 1)
    grid_x = grid_x.view(batch, 1, size).expand(batch, size, size)  # (B, size) -> (B, size, size)
    grid_y = grid_y.view(batch, size, 1).expand(batch, size, size)  # (B, size) -> (B, size, size)
    grid = torch.stack((grid_x, grid_y), dim=-1)  # 2 x (B, size, size) -> (B, size, size, 2), last dim (x, y)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)
