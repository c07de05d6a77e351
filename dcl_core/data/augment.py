"""Batched, on-device SimCLR / BYOL augmentation.

Instead of a per-sample PIL pipeline, :class:`ViewAugmentation` augments a whole ``uint8`` batch
``(B, 3, H, W)`` at once with tensor ops, on whatever device the batch lives on:

* random resized crop + horizontal flip as one per-sample affine grid and a single bilinear
  :func:`torch.nn.functional.grid_sample` call;
* color jitter (brightness, contrast, saturation, hue) with per-sample factors, using a batched
  RGB <-> HSV conversion for the hue shift;
* random grayscale, optional Gaussian blur (per-sample sigma, depthwise separable convolution),
  optional solarization, then normalization.

Randomness: every random quantity is drawn per sample from a **CPU** ``torch.Generator`` passed by
the caller (a few numbers per image, drawn in one call) and then moved to the batch's device. The
same ``(images, generator state)`` therefore gives bit-identical views on a given device, and the
random parameters themselves do not depend on the device.

Why not kornia's batched augmentations: they draw their parameters from the global RNG, through samplers
that kornia documents as not reproducible across devices and dtypes, and their resized crop warps the box's
corner pixels onto the output's (an ``align_corners=True`` mapping) instead of torchvision's crop then resize.
Here every draw comes from the caller's seeded CPU generator, the boxes follow torchvision's
``RandomResizedCrop.get_params`` (:func:`sample_crop_boxes`) and the resampling matches its crop + bilinear
resize (:func:`crop_flip_resize`), so the random parameters do not depend on the device.

Grayscale and normalization are torchvision's own functions: ``transforms.functional.rgb_to_grayscale``
(v1: v2's computes the weighted sum with fused ``add(alpha=)`` steps, which differ from v1's
``0.2989 r + 0.587 g + 0.114 b`` by up to 1 ulp and would change the numbers of a seeded run) and
``transforms.v2.functional.normalize``.

Differences from torchvision's ``transforms`` (documented deviations):

* ``ColorJitter`` is applied in the fixed order brightness, contrast, saturation, hue; torchvision
  draws a random order per image.
* Crops are resampled with bilinear interpolation without antialiasing. With the usual setup (the
  stored images already have the training resolution) crops are only ever upsampled, so this matches
  torchvision; if much larger images are cropped down, some aliasing occurs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torchvision.transforms.functional import rgb_to_grayscale
from torchvision.transforms.v2 import functional as TF

from dcl_core.config import AUGMENTATIONS

Stats = tuple[float, float, float]

CIFAR_MEAN: Stats = (0.4914, 0.4822, 0.4465)
CIFAR_STD: Stats = (0.2470, 0.2435, 0.2616)
IMAGENET_MEAN: Stats = (0.485, 0.456, 0.406)
IMAGENET_STD: Stats = (0.229, 0.224, 0.225)

POLICIES: tuple[str, ...] = AUGMENTATIONS  # the config's data.augmentation choices, kept torch-free there

_CROP_ATTEMPTS = 10  # as torchvision's RandomResizedCrop.get_params
# Columns of the per-sample uniform draw (one torch.rand call per view).
_COL_SCALE = slice(0, _CROP_ATTEMPTS)
_COL_RATIO = slice(_CROP_ATTEMPTS, 2 * _CROP_ATTEMPTS)
_COL_POS = slice(2 * _CROP_ATTEMPTS, 2 * _CROP_ATTEMPTS + 2)
_COL_FLIP = 2 * _CROP_ATTEMPTS + 2
_COL_JITTER = _COL_FLIP + 1
_COL_FACTORS = slice(_COL_JITTER + 1, _COL_JITTER + 5)
_COL_GRAY = _COL_JITTER + 5
_COL_BLUR = _COL_GRAY + 1
_COL_SIGMA = _COL_BLUR + 1
_COL_SOLARIZE = _COL_SIGMA + 1
_NUM_DRAWS = _COL_SOLARIZE + 1


def normalization_for(dataset: str) -> tuple[Stats, Stats]:
    """Returns the ``(mean, std)`` used to normalize images of ``dataset``.

    Args:
        dataset: Dataset name.

    Returns:
        CIFAR statistics for ``cifar10``/``cifar100``, ImageNet statistics otherwise.
    """
    if dataset in ("cifar10", "cifar100"):
        return CIFAR_MEAN, CIFAR_STD
    return IMAGENET_MEAN, IMAGENET_STD


def _check_images(images: torch.Tensor) -> None:
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 3:
        got = f"{images.dtype} {tuple(images.shape)}"
        raise ValueError(f"expected uint8 images of shape (B, 3, H, W), got {got}")


# ----------------------------------------------------------------------------------------------------
# Batched color helpers (float images in [0, 1], channel dimension -3)
# ----------------------------------------------------------------------------------------------------


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
    params = params.to(device=x.device, dtype=x.dtype).view(batch, 8, 1)  # (B, 8) -> (B, 8, 1)
    steps = (torch.arange(size, device=x.device, dtype=x.dtype) * 2.0 + 1.0) / size - 1.0  # pixel centers
    grid_x = params[:, 1] + params[:, 0] * steps  # (B, 1) * (size,) -> (B, size)
    grid_y = params[:, 3] + params[:, 2] * steps  # (B, 1) * (size,) -> (B, size)
    grid_x = torch.clamp(grid_x, min=params[:, 4], max=params[:, 5])  # bounds (B, 1)
    grid_y = torch.clamp(grid_y, min=params[:, 6], max=params[:, 7])  # bounds (B, 1)
    grid_x = grid_x.view(batch, 1, size).expand(batch, size, size)  # (B, size) -> (B, size, size)
    grid_y = grid_y.view(batch, size, 1).expand(batch, size, size)  # (B, size) -> (B, size, size)
    grid = torch.stack((grid_x, grid_y), dim=-1)  # 2 x (B, size, size) -> (B, size, size, 2), last dim (x, y)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


# ----------------------------------------------------------------------------------------------------
# Policies
# ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ViewPolicy:
    """Parameters of the augmentation that produces one view.

    Attributes:
        crop_scale: Area fraction range of the random resized crop.
        crop_ratio: Aspect ratio range of the crop.
        flip_p: Probability of a horizontal flip.
        jitter_p: Probability of color jitter.
        brightness: Brightness factor drawn from ``[max(0, 1 - b), 1 + b]``.
        contrast: Contrast factor range, like ``brightness``.
        saturation: Saturation factor range, like ``brightness``.
        hue: Hue shift drawn from ``[-hue, hue]`` (turns; at most 0.5).
        gray_p: Probability of converting to grayscale.
        blur_p: Probability of Gaussian blur.
        blur_sigma: Range of the blur's sigma in pixels.
        solarize_p: Probability of solarization.
        solarize_threshold: Pixels ``>=`` this value (in ``[0, 1]``) are inverted by solarization.
    """

    crop_scale: tuple[float, float] = (0.08, 1.0)
    crop_ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)
    flip_p: float = 0.5
    jitter_p: float = 0.8
    brightness: float = 0.4
    contrast: float = 0.4
    saturation: float = 0.4
    hue: float = 0.1
    gray_p: float = 0.2
    blur_p: float = 0.0
    blur_sigma: tuple[float, float] = (0.1, 2.0)
    solarize_p: float = 0.0
    solarize_threshold: float = 0.5


def _factor(strength: float, u: torch.Tensor, apply: torch.Tensor) -> torch.Tensor:
    """Jitter factor uniform in ``[max(0, 1 - strength), 1 + strength]``; exactly 1 where not applied."""
    low, high = max(0.0, 1.0 - strength), 1.0 + strength
    return torch.where(apply, low + (high - low) * u, torch.ones_like(u))


def _blend(x: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``clamp(f x + (1 - f) other, 0, 1)`` with per-sample ``factor`` ``(B,)``."""
    f = factor.view(-1, 1, 1, 1)  # (B,) -> (B, 1, 1, 1)
    return torch.clamp(f * x + (1.0 - f) * other, 0.0, 1.0)


