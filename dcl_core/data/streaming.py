"""Streaming ImageFolder data, for datasets too large to decode into memory (ImageNet-100/1K).

The in-memory path (:mod:`dcl_core.data.datasets`) decodes small images once into one uint8 tensor and makes
the views with a batched augmentation on the training device. ImageNet does not fit that way (1.28M images
at 224 px are ~190 GB, per DDP worker), and its protocol crops each view from the full-resolution image.
Here torchvision's ``ImageFolder`` reads every file in ``DataLoader`` worker processes and
``torchvision.transforms.v2`` makes the two views per sample, with the parameters of the same
:class:`~dcl_core.data.augment.ViewPolicy` objects the batched augmentation uses, in the same order (crop,
flip, colour jitter, grayscale, blur, solarize, normalize). So ``data.loader`` decides where the work happens,
not what the views are; the one difference is that torchvision's ``ColorJitter`` applies its four
adjustments in a random order, the batched one in a fixed order.

Evaluation images are resized (shorter side) to ``image_size / 0.875`` and center-cropped to ``image_size``:
ImageNet's standard 256 -> 224.

Reproducible given the seed: the trainer hands each epoch's ``DataLoader`` a generator seeded for that epoch
(worker ``i`` seeds its RNG from it), and with ``workers=0`` the transforms use the global RNG the trainer
seeds per epoch.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision.datasets import ImageFolder
from torchvision.transforms import v2

from dcl_core.data.augment import ViewAugmentation, ViewPolicy
from dcl_core.data.datasets import class_balanced_subset
from dcl_core.data.decode import pil_image
from dcl_core.data.errors import DataError, UnreadableImageError
from dcl_core.data.folders import folder_samples
from dcl_core.data.image_bytes import read_image_bytes

log = logging.getLogger(__name__)

EVAL_CROP_RATIO = 0.875  # ImageNet's resize 256 -> center crop 224


def view_transform(
    policy: ViewPolicy, image_size: int, blur_kernel: int, mean: Sequence[float], std: Sequence[float]
) -> v2.Compose:
    """One view's per-sample pipeline (PIL image -> normalized float tensor (3, S, S)) for ``policy``."""
    steps: list[v2.Transform] = [
        v2.ToImage(),  # PIL -> uint8 (3, H, W), full resolution
        v2.RandomResizedCrop(image_size, scale=policy.crop_scale, ratio=policy.crop_ratio, antialias=True),
        v2.RandomHorizontalFlip(policy.flip_p),
        v2.ToDtype(torch.float32, scale=True),  # [0, 1], as the batched augmentation works
    ]
    if policy.jitter_p > 0:
        jitter = v2.ColorJitter(policy.brightness, policy.contrast, policy.saturation, policy.hue)
        steps.append(v2.RandomApply([jitter], p=policy.jitter_p))
    if policy.gray_p > 0:
        steps.append(v2.RandomGrayscale(policy.gray_p))
    if policy.blur_p > 0:
        steps.append(v2.RandomApply([v2.GaussianBlur(blur_kernel, sigma=policy.blur_sigma)], p=policy.blur_p))
    if policy.solarize_p > 0:
        steps.append(v2.RandomSolarize(policy.solarize_threshold, p=policy.solarize_p))
    steps.append(v2.Normalize(list(mean), list(std)))
    return v2.Compose(steps)


class TwoViews:
    """Per-sample transform: one image -> its two views (the policies of a :class:`ViewAugmentation`)."""

    def __init__(self, augment: ViewAugmentation) -> None:
        self.views = tuple(
            view_transform(p, augment.image_size, augment.blur_kernel_size, augment.mean, augment.std)
            for p in augment.policies
        )

    def __call__(self, image: object) -> tuple[torch.Tensor, torch.Tensor]:
        """The image's two augmented views."""
        return self.views[0](image), self.views[1](image)


def load_image(path: str) -> Image.Image:
    """``ImageFolder``'s loader (PIL, RGB) of the file's bytes read within their bound (a regular file, never a
    FIFO or device: :func:`~dcl_core.data.image_bytes.read_image_bytes`); a file it cannot read or decode raises
    :class:`~dcl_core.data.datasets.UnreadableImageError` naming the file, not PIL's error without it."""
    data = read_image_bytes(path)
    try:
        return pil_image(data)
    except Exception as exc:  # PIL raises OSError, SyntaxError, ValueError, DecompressionBombError, ...
        raise UnreadableImageError(f"cannot decode image {path}: {exc}") from None


