"""Tests of the batched SimCLR / BYOL augmentation in dcl_core.data.augment."""

from __future__ import annotations

import colorsys
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from torchvision.transforms.functional import rgb_to_grayscale
from torchvision.transforms.v2 import functional as TF

from dcl_core.data import (
    CIFAR_MEAN,
    CIFAR_STD,
    IMAGENET_MEAN,
    IMAGENET_STD,
    EvalTransform,
    ViewAugmentation,
    normalization_for,
)
from dcl_core.data import augment as augment_module
from dcl_core.data.augment import ViewPolicy
from dcl_core.data.image_ops import (
    adjust_hue,
    crop_flip_resize,
    gaussian_blur,
    hsv_to_rgb,
    rgb_to_hsv,
    sample_crop_boxes,
)

IDENTITY = ViewPolicy(crop_scale=(1.0, 1.0), flip_p=0.0, jitter_p=0.0, gray_p=0.0, blur_p=0.0, solarize_p=0.0)


def _images(batch: int = 8, size: int = 32, seed: int = 0, height: int | None = None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (batch, 3, height or size, size), dtype=torch.uint8, generator=gen)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _normalize(x: torch.Tensor, mean: tuple = CIFAR_MEAN, std: tuple = CIFAR_STD) -> torch.Tensor:
    m = torch.tensor(mean).view(1, 3, 1, 1)  # (3,) -> (1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)  # (3,) -> (1, 3, 1, 1)
    return (x - m) / s


# ----------------------------------------------------------------------------------------------------
# ViewAugmentation: shapes, determinism, randomness
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["simclr", "byol"])
@pytest.mark.parametrize(("in_size", "out_size"), [(32, 32), (32, 16), (24, 32)])
def test_output_shape_dtype_device(policy: str, in_size: int, out_size: int) -> None:
    x = _images(5, in_size)
    v1, v2 = ViewAugmentation(out_size, policy=policy)(x, _gen(0))
    for v in (v1, v2):
        assert v.shape == (5, 3, out_size, out_size) and v.dtype == torch.float32 and v.device == x.device
        assert torch.isfinite(v).all()


def test_same_seed_same_views_other_seed_different() -> None:
    x = _images(16)
    aug = ViewAugmentation(32)
    a1, a2 = aug(x, _gen(123))
    b1, b2 = aug(x, _gen(123))
    assert torch.equal(a1, b1) and torch.equal(a2, b2)
    c1, c2 = aug(x, _gen(124))
    assert not torch.equal(a1, c1) and not torch.equal(a2, c2)
    assert not torch.equal(a1, a2)  # the two views are independent draws


def test_samples_in_a_batch_get_different_augmentations() -> None:
    x = _images(1).expand(32, -1, -1, -1).contiguous()  # one image repeated 32 times
    v1, _ = ViewAugmentation(32)(x, _gen(0))
    flat = v1.reshape(32, 1, -1)  # (32, 3, 32, 32) -> (32, 1, 3072)
    gap = (flat - flat.transpose(0, 1)).abs().amax(dim=-1)  # (32, 32) max abs difference per pair
    assert (gap + torch.eye(32) > 1e-3).all()  # every pair of different samples differs


def test_generator_stream_advances_per_call() -> None:
    x = _images(4)
    aug = ViewAugmentation(32)
    gen = _gen(0)
    first, _ = aug(x, gen)
    second, _ = aug(x, gen)
    assert not torch.equal(first, second)


# ----------------------------------------------------------------------------------------------------
# Closed forms
# ----------------------------------------------------------------------------------------------------


def test_identity_policy_is_just_normalization() -> None:
    x = _images(6)
    aug = ViewAugmentation(32)
    out = aug.apply_policy(x, _gen(0), IDENTITY)
    assert torch.allclose(out, _normalize(x.float() / 255.0), atol=1e-6, rtol=0)
    raw = aug.apply_policy(x, _gen(0), IDENTITY, normalize=False)
    assert torch.allclose(raw, x.float() / 255.0, atol=1e-6, rtol=0)