def _color_jitter(x: torch.Tensor, policy: ViewPolicy, factors: torch.Tensor, jitter: torch.Tensor) -> torch.Tensor:
    """Brightness, contrast, saturation, hue, in this fixed order, on the images where ``jitter`` is set.

    Args:
        x: Float images ``(B, 3, H, W)`` in ``[0, 1]``.
        policy: The view's jitter strengths.
        factors: ``(B, 4)`` uniforms (CPU, float64) for the four adjustments.
        jitter: ``(B,)`` bool (CPU), apply jitter to this image.

    Returns:
        ``(B, 3, H, W)`` images; those without jitter are unchanged.
    """
    device = x.device
    if policy.brightness > 0:
        fac = _factor(policy.brightness, factors[:, 0], jitter).to(device, x.dtype)
        x = torch.clamp(x * fac.view(-1, 1, 1, 1), 0.0, 1.0)  # (B,) -> (B, 1, 1, 1)
    if policy.contrast > 0:
        fac = _factor(policy.contrast, factors[:, 1], jitter).to(device, x.dtype)
        mean = rgb_to_grayscale(x).mean(dim=(1, 2, 3), keepdim=True)  # (B, 1, 1, 1)
        x = _blend(x, mean, fac)
    if policy.saturation > 0:
        fac = _factor(policy.saturation, factors[:, 2], jitter).to(device, x.dtype)
        x = _blend(x, rgb_to_grayscale(x), fac)
    if policy.hue > 0:
        shift = (policy.hue * (2.0 * factors[:, 3] - 1.0)).to(device, x.dtype)
        mask = jitter.to(device).view(-1, 1, 1, 1)  # (B,) -> (B, 1, 1, 1)
        x = torch.where(mask, adjust_hue(x, shift), x)
    return x