class _Folder(ImageFolder):
    """torchvision's ``ImageFolder``, listed by :func:`~dcl_core.data.folders.folder_samples` (the same files in
    the same order, but a folder link loop is refused, not walked)."""

    @staticmethod
    def make_dataset(directory: str | Path, class_to_idx: dict[str, int], extensions: object = None,
                     is_valid_file: object = None, allow_empty: bool = False) -> list[tuple[str, int]]:
        """The class folders' image files (the extensions and validity check are ImageFolder's own)."""
        return folder_samples(str(directory), class_to_idx, allow_empty)


def eval_transform(image_size: int, mean: Sequence[float], std: Sequence[float]) -> v2.Compose:
    """Resize the shorter side to ``image_size / 0.875``, center-crop ``image_size``, normalize."""
    return v2.Compose([
        v2.ToImage(),
        v2.Resize(round(image_size / EVAL_CROP_RATIO), antialias=True),
        v2.CenterCrop(image_size),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize(list(mean), list(std)),
    ])


@dataclass
class FolderSplit:
    """One split of an ImageFolder tree (possibly a class-balanced subset), read lazily."""

    dataset: Dataset
    labels: torch.Tensor  # (N,) int64
    classes: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.labels)

    def with_transform(self, transform: object) -> FolderSplit:
        """The same images, in the same order, with another per-sample transform (no second directory scan:
        ImageNet-1K's train folder holds 1.28M files)."""
        inner = self.dataset.dataset if isinstance(self.dataset, Subset) else self.dataset
        folder: Any = copy.copy(inner)  # an ImageFolder (torchvision is untyped)
        folder.transform = transform  # ImageFolder applies self.transform in __getitem__
        dataset = Subset(folder, self.dataset.indices) if isinstance(self.dataset, Subset) else folder
        return FolderSplit(dataset, self.labels, self.classes)


def folder_split(
    split_dir: Path, transform: object, per_class: int = 0, seed: int = 0, classes: Sequence[str] | None = None
) -> FolderSplit:
    """``ImageFolder(split_dir)`` with ``transform``, optionally a seeded class-balanced subset.

    Args:
        split_dir: ``<root>/train`` or ``<root>/val`` with one folder per class.
        transform: per-sample transform (:class:`TwoViews` or :func:`eval_transform`).
        per_class: keep this many images per class (0 = all), the subset :func:`class_balanced_subset` picks.
        seed: seed of that subset.
        classes: the train split's class names; an evaluation split must use the same (label numbering).
    """
    if not split_dir.is_dir():
        raise DataError(f"ImageFolder split not found: {split_dir}")
    folder = _Folder(str(split_dir), transform=transform, loader=load_image)
    if classes is not None and tuple(folder.classes) != tuple(classes):
        raise DataError(f"{split_dir} has classes {folder.classes[:5]}... unlike the train split's")
    labels = torch.tensor(folder.targets, dtype=torch.long)  # (N,)
    dataset: Dataset = folder
    if per_class > 0:
        index = class_balanced_subset(labels, per_class, seed)  # (C * per_class,)
        dataset, labels = Subset(folder, index.tolist()), labels[index]
    log.info("streaming %s: %d images, %d classes", split_dir, len(labels), len(folder.classes))
    return FolderSplit(dataset, labels, tuple(folder.classes))


def epoch_loader(
    split: FolderSplit, batches: Sequence[torch.Tensor], workers: int, generator: torch.Generator, pin: bool
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The two-view batches of one epoch, in the given order of index batches, decoded by ``workers``."""
    loader = DataLoader(
        split.dataset, batch_sampler=[b.tolist() for b in batches], num_workers=workers, generator=generator,
        pin_memory=pin, persistent_workers=False,
    )
    for (view1, view2), _ in loader:  # (n, 3, S, S) each
        yield view1, view2


def eval_batches(split: FolderSplit, batch_size: int, workers: int, pin: bool) -> Iterator[torch.Tensor]:
    """The split's evaluation-transformed images in order, ``batch_size`` at a time."""
    loader = DataLoader(split.dataset, batch_size=batch_size, shuffle=False, num_workers=workers, pin_memory=pin)
    for images, _ in loader:  # (b, 3, S, S) normalized float
        yield images