def test_public_path_without_jitter_or_crop_is_normalize_flip_or_gray() -> None:
    # jitter_strength=0 makes every jitter factor exactly 1 and crop_scale=(1, 1) a full-image crop, so
    # each view must be one of: image, mirrored image, grayscale image, mirrored grayscale image.
    x = _images(64, seed=3)
    aug = ViewAugmentation(32, crop_scale=(1.0, 1.0), jitter_strength=0.0, blur=False)
    v1, _ = aug(x, _gen(9))
    base = x.float() / 255.0
    gray = rgb_to_grayscale(base).expand_as(base)
    outcomes = (base, base.flip(-1), gray, gray.flip(-1))
    candidates = torch.stack([_normalize(c) for c in outcomes])  # 4 x (B, 3, H, W) -> (4, B, 3, H, W)
    err = (candidates - v1.unsqueeze(0)).abs().amax(dim=(2, 3, 4))  # (4, B)
    assert (err.min(dim=0).values < 1e-5).all()
    kinds = err.argmin(dim=0)
    assert set(kinds.tolist()) == {0, 1, 2, 3}  # all four outcomes occur in 64 samples
    flipped = (kinds % 2 == 1).float().mean().item()
    grayed = (kinds >= 2).float().mean().item()
    assert 0.25 < flipped < 0.75 and 0.05 < grayed < 0.45


def test_flip_is_an_exact_mirror() -> None:
    x = _images(4, seed=1)
    out = ViewAugmentation(32).apply_policy(x, _gen(0), replace(IDENTITY, flip_p=1.0), normalize=False)
    assert torch.allclose(out, x.flip(-1).float() / 255.0, atol=1e-6, rtol=0)
    assert not torch.allclose(out, x.float() / 255.0, atol=1e-3)  # the test image is asymmetric


def test_crop_flip_resize_selects_the_box() -> None:
    x = torch.rand(2, 3, 32, 32)
    boxes = torch.tensor([[8.0, 4.0, 16.0, 16.0], [0.0, 10.0, 20.0, 12.0]])
    flip = torch.tensor([False, True])
    same = crop_flip_resize(x[:1], boxes[:1], flip[:1], 16)
    assert torch.allclose(same, x[:1, :, 8:24, 4:20], atol=1e-6)
    # A 20x12 box resized to 24x24 and mirrored equals bilinear interpolation of the mirrored crop.
    resized = crop_flip_resize(x[1:], boxes[1:], flip[1:], 24)
    crop = x[1:, :, 0:20, 10:22].flip(-1)
    expected = F.interpolate(crop, size=(24, 24), mode="bilinear", align_corners=False)
    assert torch.allclose(resized, expected, atol=1e-5)


def test_sample_crop_boxes_follow_torchvision_rules() -> None:
    gen = _gen(0)
    n = 4000
    scale, ratio = (0.08, 1.0), (3 / 4, 4 / 3)
    boxes = sample_crop_boxes(
        torch.rand(n, 10, generator=gen), torch.rand(n, 10, generator=gen), torch.rand(n, 2, generator=gen),
        32, 32, scale, ratio,
    )
    top, left, h, w = boxes.unbind(1)
    assert torch.equal(boxes, boxes.round())
    assert (top >= 0).all() and (left >= 0).all() and (top + h <= 32).all() and (left + w <= 32).all()
    assert (h >= 1).all() and (w >= 1).all()
    area = h * w / 1024
    assert area.min() > 0.05 and area.max() <= 1.0 and 0.45 < area.mean() < 0.6  # mean of U(0.08, 1) ~ 0.54
    aspect = w / h
    assert aspect.min() > 0.6 and aspect.max() < 1.6  # rounding widens [3/4, 4/3] a little on 32 px
    assert (top == 0).any() and (top + h == 32).any()  # positions reach both edges

    # Nothing fits a full-area crop of a 32x48 image within ratio <= 4/3: center crop 32x43 instead.
    fallback = sample_crop_boxes(
        torch.rand(3, 10, generator=gen), torch.rand(3, 10, generator=gen), torch.rand(3, 2, generator=gen),
        32, 48, (1.0, 1.0), ratio,
    )
    assert fallback.tolist() == [[0.0, 2.0, 32.0, 43.0]] * 3


