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
``RandomResizedCrop.get_params`` (:func:`~dcl_core.data.image_ops.sample_crop_boxes`) and the resampling
matches its crop + bilinear resize (:func:`~dcl_core.data.image_ops.crop_flip_resize`), so the random
parameters do not depend on the device.

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

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torchvision.transforms.functional import rgb_to_grayscale
from torchvision.transforms.v2 import functional as TF

from dcl_core.config import AUGMENTATIONS
from dcl_core.data.image_ops import adjust_hue, crop_flip_resize, gaussian_blur, sample_crop_boxes, to_device

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
        fac = to_device(_factor(policy.brightness, factors[:, 0], jitter), device, x.dtype)
        x = torch.clamp(x * fac.view(-1, 1, 1, 1), 0.0, 1.0)  # (B,) -> (B, 1, 1, 1)
    if policy.contrast > 0:
        fac = to_device(_factor(policy.contrast, factors[:, 1], jitter), device, x.dtype)
        mean = rgb_to_grayscale(x).mean(dim=(1, 2, 3), keepdim=True)  # (B, 1, 1, 1)
        x = _blend(x, mean, fac)
    if policy.saturation > 0:
        fac = to_device(_factor(policy.saturation, factors[:, 2], jitter), device, x.dtype)
        x = _blend(x, rgb_to_grayscale(x), fac)
    if policy.hue > 0:
        shift = to_device(policy.hue * (2.0 * factors[:, 3] - 1.0), device, x.dtype)
        mask = to_device(jitter, device).view(-1, 1, 1, 1)  # (B,) -> (B, 1, 1, 1)
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
            mask = to_device(gray, device).view(-1, 1, 1, 1)  # (B,) -> (B, 1, 1, 1)
            x = torch.where(mask, rgb_to_grayscale(x).expand_as(x), x)

        blur = u[:, _COL_BLUR] < policy.blur_p
        if bool(blur.any()):
            low, high = policy.blur_sigma
            sigma = to_device((low + (high - low) * u[:, _COL_SIGMA])[blur], device, x.dtype)  # (n_blur,)
            index = to_device(torch.nonzero(blur).flatten(), device)  # (n_blur,) samples to blur
            blurred = gaussian_blur(x.index_select(0, index), sigma, self.blur_kernel_size)
            x = x.index_copy(0, index, blurred)  # (B, 3, S, S)

        solarize = u[:, _COL_SOLARIZE] < policy.solarize_p
        if bool(solarize.any()):
            mask = to_device(solarize, device).view(-1, 1, 1, 1) & (x >= policy.solarize_threshold)  # (B, 1, 1, 1)
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