class ViewAugmentation:
    """Produces two randomly augmented, normalized views of a uint8 batch.

    Policies:

    * ``"simclr"`` (DCL paper A.4, SimCLR defaults), the same for both views: random resized crop
      (``crop_scale``, ratio 3/4..4/3), horizontal flip p=0.5, color jitter p=0.8 with
      brightness=contrast=saturation=0.8*s and hue=0.2*s (``s = jitter_strength``; the paper uses
      s=1.0, SimCLR's CIFAR setting is s=0.5), grayscale p=0.2, and Gaussian blur p=0.5 (kernel about
      10% of the image size, sigma in [0.1, 2]) when ``blur`` is on. ``blur=None`` means on for
      ``image_size >= 96`` (SimCLR skips blur on CIFAR).
    * ``"byol"`` (BYOL's asymmetric policy, paper Table 3): crop and flip as above, jitter
      (0.4, 0.4, 0.2, 0.1) p=0.8, grayscale p=0.2, blur p=1.0 / 0.1 and solarize p=0.0 / 0.2 for
      view 1 / view 2. ``jitter_strength`` is ignored. ``blur=None`` means on at every size, since
      BYOL is an ImageNet policy; ``blur=False`` removes blur from both views.

    The object has no learnable parameters; ``policies`` holds the two :class:`ViewPolicy` objects.

    Speed (measured once, torch 2.14 CPU, 2 cores, a noisy shared VM): a batch of 256 CIFAR images
    (32 px) into two "simclr" views takes 30-50 ms (best runs ~25 ms); 256 STL-size images (96 px,
    with blur) take ~0.3-0.5 s. ``python benchmarks/run.py --sections augmentation`` measures it against
    torchvision's per-sample pipeline and kornia's batched one.

    Args:
        image_size: Output side length.
        policy: ``"simclr"`` or ``"byol"``.
        mean: Per-channel normalization mean.
        std: Per-channel normalization std.
        crop_scale: Area fraction range of the random resized crop.
        jitter_strength: Color jitter strength ``s`` of the ``"simclr"`` policy.
        blur: Gaussian blur on/off; ``None`` chooses per policy as described above.

    Raises:
        ValueError: Unknown policy or invalid parameters.
    """

    def __init__(
        self,
        image_size: int,
        policy: str = "simclr",
        mean: Sequence[float] = CIFAR_MEAN,
        std: Sequence[float] = CIFAR_STD,
        crop_scale: tuple[float, float] = (0.08, 1.0),
        jitter_strength: float = 0.5,
        blur: bool | None = None,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown augmentation policy {policy!r}; valid policies: {', '.join(POLICIES)}")
        if image_size <= 0:
            raise ValueError(f"image_size must be positive, got {image_size}")
        if not 0.0 < crop_scale[0] <= crop_scale[1] <= 1.0:
            raise ValueError(f"crop_scale must satisfy 0 < low <= high <= 1, got {crop_scale}")
        if jitter_strength < 0:
            raise ValueError(f"jitter_strength must be >= 0, got {jitter_strength}")
        self.image_size = image_size
        self.policy = policy
        self.mean: Stats = (float(mean[0]), float(mean[1]), float(mean[2]))
        self.std: Stats = (float(std[0]), float(std[1]), float(std[2]))
        self.blur_kernel_size = max(3, int(0.1 * image_size)) | 1  # ~10% of the size, odd
        crop_scale = (float(crop_scale[0]), float(crop_scale[1]))
        if policy == "simclr":
            use_blur = image_size >= 96 if blur is None else blur
            s = jitter_strength
            view = ViewPolicy(
                crop_scale=crop_scale,
                brightness=0.8 * s,
                contrast=0.8 * s,
                saturation=0.8 * s,
                hue=min(0.2 * s, 0.5),
                blur_p=0.5 if use_blur else 0.0,
            )
            self.policies: tuple[ViewPolicy, ViewPolicy] = (view, view)
        else:
            use_blur = True if blur is None else blur
            first = ViewPolicy(
                crop_scale=crop_scale,
                brightness=0.4,
                contrast=0.4,
                saturation=0.2,
                hue=0.1,
                blur_p=1.0 if use_blur else 0.0,
                solarize_p=0.0,
            )
            second = replace(first, blur_p=0.1 if use_blur else 0.0, solarize_p=0.2)
            self.policies = (first, second)

    def __repr__(self) -> str:
        return (
            f"ViewAugmentation(image_size={self.image_size}, policy={self.policy!r}, "
            f"policies={self.policies})"
        )

    def __call__(self, images: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """Augments a batch into two views.

        Args:
            images: ``uint8`` images ``(B, 3, H, W)`` on any device.
            generator: A CPU ``torch.Generator``; all random parameters are drawn from it.

        Returns:
            Two float32 normalized views ``(B, 3, image_size, image_size)`` on the images' device.
        """
        _check_images(images)
        x = images.to(torch.float32) / 255.0
        first = self._view(x, generator, self.policies[0], normalize=True)
        second = self._view(x, generator, self.policies[1], normalize=True)
        return first, second

    def apply_policy(
        self, images: torch.Tensor, generator: torch.Generator, policy: ViewPolicy, normalize: bool = True
    ) -> torch.Tensor:
        """Produces one view with an explicit :class:`ViewPolicy` (used by tests and ablations).

        Args:
            images: ``uint8`` images ``(B, 3, H, W)``.
            generator: A CPU ``torch.Generator``.
            policy: The view's parameters.
            normalize: Apply mean/std normalization; ``False`` returns values in ``[0, 1]``.

        Returns:
            Float32 images ``(B, 3, image_size, image_size)``.
        """
        _check_images(images)
        return self._view(images.to(torch.float32) / 255.0, generator, policy, normalize)

    def _view(
        self, x: torch.Tensor, generator: torch.Generator, policy: ViewPolicy, normalize: bool
    ) -> torch.Tensor:
        if generator.device.type != "cpu":
            raise ValueError(
                f"the augmentation generator must be a CPU torch.Generator, got {generator.device}"
            )
        batch, _, height, width = x.shape
        device = x.device
        # One fixed-size draw per view keeps the random stream layout independent of the outcomes.
        u = torch.rand(batch, _NUM_DRAWS, generator=generator, dtype=torch.float64)  # (B, D)

        boxes = sample_crop_boxes(
            u[:, _COL_SCALE],
            u[:, _COL_RATIO],
            u[:, _COL_POS],
            height,
            width,
            policy.crop_scale,
            policy.crop_ratio,
        )
        flip = u[:, _COL_FLIP] < policy.flip_p
        x = crop_flip_resize(x, boxes, flip, self.image_size)

        jitter = u[:, _COL_JITTER] < policy.jitter_p
        if policy.jitter_p > 0 and bool(jitter.any()):
            x = _color_jitter(x, policy, u[:, _COL_FACTORS], jitter)

        gray = u[:, _COL_GRAY] < policy.gray_p
        if bool(gray.any()):
            mask = gray.to(device).view(-1, 1, 1, 1)  # (B,) -> (B, 1, 1, 1)
            x = torch.where(mask, rgb_to_grayscale(x).expand_as(x), x)

        blur = u[:, _COL_BLUR] < policy.blur_p
        if bool(blur.any()):
            low, high = policy.blur_sigma
            sigma = (low + (high - low) * u[:, _COL_SIGMA])[blur].to(device, x.dtype)  # (n_blur,)
            index = torch.nonzero(blur).flatten().to(device)  # (n_blur,) samples to blur
            blurred = gaussian_blur(x.index_select(0, index), sigma, self.blur_kernel_size)
            x = x.index_copy(0, index, blurred)  # (B, 3, S, S)

        solarize = u[:, _COL_SOLARIZE] < policy.solarize_p
        if bool(solarize.any()):
            mask = solarize.to(device).view(-1, 1, 1, 1) & (x >= policy.solarize_threshold)  # (B, 1, 1, 1)
            x = torch.where(mask, 1.0 - x, x)

        return TF.normalize(x, list(self.mean), list(self.std)) if normalize else x


class EvalTransform:
    """Deterministic evaluation transform: resize (if needed), center crop, normalize.

    Args:
        image_size: Output side length.
        mean: Per-channel normalization mean.
        std: Per-channel normalization std.
    """

    def __init__(
        self, image_size: int, mean: Sequence[float] = CIFAR_MEAN, std: Sequence[float] = CIFAR_STD
    ) -> None:
        if image_size <= 0:
            raise ValueError(f"image_size must be positive, got {image_size}")
        self.image_size = image_size
        self.mean: Stats = (float(mean[0]), float(mean[1]), float(mean[2]))
        self.std: Stats = (float(std[0]), float(std[1]), float(std[2]))

    def __repr__(self) -> str:
        return f"EvalTransform(image_size={self.image_size}, mean={self.mean}, std={self.std})"

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        """Transforms a batch.

        Args:
            images: ``uint8`` images ``(B, 3, H, W)`` on any device.

        Returns:
            Float32 normalized images ``(B, 3, image_size, image_size)`` on the same device. Images
            already of size ``image_size`` are only normalized; others have their shorter side resized
            (bilinear, antialiased) to ``image_size`` and are center-cropped.
        """
        _check_images(images)
        x = images.to(torch.float32) / 255.0
        size = self.image_size
        if x.shape[-2] != size or x.shape[-1] != size:
            if min(x.shape[-2], x.shape[-1]) != size:
                x = TF.resize(x, [size], antialias=True)
            x = TF.center_crop(x, [size, size])
        return TF.normalize(x, list(self.mean), list(self.std))