def test_grayscale_gives_equal_channels() -> None:
    x = _images(8)
    out = ViewAugmentation(32).apply_policy(x, _gen(0), replace(IDENTITY, gray_p=1.0), normalize=False)
    assert torch.equal(out[:, 0], out[:, 1]) and torch.equal(out[:, 1], out[:, 2])
    assert torch.allclose(out[:, :1], rgb_to_grayscale(x.float() / 255.0), atol=1e-6)


def test_color_jitter_matches_torchvision_functional() -> None:
    # Fixed-order jitter must equal torchvision's adjust_* functions applied in the same order with the
    # same factors; the factors are recovered by replaying the documented per-view uniform draw.
    x = _images(6, seed=2)
    policy = replace(IDENTITY, jitter_p=1.0, brightness=0.8, contrast=0.8, saturation=0.8, hue=0.2)
    out = ViewAugmentation(32).apply_policy(x, _gen(5), policy, normalize=False)
    u = torch.rand(6, augment_module._NUM_DRAWS, generator=_gen(5), dtype=torch.float64)
    factors = u[:, augment_module._COL_FACTORS]
    for i in range(6):
        b, c, s, h = factors[i].tolist()
        img = x[i].float() / 255.0
        img = TF.adjust_brightness(img, 0.2 + 1.6 * b)
        img = TF.adjust_contrast(img, 0.2 + 1.6 * c)
        img = TF.adjust_saturation(img, 0.2 + 1.6 * s)
        img = TF.adjust_hue(img, 0.2 * (2 * h - 1))
        assert torch.allclose(out[i], img, atol=2e-5), i
    assert not torch.allclose(out, x.float() / 255.0, atol=1e-2)


def test_jitter_probability_is_per_sample() -> None:
    x = _images(200, size=8)
    policy = replace(IDENTITY, jitter_p=0.8, brightness=0.8, contrast=0.0, saturation=0.0, hue=0.0)
    out = ViewAugmentation(8).apply_policy(x, _gen(1), policy, normalize=False)
    untouched = (out - x.float() / 255.0).abs().amax(dim=(1, 2, 3)) < 1e-7  # (200,)
    assert 0.1 < untouched.float().mean().item() < 0.3


def test_solarize_inverts_bright_pixels() -> None:
    x = _images(4)
    out = ViewAugmentation(32).apply_policy(x, _gen(0), replace(IDENTITY, solarize_p=1.0), normalize=False)
    base = x.float() / 255.0
    assert torch.allclose(out, torch.where(base >= 0.5, 1.0 - base, base), atol=1e-6)


# ----------------------------------------------------------------------------------------------------
# Color and blur helpers
# ----------------------------------------------------------------------------------------------------


def test_hsv_round_trip_and_zero_hue_shift_identity() -> None:
    x = torch.rand(4, 3, 16, 16, generator=_gen(0))
    x[0, :, :4] = 0.5  # gray pixels (zero saturation)
    x[1, :, :2] = 0.0  # black pixels
    assert torch.allclose(hsv_to_rgb(rgb_to_hsv(x)), x, atol=1e-6)
    assert torch.allclose(adjust_hue(x, torch.zeros(4)), x, atol=1e-6)
    assert torch.allclose(adjust_hue(x, torch.ones(4)), x, atol=1e-5)  # a full turn


def test_rgb_to_hsv_matches_colorsys_and_hue_rotation() -> None:
    x = torch.rand(1, 3, 8, 8, generator=_gen(1))
    hsv = rgb_to_hsv(x)
    for i, j in [(0, 0), (3, 5), (7, 7), (2, 6)]:
        expected = colorsys.rgb_to_hsv(*x[0, :, i, j].tolist())
        assert torch.allclose(hsv[0, :, i, j], torch.tensor(expected), atol=1e-6)
    red = torch.tensor([1.0, 0.0, 0.0]).view(1, 3, 1, 1)  # (3,) -> (1, 3, 1, 1)
    green = adjust_hue(red, torch.tensor([1 / 3])).flatten()  # (1, 3, 1, 1) -> (3,)
    blue = adjust_hue(red, torch.tensor([-1 / 3])).flatten()  # (1, 3, 1, 1) -> (3,)
    assert torch.allclose(green, torch.tensor([0.0, 1.0, 0.0]), atol=1e-6)
    assert torch.allclose(blue, torch.tensor([0.0, 0.0, 1.0]), atol=1e-6)


def test_gaussian_blur_matches_torchvision_per_sample() -> None:
    x = torch.rand(3, 3, 24, 24, generator=_gen(2))
    sigma = torch.tensor([0.5, 1.7, 0.0])
    out = gaussian_blur(x, sigma, kernel_size=9)
    for i in range(2):
        expected = TF.gaussian_blur(x[i : i + 1], [9, 9], [sigma[i].item()] * 2)
        assert torch.allclose(out[i : i + 1], expected, atol=1e-5)
    assert torch.equal(out[2], x[2])  # sigma 0: untouched


def test_blur_in_view_augmentation() -> None:
    x = _images(4, size=96)
    aug = ViewAugmentation(96, mean=IMAGENET_MEAN, std=IMAGENET_STD)
    assert aug.blur_kernel_size == 9
    blurred = aug.apply_policy(x, _gen(0), replace(IDENTITY, blur_p=1.0), normalize=False)
    base = x.float() / 255.0
    assert blurred.shape == base.shape
    # Blurring random noise strongly reduces its high-frequency energy.
    assert blurred.diff(dim=-1).abs().mean() < 0.5 * base.diff(dim=-1).abs().mean()


# ----------------------------------------------------------------------------------------------------
# Configuration and errors
# ----------------------------------------------------------------------------------------------------


def test_policy_configuration() -> None:
    simclr32 = ViewAugmentation(32)
    assert [p.blur_p for p in simclr32.policies] == [0.0, 0.0]  # SimCLR skips blur on CIFAR
    assert ViewAugmentation(96).policies[0].blur_p == 0.5
    assert ViewAugmentation(32, blur=True).policies[1].blur_p == 0.5
    default = simclr32.policies[0]
    assert (default.brightness, default.hue) == pytest.approx((0.4, 0.1))
    strong = ViewAugmentation(32, jitter_strength=1.0).policies[0]
    strengths = (strong.brightness, strong.contrast, strong.saturation, strong.hue)
    assert strengths == pytest.approx((0.8, 0.8, 0.8, 0.2))
    assert (strong.jitter_p, strong.gray_p, strong.flip_p) == (0.8, 0.2, 0.5)
    assert ViewAugmentation(32, crop_scale=(0.2, 1.0)).policies[0].crop_scale == (0.2, 1.0)

    byol1, byol2 = ViewAugmentation(32, policy="byol").policies
    assert (byol1.blur_p, byol2.blur_p, byol1.solarize_p, byol2.solarize_p) == (1.0, 0.1, 0.0, 0.2)
    assert (byol1.brightness, byol1.contrast, byol1.saturation, byol1.hue) == (0.4, 0.4, 0.2, 0.1)
    no_blur = ViewAugmentation(224, policy="byol", blur=False).policies
    assert [p.blur_p for p in no_blur] == [0.0, 0.0]


def test_errors() -> None:
    with pytest.raises(ValueError, match="unknown augmentation policy 'moco'"):
        ViewAugmentation(32, policy="moco")
    aug = ViewAugmentation(32)
    with pytest.raises(ValueError, match="uint8"):
        aug(torch.rand(2, 3, 32, 32), _gen(0))
    with pytest.raises(ValueError, match="uint8"):
        EvalTransform(32)(torch.zeros(2, 1, 32, 32, dtype=torch.uint8))
    with pytest.raises(ValueError, match="crop_scale"):
        ViewAugmentation(32, crop_scale=(0.0, 1.0))


def test_grayscale_and_normalization_keep_their_exact_formulas() -> None:
    # The views reuse torchvision's rgb_to_grayscale (v1) and normalize (v2); seeded runs stay reproducible only
    # while they compute exactly 0.2989 r + 0.587 g + 0.114 b and (x - mean) / std, bit for bit.
    x = torch.rand(16, 3, 24, 24, generator=_gen(7))
    r, g, b = x.unbind(dim=1)
    assert torch.equal(rgb_to_grayscale(x), (0.2989 * r + 0.587 * g + 0.114 * b).unsqueeze(1))
    assert torch.equal(TF.normalize(x, list(CIFAR_MEAN), list(CIFAR_STD)), _normalize(x))


def test_normalization_for() -> None:
    assert normalization_for("cifar10") == (CIFAR_MEAN, CIFAR_STD)
    assert normalization_for("cifar100") == (CIFAR_MEAN, CIFAR_STD)
    assert normalization_for("stl10") == (IMAGENET_MEAN, IMAGENET_STD)
    assert normalization_for("imagefolder") == (IMAGENET_MEAN, IMAGENET_STD)


def test_normalized_statistics_are_sane() -> None:
    x = _images(128, seed=4)
    for v in ViewAugmentation(32)(x, _gen(0)):
        low = _normalize(torch.zeros(1, 3, 1, 1))
        high = _normalize(torch.ones(1, 3, 1, 1))
        assert (v >= low - 1e-5).all() and (v <= high + 1e-5).all()
        channel_mean = v.mean(dim=(0, 2, 3))
        assert channel_mean.abs().max() < 1.0
        assert 0.3 < v.std().item() < 2.5


# ----------------------------------------------------------------------------------------------------
# EvalTransform
# ----------------------------------------------------------------------------------------------------


def test_eval_transform_identity_size_is_exact_normalization() -> None:
    x = _images(5)
    out = EvalTransform(32, CIFAR_MEAN, CIFAR_STD)(x)
    assert out.dtype == torch.float32 and out.shape == (5, 3, 32, 32)
    assert torch.equal(out, _normalize(x.to(torch.float32) / 255.0))


def test_eval_transform_resizes_and_center_crops() -> None:
    x = torch.zeros(2, 3, 64, 48, dtype=torch.uint8)
    x[:, 1] = 200  # constant green image stays constant after resizing
    out = EvalTransform(24, IMAGENET_MEAN, IMAGENET_STD)(x)
    assert out.shape == (2, 3, 24, 24)
    expected = _normalize(torch.tensor([0.0, 200 / 255, 0.0]).view(1, 3, 1, 1), IMAGENET_MEAN, IMAGENET_STD)
    assert torch.allclose(out, expected.expand_as(out), atol=1e-5)
    # A 48x64 (H x W) image whose shorter side already matches is only center-cropped.
    wide = _images(1, size=64, height=48)
    cropped = EvalTransform(48, CIFAR_MEAN, CIFAR_STD)(wide)
    assert torch.equal(cropped, _normalize(wide[:, :, :, 8:56].float() / 255.0))


# ----------------------------------------------------------------------------------------------------
# Speed and devices
# ----------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_matches_cpu_parameters() -> None:
    x = _images(8)
    aug = ViewAugmentation(32, crop_scale=(1.0, 1.0), jitter_strength=0.0)
    cpu1, _ = aug(x, _gen(0))
    gpu1, _ = aug(x.cuda(), _gen(0))
    assert gpu1.device.type == "cuda"
    assert torch.allclose(gpu1.cpu(), cpu1, atol=1e-4)  # same random parameters on both devices
    with pytest.raises(ValueError, match="CPU"):
        aug(x.cuda(), torch.Generator(device="cuda"))
